"""A shaped index (``collections``) on real servers: three collections into two indexes through
one stream, a filter documents move in and out of, routing that changes, field rules, a
planned handover, a changed filter that resyncs, and deletes found without pre-images."""

from __future__ import annotations

import random
import re
import urllib.request
import uuid
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any
from urllib.parse import quote

import pymongo
import pytest

from listeners.checkpoints.stores import MongoCheckpointStore
from listeners.deadletters import DeadLetterStore
from listeners.elasticsearch import ElasticsearchSync
from listeners.elasticsearch.shape.verify import compare_shaped
from listeners.elasticsearch.transport import connect
from listeners.stream.partition import Partition
from singleton.errors import ConfigurationError
from singleton.service.dev.embedded import MongoServer, wait_until
from singleton.service.drill import shaped
from singleton.service.metrics import MetricsServer
from singleton.testing import MemoryLeaseBackend
from tests.integration import es_support
from tests.integration.listener_support import make_runner


@pytest.fixture(scope="module")
def mongo_server() -> Iterator[MongoServer]:
    """A SecantusDB of this module's own: it scans its oplog to open a change stream, so the
    thousands of writes here would slow down every other test sharing a server with them."""
    with MongoServer() as server:
        yield server


def _listener(db: str, es_url: str, layout: dict[str, Any] | None = None) -> ElasticsearchSync:
    return ElasticsearchSync(
        name=f"{db}-search",
        database=db,
        index=f"{db}-{{collection}}",
        collections=layout or shaped.layout(f"{db}-orders"),
        es=es_url,
        ttl=1.0,
    )


def _caught_up(client: Any, db: str, listener: ElasticsearchSync, es_url: str) -> None:
    """Write a marker order (new content each time) and wait until it is indexed: events
    arrive in order, so everything before it is too."""
    mark = uuid.uuid4().hex
    client[db].orders.replace_one(
        {"_id": "~end"}, {"status": "paid", "customer_id": "c1", "mark": mark}, upsert=True
    )
    assert listener.shape is not None
    es_id = quote(listener.shape.collections["orders"].es_id("~end"), safe="")
    http = connect(es_url)

    def indexed() -> bool:
        status, body = http.request("GET", f"/{db}-orders/_doc/{es_id}?routing=c1")
        return status == 200 and body["_source"].get("mark") == mark

    try:
        wait_until(indexed, 120, interval=0.1, what="the marker order indexed")
    finally:
        http.close()


def _assert_equal(client: Any, es_url: str, listener: ElasticsearchSync) -> None:
    assert listener.shape is not None
    diffs = compare_shaped(client, es_url, listener.shape)
    assert all(d.ok for d in diffs.values()), {a: str(d) for a, d in diffs.items()}
    assert all(d.mongo_count > 0 for d in diffs.values()), diffs


def _wait_equal(client: Any, es_url: str, shape: Any, timeout: float) -> None:
    """Wait until every index equals the shaped view; else fail with the differences."""

    def equal() -> bool:
        return all(d.ok for d in compare_shaped(client, es_url, shape).values())

    try:
        wait_until(equal, timeout, interval=0.5, what="the indexes equal to the shaped view")
    except Exception:
        diffs = compare_shaped(client, es_url, shape)
        raise AssertionError({a: str(d) for a, d in diffs.items()}) from None


def test_shaped_copy_stream_and_handover(mongo_url: str, es_url: str, unique: str) -> None:
    client: pymongo.MongoClient[dict[str, Any]] = pymongo.MongoClient(mongo_url)
    db = f"sh{unique}"
    rng = random.Random(7)
    shaped.seed(client[db], 200, rng)
    backend = MemoryLeaseBackend()
    store = MongoCheckpointStore(client, database=db)
    a_listener, b_listener = _listener(db, es_url), _listener(db, es_url)
    a = make_runner(mongo_url, db, backend, a_listener, "a", store).start()
    b = None
    try:
        wait_until(lambda: a.status()["state"] == "streaming", 120, what="A synced")
        _caught_up(client, db, a_listener, es_url)
        _assert_equal(client, es_url, a_listener)  # the copy: filter, ids, routing, fields
        shaped.workload(client, db, 300, rng, ids=240)
        b = make_runner(mongo_url, db, backend, b_listener, "b", store).start()
        a.stop()  # planned handover in the middle
        wait_until(lambda: b.status()["state"] == "streaming", 60, what="B streaming")
        counts = shaped.workload(client, db, 300, rng, ids=240)
        _caught_up(client, db, b_listener, es_url)
        _assert_equal(client, es_url, b_listener)
        by_collection = b_listener.by_collection.snapshot()  # the metrics' collection label
        assert set(by_collection) == {"orders", "legacy_orders", "customers"}
        assert all(c["events"] > 0 for c in by_collection.values()), by_collection
    finally:
        a.stop()
        if b is not None:
            b.stop()
        a_listener.close()
        b_listener.close()
        client.close()
    assert counts["reroute"] > 10 and counts["status"] > 10 and counts.get("txn", 0) > 5


def test_ids_of_collections_sharing_an_index_differ(
    mongo_url: str, es_url: str, unique: str
) -> None:
    client: pymongo.MongoClient[dict[str, Any]] = pymongo.MongoClient(mongo_url)
    db = f"ids{unique}"
    client[db].orders.insert_one({"_id": 1, "status": "open", "customer_id": "c1"})
    client[db].legacy_orders.insert_one({"_id": 1, "status": "old"})
    listener = _listener(db, es_url)
    ctx = es_support.Tenures(listener.lease_name).next(client)
    try:
        listener.on_start(ctx)
        listener.initial_sync(ctx)
        assert listener.shape is not None
        diffs = compare_shaped(client, es_url, listener.shape)
    finally:
        listener.close()
        client.close()
    orders = diffs[f"{db}-orders"]
    assert orders.ok and orders.mongo_count == 2, orders
    assert listener.shape.source_of_id(f"{db}-orders", "legacy_orders$~i:1") == (
        "legacy_orders",
        1,
    )


def test_a_changed_filter_resyncs(mongo_url: str, es_url: str, unique: str) -> None:
    client: pymongo.MongoClient[dict[str, Any]] = pymongo.MongoClient(mongo_url)
    db = f"flt{unique}"
    rng = random.Random(3)
    shaped.seed(client[db], 100, rng)
    backend = MemoryLeaseBackend()
    store = MongoCheckpointStore(client, database=db)
    first = _listener(db, es_url)
    runner = make_runner(mongo_url, db, backend, first, "a", store).start()
    try:
        wait_until(lambda: runner.status()["state"] == "streaming", 120, what="synced")
        _caught_up(client, db, first, es_url)
    finally:
        runner.stop()
        first.close()
    layout = shaped.layout(f"{db}-orders")
    layout["orders"]["filter"] = {"status": "paid"}
    second = _listener(db, es_url, layout)
    runner = make_runner(mongo_url, db, backend, second, "b", store).start()
    try:
        wait_until(lambda: runner.status()["state"] == "streaming", 120, what="resynced")
        _caught_up(client, db, second, es_url)
        _assert_equal(client, es_url, second)
        assert runner.status()["sink_lost"] == 1
    finally:
        runner.stop()
        second.close()
        client.close()


def test_routed_deletes_without_pre_images_ask_the_index(
    mongo_url: str, es_url: str, unique: str
) -> None:
    """Pre-images turned off under the listener: deletes and moves find the old copy in the
    index (a refresh and an ids search), and the index stays exact."""
    client: pymongo.MongoClient[dict[str, Any]] = pymongo.MongoClient(mongo_url)
    db = f"nopre{unique}"
    rng = random.Random(5)
    shaped.seed(client[db], 60, rng)
    listener = _listener(db, es_url)
    backend = MemoryLeaseBackend()
    runner = make_runner(mongo_url, db, backend, listener, "a").start()
    try:
        wait_until(lambda: runner.status()["state"] == "streaming", 120, what="synced")
        client[db].command("collMod", "orders", changeStreamPreAndPostImages={"enabled": False})
        for key in range(0, 60, 3):
            client[db].orders.update_one(
                {"_id": key}, {"$set": {"customer_id": f"c{rng.randrange(40)}"}}
            )
        for key in range(1, 60, 3):
            client[db].orders.delete_one({"_id": key})
        _caught_up(client, db, listener, es_url)
        _assert_equal(client, es_url, listener)
        session = listener._session
        assert session is not None and session.shaped is not None
        assert session.shaped.routes.asked > 0  # (the pre-image path would not ask)
    finally:
        runner.stop()
        listener.close()
        client.close()


@pytest.mark.parametrize(
    ("layout", "message"),
    [
        ({"orders": {"filters": {}}}, "unknown key filters in collections.orders"),
        ({"orders": {"routing": ""}}, "collections.orders.routing"),
        ({"orders": {"filter": {"a": {"$where": "1"}}}}, "$where"),
        ({"orders": {"include": "name"}}, "include"),
        ({"or$ders": {}}, "no collection name"),
    ],
)
def test_bad_collection_tables_are_refused(
    es_url: str, layout: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigurationError, match=message.replace("$", r"\$")):
        ElasticsearchSync(database="shop", collections=layout, es=es_url)


def test_partitions_of_a_shaped_listener_share_its_indexes(
    mongo_url: str, es_url: str, unique: str
) -> None:
    """``partitions = 2`` with three collections: each partition copies and streams the
    documents of its own ids, of every collection, into the same aliases."""
    client: pymongo.MongoClient[dict[str, Any]] = pymongo.MongoClient(mongo_url)
    db = f"part{unique}"
    rng = random.Random(11)
    shaped.seed(client[db], 120, rng)
    backend = MemoryLeaseBackend()
    store = MongoCheckpointStore(client, database=db)
    listeners, runners = [], []
    for p in range(2):
        listener = _listener(db, es_url)
        listener.partition = Partition(p, 2)
        listeners.append(listener)
        runners.append(make_runner(mongo_url, db, backend, listener, f"r{p}", store).start())
    try:
        for runner in runners:
            wait_until(lambda r=runner: r.status()["state"] == "streaming", 120, what="synced")
        shaped.workload(client, db, 200, rng, ids=150)
        shape = listeners[0].shape
        assert shape is not None
        _wait_equal(client, es_url, shape, 120)
        assert {lst.lease_name for lst in listeners} == {
            f"{db}-search.0-of-2",
            f"{db}-search.1-of-2",
        }
    finally:
        for runner in runners:
            runner.stop()
        for listener in listeners:
            listener.close()
        client.close()


def test_a_changed_filter_resyncs_each_partition_and_sweeps_what_it_keeps_out(
    mongo_url: str, es_url: str, unique: str
) -> None:
    """Partitions copy in place: after the orders filter narrows, each resumed partition finds
    its share copied by other rules, copies it again and deletes what the filter now keeps out
    (without the check they resume as they were; without the sweep the old orders stay)."""
    client: pymongo.MongoClient[dict[str, Any]] = pymongo.MongoClient(mongo_url)
    db = f"pflt{unique}"
    shaped.seed(client[db], 120, random.Random(5))
    backend = MemoryLeaseBackend()
    store = MongoCheckpointStore(client, database=db)

    def run(layout: dict[str, Any] | None, tag: str) -> tuple[ElasticsearchSync, list[Any]]:
        listeners, runners = [], []
        for p in range(2):
            listener = _listener(db, es_url, layout)
            listener.partition = Partition(p, 2)
            listeners.append(listener)
            runners.append(make_runner(mongo_url, db, backend, listener, f"{tag}{p}", store))
        try:
            for runner in runners:
                runner.start()
            for runner in runners:
                wait_until(lambda r=runner: r.status()["state"] == "streaming", 120, what="sync")
            shape = listeners[0].shape
            assert shape is not None
            _wait_equal(client, es_url, shape, 60)
            return listeners[0], [r.status() for r in runners]
        finally:
            for runner in runners:
                runner.stop()
            for listener in listeners:
                listener.close()

    try:
        _, first = run(None, "a")
        assert [s["sink_lost"] for s in first] == [0, 0]
        before = client[db].orders.count_documents({"status": {"$ne": "paid"}})
        assert before > 0  # (the narrower filter keeps some out)
        layout = shaped.layout(f"{db}-orders")
        layout["orders"]["filter"] = {"status": "paid"}
        _, second = run(layout, "b")
        assert [s["sink_lost"] for s in second] == [1, 1]
    finally:
        client.close()


def tag_customer(doc: dict[str, Any]) -> dict[str, Any] | None:
    """The customers' own transform (named in the layout as ``module:function``): Oslo's
    customers stay out, the others are tagged."""
    if doc.get("city") == "Oslo":
        return None
    return {**doc, "kind": "customer"}


def test_a_collection_transform_applies_to_its_documents_alone_in_copy_and_stream(
    mongo_url: str, es_url: str, unique: str
) -> None:
    client: pymongo.MongoClient[dict[str, Any]] = pymongo.MongoClient(mongo_url)
    db = f"xf{unique}"
    shaped.seed(client[db], 40, random.Random(9))
    layout = shaped.layout(f"{db}-orders")
    layout["customers"]["transform"] = f"{__name__}:tag_customer"
    listener = _listener(db, es_url, layout)
    runner = make_runner(
        mongo_url,
        db,
        MemoryLeaseBackend(),
        listener,
        "a",
        MongoCheckpointStore(client, database=db),
    ).start()
    http = connect(es_url)
    try:
        wait_until(lambda: runner.status()["state"] == "streaming", 120, what="synced")
        assert listener.shape is not None
        _wait_equal(client, es_url, listener.shape, 60)  # the copy
        customers = client[db].customers
        oslo = customers.find_one({"address.city": "Oslo"})
        lima = customers.find_one({"address.city": {"$ne": "Oslo"}})
        assert oslo is not None and lima is not None
        customers.update_one({"_id": oslo["_id"]}, {"$set": {"address.city": "Lima"}})
        customers.update_one({"_id": lima["_id"]}, {"$set": {"address.city": "Oslo"}})
        _caught_up(client, db, listener, es_url)
        _wait_equal(client, es_url, listener.shape, 60)  # the stream, both ways
        for key, held in ((oslo["_id"], True), (lima["_id"], False)):
            status, body = http.request("GET", f"/{db}-customers/_doc/{key}")
            assert (status == 200) is held, (key, status)
            if held:
                assert body["_source"]["kind"] == "customer"
        status, body = http.request("GET", f"/{db}-orders/_search?size=100")
        assert status == 200 and body["hits"]["hits"]
        assert all("kind" not in h["_source"] for h in body["hits"]["hits"])
    finally:
        http.close()
        runner.stop()
        listener.close()
        client.close()


def test_metrics_carry_the_collection_of_each_event_and_dead_letter(
    mongo_url: str, es_url: str, unique: str
) -> None:
    """``/metrics`` of a replica hosting a shaped listener that streamed real events: events,
    dead letters and lag per collection (an ``_id`` over Elasticsearch's 512 bytes is
    dead-lettered, under its own collection)."""
    client: pymongo.MongoClient[dict[str, Any]] = pymongo.MongoClient(mongo_url)
    db = f"met{unique}"
    shaped.seed(client[db], 10, random.Random(2))
    listener = _listener(db, es_url)
    store = MongoCheckpointStore(client, database=db)
    runner = make_runner(mongo_url, db, MemoryLeaseBackend(), listener, "a", store).start()
    try:
        wait_until(lambda: runner.status()["state"] == "streaming", 120, what="synced")
        for i in range(7):
            client[db].customers.update_one({"_id": f"c{i}"}, {"$set": {"name": f"n{i}"}})
        client[db].customers.insert_one({"_id": "x" * 600, "name": "too long an id"})
        _caught_up(client, db, listener, es_url)  # (one order event)
        hosted = SimpleNamespace(name="shop", elector=runner.elector, runner=runner)
        replica = SimpleNamespace(hosted=[hosted], jobs=None, started_at=1.0, problems=list)
        server = MetricsServer(replica, "127.0.0.1:0").start()
        try:
            with urllib.request.urlopen(f"{server.url}/metrics", timeout=5) as reply:
                body = reply.read().decode()
        finally:
            server.stop()
    finally:
        runner.stop()
        listener.close()
        client.close()

    def sample(name: str, collection: str) -> float:
        found = re.search(rf'{name}{{collection="{collection}",lease="shop"}} (\S+)', body)
        assert found, (name, collection, body[-3000:])
        return float(found.group(1))

    assert sample("singleton_collection_events_total", "customers") == 8
    assert sample("singleton_collection_events_total", "orders") == 1
    assert sample("singleton_collection_dead_letters_total", "customers") == 1
    assert sample("singleton_collection_dead_letters_total", "orders") == 0
    assert sample("singleton_collection_lag_seconds", "customers") >= 0


#: While true, the customers transform below cannot shape a customer named ``BAD...``.
REFUSING = {"on": True}


def refuse_bad(doc: dict[str, Any]) -> dict[str, Any] | None:
    """A customers transform that fails on some documents (they are dead-lettered)."""
    if REFUSING["on"] and str(doc.get("name", "")).startswith("BAD"):
        raise ValueError("a customer this transform cannot shape")
    return doc


def test_a_shaped_dead_letter_is_replayed_through_its_collections_rules(
    mongo_url: str, es_url: str, unique: str
) -> None:
    """A customer its collection's transform cannot shape is dead-lettered with the reason;
    once the rules can, ``dead-letters replay`` (the store's request) re-delivers it and it is
    indexed as the rules shape it, with no other event for it in between."""
    client: pymongo.MongoClient[dict[str, Any]] = pymongo.MongoClient(mongo_url)
    db = f"dlr{unique}"
    shaped.seed(client[db], 10, random.Random(4))
    layout = shaped.layout(f"{db}-orders")
    layout["customers"]["transform"] = f"{__name__}:refuse_bad"
    REFUSING["on"] = True
    listener = _listener(db, es_url, layout)
    store = MongoCheckpointStore(client, database=db)
    runner = make_runner(mongo_url, db, MemoryLeaseBackend(), listener, "a", store).start()
    letters = DeadLetterStore(client, database=db)
    http = connect(es_url)
    try:
        wait_until(lambda: runner.status()["state"] == "streaming", 120, what="synced")
        client[db].customers.insert_one({"_id": "bad", "name": "BAD one", "email": "b@x"})
        wait_until(lambda: letters.dead_letters.count_documents({}) == 1, 30, what="dead-lettered")
        [letter] = list(letters.dead_letters.find())
        assert "cannot shape" in str(letter), letter
        assert http.request("GET", f"/{db}-customers/_doc/bad")[0] == 404
        REFUSING["on"] = False
        assert letters.request_replay(listener.lease_name) == 1
        wait_until(lambda: letters.dead_letters.count_documents({}) == 0, 30, what="replayed")
        status, body = http.request("GET", f"/{db}-customers/_doc/bad")
        assert status == 200 and body["_source"] == {"name": "BAD one", "email": "b@x"}, body
        assert listener.shape is not None
        _wait_equal(client, es_url, listener.shape, 30)
    finally:
        REFUSING["on"] = False
        runner.stop()
        listener.close()
        http.close()
        client.close()


def test_a_document_a_field_rule_makes_invalid_is_dead_lettered_with_its_reason(
    mongo_url: str, es_url: str, unique: str
) -> None:
    """A rename moves a customer's ``label`` onto ``n``, which the index maps as a number: a
    label that is no number makes a document the index refuses. It is dead-lettered with the
    index's reason, in the copy and in the stream alike, and the others are indexed."""
    client: pymongo.MongoClient[dict[str, Any]] = pymongo.MongoClient(mongo_url)
    db = f"fr{unique}"
    client[db].customers.insert_many(
        [{"_id": "a", "label": "7"}, {"_id": "b", "label": "not a number"}]
    )
    listener = ElasticsearchSync(
        name=f"{db}-search",
        database=db,
        index=f"{db}-{{collection}}",
        collections={"customers": {"rename": {"label": "n"}}},
        mappings={"properties": {"n": {"type": "long"}}},
        es=es_url,
        ttl=1.0,
    )
    runner = make_runner(mongo_url, db, MemoryLeaseBackend(), listener, "a").start()
    letters = DeadLetterStore(client, database=db)
    http = connect(es_url)
    try:
        wait_until(lambda: runner.status()["state"] == "streaming", 120, what="synced")
        client[db].customers.insert_many(
            [{"_id": "c", "label": "8"}, {"_id": "d", "label": "nor this"}]
        )
        wait_until(lambda: letters.dead_letters.count_documents({}) == 2, 30, what="dead letters")
        reasons = {
            str(d["event"]["documentKey"]["_id"]): str(d)
            for d in letters.letters(listener.lease_name)
        }
        assert set(reasons) == {"b", "d"}, reasons
        assert all(
            "mapper_parsing_exception" in r or "failed to parse" in r for r in reasons.values()
        )
        for key, n in (("a", 7), ("c", 8)):
            status, body = http.request("GET", f"/{db}-customers/_doc/{key}")
            assert status == 200 and body["_source"] == {"n": str(n)}, body
        assert listener.shape is not None
    finally:
        runner.stop()
        listener.close()
        http.close()
        client.close()


def test_one_stream_reads_the_listed_collections_alone_into_one_checkpoint(
    mongo_url: str, es_url: str, unique: str
) -> None:
    """The stream is filtered on the server to the listed collections: writes to another
    collection of the database reach neither the sink nor an index, and the listener keeps one
    checkpoint for all of them (one lease, one position)."""
    client: pymongo.MongoClient[dict[str, Any]] = pymongo.MongoClient(mongo_url)
    db = f"os{unique}"
    shaped.seed(client[db], 20, random.Random(2))
    listener = _listener(db, es_url)
    store = MongoCheckpointStore(client, database=db)
    runner = make_runner(mongo_url, db, MemoryLeaseBackend(), listener, "a", store).start()
    http = connect(es_url)
    try:
        wait_until(lambda: runner.status()["state"] == "streaming", 120, what="synced")
        _caught_up(client, db, listener, es_url)
        before = runner.status()["events_handled"]
        client[db].unlisted.insert_many([{"_id": i} for i in range(50)])
        _caught_up(client, db, listener, es_url)  # (one event: the marker order)
        assert runner.status()["events_handled"] - before == 1
        _assert_equal(client, es_url, listener)
        assert http.request("GET", f"/{db}-unlisted")[0] == 404
        names = {c["_id"] for c in client[db].checkpoints.find({}, {"_id": 1})}
        assert names == {listener.lease_name}, names
    finally:
        runner.stop()
        listener.close()
        http.close()
        client.close()
