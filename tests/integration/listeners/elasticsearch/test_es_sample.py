"""The sampled check on real servers (SecantusDB, osmem-server): documents deleted from the index,
or overwritten in it, by someone else are found by an idle stream's sample, confirmed at the
next one, and the tenure resyncs; a busy collection's writes (a sample racing the stream) are
never taken for a divergence."""

from __future__ import annotations

import random
import threading
from typing import Any
from urllib.parse import quote

import pymongo

from listeners.elasticsearch import ElasticsearchSync
from listeners.elasticsearch.ids import doc_id
from listeners.elasticsearch.transport import connect
from listeners.elasticsearch.verify import compare
from listeners.runtime.runner import ListenerRunner
from singleton.service.dev.embedded import wait_until
from singleton.testing import MemoryLeaseBackend
from tests.integration.listener_support import LogCapture, make_runner


def _equal(coll: Any, es_url: str, alias: str) -> bool:
    try:
        return compare(coll, es_url, alias).ok
    except Exception:  # (the index is being rebuilt)
        return False


def _started(mongo_url: str, db: str, listener: ElasticsearchSync) -> ListenerRunner:
    runner = make_runner(mongo_url, db, MemoryLeaseBackend(), listener, "r").start()
    wait_until(lambda: runner.status()["state"] == "streaming", 60, what="streaming")
    return runner


def test_documents_deleted_and_changed_in_the_index_by_someone_else_are_resynced(
    mongo_url: str, es_url: str, docs: Any
) -> None:
    coll, db = docs, docs.database.name
    coll.insert_many([{"_id": i, "n": i} for i in range(300)])
    listener = ElasticsearchSync(
        database=db, collection="docs", es=es_url, ttl=1.0, sample_interval=0.3, sample_size=50
    )
    alias = listener.index_name
    http = connect(es_url)
    with LogCapture() as logs:
        runner = _started(mongo_url, db, listener)
        try:
            wait_until(lambda: _equal(coll, es_url, alias), 60, what="the copy")
            for i in range(0, 300, 2):  # half of them deleted, behind the listener's back
                http.request("DELETE", f"/{alias}/_doc/{quote(doc_id(i), safe='')}")
            body = b'{"n": -1}'
            http.request("PUT", f"/{alias}/_doc/{quote(doc_id(1), safe='')}", body)
            wait_until(lambda: runner.status()["sink_lost"] == 1, 60, what="the divergence found")
            wait_until(lambda: _equal(coll, es_url, alias), 60, what="the index equal again")
        finally:
            runner.stop()
            listener.close()
            http.close()
    found = [m for m in logs.errors if "a sampled check found" in m]
    assert len(found) == 1 and "differing from the collection twice" in found[0], logs.errors


def test_a_busy_collection_is_never_taken_for_a_diverged_index(
    mongo_url: str, es_url: str, docs: Any
) -> None:
    """A sample reads MongoDB, then the index: the writes in between, and the events not yet
    applied, make suspects, never a resync (each suspect is read again at the next sample)."""
    coll, db = docs, docs.database.name
    coll.insert_many([{"_id": i, "n": 0} for i in range(60)])
    listener = ElasticsearchSync(
        database=db, collection="docs", es=es_url, ttl=1.0, sample_interval=0.05, sample_size=60
    )
    stop = threading.Event()
    rng = random.Random(5)

    def write() -> None:
        while not stop.is_set():
            coll.update_one({"_id": rng.randrange(60)}, {"$inc": {"n": 1}})
            stop.wait(rng.uniform(0.0, 0.03))

    with LogCapture("INFO") as logs:
        runner = _started(mongo_url, db, listener)
        writer = threading.Thread(target=write)
        writer.start()
        try:
            # until several samples met suspects (the writes raced them) and were cleared
            wait_until(
                lambda: sum("documents differ from the index" in m for m in logs.errors) >= 3,
                60,
                what="samples that met writes",
            )
        finally:
            stop.set()
            writer.join(10)
        try:
            wait_until(lambda: _equal(coll, es_url, listener.index_name), 60, what="caught up")
            assert runner.status()["sink_lost"] == 0
        finally:
            runner.stop()
            listener.close()


def test_a_shaped_document_overwritten_under_its_routing_is_resynced(
    mongo_url: str, es_url: str, unique: str
) -> None:
    client: pymongo.MongoClient[dict[str, Any]] = pymongo.MongoClient(mongo_url)
    db = f"smp{unique}"
    client[db].orders.insert_many(
        [{"_id": i, "customer_id": f"c{i % 3}", "status": "open"} for i in range(40)]
    )
    layout = {"orders": {"routing": "customer_id", "filter": {"status": "open"}}}
    listener = ElasticsearchSync(
        name=f"{db}-search",
        database=db,
        index=f"{db}-{{collection}}",
        collections=layout,
        es=es_url,
        ttl=1.0,
        sample_interval=0.3,
        sample_size=40,
    )
    assert listener.shape is not None
    rules = listener.shape.collections["orders"]
    es_id = quote(rules.es_id(4), safe="")
    http = connect(es_url)
    runner = _started(mongo_url, db, listener)
    try:
        path = f"/{db}-orders/_doc/{es_id}?routing=c1"
        wait_until(lambda: http.request("GET", path)[0] == 200, 60, what="order 4 indexed")
        assert http.request("PUT", path, b'{"status": "forged"}')[0] in (200, 201)
        wait_until(lambda: runner.status()["sink_lost"] == 1, 60, what="the divergence found")
        wait_until(
            lambda: http.request("GET", path)[1].get("_source", {}).get("status") == "open",
            60,
            what="order 4 as the collection holds it",
        )
    finally:
        runner.stop()
        listener.close()
        http.close()
        client.close()


def test_a_comparison_that_cannot_hold_turns_the_check_off_instead_of_resyncing_in_a_loop(
    mongo_url: str, es_url: str, docs: Any
) -> None:
    """An index whose mapping leaves a field out of ``_source`` differs from the collection
    after every copy: the first confirmed divergence resyncs, the second (no clean sample in
    between) turns the check off with one ERROR line, and the listener streams on."""
    coll, db = docs, docs.database.name
    coll.insert_many([{"_id": i, "n": i, "secret": "s"} for i in range(40)])
    listener = ElasticsearchSync(
        database=db,
        collection="docs",
        es=es_url,
        ttl=1.0,
        sample_interval=0.2,
        sample_size=40,
        mappings={"_source": {"excludes": ["secret"]}},
    )
    with LogCapture() as logs:
        runner = _started(mongo_url, db, listener)
        try:
            wait_until(
                lambda: any("sampled check turned off" in m for m in logs.errors),
                60,
                what="the check turned off",
            )
            assert runner.status()["sink_lost"] == 1  # one resync, not a loop
            coll.insert_one({"_id": 99, "n": 99})
            http = connect(es_url)
            try:
                path = f"/{listener.index_name}/_doc/{quote(doc_id(99), safe='')}"
                wait_until(lambda: http.request("GET", path)[0] == 200, 30, what="streaming on")
            finally:
                http.close()
            assert runner.status()["sink_lost"] == 1
        finally:
            runner.stop()
            listener.close()


def test_a_dead_lettered_document_is_not_taken_for_a_divergence(
    mongo_url: str, es_url: str, docs: Any
) -> None:
    """A document the index refuses (its mapping wants a number) is dead-lettered: it is
    missing from the index by design, and the samples that meet it never resync."""
    coll, db = docs, docs.database.name
    coll.insert_many([{"_id": i, "n": i} for i in range(20)] + [{"_id": "bad", "n": "text"}])
    listener = ElasticsearchSync(
        database=db,
        collection="docs",
        es=es_url,
        ttl=1.0,
        sample_interval=0.1,
        sample_size=21,
        mappings={"properties": {"n": {"type": "long"}}},
    )
    with LogCapture("INFO") as logs:
        runner = _started(mongo_url, db, listener)
        try:
            wait_until(
                lambda: sum("documents differ from the index" in m for m in logs.errors) >= 4,
                30,
                what="samples that met the dead letter",
            )
            assert runner.status()["sink_lost"] == 0
        finally:
            runner.stop()
            listener.close()
    assert not any("sampled check turned off" in m for m in logs.errors)
