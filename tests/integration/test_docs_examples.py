"""Every Python and shell example of README.md and docs/** runs as pasted, against real servers.

Per page, the Python blocks run in order as one script (a later block may use what an earlier
one defined, as a reader pasting them into one session would), in a fresh process, in a
directory holding the files the page asks the reader to save (``<!-- docs-test: file: ... -->``).
The shell blocks run in order with ``bash -euo pipefail`` in a directory holding the
``singleton.toml`` that ``singleton dev-servers --write-config`` writes, with the virtualenv's
``singleton`` first on ``PATH``.

The examples name the servers a reader runs locally: Redis on ``redis://127.0.0.1:6379/0``,
MongoDB on ``mongodb://127.0.0.1:27017/?replicaSet=rs0`` and Elasticsearch on
``http://127.0.0.1:9200``. Each page gets servers of its own, a real ``redis-server``,
SecantusDB and osmem-server on free ports (``singleton.service.dev.embedded``, as the fixtures of
``tests/conftest.py`` and ``singleton dev-servers`` start them), whose URLs replace those three,
exactly as getting-started.md tells a reader to do with the URLs ``dev-servers`` prints; nothing
else in an example is changed. Fresh servers per page, because pages reuse names (two listeners
of ``shop.orders`` on two pages are one checkpoint on shared servers, and a second listener
class refuses the first one's checkpoint, rightly); and not the shared Redis on 6379 itself,
whose lease store remembers the checkpoints of earlier runs (a fresh MongoDB without them is,
rightly, a checkpoint that disappeared).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from singleton.service.dev.embedded import ElasticServer, MongoServer, RedisServer
from singleton.service.dev.servers import sample_config
from tests.unit.test_docs import ROOT, Block, blocks_of, page_files, pages

LOCAL_MONGO = "mongodb://127.0.0.1:27017/?replicaSet=rs0"
LOCAL_ES = "http://127.0.0.1:9200"
LOCAL_REDIS = "redis://127.0.0.1:6379/0"
#: Seconds a page's examples may take (below pytest's own 180 s, so that a hang says where).
TIMEOUT = 150


def _runnable(page: Path, kind: str) -> list[Block]:
    return [b for b in blocks_of(page) if b.kind == kind and b.runs]


def _pages_with(kind: str) -> list[Path]:
    """The pages with a runnable block of ``kind`` that is a program, not only a file to save
    (a page whose blocks are all files is run through the page that uses them)."""
    return [p for p in pages() if any(not b.file_name for b in _runnable(p, kind))]


def _name(page: Path) -> str:
    return str(page.relative_to(ROOT))


@pytest.fixture
def page_servers() -> Iterator[tuple[str, str, str]]:
    """A page's own Redis, MongoDB and Elasticsearch: ``(redis_url, mongo_url, es_url)``."""
    servers = (RedisServer(), MongoServer(), ElasticServer())
    assert not servers[0].fake, "redis-server must be on PATH for the real-server tests"
    try:
        for server in servers:
            server.start()
        yield servers[0].url, servers[1].url, servers[2].url
    finally:
        for server in reversed(servers):
            server.cleanup()


def _environment(workdir: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '/usr/bin:/bin')}"
    env["PYTHONPATH"] = f"{workdir}:{ROOT}"
    env.pop("SINGLETON_CONFIG", None)
    return env


def _save_files(page: Path, workdir: Path) -> None:
    for name, text in page_files(page).items():
        (workdir / name).write_text(text, encoding="utf-8")


def _fail(page: Path, what: str, done: subprocess.CompletedProcess[str]) -> str:
    return (
        f"{_name(page)}: {what} exited {done.returncode}\n--- stdout\n{done.stdout[-3000:]}"
        f"\n--- stderr\n{done.stderr[-5000:]}"
    )


def _run(argv: list[str], workdir: Path) -> subprocess.CompletedProcess[str]:
    """``argv`` in ``workdir``, in a process group of its own; one that outlives
    :data:`TIMEOUT` is killed with everything it started (a replica a shell block put in the
    background) and fails with what it printed so far."""
    proc = subprocess.Popen(
        argv,
        cwd=workdir,
        env=_environment(workdir),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        err += f"\n(killed after {TIMEOUT} s)"
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


@pytest.mark.parametrize("page", _pages_with("python"), ids=_name)
def test_python_examples_run(
    page: Path, tmp_path: Path, page_servers: tuple[str, str, str]
) -> None:
    redis_url, mongo_url, es_url = page_servers
    _save_files(page, tmp_path)
    parts = []
    for b in _runnable(page, "python"):
        if b.file_name:
            continue
        code = b.code.replace(LOCAL_MONGO, mongo_url).replace(LOCAL_ES, es_url)
        code = code.replace(LOCAL_REDIS, redis_url)
        parts.append(f"# --- {b.where}\n{code}")
    assert parts, f"{_name(page)}: no Python program to run"
    script = tmp_path / "examples.py"
    script.write_text("\n".join(parts), encoding="utf-8")
    done = _run([sys.executable, str(script)], tmp_path)
    assert done.returncode == 0, _fail(page, "its Python examples", done)


@pytest.mark.parametrize("page", _pages_with("sh"), ids=_name)
def test_shell_examples_run(page: Path, tmp_path: Path, page_servers: tuple[str, str, str]) -> None:
    redis_url, mongo_url, es_url = page_servers
    _save_files(page, tmp_path)
    (tmp_path / "singleton.toml").write_text(sample_config(redis_url, mongo_url, es_url))
    for b in _runnable(page, "sh"):
        done = _run(["bash", "-euo", "pipefail", "-c", b.code], tmp_path)
        assert done.returncode == 0, _fail(page, f"the shell block at line {b.line}", done)


def test_a_failing_example_fails_the_test(tmp_path: Path) -> None:
    """The runner above can fail: a name the example never defined (the README's old ``audit``)
    ends the script with a non-zero exit."""
    script = tmp_path / "examples.py"
    script.write_text("audit.insert_many([{}])\n", encoding="utf-8")
    done = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert done.returncode != 0 and "NameError" in done.stderr
