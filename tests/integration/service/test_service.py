"""``singleton run`` replicas as real processes on real Redis and SecantusDB: one holder, SIGTERM
hands over with nothing handled twice, several listeners spread, bad services never lead."""

from __future__ import annotations

import signal
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pymongo
import pytest

from listeners.base import ChangeStreamListener
from singleton.errors import ConfigurationError
from singleton.lease.contract import LeaseBackend
from singleton.service.assembly import build_listeners
from singleton.service.config import Config, load_config
from singleton.service.dev.embedded import free_port, wait_until
from singleton.service.registry import make_backend
from tests.integration.cluster import ReplicaProc, status_json, store_args

LISTENER = "tests.integration.recording:RecordingListener"


def lease_backend(kind: str, redis_url: str, mongo_url: str, ns: str) -> LeaseBackend:
    config = Config(backend=kind, redis_url=redis_url, mongo_url=mongo_url, namespace=ns)
    return make_backend(config)


class Inserter(threading.Thread):
    def __init__(self, coll: Any) -> None:
        super().__init__(daemon=True)
        self.coll = coll
        self.ids: list[int] = []
        self.halt = threading.Event()

    def run(self) -> None:
        n = 0
        while not self.halt.wait(0.01):  # ~100 inserts/s: a paced load, not a synchronisation
            self.coll.insert_one({"_id": n, "n": n})
            self.ids.append(n)
            n += 1


def holder(backend: LeaseBackend, name: str) -> str | None:
    state = backend.inspect(name)
    return None if state is None else state.identity


@pytest.mark.parametrize("kind", ["redis", "mongo"])
def test_one_holder_and_sigterm_hands_over_without_replay(
    kind: str, redis_url: str, mongo_url: str, unique: str, tmp_path: Path
) -> None:
    ns, db = f"svc{unique}", f"db{unique}"
    common = store_args(kind, redis_url, mongo_url, ns)
    listener = ["--listener", LISTENER, "-o", f"database={db}", "-o", "collection=orders"]
    lease = f"{db}.orders"
    procs = {f"r{i}": ReplicaProc(f"r{i}", common + listener, tmp_path) for i in range(3)}
    client: pymongo.MongoClient[dict[str, Any]] = pymongo.MongoClient(mongo_url)
    backend = lease_backend(kind, redis_url, mongo_url, ns)
    writer = Inserter(client[db]["orders"])
    try:
        for p in procs.values():
            p.start()
        wait_until(lambda: holder(backend, lease) is not None, 30, what="a leader")
        status: Any = status_json(common + listener)
        holders = [entry for entry in status["leases"] if entry["holder"]]
        assert len(holders) == 1 and holders[0]["name"] == lease, status
        first = holders[0]["identity"]
        assert first in procs

        handled = client[db]["handled"]
        writer.start()
        wait_until(lambda: handled.count_documents({}) >= 30, 30, what="events handled")
        sent = time.monotonic()
        procs[first].signal(signal.SIGTERM)
        wait_until(
            lambda: holder(backend, lease) not in (None, first),
            10,
            interval=0.005,
            what="a successor",
        )
        handover = time.monotonic() - sent
        assert procs[first].wait(20) == 0
        successor = holder(backend, lease)
        wait_until(
            lambda: handled.count_documents({"identity": successor}) >= 30,
            30,
            what="the successor handles events",
        )
        writer.halt.set()
        writer.join(5)
        wanted = len(writer.ids)
        wait_until(
            lambda: handled.count_documents({"op": "insert"}) >= wanted, 30, what="every insert"
        )
        events = Counter(row["event"] for row in handled.find({}, {"event": 1}))
        twice = [e for e, n in events.items() if n > 1]
        assert twice == [], f"{len(twice)} events handled twice across the SIGTERM handover"
        docs = {row["doc"] for row in handled.find({"op": "insert"}, {"doc": 1})}
        assert docs == set(writer.ids)
        by_identity: dict[str, set[int]] = {}
        for row in handled.find({}, {"identity": 1, "token": 1}):
            by_identity.setdefault(row["identity"], set()).add(row["token"])
        assert set(by_identity) == {first, successor}, by_identity
        assert max(by_identity[first]) < min(by_identity[successor]), by_identity
        # SIGTERM drains and releases: the successor is elected long before the 4 s ttl.
        assert handover < 1.0, f"handover took {handover:.3f}s"
    finally:
        writer.halt.set()
        for p in procs.values():
            p.stop()
        backend.close()
        client.close()


def test_two_listeners_spread_over_three_replicas(
    redis_url: str, mongo_url: str, unique: str, tmp_path: Path
) -> None:
    ns, db = f"svc{unique}", f"db{unique}"
    args = [
        *store_args("redis", redis_url, mongo_url, ns),
        "--listener",
        LISTENER,
        "-o",
        f"database={db}",
        "-o",
        "collection=a",
        "-o",
        "name=job-a",
        "--listener",
        LISTENER,
        "-o",
        f"database={db}",
        "-o",
        "collection=b",
        "-o",
        "name=job-b",
    ]
    procs = [ReplicaProc(f"r{i}", args, tmp_path).start() for i in range(3)]
    client: pymongo.MongoClient[dict[str, Any]] = pymongo.MongoClient(mongo_url)
    backend = lease_backend("redis", redis_url, mongo_url, ns)
    try:
        wait_until(
            lambda: holder(backend, "job-a") is not None and holder(backend, "job-b") is not None,
            30,
            what="both leases held",
        )
        for coll in ("a", "b"):
            wait_until(
                lambda c=coll: _streaming(client, db, c), 30, what=f"listener on {coll} streaming"
            )
        client[db]["a"].insert_many([{"_id": i} for i in range(50)])
        client[db]["b"].insert_many([{"_id": i} for i in range(50)])
        handled = client[db]["handled"]
        wait_until(
            lambda: handled.count_documents({"op": "insert", "doc": {"$gte": 0}}) >= 100,
            30,
            what="all inserts handled",
        )
        for coll in ("a", "b"):
            rows = list(handled.find({"ns": f"{db}.{coll}", "doc": {"$gte": 0}}))
            assert sorted(r["doc"] for r in rows) == list(range(50)), coll  # each exactly once
            assert len({r["identity"] for r in rows}) == 1, f"{coll} ran on two replicas at once"
    finally:
        for p in procs:
            p.stop()
        backend.close()
        client.close()


def _streaming(client: Any, db: str, coll: str) -> bool:
    """A probe document inserted until one shows up as handled: the stream is open."""
    client[db][coll].insert_one({"probe": True, "_id": f"probe-{time.monotonic()}"})
    return bool(client[db]["handled"].count_documents({"ns": f"{db}.{coll}"}))


def one_replica_args(redis_url: str, mongo_url: str, unique: str) -> list[str]:
    return [
        *store_args("redis", redis_url, mongo_url, f"svc{unique}"),
        *["--listener", LISTENER, "-o", f"database=db{unique}", "-o", "collection=orders"],
    ]


def test_unreachable_lease_store_retries_never_leads_and_stops_cleanly(
    mongo_url: str, unique: str, tmp_path: Path
) -> None:
    dead = f"redis://:hunter2@127.0.0.1:{free_port()}/0"
    proc = ReplicaProc("lonely", one_replica_args(dead, mongo_url, unique), tmp_path).start()
    try:
        wait_until(lambda: proc.log().count("contend failed") >= 2, 30, what="two retries")
        proc.signal(signal.SIGTERM)
        assert proc.wait(20) == 0
    finally:
        proc.stop()
    log = proc.log()
    assert "elected:" not in log
    assert "hunter2" not in log
    assert ":***@" in log  # the URL is shown, redacted


def test_wrong_password_never_reaches_the_logs(
    redis_url: str, mongo_url: str, unique: str, tmp_path: Path
) -> None:
    # redis-server here has no password: AUTH fails, and the error is logged on every retry.
    bad = redis_url.replace("redis://", "redis://someone:hunter2@")
    proc = ReplicaProc("badpass", one_replica_args(bad, mongo_url, unique), tmp_path).start()
    try:
        wait_until(lambda: "contend failed" in proc.log(), 30, what="a failed attempt")
    finally:
        proc.stop()
    assert "hunter2" not in proc.log()


class RunsUserCode(ChangeStreamListener):
    """A user's listener whose ``__init__`` leaves a mark (the file named by ``marker``) and
    raises: ``singleton status`` must never construct it."""

    database = "shop"
    collection = "orders"
    extra_options = frozenset({"marker"})

    def __init__(self, **options: Any) -> None:
        Path(str(options["marker"])).write_text("constructed")
        raise RuntimeError("user __init__ ran")


def test_status_names_every_lease_without_running_listener_code(
    redis_url: str, mongo_url: str, unique: str, tmp_path: Path
) -> None:
    marker = tmp_path / "constructed"
    use = f'use = "{__name__}:RunsUserCode"\nmarker = "{marker}"\n'
    config = tmp_path / "singleton.toml"
    config.write_text(f'[[listeners]]\n{use}partitions = 2\n\n[[listeners]]\n{use}name = "audit"\n')
    status = status_json(
        ["--config", str(config), *store_args("redis", redis_url, mongo_url, unique)]
    )
    expected = ["shop.orders.0-of-2", "shop.orders.1-of-2", "audit"]
    leases: Any = status["leases"]
    checkpoints: Any = status["checkpoints"]
    assert [lease["name"] for lease in leases] == expected
    assert [cp["name"] for cp in checkpoints] == expected
    assert not marker.exists()
    with pytest.raises(ConfigurationError, match="user __init__ ran"):  # it does raise when built
        build_listeners(load_config(config))
    assert marker.exists()
