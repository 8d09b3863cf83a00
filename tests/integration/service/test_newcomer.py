"""A newcomer's path: ``singleton dev-servers`` gives servers to point ``singleton run`` at, and
a listener module in the working directory (or ``--app-dir``) resolves by name."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pymongo
import redis

from singleton.service.config import load_config
from singleton.service.dev.cluster import child_environment, singleton_command
from singleton.service.dev.embedded import wait_until
from tests.integration.cluster import run_singleton

MODULE = """
from listeners import ChangeStreamListener


class Mine(ChangeStreamListener):
    def handle_batch(self, events, ctx):
        pass
"""


def test_dev_servers_print_a_ready_config_and_stop_on_ctrl_c(tmp_path: Path) -> None:
    config = tmp_path / "singleton.toml"
    proc = subprocess.Popen(
        singleton_command("dev-servers", "--write-config", str(config)),
        env=child_environment(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        wait_until(lambda: config.exists() and "[[listeners]]" in config.read_text(), 60)
        cfg = load_config(config)
        assert redis.Redis.from_url(cfg.redis_url).ping()
        client: pymongo.MongoClient[dict[str, object]] = pymongo.MongoClient(cfg.mongo_url)
        assert client.admin.command("ping")["ok"] == 1
        client.close()
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    assert b"singleton run --config" in out


def test_a_listener_module_in_the_working_directory_resolves(tmp_path: Path) -> None:
    (tmp_path / "mylisteners.py").write_text(MODULE)
    args = ("status", "--listener", "mylisteners:Mine", "-o", "database=d", "--mongo-url")
    dead_mongo = "mongodb://127.0.0.1:1/?serverSelectionTimeoutMS=200"
    # From the module's own folder (the default --app-dir is "."): it imports.
    here = run_singleton(*args, dead_mongo, "--redis-url", "redis://127.0.0.1:1/0", cwd=tmp_path)
    assert "cannot import" not in here.stderr and here.returncode == 1, here.stderr
    # From elsewhere, --app-dir points at it.
    there = run_singleton(
        *args, dead_mongo, "--app-dir", str(tmp_path), "--redis-url", "redis://127.0.0.1:1/0"
    )
    assert "cannot import" not in there.stderr and there.returncode == 1, there.stderr
    # Without it, the error names the listener.
    lost = run_singleton(*args, dead_mongo, "--redis-url", "redis://127.0.0.1:1/0")
    assert lost.returncode == 2 and "cannot import listener 'mylisteners:Mine'" in lost.stderr
