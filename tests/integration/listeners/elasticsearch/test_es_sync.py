"""ElasticsearchSync against SecantusDB and osmem-server: the index equals the collection after a
random workload, replays change nothing, a deposed leader's late writes are refused, and the
transport moves past a dead node without showing credentials."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import pymongo
import pytest

from listeners.elasticsearch import ElasticsearchSync
from listeners.elasticsearch.transport import connect
from listeners.elasticsearch.verify import compare, es_documents
from singleton.drivers.mongo import cluster_time
from singleton.errors import ConfigurationError, EsUnavailableError, LeaseLostError
from tests.integration import es_support


@pytest.fixture(scope="module")
def client() -> Iterator[pymongo.MongoClient[dict[str, Any]]]:
    # Thousands of transactions here: on the shared server they would slow the others down.
    with es_support.own_client() as c:
        yield c


def make(db: str, es_url: str, **kw: Any) -> ElasticsearchSync:
    return ElasticsearchSync(database=db, collection="docs", es=es_url, **kw)


def test_random_workload_then_full_replay(
    client: pymongo.MongoClient[dict[str, Any]], es_url: str, docs: Any
) -> None:
    coll, db = docs, docs.database.name
    listener = make(db, es_url, bulk_actions=400, concurrency=2)
    ctx = es_support.Tenures(listener.lease_name).next(client)
    start = cluster_time(client)
    counts = es_support.random_workload(client, coll, 5000, seed=5)
    assert counts["txn"] > 100 and counts["delete"] > 300, counts
    es_support.put_marker(coll)
    events = es_support.handle_until_marker(listener, ctx, coll, start)
    assert events >= 2500  # updates and deletes of absent documents produce no event
    diff = compare(coll, es_url, listener.index_name)
    assert diff.ok, diff
    assert diff.mongo_count > 100
    before = es_documents(es_url, listener.index_name)
    written = listener.stats.written

    # Replaying the whole stream from the start changes nothing: every write is refused (409).
    es_support.handle_until_marker(listener, ctx, coll, start)
    assert listener.stats.written == written, listener.stats
    assert es_documents(es_url, listener.index_name) == before
    diff = compare(coll, es_url, listener.index_name)
    assert diff.ok, diff
    listener.close()


def test_deposed_leader_replaying_old_events_changes_nothing(
    client: pymongo.MongoClient[dict[str, Any]], es_url: str, docs: Any
) -> None:
    coll, db = docs, docs.database.name
    tenures = es_support.Tenures(f"{db}.docs")
    old_ctx = tenures.next(client)
    start = cluster_time(client)
    es_support.random_workload(client, coll, 600, seed=7, ids=80)
    coll.insert_many([{"_id": f"doomed{i}", "n": i} for i in range(20)])
    coll.insert_one({"_id": "edited", "n": 1})
    es_support.put_marker(coll)
    old_batches = list(es_support.events_until_marker(coll, start, batch_size=100))

    # The successor handles everything, then deletes and edits documents.
    new = make(db, es_url)
    new_ctx = tenures.next(client)
    assert new_ctx.token > old_ctx.token
    coll.delete_many({"_id": {"$regex": "^doomed"}})
    coll.update_one({"_id": "edited", "n": 1}, {"$set": {"n": 2, "by": "successor"}})
    es_support.put_marker(coll, "~second")
    es_support.handle_until_marker(new, new_ctx, coll, start, marker="~second")
    assert compare(coll, es_url, new.index_name).ok
    before = es_documents(es_url, new.index_name)
    assert "doomed3" not in before and before["edited"]["by"] == "successor"

    # The deposed leader (paused, still believing it leads) replays its older events.
    old = make(db, es_url)
    for batch in old_batches:
        old.handle_batch(batch, old_ctx)
    assert old.stats.written == 0, old.stats
    after = es_documents(es_url, new.index_name)
    assert after == before
    assert not any(k.startswith("doomed") for k in after), "a deleted document was resurrected"
    diff = compare(coll, es_url, new.index_name)
    assert diff.ok, diff

    # Once its tenure has ended it does not even send.
    tenures.end(old_ctx)
    with pytest.raises(LeaseLostError):
        old.handle_batch(old_batches[0], old_ctx)
    new.close()
    old.close()


def test_index_bootstrap_raises_gc_deletes(
    client: pymongo.MongoClient[dict[str, Any]], es_url: str, unique: str
) -> None:
    db = f"es{unique}"
    index = f"{db}.docs"
    http = connect(es_url)
    status, _ = http.request("PUT", f"/{index}", b'{"settings":{"index.gc_deletes":"60s"}}')
    assert status == 200
    listener = make(db, es_url, ttl=10, request_timeout=20, gc_safety_factor=5)
    assert listener.gc_deletes_seconds == 150
    listener.ensure_index(index, es_support.Tenures(index).next(client))
    status, settings = http.request("GET", f"/{index}/_settings")
    assert settings[index]["settings"]["index"]["gc_deletes"] == "150s", (status, settings)
    listener.close()
    http.close()


def test_transport_moves_past_a_dead_node_and_never_shows_credentials(es_url: str) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://user:secret@127.0.0.1:{s.getsockname()[1]}"  # refused once closed
    http = connect([dead, es_url.replace("http://", "http://user:secret@")], request_timeout=5)
    assert "secret" not in http.description and "user" not in http.description
    assert [http.request("GET", "/")[0] for _ in range(4)] == [200] * 4
    http.close()
    lone = connect(dead, request_timeout=5)
    with pytest.raises(EsUnavailableError) as unavailable:
        lone.request("GET", "/")
    lone.close()
    with pytest.raises(ConfigurationError) as invalid:
        connect("ftp://user:secret@localhost:9200")
    assert "secret" not in str(unavailable.value) + str(invalid.value)
