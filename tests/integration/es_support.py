"""Helpers for the ElasticsearchSync tests: tenures without an elector, a sync with its first
tenure, a random workload, a SecantusDB of a test module's own, and reading a change stream up to
a marker (no sleeps: the marker event is the synchronisation)."""

from __future__ import annotations

import contextlib
import random
import time
from collections.abc import Iterator
from typing import Any

import pymongo
from bson.timestamp import Timestamp

from listeners.base import ChangeStreamListener, ListenerContext, default_logger
from listeners.elasticsearch import ElasticsearchSync
from singleton.election.leadership import Leadership
from singleton.service.dev.embedded import MongoServer
from singleton.testing import FakeClock, MemoryLeaseBackend

MARKER = "~marker"


@contextlib.contextmanager
def own_client() -> Iterator[pymongo.MongoClient[dict[str, Any]]]:
    """A client on a SecantusDB of its own. SecantusDB finds where a transaction starts (and a
    cluster time) by scanning its oplog: tests with many writes, or many transactions, would
    slow each other down on the shared server."""
    with MongoServer() as server:
        client: pymongo.MongoClient[dict[str, Any]] = pymongo.MongoClient(server.url)
        try:
            yield client
        finally:
            client.close()


class Tenures:
    """Successive tenures of one lease (tokens 1, 2, ...), each on a clock of its own, so that
    it stays valid until :meth:`end` moves that clock past its renew deadline."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.backend = MemoryLeaseBackend()
        self.n = 0
        self._clocks: dict[int, FakeClock] = {}

    def next(self, client: Any, progress: Any = None) -> ListenerContext:
        """The context of the next tenure (a newer fencing token than every earlier one)."""
        self.n += 1
        lease = self.backend.try_acquire(self.name, f"replica-{self.n}/x", ttl=3600)
        assert lease is not None
        self.backend.release(lease)
        clock = self._clocks[lease.token] = FakeClock()
        ld = Leadership(lease, f"replica-{self.n}", clock.monotonic() + 3600, clock)
        return ListenerContext(ld, client, default_logger(), self.name, progress)

    def end(self, ctx: ListenerContext) -> None:
        """That tenure's renew deadline passes, as for a paused or partitioned leader."""
        self._clocks[ctx.token].advance(3600)


def sync_with_tenure(
    client: Any, docs: Any, es: Any, **options: Any
) -> tuple[ElasticsearchSync, ListenerContext]:
    """An :class:`ElasticsearchSync` of the collection ``docs`` into ``es`` (``options`` for the
    rest), and the context of a first tenure of its lease on ``client``."""
    listener = ElasticsearchSync(
        database=docs.database.name, collection=docs.name, es=es, **options
    )
    return listener, Tenures(listener.lease_name).next(client)


def put_marker(coll: Any, marker: str = MARKER) -> None:
    """Insert and delete a marker document: its delete event ends :func:`events_until_marker`."""
    coll.insert_one({"_id": marker})
    coll.delete_one({"_id": marker})


def events_until_marker(
    coll: Any,
    start: Timestamp,
    batch_size: int = 500,
    timeout: float = 180.0,
    marker: str = MARKER,
) -> Iterator[list[dict[str, Any]]]:
    """Batches of change events from ``start`` through the marker's delete (inclusive)."""
    deadline = time.monotonic() + timeout
    with coll.watch(
        start_at_operation_time=start,
        full_document="updateLookup",
        max_await_time_ms=200,
        batch_size=batch_size,
    ) as stream:
        batch: list[dict[str, Any]] = []
        while True:
            assert time.monotonic() < deadline, "the marker event never arrived"
            event = stream.try_next()
            if event is None:
                continue
            batch.append(event)
            done = event["operationType"] == "delete" and event["documentKey"]["_id"] == marker
            if done or len(batch) >= batch_size:
                yield batch
                batch = []
            if done:
                return


def handle_until_marker(
    listener: ChangeStreamListener,
    ctx: ListenerContext,
    coll: Any,
    start: Timestamp,
    marker: str = MARKER,
) -> int:
    """Hand every event from ``start`` through the marker's delete to ``listener``, in batches
    as the runner would; returns how many events there were."""
    events = 0
    for batch in events_until_marker(coll, start, marker=marker):
        listener.handle_batch(batch, ctx)
        events += len(batch)
    return events


def random_workload(
    client: pymongo.MongoClient[dict[str, Any]], coll: Any, ops: int, seed: int, ids: int = 300
) -> dict[str, int]:
    """``ops`` random writes on ``ids`` documents: insert, update, replace, delete, and
    multi-document transactions that touch one document twice. Returns counts per kind."""
    rng = random.Random(seed)
    counts = {"insert": 0, "update": 0, "replace": 0, "delete": 0, "txn": 0}
    done = 0

    def one(session: Any = None) -> str:
        key = rng.randrange(ids)
        kind = rng.choice(["insert", "update", "update", "replace", "delete"])
        if kind == "insert":
            coll.replace_one(
                {"_id": key},
                {
                    "n": rng.randrange(10**6),
                    "tag": f"t{rng.randrange(50)}",
                    "nested": {"a": [rng.random(), rng.random()]},
                },
                upsert=True,
                session=session,
            )
        elif kind == "update":
            op = rng.choice(["set", "inc", "unset"])
            if op == "set":
                upd = {"$set": {"s": f"v{rng.randrange(1000)}", "nested.b": rng.random()}}
            elif op == "inc":
                upd = {"$inc": {"n": 1}}
            else:
                upd = {"$unset": {"tag": ""}}
            coll.update_one({"_id": key}, upd, session=session)
        elif kind == "replace":
            coll.replace_one(
                {"_id": key}, {"r": rng.randrange(100), "when": "now"}, session=session
            )
        else:
            coll.delete_one({"_id": key}, session=session)
        return kind

    while done < ops:
        if rng.random() < 0.1 and ops - done >= 3:
            key = rng.randrange(ids)
            with client.start_session() as s, s.start_transaction():
                coll.update_one({"_id": key}, {"$set": {"txn": 1}}, upsert=True, session=s)
                kind = one(s)
                coll.update_one({"_id": key}, {"$inc": {"txn": 1}}, upsert=True, session=s)
            counts["txn"] += 1
            counts[kind] += 1
            done += 3
        else:
            counts[one()] += 1
            done += 1
    return counts
