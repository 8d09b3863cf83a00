"""A newcomer's path: ``singleton dev-servers`` gives servers to point ``singleton run`` at, and
a listener module in the working directory (or ``--app-dir``) resolves by name."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import urllib.request
from pathlib import Path

import pymongo
import redis

from singleton.service.config import load_config
from singleton.service.dev.cluster import child_environment, singleton_command
from singleton.service.dev.embedded import wait_until
from tests.integration.cluster import ROOT, ReplicaProc, run_singleton, store_args

MODULE = """
from listeners import ChangeStreamListener


class Mine(ChangeStreamListener):
    def handle_batch(self, events, ctx):
        pass
"""


def readme_recipe() -> list[list[str]]:
    """The commands of the README's quick start ("Quick start: servers to try it on"), as
    written (comments off); docs/getting-started.md shows the same block."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## Quick start: servers to try it on", 1)[1]
    block = section.split("```sh\n", 1)[1].split("```", 1)[0]
    lines = [line.split("  #", 1)[0].strip() for line in block.splitlines()]
    return [shlex.split(line) for line in lines if line.startswith("singleton ")]


def metrics_url(log: Path) -> str | None:
    found = re.search(r"/status at (http://\S+)", log.read_text(errors="replace"))
    return None if found is None else found.group(1)


def ready(url: str | None) -> bool:
    if url is None:
        return False
    with urllib.request.urlopen(url + "/readyz", timeout=2) as reply:
        return bool(reply.status == 200)


def test_the_readme_recipe_runs_three_replicas_from_the_written_config(tmp_path: Path) -> None:
    """``singleton dev-servers --write-config singleton.toml``, then ``singleton run --config
    singleton.toml --identity a`` (then b, c) exactly as the README says: all three ready. The
    written config pinned metrics_address = "127.0.0.1:9464", so b exited 2."""
    dev, run, status = readme_recipe()
    assert dev[:2] == ["singleton", "dev-servers"] and run[:2] == ["singleton", "run"], dev
    assert "--identity" in run and status[:2] == ["singleton", "status"], (run, status)
    servers = subprocess.Popen(
        singleton_command(*dev[1:]),
        cwd=tmp_path,
        env=child_environment(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    config = tmp_path / "singleton.toml"
    replicas: dict[str, subprocess.Popen[bytes]] = {}
    try:
        wait_until(lambda: config.exists() and "[[listeners]]" in config.read_text(), 60)
        cfg = load_config(config)
        assert redis.Redis.from_url(cfg.redis_url).ping()
        client: pymongo.MongoClient[dict[str, object]] = pymongo.MongoClient(cfg.mongo_url)
        assert client.admin.command("ping")["ok"] == 1
        client.close()
        at = run.index("--identity") + 1
        for identity in "abc":
            argv = [*run[1:at], identity, *run[at + 1 :]]
            with open(tmp_path / f"{identity}.log", "wb") as log:
                replicas[identity] = subprocess.Popen(
                    singleton_command(*argv),
                    cwd=tmp_path,
                    env=child_environment(),
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
        for identity, proc in replicas.items():
            log = tmp_path / f"{identity}.log"
            wait_until(
                lambda: proc.poll() is not None or ready(metrics_url(log)),  # noqa: B023
                60,
                what=f"replica {identity} ready",
            )
            assert proc.poll() is None, log.read_text()
        shown = run_singleton(*status[1:], cwd=tmp_path)
        assert shown.returncode == 0, shown.stderr
        assert shown.stdout.startswith("store: redis redis://127.0.0.1:"), shown.stdout
        rows = {line.split()[0]: line.split() for line in shown.stdout.splitlines() if line}
        assert all(rows[i][1] == "yes" for i in "abc"), shown.stdout  # REPLICA LIVE HELD
        seen = json.loads(run_singleton(*status[1:], "--json", cwd=tmp_path).stdout)
        live = {m["identity"]: m for m in seen["members"]["live"]}
        assert sorted(live) == ["a", "b", "c"]
        assert sorted(m["leases"] for m in live.values()) == [0, 0, 1], live  # one listener
        # A port one of them serves, given to a fourth: exit 2, naming the fix.
        taken = str(metrics_url(tmp_path / "a.log")).removeprefix("http://")
        fourth = run_singleton(*run[1:at], "d", "--metrics-address", taken, cwd=tmp_path)
        assert fourth.returncode == 2, fourth.stderr
        assert "Address already in use" in fourth.stderr and "--metrics-address" in fourth.stderr
    finally:
        for proc in replicas.values():
            proc.send_signal(signal.SIGTERM)
        codes = {identity: proc.wait(30) for identity, proc in replicas.items()}
        os.killpg(servers.pid, signal.SIGINT)
        out, _ = servers.communicate(timeout=60)
    assert codes == {"a": 0, "b": 0, "c": 0}, codes
    assert servers.returncode == 0, out
    assert b"singleton run --config singleton.toml --identity a" in out


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
    assert "--app-dir DIR" in lost.stderr and "PYTHONPATH" in lost.stderr  # how to fix it


ASYNC_JOBS = """
import asyncio
import os


async def tick(ctx):
    await asyncio.sleep(0.01)
    ctx.check()
    with open(os.environ["ASYNC_JOB_RECORD"], "a") as f:
        f.write(f"{ctx.fire_time.isoformat()} {ctx.token}\\n")


async def stream(ctx):
    yield ctx.fire_time
"""


def test_an_async_job_function_runs_in_a_replica(
    redis_url: str, mongo_url: str, unique: str, tmp_path: Path
) -> None:
    """``[[jobs]] use = "myjobs:tick"`` with ``async def tick``: it started, fire times passed
    and nothing ran (one "coroutine ... was never awaited")."""
    (tmp_path / "myjobs.py").write_text(ASYNC_JOBS)
    config = tmp_path / "jobs.toml"
    config.write_text('[[jobs]]\nuse = "myjobs:tick"\nname = "tick"\nevery = 0.5\n')
    record = tmp_path / "runs.txt"
    args = [*store_args("redis", redis_url, mongo_url, f"async{unique}"), "--config", str(config)]
    unsound = tmp_path / "gen.toml"
    unsound.write_text('[[jobs]]\nuse = "myjobs:stream"\nname = "s"\nevery = 0.5\n')
    refused = run_singleton("run", *args, "--config", str(unsound), "--app-dir", str(tmp_path))
    assert refused.returncode == 2, refused.stderr
    assert "job 's': myjobs:stream is a generator function" in refused.stderr
    replica = ReplicaProc("a", [*args, "--app-dir", str(tmp_path)], tmp_path)
    replica.env["ASYNC_JOB_RECORD"] = str(record)
    replica.start()
    try:
        wait_until(
            lambda: record.exists() and len(record.read_text().splitlines()) >= 3,
            30,
            what="three async calls",
        )
    finally:
        replica.stop()
    assert replica.proc is not None and replica.proc.returncode == 0, replica.log()
    fires = [line.split()[0] for line in record.read_text().splitlines()]
    assert len(set(fires)) == len(fires)
    assert "never awaited" not in replica.log()


def test_status_without_a_config_names_the_store_it_read(redis_url: str, tmp_path: Path) -> None:
    """It read redis://127.0.0.1:6379/0 silently and printed an empty table."""
    table = run_singleton("status", "--redis-url", redis_url, cwd=tmp_path)
    assert table.returncode == 0, table.stderr
    assert table.stdout.splitlines()[0] == (
        f"store: redis {redis_url}, namespace singleton (no config file)"
    )
    assert "no --config" in table.stderr and "pass --config singleton.toml" in table.stderr
    as_json = run_singleton("status", "--json", "--redis-url", redis_url, cwd=tmp_path)
    store = json.loads(as_json.stdout)["store"]  # stdout stays one JSON document
    assert store["config"] is None and store["url"] == redis_url and store["backend"] == "redis"
    assert "no --config" in as_json.stderr
    config = tmp_path / "singleton.toml"
    config.write_text(f'redis_url = "{redis_url}"\n[[jobs]]\nuse = "m:f"\nname = "j"\nevery = 1\n')
    named = run_singleton("status", "--config", str(config), cwd=tmp_path)
    assert f"(config {config})" in named.stdout.splitlines()[0] and named.stderr == ""


def test_a_user_module_named_listeners_is_told_to_rename(tmp_path: Path) -> None:
    """``use = "listeners:OrdersToFile"`` said "module 'listeners' has no attribute
    'OrdersToFile'" (singleton's package found first) or crashed in a circular import (the
    user's found first, as ``python -m`` from its folder does): both say to rename it."""
    (tmp_path / "listeners.py").write_text(MODULE.replace("Mine", "OrdersToFile"))
    (tmp_path / "jobs.toml").write_text('[[jobs]]\nuse = "listeners:report"\nname = "r"\nevery=1\n')
    args = ("--listener", "listeners:OrdersToFile", "-o", "database=d")
    there = run_singleton("status", *args, "--app-dir", str(tmp_path))
    assert there.returncode == 2, there.stderr
    assert "is shadowed by singleton's own 'listeners' package" in there.stderr
    assert "rename yours (e.g. my_listeners.py)" in there.stderr
    job = run_singleton("run", "--config", str(tmp_path / "jobs.toml"), "--app-dir", str(tmp_path))
    assert job.returncode == 2 and "job 'listeners:report'" in job.stderr, job.stderr
    assert "is shadowed by singleton's own 'listeners' package" in job.stderr
    here = run_singleton("status", *args, cwd=tmp_path)
    assert here.returncode == 2 and "Traceback" not in here.stderr, here.stderr
    assert "takes the name of singleton's own 'listeners' package" in here.stderr
    assert "rename yours (e.g. my_listeners.py)" in here.stderr


def test_dead_letters_help_lists_only_its_own_flags() -> None:
    shown = run_singleton("dead-letters", "--help")
    assert shown.returncode == 0
    for flag in ("--config", "--app-dir", "--mongo-url", "--namespace", "--listener", "--json"):
        assert flag in shown.stdout
    for flag in ("--metrics-address", "--ttl", "--identity", "--backend", "--log-format"):
        assert flag not in shown.stdout, flag


def test_a_listener_without_a_database_says_where_to_add_it(tmp_path: Path) -> None:
    config = tmp_path / "singleton.toml"
    config.write_text('[[listeners]]\nuse = "logging"\ncollection = "orders"\n')
    for command in ("run", "status"):
        shown = run_singleton(
            command, "--config", str(config), "--redis-url", "redis://127.0.0.1:1"
        )
        assert shown.returncode == 2, shown.stderr
        assert 'add `database = "<name>"` to its [[listeners]] table' in shown.stderr
        assert "got None" not in shown.stderr


def test_a_password_with_a_hash_is_never_printed() -> None:
    """``redis://u:pre#post@host/0``: the exit message quoted the parser's "Port could not be
    cast to integer value as 'pre'"."""
    for key, url in (
        ("--redis-url", "redis://u:pre#post@127.0.0.1:1/0"),
        ("--redis-url", "redis://u:6380#post@127.0.0.1:1/0"),  # parsed as host u, port 6380
        ("--mongo-url", "mongodb://u:pre/post@127.0.0.1:1/"),
        ("--es-url", "http://u:pre?post@127.0.0.1:1"),
    ):
        shown = run_singleton("status", key, url)
        assert shown.returncode == 2, shown.stderr
        assert f"{key[2:].replace('-', '_')}: the user name or password" in shown.stderr
        assert "`#` as %23" in shown.stderr
        for piece in ("pre", "post", "6380"):
            assert piece not in shown.stdout + shown.stderr.replace("prefix", ""), shown.stderr
