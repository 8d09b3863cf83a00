"""singleton is quiet as a library; ``use_stdlib_logging`` sends its records to ``logging``,
under module names, with fields as attributes, redacted on every route.

The scripts run in fresh processes against the session's real ``redis-server``: what a user's
script prints is what a process writes on stdout and stderr, and nothing else.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from loguru import logger

from singleton.stdlog import (
    redact_record,
    seconds,
    stdlib_level,
    stop_stdlib_logging,
    use_stdlib_logging,
)
from tests.unit.test_docs import ROOT, blocks_of

if TYPE_CHECKING:
    from loguru import Logger, Record

LOGGING_PAGE = ROOT / "docs" / "how-to" / "logging.md"
LOCAL_REDIS = "redis://127.0.0.1:6379/0"
PASSWORD = "hunter2-Zq9"

SCRIPT = """
import logging, sys
from tests.unit.test_logging import DRIVER
from loguru import logger
from singleton import Elector
from singleton.lease.redis import RedisLeaseBackend

if sys.argv[2] == "stdlib":
    import singleton
    singleton.use_stdlib_logging()
    logging.basicConfig(
        level="INFO", stream=sys.stderr,
        format="REC %(name)s|%(levelname)s|%(lease)s|%(identity)s|%(message)s",
    )
backend = RedisLeaseBackend(sys.argv[1], namespace="test-logging")
with Elector(backend, "orders", ttl=2.0, identity="me-1").lead(timeout=20) as leadership:
    print("TOKEN", leadership.token)
    # What a driver might say, logged from a module of ours: a URL with its password, in a
    # message and in an exception.
    exec(DRIVER, {"__name__": "singleton.lease.redis", "password": sys.argv[3]})
backend.close()
"""
DRIVER = """
from loguru import logger
logger = logger.bind(lease="orders", identity="me-1")
logger.warning("cannot reach redis://user:{}@10.0.0.9:6379/0", password)
try:
    raise ConnectionError(f"refused by redis://user:{password}@10.0.0.9:6379/0")
except ConnectionError:
    logger.exception("renewal failed")
"""


def _from(module: str) -> Logger:
    """The logger, its records named as if ``module`` had logged them."""

    def rename(record: Record) -> None:
        record["name"] = module

    return logger.patch(rename)


def _run(code: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
        env=env,
        check=False,
    )


def _with_password(url: str) -> str:
    return url.replace("redis://", f"redis://:{PASSWORD}@", 1)


def test_a_plain_script_prints_nothing(redis_url: str, tmp_path: Path) -> None:
    out = _run(SCRIPT, _with_password(redis_url), "quiet", PASSWORD, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("TOKEN ") and out.stdout.count("\n") == 1, out.stdout
    assert out.stderr == ""


def test_use_stdlib_logging_prints_the_election_redacted(redis_url: str, tmp_path: Path) -> None:
    out = _run(SCRIPT, _with_password(redis_url), "stdlib", PASSWORD, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert PASSWORD not in out.stdout + out.stderr
    records = [line[4:].split("|", 4) for line in out.stderr.splitlines() if line[:4] == "REC "]
    by_message = {r[4].split(":")[0]: r for r in records}
    starting = by_message["elector starting"]
    assert starting[:4] == ["singleton.election.elector", "INFO", "orders", "me-1"]
    assert "renew_interval=0.67s" in starting[4] and "redis://:***@" in starting[4]
    assert by_message["elected"][:4] == ["singleton.election.machine", "INFO", "orders", "me-1"]
    assert "elector stopped" in by_message
    warned = by_message["cannot reach redis"]
    assert warned[:2] == ["singleton.lease.redis", "WARNING"]
    assert "redis://user:***@10.0.0.9" in warned[4]
    assert "ConnectionError: refused by redis://user:***@10.0.0.9:6379/0" in out.stderr
    assert not any(line.startswith(("20", "\x1b")) for line in out.stderr.splitlines()), (
        "loguru's default handler still writes: records would show twice"
    )


def test_the_logging_guide_examples_print_what_it_says(redis_url: str, tmp_path: Path) -> None:
    blocks = [b for b in blocks_of(LOGGING_PAGE) if b.kind == "python" and b.runs]
    assert len(blocks) == 3
    outputs = []
    for block in blocks:
        assert LOCAL_REDIS in block.code, block.where
        out = _run(block.code.replace(LOCAL_REDIS, redis_url), cwd=tmp_path)
        assert out.returncode == 0, f"{block.where}: {out.stderr}"
        outputs.append(out)
    quiet, stdlib, loguru = outputs
    assert quiet.stdout.startswith("leading with token ") and quiet.stderr == ""
    lines = stdlib.stderr.splitlines()
    assert any(x.startswith("INFO singleton.election.machine [orders] elected:") for x in lines)
    assert "INFO app [orders] leading" in lines
    assert any(
        x.startswith("INFO singleton.election.machine elected:") for x in loguru.stderr.splitlines()
    )


@pytest.fixture
def to_stdlib() -> Iterator[None]:
    use_stdlib_logging()
    yield
    stop_stdlib_logging()


@pytest.mark.usefixtures("to_stdlib")
def test_bound_fields_levels_and_reserved_names(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    log = _from("listeners.runtime.tenure")
    log.bind(listener="es", token=7, name="clash").success("tenure began: lease=orders")
    log.trace("heartbeat")
    record = next(r for r in caplog.records if r.name == "listeners.runtime.tenure")
    assert record.levelno == logging.INFO and record.getMessage() == "tenure began: lease=orders"
    assert (record.listener, record.token, record.lease) == ("es", 7, "orders")  # type: ignore[attr-defined]
    assert record.field_name == "clash"  # type: ignore[attr-defined]
    assert [r.levelno for r in caplog.records if r.name == "listeners.runtime.tenure"] == [
        logging.INFO,
        logging.DEBUG,
    ]


@pytest.mark.usefixtures("to_stdlib")
def test_only_our_packages_are_forwarded(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    _from("someone.else").info("not ours")
    _from("singletonish").info("not ours either")
    assert not [r for r in caplog.records if "ours" in r.getMessage()]


def test_use_stdlib_logging_is_idempotent(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    use_stdlib_logging()
    use_stdlib_logging()
    try:
        _from("singleton.x").info("once")
    finally:
        stop_stdlib_logging()
    _from("singleton.x").info("after stop")
    assert [r.getMessage() for r in caplog.records if r.name == "singleton.x"] == ["once"]


def test_redact_record_covers_message_fields_and_exception_args() -> None:
    seen: list[dict[str, object]] = []
    sink = logger.add(lambda m: seen.append(json.loads(m)["record"]), serialize=True)
    try:
        exc = RuntimeError("mongodb://u:pw1@h/")
        logger.patch(redact_record).bind(url="redis://:pw2@h:1").opt(exception=exc).error(
            "at https://u:pw3@h:9200"
        )
    finally:
        logger.remove(sink)
    text = json.dumps(seen)
    assert "pw1" not in text and "pw2" not in text and "pw3" not in text
    assert exc.args == ("mongodb://u:***@h/",)


def test_levels_map_by_name() -> None:
    assert stdlib_level("TRACE", 5) == logging.DEBUG
    assert stdlib_level("SUCCESS", 25) == logging.INFO
    assert stdlib_level("WARNING", 30) == logging.WARNING
    assert stdlib_level("CUSTOM", 33) == 33


def test_importing_the_library_disables_its_loggers(tmp_path: Path) -> None:
    code = textwrap.dedent(
        """
        from loguru import logger
        import listeners
        said = "from loguru import logger; logger.warning('{}')"
        exec(said.format("hidden"), {"__name__": "singleton.lease.redis"})
        exec(said.format("hidden too"), {"__name__": "listeners.runtime.tenure"})
        logger.enable("listeners")
        exec(said.format("enabled: shown"), {"__name__": "listeners.runtime.tenure"})
        logger.info("main is not ours: shown")
        """
    )
    out = _run(code, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "hidden" not in out.stderr
    assert "enabled: shown" in out.stderr and "main is not ours: shown" in out.stderr


def test_seconds_read_as_people_write_them() -> None:
    cases = {2 / 3: "0.67s", 2.0: "2s", 0.25: "0.25s", 0.05: "0.05s", 300.4: "300s", 0: "0s"}
    assert {value: seconds(value) for value in cases} == cases
    assert seconds(None) == "none"
