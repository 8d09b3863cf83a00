"""Never stuck, never silent, seen from outside a running ``singleton run``: a failed listener
releases its lease and the replica says so (``/readyz`` 503 naming the listener and the reason,
``singleton_listener_failed`` 1); a checkpoint of another deployment stops the start (exit 2,
both sides named); ``singleton status`` answers within one timeout when MongoDB is frozen."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pymongo

from listeners.checkpoints.stores import MongoCheckpointStore
from singleton.errors import BackendUnavailableError
from singleton.service.config import Config
from singleton.service.dev.embedded import MongoServer, free_port, wait_until
from singleton.service.registry import make_backend
from tests.integration.cluster import ReplicaProc, run_singleton, store_args

BROKEN = "tests.integration.recording:BrokenListener"


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError:
        return 0, ""


def _until(predicate: Any, timeout: float, proc: ReplicaProc, what: str) -> None:
    try:
        wait_until(predicate, timeout, what=what)
    except BackendUnavailableError as exc:
        raise AssertionError(f"{exc}\n{proc.log()[-3000:]}") from None


def test_a_failed_listener_resigns_and_readyz_names_it(
    redis_url: str, mongo_url: str, unique: str, tmp_path: Path
) -> None:
    ns, db, port = f"fs{unique}", f"db{unique}", free_port()
    args = [
        *store_args("redis", redis_url, mongo_url, ns),
        *["--metrics-address", f"127.0.0.1:{port}"],
        *["--listener", BROKEN, "-o", f"database={db}", "-o", "collection=orders"],
        # a batch that keeps failing fails the tenure, once its budget is spent
        *["-o", "on_poison=stop", "-o", "failure_budget=2"],
    ]
    lease = f"{db}.orders"
    client: Any = pymongo.MongoClient(mongo_url)
    backend = make_backend(Config(backend="redis", redis_url=redis_url, namespace=ns))
    proc = ReplicaProc("broken", args, tmp_path).start()
    try:
        _until(lambda: backend.inspect(lease) is not None, 30, proc, "elected")
        assert _get(f"http://127.0.0.1:{port}/readyz")[0] == 200

        def failed() -> bool:  # a write reaches the stream, the listener fails on it
            client[db].orders.insert_one({"n": 1})
            return _get(f"http://127.0.0.1:{port}/readyz")[0] == 503

        _until(failed, 30, proc, "readyz 503")
        code, body = _get(f"http://127.0.0.1:{port}/readyz")
        assert code == 503 and lease in body and "HTTP 400" in body, body
        # Released at once, not left to expire: free well before the ttl (4 s) could run out,
        # and the replica stays out for its cooldown.
        _until(lambda: backend.inspect(lease) is None, 3.0, proc, "lease released")
        metrics = _get(f"http://127.0.0.1:{port}/metrics")[1]
        assert f'singleton_listener_failed{{lease="{lease}"}} 1.0' in metrics, metrics
        errors = [line for line in proc.log().splitlines() if "ERROR" in line]
        assert errors and all("HTTP 400" in line or "Traceback" not in line for line in errors)
    finally:
        proc.stop()
        backend.close()
        client.close()


def test_a_checkpoint_of_another_deployment_stops_the_start_with_exit_2(
    redis_url: str, mongo_url: str, unique: str
) -> None:
    ns, db, name = f"fs{unique}", f"db{unique}", f"shared{unique}"
    store = MongoCheckpointStore(mongo_url, database=ns)
    theirs = {"listener": "theirs.module:Sync", "namespace": "other.people", "sink": ""}
    try:
        store.claim(name, 1, "them/1", theirs)
    finally:
        store.close()
    out = run_singleton(
        "run",
        *store_args("redis", redis_url, mongo_url, ns),
        *["--listener", "tests.integration.recording:RecordingListener"],
        *["-o", f"name={name}", "-o", f"database={db}", "-o", "collection=orders"],
        timeout=60,
    )
    assert out.returncode == 2, out.stderr[-2000:]
    assert "other.people" in out.stderr and f"{db}.orders" in out.stderr, out.stderr[-2000:]


def test_status_answers_within_one_timeout_when_mongo_is_frozen(
    redis_url: str, unique: str, tmp_path: Path
) -> None:
    listeners = "".join(
        f'[[listeners]]\nuse = "logging"\nname = "l{i}"\ndatabase = "d"\ncollection = "c{i}"\n\n'
        for i in range(10)
    )
    with MongoServer(log_dir=str(tmp_path)) as mongo:
        config = tmp_path / "singleton.toml"
        config.write_text(
            f'redis_url = "{redis_url}"\nmongo_url = "{mongo.url}"\nnamespace = "fs{unique}"\n\n'
            + listeners
        )
        mongo.pause()
        try:
            started = time.monotonic()
            out = run_singleton("status", "--json", "--config", str(config), timeout=120)
            elapsed = time.monotonic() - started
        finally:
            mongo.resume()
    assert out.returncode == 1, out.stderr  # errors reported, not a hang
    assert "checkpoint l0" in out.stdout and "no answer in time" in out.stdout, out.stdout
    # One timeout (5 s) for all ten listeners, plus the interpreter's start: not ten timeouts.
    assert elapsed < 20, elapsed


def test_a_redis_checkpoint_store_without_persistence_is_warned_about(redis_url: str) -> None:
    from loguru import logger

    from singleton.service.assembly import warn_without_persistence

    warnings: list[str] = []
    sink = logger.add(lambda m: warnings.append(str(m)), level="WARNING", format="{message}")
    try:
        warn_without_persistence(redis_url)  # the test server runs with --save "" --appendonly no
    finally:
        logger.remove(sink)
    assert any("keeps nothing on disk" in w and ":***@" not in w for w in warnings), warnings


def test_a_replica_dead_letters_under_its_namespace_where_the_cli_finds_them(
    redis_url: str, mongo_url: str, unique: str, tmp_path: Path
) -> None:
    ns, db = f"fs{unique}", f"db{unique}"
    config = tmp_path / "singleton.toml"
    config.write_text(
        f'redis_url = "{redis_url}"\nmongo_url = "{mongo_url}"\nnamespace = "{ns}"\n\n'
        "[lease]\nttl = 4.0\nrenew_interval = 1.0\nrenew_deadline = 2.5\n\n"
        '[[listeners]]\nuse = "tests.integration.recording:PoisonedListener"\n'
        f'name = "orders"\ndatabase = "{db}"\ncollection = "orders"\n'
    )
    client: Any = pymongo.MongoClient(mongo_url)
    proc = ReplicaProc("dl", ["--config", str(config)], tmp_path).start()
    try:

        def listed() -> bool:
            client[db].orders.insert_many([{"poison": True}, {"n": 1}])  # a neighbour proves it
            out = run_singleton(
                "dead-letters", "list", "--json", "--config", str(config), "--listener", "orders"
            )
            assert out.returncode == 0, out.stderr
            return len(json.loads(out.stdout)) >= 1

        _until(listed, 60, proc, "a dead letter listed under the namespace")
        assert client[ns]["dead_letters"].count_documents({}) >= 1
        assert client["singleton"]["dead_letters"].count_documents({"_id.listener": "orders"}) == 0
    finally:
        proc.stop()
        client.close()
