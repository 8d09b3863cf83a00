"""``on_drop`` when the synced collection is dropped under a streaming leader (SecantusDB,
osmem-server): ``keep`` leaves the old documents in the index and says so at WARNING;
``delete_index`` deletes the index, and the documents written after the drop build it anew.
Either way ``singleton_collection_drops_total`` counts the drop (``drops_seen``)."""

from __future__ import annotations

from typing import Any

import pymongo
import pytest

from listeners.checkpoints.stores import MongoCheckpointStore
from listeners.elasticsearch import ElasticsearchSync
from listeners.elasticsearch.transport import connect
from singleton.service.dev.embedded import MongoServer, wait_until
from singleton.testing import MemoryLeaseBackend
from tests.integration.listener_support import LogCapture, make_runner


def _ids(es_url: str, alias: str) -> set[Any]:
    http = connect(es_url)
    try:
        assert http.request("POST", f"/{alias}/_refresh")[0] == 200
        status, body = http.request("GET", f"/{alias}/_search?size=1000&_source=false")
        assert status == 200, body
        return {hit["_id"] for hit in body["hits"]["hits"]}
    finally:
        http.close()


@pytest.mark.parametrize("policy", ["keep", "delete_index"])
def test_a_dropped_collection_is_announced_counted_and_handled_by_on_drop(
    policy: str, faulty_mongo: MongoServer, es_url: str, unique: str
) -> None:
    # A SecantusDB of this module's own: after a drop, change streams opened on the shared
    # one were slow to open (past a 333 ms timeout) for later tests of the same worker.
    mongo_url, db = faulty_mongo.url, f"drop{unique}"
    client: pymongo.MongoClient[dict[str, Any]] = pymongo.MongoClient(mongo_url)
    coll = client[db]["docs"]
    listener = ElasticsearchSync(database=db, collection="docs", es=es_url, ttl=1.0, on_drop=policy)
    alias = listener.index_name
    runner = make_runner(
        mongo_url,
        db,
        MemoryLeaseBackend(),
        listener,
        "r",
        MongoCheckpointStore(client, database=db),
    )
    with LogCapture("WARNING") as logs:
        runner.start()
        try:
            wait_until(lambda: runner.status().state == "streaming", 30, what="streaming")
            coll.insert_many([{"_id": f"old{i}"} for i in range(5)])
            wait_until(lambda: len(_ids(es_url, alias)) == 5, 30, what="5 indexed")
            coll.drop()
            wait_until(lambda: listener.drops_seen == 1, 30, what="the drop seen")
            coll.insert_many([{"_id": f"new{i}"} for i in range(3)])
            new = {f"new{i}" for i in range(3)}
            old = {f"old{i}" for i in range(5)}
            expected = new if policy == "delete_index" else old | new

            def indexed() -> bool:
                try:
                    return _ids(es_url, alias) == expected
                except AssertionError:  # (the index is being built anew)
                    return False

            wait_until(indexed, 30, what=f"the index holding {sorted(expected)}")
        finally:
            runner.stop()
            listener.close()
            client.close()
    said = [m for m in logs.errors if "of " in m and f"on_drop={policy}" in m]
    assert len(said) == 1, logs.errors
    assert ("its documents stay in the index" in said[0]) == (policy == "keep"), said
