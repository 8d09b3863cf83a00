"""Operator input (#32) through real ``singleton`` processes: bad settings exit 2 at once (they
used to connect for ~6 s first, or end in a traceback), an unreachable MongoDB is a clean failed
``verify``, a Sentinel password holding a raw space never shows on any command, and ``run``
warns at start-up about a world-readable config file holding passwords and about a Redis that
evicts keys (a redis-server of this module's own, so its CONFIG changes reach no other test)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from singleton.service.assembly import warn_evicting_policy
from singleton.service.dev.cluster import child_environment, singleton_command
from singleton.service.dev.embedded import RedisServer, free_port
from tests.integration.cluster import ROOT, run_singleton
from tests.unit.election.election_support import captured_logs

SECRET = "SECRETtail"


@pytest.fixture(scope="module")
def silent() -> Iterator[str]:
    """``host:port`` of a server that takes connections and never answers."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(64)
        yield f"127.0.0.1:{sock.getsockname()[1]}"


@pytest.fixture(scope="module")
def own_redis() -> Iterator[RedisServer]:
    with RedisServer() as started:
        assert not started.fake, "redis-server must be on PATH (make sysdeps)"
        yield started


@pytest.fixture(scope="module")
def baseline(tmp_path_factory: pytest.TempPathFactory) -> float:
    """Seconds a ``singleton`` process takes to start and exit 2 on a value refused before any
    store is read (an unknown backend)."""
    start = time.monotonic()
    out = run_singleton("status", "--backend", "nosuch")
    assert out.returncode == 2, out.stderr
    return time.monotonic() - start


def _config(tmp_path: Path, text: str, mode: int = 0o600) -> str:
    path = tmp_path / "singleton.toml"
    path.write_text(text)
    path.chmod(mode)
    return str(path)


def _es_table(database: str, *lines: str) -> str:
    table = ["[[listeners]]", 'use = "elasticsearch"', f'database = "{database}"']
    return "\n".join([*table, 'collection = "orders"', *lines, ""])


def _job_table() -> str:
    return '[[jobs]]\nuse = "builtins:id"\nname = "j"\nevery = 60\n'


def _run_briefly(argv: list[str], until: str, timeout: float = 30) -> str:
    """``singleton run ARGV`` until its output holds ``until``, then SIGTERM: its output."""
    proc = subprocess.Popen(
        singleton_command("run", *argv),
        cwd=ROOT,
        env=child_environment(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: list[str] = []
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    try:
        for line in proc.stdout:
            lines.append(line)
            if until in line or time.monotonic() > deadline:
                break
        proc.send_signal(signal.SIGTERM)
        rest, _ = proc.communicate(timeout=30)
        lines.append(rest)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
    return "".join(lines)


# -- exit 2 at once ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("command", "table", "flags", "message"),
    [
        ("run", "", ["--ttl", "0.001"], "ttl must be from 1 s to 3600 s"),
        ("status", "", ["--ttl", "0.001"], "ttl must be from 1 s to 3600 s"),
        ("status", "", ["--lease", ""], "--lease must name a lease"),
        ("status", "", ["--mongo-url", "mongodb://db/?bogusOption=1"], "unknown option"),
        ("verify", "", ["--mongo-url", "mongodb://db/?bogusOption=1"], "unknown option"),
        ("run", "", ["--mongo-url", "mongodb://db/?bogusOption=1"], "unknown option"),
        ("run", "gc_safety_factor = inf", [], "gc_safety_factor must be a finite number"),
        ("run", 'index = "ord*ers"', [], "index 'ord*ers' has a '*'"),
        ("verify", 'index = "ord*ers"', [], "e.g. index = 'ord_ers'"),
    ],
)
def test_bad_input_exits_2_at_once(
    command: str,
    table: str,
    flags: list[str],
    message: str,
    silent: str,
    tmp_path: Path,
    baseline: float,
) -> None:
    config = _config(tmp_path, _es_table("shop", table))
    stores = ["--redis-url", f"redis://{silent}/0", "--mongo-url", f"mongodb://{silent}/"]
    stores += ["--es-url", f"http://{silent}"]
    start = time.monotonic()
    out = run_singleton(command, "--config", config, *stores, *flags, timeout=60)
    took = time.monotonic() - start
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert message in out.stderr and "Traceback" not in out.stderr, out.stderr
    # (connecting first took 5 s or more: status's timeout, a replica's checks)
    assert took < baseline + 3, f"exit 2 after {took:.1f}s (start-up {baseline:.1f}s)"


def test_verify_with_mongodb_unreachable_fails_cleanly(tmp_path: Path) -> None:
    """As ``status`` does with an unreachable store: exit 1 and one line saying why (a pymongo
    traceback before)."""
    closed = free_port("127.0.0.1")
    config = _config(tmp_path, _es_table("shop"))
    out = run_singleton(
        "verify", "--config", config, "--mongo-url", f"mongodb://127.0.0.1:{closed}/"
    )
    assert out.returncode == 1, (out.stdout, out.stderr)
    assert "Traceback" not in out.stderr, out.stderr
    assert out.stderr.startswith("singleton: failed: verify shop.orders: MongoDB mongodb://")
    assert "ServerSelectionTimeoutError" in out.stderr


# -- a raw space in a Sentinel password ------------------------------------------------------
def test_a_sentinel_password_with_a_raw_space_shows_on_no_command(
    mongo_url: str, es_url: str, unique: str, tmp_path: Path
) -> None:
    """Its tail appeared in ``status``, ``status --json``, ``verify``, ``dead-letters list`` and
    the ``run`` log."""
    closed = free_port("127.0.0.1")
    sentinel = f"redis+sentinel://127.0.0.1:{closed}/mymaster?sentinel_password=Ab9Kx {SECRET}"
    text = "\n".join(
        [
            f'redis_url = "{sentinel}"',
            f'mongo_url = "{mongo_url}"',
            f'es_url = "{es_url}"',
            f'namespace = "n{unique}"',
            _es_table(f"d{unique}"),
        ]
    )
    config = ["--config", _config(tmp_path, text)]
    shown = []
    for args in (
        ["status"],
        ["status", "--json"],
        ["verify"],
        ["dead-letters", "list", "--listener", f"d{unique}.orders"],
    ):
        out = run_singleton(*args, *config, timeout=60)
        assert "Traceback" not in out.stderr, (args, out.stderr)
        shown.append(out.stdout + out.stderr)
    assert "sentinel_password=***" in shown[0], shown[0]
    shown.append(_run_briefly(config, until=" started: backend=redis redis+sentinel://"))
    for args, text in zip(
        ("status", "status --json", "verify", "dead-letters", "run"), shown, strict=True
    ):
        assert SECRET not in text and "Ab9Kx" not in text, (args, text)


# -- start-up warnings -----------------------------------------------------------------------
def test_a_world_readable_config_holding_a_password_is_warned_about(
    redis_url: str, unique: str, tmp_path: Path
) -> None:
    text = "\n".join(
        [
            f'redis_url = "{redis_url}"',
            f'namespace = "n{unique}"',
            'es_url = "http://elastic:Ab9Kx@127.0.0.1:9"',  # never reached: a jobs-only replica
            _job_table(),
        ]
    )
    path = _config(tmp_path, text, mode=0o644)
    out = _run_briefly(["--config", path], until=" started: ")
    assert f"config file {path} is readable by every user" in out, out
    assert "(mode 644) and holds secrets in es_url: chmod o-r" in out, out
    assert "Ab9Kx" not in out
    os.chmod(path, 0o640)
    out = _run_briefly(["--config", path], until=" started: ")
    assert "readable by every user" not in out and "replica" in out, out


def test_an_evicting_redis_is_warned_about_at_start_up(
    own_redis: RedisServer, unique: str, tmp_path: Path
) -> None:
    admin = redis.Redis(host=own_redis.host, port=own_redis.port)
    admin.config_set("maxmemory-policy", "allkeys-lru")
    try:
        text = f'redis_url = "{own_redis.url}"\nnamespace = "n{unique}"\n' + _job_table()
        out = _run_briefly(["--config", _config(tmp_path, text)], until=" started: ")
        assert "has maxmemory-policy allkeys-lru (maxmemory 0: no limit yet)" in out, out
        assert "set maxmemory-policy noeviction" in out, out
    finally:
        admin.config_set("maxmemory-policy", "noeviction")
        admin.close()


@pytest.mark.parametrize(
    ("policy", "warned"),
    [
        ("volatile-ttl", True),  # lease and member keys carry a TTL
        ("allkeys-random", True),
        ("noeviction", False),
    ],
)
def test_which_policies_are_warned_about(own_redis: RedisServer, policy: str, warned: bool) -> None:
    admin = redis.Redis(host=own_redis.host, port=own_redis.port)
    admin.config_set("maxmemory-policy", policy)
    admin.config_set("maxmemory", "100mb")
    try:
        with captured_logs("DEBUG") as logs:
            warn_evicting_policy(own_redis.url)
    finally:
        admin.config_set("maxmemory-policy", "noeviction")
        admin.config_set("maxmemory", "0")
        admin.close()
    warnings = [m for level, m in logs if level == "WARNING"]
    if warned:
        assert len(warnings) == 1 and f"maxmemory-policy {policy}" in warnings[0], logs
        assert f"maxmemory {100 * 1024 * 1024} bytes" in warnings[0]
    else:
        assert not warnings, logs


def test_an_acl_hiding_config_says_nothing_above_debug(own_redis: RedisServer) -> None:
    admin = redis.Redis(host=own_redis.host, port=own_redis.port)
    admin.execute_command(
        "ACL", "SETUSER", "noconfig", "on", ">nc-pw", "~*", "&*", "+@all", "-config"
    )
    admin.config_set("maxmemory-policy", "allkeys-lru")
    url = f"redis://noconfig:nc-pw@{own_redis.host}:{own_redis.port}/0"
    try:
        with captured_logs("DEBUG") as logs:
            warn_evicting_policy(url)
    finally:
        admin.config_set("maxmemory-policy", "noeviction")
        admin.close()
    assert [level for level, _ in logs] == ["DEBUG"], logs
    assert "nc-pw" not in logs[0][1]
