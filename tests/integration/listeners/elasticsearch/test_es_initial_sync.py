"""Initial sync of 20,000 documents while writes go on, then streaming: the index equals the
collection. A copy stopped in the middle (lost tenure) resumes where its progress says."""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pymongo
import pytest

from listeners.checkpoints.stores import MongoCheckpointStore
from listeners.elasticsearch import ElasticsearchSync
from listeners.elasticsearch.verify import compare
from singleton.drivers.mongo import cluster_time
from singleton.errors import LeaseLostError
from tests.integration import es_support

DOCS = 20_000


@pytest.fixture
def client() -> Iterator[pymongo.MongoClient[dict[str, Any]]]:
    # 20,000 inserts would slow every later test's transaction-anchor lookups on the shared server.
    with es_support.own_client() as c:
        yield c


class Writer(threading.Thread):
    """Updates, inserts and deletes until told to stop."""

    def __init__(self, coll: Any, seed: int) -> None:
        super().__init__(daemon=True)
        self.coll = coll
        self.rng = random.Random(seed)
        self.stop = threading.Event()
        self.writes = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                key = self.rng.randrange(DOCS + 2000)
                kind = self.rng.random()
                if kind < 0.6:
                    self.coll.update_one({"_id": key}, {"$set": {"w": self.writes}})
                elif kind < 0.8:
                    self.coll.replace_one({"_id": key}, {"new": self.writes}, upsert=True)
                else:
                    self.coll.delete_one({"_id": key})
                self.writes += 1
        except BaseException as exc:  # surfaced by the test
            self.error = exc

    def finish(self) -> None:
        self.stop.set()
        self.join(30)
        assert self.error is None, self.error
        assert self.writes > 100, self.writes


class Counting:
    """A transform that indexes documents unchanged, counts them and calls ``at`` with the count
    (the copy calls it from the thread that runs ``initial_sync``)."""

    def __init__(self, at: Callable[[int], None] | None = None) -> None:
        self.count = 0
        self.at = at

    def __call__(self, doc: dict[str, Any]) -> dict[str, Any]:
        self.count += 1
        if self.at is not None:
            self.at(self.count)
        return doc


def test_initial_sync_with_concurrent_writes_resumes_after_a_stop(
    client: pymongo.MongoClient[dict[str, Any]], es_url: str, docs: Any
) -> None:
    coll, db = docs, docs.database.name
    coll.insert_many([{"_id": i, "n": i, "tag": f"t{i % 97}"} for i in range(DOCS)])
    progress = MongoCheckpointStore(client, database=f"cp{db}")
    tenures = es_support.Tenures(f"{db}.docs")
    first = tenures.next(client, progress)

    def end_midway(n: int) -> None:
        if n == DOCS // 2:
            tenures.end(first)  # the tenure ends in the middle of the copy

    writer = Writer(coll, seed=11)
    start = cluster_time(client)  # what the runner does before calling initial_sync
    writer.start()
    options: dict[str, Any] = {"database": db, "collection": "docs", "es": es_url}
    listener = ElasticsearchSync(**options, transform=Counting(end_midway), concurrency=2)
    with pytest.raises(LeaseLostError):
        listener.initial_sync(first)
    saved = progress.load_progress(listener.lease_name)
    assert saved is not None and 0 < saved["copied"] < DOCS, saved

    # A successor resumes the copy (it streams from its own later cluster time, as the runner).
    second = tenures.next(client, progress)
    start2 = cluster_time(client)
    writer.finish()  # so that the events the resumed copy replays are counted
    seen = Counting()
    listener2 = ElasticsearchSync(**options, transform=seen)
    listener2.initial_sync(second)
    # A resumed copy sees the documents not yet copied plus the replayed events (a document the
    # writer inserted can be both); one that started over would also see the ~10,000 copied ones
    # again. The bound sits halfway between, so neither the writer's pace nor the load decides it.
    expected = DOCS - saved["copied"] + writer.writes
    bound = expected + saved["copied"] // 2
    assert seen.count <= bound, ("the copy did not resume", seen.count, expected, bound)
    assert progress.load_progress(listener.lease_name) is None  # cleared once complete

    es_support.put_marker(coll)
    es_support.handle_until_marker(listener2, second, coll, start2)
    diff = compare(coll, es_url, listener2.index_name)
    assert diff.ok, diff
    assert diff.mongo_count > DOCS - 2000
    assert start < start2
    listener.close()
    listener2.close()
