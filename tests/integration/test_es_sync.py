"""ElasticsearchSync against SecantusDB and osmem-server: the index equals the collection after a
random workload, replays change nothing, and a deposed leader's late writes are refused."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pymongo
import pytest

from listeners.elasticsearch import ElasticsearchSync
from listeners.elasticsearch.verify import compare, es_documents
from singleton.errors import LeaseLostError
from singleton.service.embedded import MongoServer
from tests.integration.es_support import (
    Tenures,
    cluster_time,
    context,
    events_until_marker,
    put_marker,
    random_workload,
)


@pytest.fixture(scope="module")
def own_mongo() -> Iterator[MongoServer]:
    # A server of its own: on SecantusDB, finding where a transaction starts scans the oplog,
    # which the rest of the suite would otherwise have grown to tens of thousands of entries.
    with MongoServer() as server:
        yield server


@pytest.fixture
def client(own_mongo: MongoServer) -> Iterator[pymongo.MongoClient[dict[str, Any]]]:
    c: pymongo.MongoClient[dict[str, Any]] = pymongo.MongoClient(own_mongo.url)
    yield c
    c.close()


def make(db: str, es_url: str, **kw: Any) -> ElasticsearchSync:
    return ElasticsearchSync(database=db, collection="docs", es=es_url, **kw)


def test_random_workload_then_full_replay(
    client: pymongo.MongoClient[dict[str, Any]], es_url: str, unique: str
) -> None:
    db = f"es{unique}"
    coll = client[db]["docs"]
    listener = make(db, es_url, bulk_actions=400, concurrency=2)
    tenures = Tenures(listener.lease_name)
    ctx = context(tenures.next(), client, listener.lease_name)
    start = cluster_time(client)
    counts = random_workload(client, coll, 5000, seed=5)
    assert counts["txn"] > 100 and counts["delete"] > 300, counts
    put_marker(coll)
    events = 0
    for batch in events_until_marker(coll, start):
        listener.handle_batch(batch, ctx)
        events += len(batch)
    assert events >= 2500  # updates and deletes of absent documents produce no event
    diff = compare(coll, es_url, listener.index_name)
    assert diff.ok, diff
    assert diff.mongo_count > 100
    before = es_documents(es_url, listener.index_name)
    assert listener._writer is not None
    written = listener._writer.stats.written

    # Replaying the whole stream from the start changes nothing: every write is refused (409).
    for batch in events_until_marker(coll, start):
        listener.handle_batch(batch, ctx)
    assert listener._writer.stats.written == written, listener._writer.stats
    assert es_documents(es_url, listener.index_name) == before
    diff = compare(coll, es_url, listener.index_name)
    assert diff.ok, diff
    listener.close()


def test_deposed_leader_replaying_old_events_changes_nothing(
    client: pymongo.MongoClient[dict[str, Any]], es_url: str, unique: str
) -> None:
    db = f"es{unique}"
    coll = client[db]["docs"]
    name = f"{db}.docs"
    tenures = Tenures(name)
    old_ld = tenures.next()
    start = cluster_time(client)
    random_workload(client, coll, 600, seed=7, ids=80)
    coll.insert_many([{"_id": f"doomed{i}", "n": i} for i in range(20)])
    coll.insert_one({"_id": "edited", "n": 1})
    put_marker(coll)
    old_batches = list(events_until_marker(coll, start, batch_size=100))

    # The successor handles everything, then deletes and edits documents.
    new = make(db, es_url)
    new_ctx = context(tenures.next(), client, name)
    assert new_ctx.token > old_ld.token
    coll.delete_many({"_id": {"$regex": "^doomed"}})
    coll.update_one({"_id": "edited", "n": 1}, {"$set": {"n": 2, "by": "successor"}})
    put_marker(coll, "~second")
    for batch in events_until_marker(coll, start, marker="~second"):
        new.handle_batch(batch, new_ctx)
    assert compare(coll, es_url, new.index_name).ok
    before = es_documents(es_url, new.index_name)
    assert "doomed3" not in before and before["edited"]["by"] == "successor"

    # The deposed leader (paused, still believing it leads) replays its older events.
    old = make(db, es_url)
    old_ctx = context(old_ld, client, name)
    for batch in old_batches:
        old.handle_batch(batch, old_ctx)
    assert old._writer is not None
    assert old._writer.stats.written == 0, old._writer.stats
    after = es_documents(es_url, new.index_name)
    assert after == before
    assert not any(k.startswith("doomed") for k in after), "a deleted document was resurrected"
    diff = compare(coll, es_url, new.index_name)
    assert diff.ok, diff

    # Once its tenure has ended it does not even send.
    old_ld._end("lost")
    with pytest.raises(LeaseLostError):
        old.handle_batch(old_batches[0], old_ctx)
    new.close()
    old.close()


def test_index_bootstrap_raises_gc_deletes(
    client: pymongo.MongoClient[dict[str, Any]], es_url: str, unique: str
) -> None:
    import json

    import urllib3

    db = f"es{unique}"
    index = f"{db}.docs"
    http = urllib3.PoolManager()
    resp = http.request(
        "PUT",
        f"{es_url}/{index}",
        body=b'{"settings":{"index.gc_deletes":"60s"}}',
        headers={"Content-Type": "application/json"},
    )
    assert resp.status == 200
    listener = make(db, es_url, ttl=10, request_timeout=20, gc_safety_factor=5)
    assert listener.gc_deletes_seconds == 150
    ctx = context(Tenures(index).next(), client, index)
    listener._setup(ctx)
    listener.ensure_index(index, ctx)
    settings = json.loads(http.request("GET", f"{es_url}/{index}/_settings").data)
    assert settings[index]["settings"]["index"]["gc_deletes"] == "150s"
    listener.close()
