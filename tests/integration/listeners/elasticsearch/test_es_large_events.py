"""Large events: the split stage is used only where the server has it, and events that arrive
without their document (fragments cut by a batch, or read with large fields projected away)
are completed by a lookup, so the index still equals the collection."""

from __future__ import annotations

from typing import Any

import pymongo

from listeners.elasticsearch import ElasticsearchSync
from listeners.elasticsearch.fragments import SPLIT_STAGE, supports_split
from listeners.elasticsearch.verify import compare
from singleton.drivers.mongo import cluster_time
from tests.integration import es_support


def test_split_stage_only_where_supported_and_documents_looked_up_when_missing(
    client: pymongo.MongoClient[dict[str, Any]], es_url: str, docs: Any
) -> None:
    coll, db = docs, docs.database.name
    listener = ElasticsearchSync(database=db, collection="docs", es=es_url)
    ctx = es_support.Tenures(listener.lease_name).next(client)
    listener.on_start(ctx)  # a tenure as the runner drives it: writes stay in flight until flushed
    supported = supports_split(coll)
    assert (SPLIT_STAGE in listener.pipeline) is supported
    assert listener.split_large_events is supported

    start = cluster_time(client)
    coll.insert_many([{"_id": i, "n": i} for i in range(5)])
    coll.update_one({"_id": 1}, {"$set": {"n": 100}})
    coll.delete_one({"_id": 3})
    coll.replace_one({"_id": 4}, {"r": True})
    es_support.put_marker(coll)
    for batch in es_support.events_until_marker(coll, start):
        # What the runner hands over after a BSONObjectTooLarge: the large fields projected away.
        listener.handle_batch(
            [{k: v for k, v in e.items() if k != "fullDocument"} for e in batch], ctx
        )
    listener.flush(None, ctx)
    diff = compare(coll, es_url, listener.index_name)
    assert diff.ok, diff
    assert diff.mongo_count == 4
    listener.close()


def _split(event: dict[str, Any]) -> list[dict[str, Any]]:
    """``event`` as ``$changeStreamSplitLargeEvent`` would send it in two fragments (the
    document in the second; both with its token, which versions them alike)."""
    head = {k: v for k, v in event.items() if k != "fullDocument"}
    tail = {"_id": event["_id"], "fullDocument": event.get("fullDocument")}
    return [
        {**head, "splitEvent": {"fragment": 1, "of": 2}},
        {**tail, "splitEvent": {"fragment": 2, "of": 2}},
    ]


def test_split_events_amid_whole_ones_are_joined_in_a_batch(
    client: pymongo.MongoClient[dict[str, Any]], es_url: str, docs: Any
) -> None:
    """The commonest events are mapped inline (``ItemMaker.collect``) up to the first fragment;
    from there the batch's fragments are joined, then mapped: the index equals the collection."""
    coll, db = docs, docs.database.name
    listener = ElasticsearchSync(database=db, collection="docs", es=es_url)
    ctx = es_support.Tenures(listener.lease_name).next(client)
    listener.on_start(ctx)
    start = cluster_time(client)
    coll.insert_many([{"_id": i, "n": i, "s": "x" * i} for i in range(8)])
    coll.update_one({"_id": 2}, {"$set": {"n": 200}})
    coll.replace_one({"_id": 5}, {"r": True})
    coll.delete_one({"_id": 6})
    es_support.put_marker(coll)
    for batch in es_support.events_until_marker(coll, start):
        mixed: list[dict[str, Any]] = []
        for i, event in enumerate(batch):
            whole = dict(event)
            mixed.extend(_split(whole) if i % 3 == 1 and "fullDocument" in whole else [whole])
        listener.handle_batch(mixed, ctx)
    listener.flush(None, ctx)
    diff = compare(coll, es_url, listener.index_name)
    assert diff.ok, diff
    assert diff.mongo_count == 7
    listener.close()
