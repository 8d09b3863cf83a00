"""Initial sync of 20,000 documents while writes go on, then streaming: the index equals the
collection. A copy stopped in the middle (lost tenure) resumes where its progress says."""

from __future__ import annotations

import random
import threading
from collections.abc import Iterator
from typing import Any

import pymongo
import pytest

from listeners.checkpoint import MongoCheckpointStore
from listeners.elasticsearch import ElasticsearchSync
from listeners.elasticsearch.verify import compare
from singleton.errors import LeaseLostError
from singleton.service.embedded import MongoServer
from tests.integration.es_support import (
    Tenures,
    cluster_time,
    context,
    events_until_marker,
    put_marker,
)

DOCS = 20_000


@pytest.fixture
def client() -> Iterator[pymongo.MongoClient[dict[str, Any]]]:
    # A server of its own: SecantusDB finds a cluster time by scanning its oplog, and 20,000
    # inserts would slow every later test's transaction-anchor lookups on the shared server.
    with MongoServer() as server:
        c: pymongo.MongoClient[dict[str, Any]] = pymongo.MongoClient(server.url)
        yield c
        c.close()


class Writer(threading.Thread):
    """Updates, inserts and deletes until told to stop (at least ``minimum`` writes)."""

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


def test_initial_sync_with_concurrent_writes_resumes_after_a_stop(
    client: pymongo.MongoClient[dict[str, Any]], es_url: str, unique: str
) -> None:
    db = f"es{unique}"
    coll = client[db]["docs"]
    coll.insert_many([{"_id": i, "n": i, "tag": f"t{i % 97}"} for i in range(DOCS)])
    progress = MongoCheckpointStore(client, database=f"cp{unique}")
    tenures = Tenures(f"{db}.docs")
    first = tenures.next()
    seen: list[int] = []

    def stop_midway(doc: dict[str, Any]) -> dict[str, Any]:
        seen.append(1)
        if len(seen) == DOCS // 2:
            first._end("lost")  # the tenure ends in the middle of the copy
        return doc

    writer = Writer(coll, seed=11)
    start = cluster_time(client)  # what the runner does before calling initial_sync
    writer.start()
    listener = ElasticsearchSync(
        database=db,
        collection="docs",
        es=es_url,
        transform=stop_midway,
        copy_batch_size=2000,
        concurrency=2,
    )
    with pytest.raises(LeaseLostError):
        listener.initial_sync(context(first, client, listener.lease_name, progress))
    saved = progress.load_progress(listener.lease_name)
    assert saved is not None and 0 < saved["copied"] < DOCS, saved
    copied_before = saved["copied"]

    # A successor resumes the copy (it streams from its own later cluster time, as the runner).
    second = tenures.next()
    seen.clear()
    start2 = cluster_time(client)
    listener2 = ElasticsearchSync(
        database=db,
        collection="docs",
        es=es_url,
        transform=stop_midway,
        copy_batch_size=2000,
    )
    listener2.initial_sync(context(second, client, listener.lease_name, progress))
    assert len(seen) <= DOCS + 2000 - copied_before + 600, "the copy did not resume"
    assert progress.load_progress(listener.lease_name) is None  # cleared once complete
    writer.stop.set()
    writer.join(30)
    assert writer.error is None, writer.error
    assert writer.writes > 100, writer.writes

    put_marker(coll)
    ctx = context(second, client, listener.lease_name, progress)
    for batch in events_until_marker(coll, start2):
        listener2.handle_batch(batch, ctx)
    diff = compare(coll, es_url, listener2.index_name)
    assert diff.ok, diff
    assert diff.mongo_count > DOCS - 2000
    assert start < start2
    listener.close()
    listener2.close()
