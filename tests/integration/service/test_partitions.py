"""``partitions = K``: one listener's stream split by document key over real ``singleton run``
processes, and the change of ``K`` (stop every replica, start them with the new ``K``).

Every event of a document is handled by exactly one partition (the one :func:`partition_of`
names), every event is handled, each partition is its own lease and its own checkpoint in
``singleton status --json``; after ``K`` changes, the new layout starts from the oldest
checkpoint of the old one, so what was written while everything was stopped is handled (replays
of earlier events are allowed). Also :func:`partition_of` pinned (a change of hash moves every
document, and breaks these tests first) and :func:`seed_partitions` refusing a running layout.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import pymongo
import pytest
from bson import ObjectId
from bson.timestamp import Timestamp

from listeners.base import ChangeEvent, ChangeStreamListener, ListenerContext
from listeners.checkpoints.stores import Checkpoint, MongoCheckpointStore
from listeners.stream.partition import layout_names, partition_of
from listeners.stream.partition_seed import seed_partitions
from singleton.errors import ConfigurationError
from singleton.service.dev.embedded import wait_until
from tests.integration.cluster import ReplicaProc, status_json, store_args

TIMINGS = [
    *["--ttl", "2", "--renew-interval", "0.5"],
    *["--renew-deadline", "1.4", "--retry-interval", "0.25"],
]


class PartitionRecorder(ChangeStreamListener):
    """Records each event it handles with the lease (partition) that handled it into
    ``<database>.handled``; duplicates are kept, to be counted."""

    extra_options: ClassVar[frozenset[str]] = frozenset()
    max_batch_wait = 0.05

    def handle_batch(self, events: Sequence[ChangeEvent], ctx: ListenerContext) -> None:
        ctx.check()
        rows = [
            {
                "event": e["_id"]["_data"],
                "op": e.get("operationType"),
                "doc": (e.get("documentKey") or {}).get("_id"),
                "lease": self.lease_name,
                "token": ctx.token,
                "identity": os.environ.get("SINGLETON_IDENTITY"),
            }
            for e in events
        ]
        if rows:
            assert self.database is not None
            ctx.client[self.database]["handled"].insert_many(rows)


# -- partition_of and seed_partitions -------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "expected"),
    [
        (0, [0, 2, 0, 852]),
        (1, [1, 2, 1, 853]),
        (42, [1, 2, 1, 489]),
        (-7, [1, 0, 1, 37]),
        (2**40, [1, 0, 1, 465]),
        ("1", [0, 0, 2, 958]),
        ("order-7", [0, 1, 0, 568]),
        (ObjectId("65a000000000000000000000"), [0, 1, 0, 860]),
    ],
)
def test_partition_of_is_pinned(key: Any, expected: list[int]) -> None:
    """Fixed values: a different hash (or encoding of the key) would move documents between
    partitions of a running deployment, so it must be a deliberate, visible change."""
    assert [partition_of(key, k) for k in (2, 3, 4, 1024)] == expected
    assert partition_of(key, 1) == 0


def test_partition_of_is_type_exact_and_spreads() -> None:
    assert partition_of(1, 4) != partition_of("1", 4)  # different documents
    counts = [0] * 4
    for i in range(4000):
        counts[partition_of(i, 4)] += 1
    assert min(counts) > 900, counts  # about 1000 each


def _checkpoint(name: str, seconds: int, token: int = 5) -> Checkpoint:
    return Checkpoint(name, {"_data": f"{seconds:08x}"}, Timestamp(seconds, 1), token, "old")


def test_seed_partitions_refuses_while_the_old_layout_runs(mongo_url: str, unique: str) -> None:
    store = MongoCheckpointStore(mongo_url, database=f"seed{unique}")
    try:
        for name, seconds in zip(
            layout_names("orders", 3), (1_700_000_300, 1_700_000_100, 1_700_000_200), strict=True
        ):
            store.save(_checkpoint(name, seconds))
        with pytest.raises(ConfigurationError, match=r"orders\.1-of-3.*stop every replica"):
            seed_partitions(store, "orders", 2, held=lambda lease: lease == "orders.1-of-3")
        assert all(store.load(n) is None for n in layout_names("orders", 2))  # nothing seeded

        oldest = seed_partitions(store, "orders", 2, held=lambda lease: False)
        assert oldest is not None and oldest.name == "orders.1-of-3"
        for name in layout_names("orders", 2):
            seeded = store.load(name)
            assert seeded is not None and seeded.cluster_time == Timestamp(1_700_000_100, 1)
        # Seeded once: the new layout has checkpoints now, so a second start seeds nothing.
        assert seed_partitions(store, "orders", 2, held=lambda lease: True) is None
    finally:
        store.close()


# -- real replicas --------------------------------------------------------------------------


def _args(redis_url: str, mongo_url: str, unique: str, k: int) -> list[str]:
    listener = f"{__name__}:{PartitionRecorder.__name__}"
    return [
        *store_args("redis", redis_url, mongo_url, f"part{unique}"),
        *TIMINGS,
        *["--listener", listener, "-o", f"database=db{unique}", "-o", "collection=orders"],
        *["-o", "name=orders", "-o", f"partitions={k}"],
    ]


def _mixed_ids(start: int, n: int) -> list[Any]:
    """``n`` ints, ``n`` strings and ``n`` ObjectIds."""
    ints: list[Any] = list(range(start, start + n))
    return ints + [f"s{i}" for i in ints] + [ObjectId() for _ in ints]


def _leases_by_doc(handled: Any, ops: Sequence[str], ids: list[Any]) -> dict[Any, set[str]]:
    out: dict[Any, set[str]] = {}
    for row in handled.find({"op": {"$in": list(ops)}, "doc": {"$in": ids}}):
        out.setdefault(row["doc"], set()).add(row["lease"])
    return out


def _status(args: list[str]) -> Any:
    status: Any = status_json(args)
    assert status["errors"] == [], status["errors"]
    return status


def _all_running(args: list[str], names: list[str], replicas: set[str]) -> bool:
    """Every partition's lease held, spread over every replica (max - min <= 1)."""
    status = _status(args)
    leases = {lease["name"]: lease["identity"] for lease in status["leases"]}
    if sorted(leases) != names or None in leases.values():
        return False
    counts = [len(status["members"]["held"].get(r, [])) for r in replicas]
    return max(counts) - min(counts) <= 1


def _streaming(coll: Any, handled: Any, names: list[str]) -> bool:
    """A probe document inserted per call until every partition has handled one."""
    coll.insert_one({"_id": f"probe-{ObjectId()}", "probe": True})
    return set(handled.distinct("lease", {"doc": {"$regex": "^probe-"}})) >= set(names)


def test_partitions_split_a_stream_and_survive_a_change_of_k(
    redis_url: str, mongo_url: str, unique: str, tmp_path: Path
) -> None:
    client: pymongo.MongoClient[dict[str, Any]] = pymongo.MongoClient(mongo_url)
    coll, handled = client[f"db{unique}"]["orders"], client[f"db{unique}"]["handled"]
    three, two = layout_names("orders", 3), layout_names("orders", 2)
    args3, args2 = (_args(redis_url, mongo_url, unique, k) for k in (3, 2))
    procs = [ReplicaProc(f"p{i}", args3, tmp_path) for i in range(2)]
    try:
        for p in procs:
            p.start()
        wait_until(lambda: _all_running(args3, three, {"p0", "p1"}), 60, what="3 partitions")
        wait_until(lambda: _streaming(coll, handled, three), 60, 0.2, what="3 streams open")

        ids = _mixed_ids(0, 60)
        coll.insert_many([{"_id": i, "v": 0} for i in ids])
        coll.update_many({"_id": {"$in": ids}}, {"$set": {"v": 1}})
        wait_until(
            lambda: handled.count_documents({"doc": {"$in": ids}}) >= 2 * len(ids),
            60,
            what="every insert and update handled",
        )
        by_doc = _leases_by_doc(handled, ["insert", "update"], ids)
        assert set(by_doc) == set(ids)
        wrong = {d: ls for d, ls in by_doc.items() if ls != {three[partition_of(d, 3)]}}
        assert wrong == {}, f"documents handled by another or several partitions: {wrong}"
        for op in ("insert", "update"):
            rows = list(handled.find({"op": op, "doc": {"$in": ids}}, {"doc": 1}))
            assert len(rows) == len(ids), f"{op}s handled more than once without a failover"
        assert all(by_doc_count > 0 for by_doc_count in _per_partition(by_doc, three))

        status = _status(args3)
        assert sorted(lease["name"] for lease in status["leases"]) == three
        assert all(lease["name"].startswith("orders.") for lease in status["leases"])
        cps = {cp["name"]: cp for cp in status["checkpoints"]}
        assert sorted(cps) == three
        assert all(cp["cluster_time"] is not None for cp in cps.values()), cps

        # Change K: stop everything, write while stopped, start with partitions = 2.
        for p in procs:
            p.signal(signal.SIGTERM)
        for p in procs:
            assert p.wait(30) == 0, p.log()[-3000:]
        later = _mixed_ids(1000, 30)
        coll.insert_many([{"_id": i, "v": 0} for i in later])
        coll.update_many({"_id": {"$in": ids[:10]}}, {"$set": {"v": 2}})
        procs = [ReplicaProc(f"p{i}", args2, tmp_path) for i in range(2)]
        for p in procs:
            p.start()
        wait_until(
            lambda: set(_leases_by_doc(handled, ["insert"], later)) == set(later),
            60,
            what="the events written while stopped handled by the new layout",
        )
        by_doc = _leases_by_doc(handled, ["insert"], later)
        wrong = {d: ls for d, ls in by_doc.items() if ls != {two[partition_of(d, 2)]}}
        assert wrong == {}, wrong
        wait_until(
            lambda: (
                handled.count_documents(
                    {"op": "update", "doc": {"$in": ids[:10]}, "lease": {"$in": two}}
                )
                >= 10
            ),
            30,
            what="the updates written while stopped",
        )
        assert any("partitions changed to 2" in p.log() for p in procs)
        wait_until(lambda: _all_running(args2, two, {"p0", "p1"}), 30, what="2 partitions")
        status = _status(args2)
        assert sorted(cp["name"] for cp in status["checkpoints"]) == two
    finally:
        for p in procs:
            p.stop()
        client.close()
    for p in procs:
        assert "Traceback" not in p.log(), p.log()[-3000:]


def _per_partition(by_doc: dict[Any, set[str]], names: list[str]) -> list[int]:
    return [sum(1 for leases in by_doc.values() if name in leases) for name in names]
