"""ElasticsearchSync under the real ListenerRunner: initial sync of existing documents, streaming
under a random workload, and a planned handover to a second replica in the middle of it."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import pymongo
import pymongo.errors

from listeners.checkpoints.stores import MongoCheckpointStore
from listeners.elasticsearch import ElasticsearchSync
from listeners.elasticsearch.ids import doc_id
from listeners.elasticsearch.transport import connect
from listeners.elasticsearch.verify import compare
from singleton.service.dev.embedded import wait_until
from singleton.testing import MemoryLeaseBackend
from tests.integration import es_support
from tests.integration.listener_support import LogCapture, make_runner


def test_runner_initial_sync_streaming_and_handover(
    mongo_url: str, es_url: str, unique: str
) -> None:
    client: pymongo.MongoClient[dict[str, Any]] = pymongo.MongoClient(mongo_url)
    db = f"es{unique}"
    coll = client[db]["docs"]
    coll.insert_many([{"_id": i, "n": i, "seed": True} for i in range(3000)])
    backend = MemoryLeaseBackend()
    store = MongoCheckpointStore(client, database=db)

    def listener() -> ElasticsearchSync:
        return ElasticsearchSync(database=db, collection="docs", es=es_url, ttl=1.0)

    a_listener, b_listener = listener(), listener()
    a = make_runner(mongo_url, db, backend, a_listener, "a", store).start()
    b = None
    http = connect(es_url)

    def indexed(key: str) -> bool:
        path = f"/{a_listener.index_name}/_doc/{quote(doc_id(key), safe='')}?realtime=true"
        return http.request("GET", path)[0] == 200

    try:
        wait_until(lambda: a.status()["state"] == "streaming", 120, what="A synced and streaming")
        es_support.random_workload(client, coll, 600, seed=21, ids=3200)
        b = make_runner(mongo_url, db, backend, b_listener, "b", store).start()
        a.stop()  # planned handover: A drains, checkpoints and releases
        wait_until(lambda: b.status()["state"] == "streaming", 60, what="B streaming")
        es_support.random_workload(client, coll, 600, seed=22, ids=3200)
        coll.insert_one({"_id": "~end"})  # events arrive in order: once it is indexed, all are
        wait_until(lambda: indexed("~end"), 120, interval=0.1, what="the last write indexed")
        diff = compare(coll, es_url, a_listener.index_name)
    finally:
        a.stop()
        if b is not None:
            b.stop()
        a_listener.close()
        b_listener.close()
        http.close()
        client.close()
    assert diff.ok, diff
    assert diff.mongo_count > 2500


class _FirstReadsTimeOut(ElasticsearchSync):
    """The copy's first ``reads`` reads time out (as a busy server's did in the issue), then
    the collection answers."""

    def __init__(self, reads: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.reads = reads

    def _collection(self, ctx: Any) -> Any:
        coll, listener = super()._collection(ctx), self

        class Slow:
            def __getattr__(self, name: str) -> Any:
                return getattr(coll, name)

            def find(self, *args: Any, **kwargs: Any) -> Any:
                if listener.reads > 0:
                    listener.reads -= 1
                    raise pymongo.errors.NetworkTimeout("the copy's first read timed out (test)")
                return coll.find(*args, **kwargs)

        return Slow()


def test_a_copy_whose_first_read_times_out_resumes_into_the_index_it_made(
    mongo_url: str, es_url: str, unique: str
) -> None:
    """Each retry of the tenure used to make another physical index (the issue saw six, and
    each new attempt copied from scratch again); the index is kept with the copy's progress
    as soon as it is made, so the retries go on into it."""
    client: pymongo.MongoClient[dict[str, Any]] = pymongo.MongoClient(mongo_url)
    db = f"es{unique}"
    coll = client[db]["docs"]
    coll.insert_many([{"_id": i, "n": i} for i in range(500)])
    listener = _FirstReadsTimeOut(2, database=db, collection="docs", es=es_url, ttl=1.0)
    with LogCapture("INFO") as logs:
        runner = make_runner(mongo_url, db, MemoryLeaseBackend(), listener, "a").start()
        try:
            wait_until(lambda: runner.status()["state"] == "streaming", 120, what="synced")
            coll.delete_one({"_id": 7})  # (a change made after the attempts is replayed too)
            wait_until(
                lambda: compare(coll, es_url, listener.index_name).ok, 60, what="equal index"
            )
        finally:
            runner.stop()
            listener.close()
            client.close()
    assert listener.reads == 0  # both attempts failed, the third copied
    created = [m for m in logs.errors if m.startswith("elasticsearch: created index")]
    assert len(created) == 1, created
