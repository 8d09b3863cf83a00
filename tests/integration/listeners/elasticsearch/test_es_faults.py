"""Through a proxy that answers 429 for 30 % of bulk items nothing is lost; a document that
violates the mapping is dead-lettered and the rest flow on."""

from __future__ import annotations

from typing import Any

import pymongo

from listeners.deadletters import DeadLetterStore
from listeners.elasticsearch import ElasticsearchSync
from listeners.elasticsearch.verify import compare
from singleton.drivers.mongo import cluster_time
from tests.integration import es_support
from tests.integration.es_proxy import BulkRejectingProxy


def test_429_for_30_percent_of_items_loses_nothing_and_bad_documents_are_dead_lettered(
    client: pymongo.MongoClient[dict[str, Any]], es_url: str, docs: Any
) -> None:
    coll, db = docs, docs.database.name
    dead = DeadLetterStore(client, database=f"dl{db}")
    with BulkRejectingProxy(es_url, reject_ratio=0.3, seed=3) as proxy:
        listener, ctx = es_support.sync_with_tenure(
            client,
            coll,
            proxy.url,
            backoff_base=0.01,
            backoff_max=0.2,
            mappings={"properties": {"n": {"type": "long"}}},
            dead_letters=dead,
            bulk_actions=200,
        )
        start = cluster_time(client)
        es_support.random_workload(client, coll, 1500, seed=9, ids=400)
        coll.insert_one({"_id": "bad", "n": "not a number", "ok": False})
        coll.insert_many([{"_id": f"after{i}", "n": i} for i in range(50)])
        es_support.put_marker(coll)
        es_support.handle_until_marker(listener, ctx, coll, start)
        assert proxy.rejected > 100, proxy.rejected
        assert listener.stats.retried >= proxy.rejected, listener.stats
        # every request was pushed back: the next stream batch is smaller (adaptive_batch)
        assert listener.next_batch_size() < listener.batch_size
        listener.close()

    diff = compare(coll, es_url, listener.index_name)
    assert diff.missing == ["bad"], diff
    assert not diff.stale and not diff.extra, diff
    letters = dead.letters(listener.lease_name)
    assert [d["event"]["documentKey"]["_id"] for d in letters] == ["bad"], letters
    assert letters[0]["event"]["status"] == 400
    assert letters[0]["event"]["source"] is None  # dead_letter_source = false: no values kept
    assert letters[0]["fencing_token"] == ctx.token

    # Once the document is fixed, its dead letter replays through handle_batch (what
    # `singleton dead-letters replay` does): the document is looked up and indexed.
    coll.update_one({"_id": "bad"}, {"$set": {"n": 7}})
    fixed = ElasticsearchSync(database=db, collection="docs", es=es_url, dead_letters=dead)
    fixed.handle_batch([letters[0]["event"]], ctx)
    fixed.close()
    assert compare(coll, es_url, listener.index_name).ok
