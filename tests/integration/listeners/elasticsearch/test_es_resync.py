"""A resync leaves nothing behind: the index users query is an alias, a resync copies into a
fresh physical index, replays what happened during the copy, and swaps the alias atomically.
Documents deleted while there was no checkpoint are gone afterwards; readers see the old index
until the swap; a plain index of an earlier version is adopted; documents that cannot be
indexed are dead-lettered in the copy and the stream alike."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pymongo
import pytest

from listeners.deadletters import DeadLetterStore
from listeners.elasticsearch import ElasticsearchSync
from listeners.elasticsearch.ids import doc_id
from listeners.elasticsearch.transport import Transport, connect
from listeners.elasticsearch.verify import compare, es_documents
from singleton.drivers.mongo import cluster_time
from tests.integration import es_support


class SwapSpy:
    """A transport that runs ``before_swap`` just before the ``_aliases`` request goes out."""

    def __init__(self, inner: Transport, before_swap: Any) -> None:
        self.inner = inner
        self.description = inner.description
        self.before_swap = before_swap
        self.swaps = 0

    def request(
        self, method: str, path: str, body: bytes | None = None, *, ndjson: bool = False
    ) -> tuple[int, Any]:
        if method == "POST" and path == "/_aliases":
            self.swaps += 1
            self.before_swap(json.loads(body or b"{}"))
        return self.inner.request(method, path, body, ndjson=ndjson)

    def close(self) -> None:
        self.inner.close()


@pytest.fixture
def http(es_url: str) -> Iterator[Transport]:
    """A plain transport on the session's osmem-server, closed after the test."""
    transport = connect(es_url)
    yield transport
    transport.close()


def _alias_targets(http: Transport, alias: str) -> list[str]:
    status, body = http.request("GET", f"/_alias/{alias}")
    return sorted(body) if status == 200 else []


def test_resync_drops_what_was_deleted_meanwhile_and_readers_see_the_old_index_until_the_swap(
    client: pymongo.MongoClient[dict[str, Any]], es_url: str, docs: Any, http: Transport
) -> None:
    coll, db = docs, docs.database.name
    coll.insert_many([{"_id": i, "n": i} for i in range(300)])
    tenures = es_support.Tenures(f"{db}.docs")
    first = ElasticsearchSync(database=db, collection="docs", es=es_url)
    alias = first.index_name
    first.initial_sync(tenures.next(client))
    assert compare(coll, es_url, alias).ok
    [old] = _alias_targets(http, alias)
    assert old != alias and old.startswith(alias + "-")

    # No checkpoint, nobody streaming: documents are deleted, changed and added.
    coll.delete_many({"_id": {"$lt": 50}})
    coll.update_many({"_id": {"$gte": 290}}, {"$set": {"changed": True}})
    coll.insert_many([{"_id": f"new{i}"} for i in range(10)])
    deleted = {doc_id(i) for i in range(50)}

    def during_copy(doc: dict[str, Any]) -> dict[str, Any]:
        if doc["_id"] == 100:  # writes while the copy runs: the replay must bring them in
            coll.delete_one({"_id": 200})  # not copied yet
            coll.delete_one({"_id": 60})  # copied already
            coll.update_one({"_id": 70}, {"$set": {"late": True}})
        return doc

    seen: dict[str, Any] = {}

    def before_swap(request: dict[str, Any]) -> None:
        readers = es_documents(es_url, alias)
        seen["old_view"] = deleted <= set(readers)  # the old index, deleted documents and all
        [target] = [a["add"]["index"] for a in request["actions"] if "add" in a]
        seen["target"] = target
        seen["copy"] = compare(coll, es_url, target)  # copied and caught up before the swap
        seen["actions"] = request["actions"]

    spy = SwapSpy(connect(es_url), before_swap)
    second = ElasticsearchSync(database=db, collection="docs", es=spy, transform=during_copy)
    second.initial_sync(tenures.next(client))

    assert spy.swaps == 1
    assert seen["old_view"] is True
    assert seen["copy"].ok, seen["copy"]
    assert {"remove": {"index": old, "alias": alias}} in seen["actions"]
    assert _alias_targets(http, alias) == [seen["target"]]
    assert http.request("GET", f"/{old}/_settings")[0] == 404  # the old index is dropped
    diff = compare(coll, es_url, alias)
    assert diff.ok, diff
    assert not deleted & set(es_documents(es_url, alias))
    assert diff.mongo_count == 300 - 50 - 2 + 10
    first.close()
    second.close()


def test_a_plain_index_of_an_earlier_version_is_adopted_by_the_first_resync(
    client: pymongo.MongoClient[dict[str, Any]], es_url: str, docs: Any, http: Transport
) -> None:
    coll, db = docs, docs.database.name
    listener = ElasticsearchSync(database=db, collection="docs", es=es_url)
    alias = listener.index_name
    assert http.request("PUT", f"/{alias}", b'{"settings":{"index.gc_deletes":"60s"}}')[0] == 200
    stale = json.dumps({"n": "old"}).encode()
    assert http.request("PUT", f"/{alias}/_doc/gone?refresh=true", stale)[0] == 201
    tenures = es_support.Tenures(listener.lease_name)

    # Streaming before any resync writes into the plain index, as the earlier version did.
    start = cluster_time(client)
    coll.insert_many([{"_id": i, "n": i} for i in range(20)])
    es_support.put_marker(coll)
    es_support.handle_until_marker(listener, tenures.next(client), coll, start)
    assert _alias_targets(http, alias) == []
    assert compare(coll, es_url, alias).extra == ["gone"]

    listener.initial_sync(tenures.next(client))
    [target] = _alias_targets(http, alias)
    assert target.startswith(alias + "-")
    diff = compare(coll, es_url, alias)
    assert diff.ok, diff  # "gone" went with the plain index
    listener.close()


def test_unindexable_documents_are_dead_lettered_in_the_copy_and_the_stream(
    client: pymongo.MongoClient[dict[str, Any]], es_url: str, docs: Any
) -> None:
    coll, db = docs, docs.database.name
    dead = DeadLetterStore(client, database=f"dl{db}")
    long_id = "x" * 600
    coll.insert_many(
        [{"_id": i, "n": i} for i in range(30)]
        + [{"_id": long_id, "n": 1}, {"_id": "nan", "a": {"b": [1.0, float("nan")]}}]
    )
    listener, ctx = es_support.sync_with_tenure(client, coll, es_url, dead_letters=dead)
    listener.initial_sync(ctx)
    start = cluster_time(client)
    coll.insert_many(
        [{"_id": "y" * 600}, {"_id": "inf", "v": float("-inf")}, {"_id": "fine", "n": 2}]
    )
    coll.delete_one({"_id": long_id})
    es_support.put_marker(coll)
    for batch in es_support.events_until_marker(coll, start):
        # As ElasticsearchSync's own stream gives them: without ``clusterTime`` and ``ns``.
        unused = ("clusterTime", "ns")
        listener.handle_batch([{k: v for k, v in e.items() if k not in unused} for e in batch], ctx)

    diff = compare(coll, es_url, listener.index_name)
    assert diff.ok, diff
    assert len(diff.unindexable) == 3, diff.unindexable  # "y"*600, nan, inf
    letters = list(dead.dead_letters.find({}))
    reasons = {str(d["event"]["documentKey"]["_id"])[:3]: d["reason"] for d in letters}
    assert set(reasons) == {"xxx", "nan", "yyy", "inf"}, reasons
    assert "512" in reasons["xxx"] and "512" in reasons["yyy"], reasons
    assert "non-finite number at path a.b.1" in reasons["nan"], reasons
    assert "non-finite number at path v" in reasons["inf"], reasons
    times = {str(d["event"]["documentKey"]["_id"])[:3]: d["event"]["clusterTime"] for d in letters}
    assert times["yyy"] >= start and times["inf"] >= start, times  # read from the resume token
    listener.close()
