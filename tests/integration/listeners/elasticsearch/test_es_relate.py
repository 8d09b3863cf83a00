"""Related documents embedded (``relate``) on real servers: an order carries its customer and
its lines; writes on all three sides (re-pointing an order's customer, moving lines between
orders, deletes, transactions) through a planned handover, and a customer update fanning out
to thousands of orders; the index equals the joined view, document by document."""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import pymongo
import pytest

from listeners.checkpoints.stores import MongoCheckpointStore
from listeners.elasticsearch import ElasticsearchSync
from listeners.elasticsearch.shape import relate
from listeners.elasticsearch.shape.verify import compare_shaped
from listeners.elasticsearch.transport import connect
from listeners.stream.partition import Partition
from singleton.service.dev.embedded import MongoServer, wait_until
from singleton.testing import MemoryLeaseBackend
from tests.integration.listener_support import make_runner

CUSTOMERS, ORDERS = 12, 80


def layout() -> dict[str, Any]:
    return {
        "orders": {
            "filter": {"status": {"$ne": "draft"}},
            "routing": "customer_id",
            "relate": [
                {
                    "from": "customers",
                    "local": "customer_id",
                    "as": "customer",
                    "fields": ["name", "address.city"],
                },
                {
                    "from": "order_lines",
                    "foreign": "order_id",
                    "as": "lines",
                    "many": True,
                    "fields": ["sku", "qty"],
                    "sort": {"sku": 1},
                },
            ],
        },
        "customers": {},
    }


@pytest.fixture(scope="module")
def mongo_server() -> Iterator[MongoServer]:
    """A SecantusDB of this module's own: it scans its oplog to open a change stream, so the
    thousands of writes here would slow down every other test sharing a server with them."""
    with MongoServer() as server:
        yield server


def _listener(db: str, es_url: str, collections: dict[str, Any] | None = None) -> ElasticsearchSync:
    return ElasticsearchSync(
        name=f"{db}-search",
        database=db,
        index=f"{db}-{{collection}}",
        collections=collections or layout(),
        es=es_url,
        ttl=1.0,
    )


def _seed(db: Any, rng: random.Random) -> None:
    db.customers.insert_many(
        [{"_id": f"c{i}", "name": f"n{i}", "address": {"city": "Oslo"}} for i in range(CUSTOMERS)]
    )
    db.orders.insert_many(
        [
            {"_id": i, "status": rng.choice(["open", "draft"]), "customer_id": f"c{i % 10}"}
            for i in range(ORDERS)
        ]
    )
    db.order_lines.insert_many(
        [
            {"_id": n, "order_id": rng.randrange(ORDERS), "sku": f"s{rng.randrange(50)}", "qty": 1}
            for n in range(200)
        ]
    )


def _write(db: Any, rng: random.Random, session: Any = None) -> None:
    kw = {"session": session}
    kind = rng.choice(["customer", "repoint", "move", "line", "unline", "status", "order"])
    if kind == "customer":
        c = rng.randrange(CUSTOMERS)
        new = {"name": f"n{c}-{rng.randrange(999)}", "address": {"city": rng.choice("ABC")}}
        db.customers.replace_one({"_id": f"c{c}"}, new, upsert=True, **kw)
    elif kind == "repoint":
        db.orders.update_one(
            {"_id": rng.randrange(ORDERS)},
            {"$set": {"customer_id": f"c{rng.randrange(CUSTOMERS + 2)}"}},  # some missing
            **kw,
        )
    elif kind == "move":  # a line moves to another order
        db.order_lines.update_one(
            {"_id": rng.randrange(200)}, {"$set": {"order_id": rng.randrange(ORDERS)}}, **kw
        )
    elif kind == "line":
        db.order_lines.replace_one(
            {"_id": rng.randrange(260)},
            {"order_id": rng.randrange(ORDERS), "sku": f"s{rng.randrange(50)}", "qty": 2},
            upsert=True,
            **kw,
        )
    elif kind == "unline":
        db.order_lines.delete_one({"_id": rng.randrange(260)}, **kw)
    elif kind == "status":
        db.orders.update_one(
            {"_id": rng.randrange(ORDERS)}, {"$set": {"status": rng.choice(["open", "draft"])}}
        )
    else:
        key = rng.randrange(ORDERS + 10)
        if rng.random() < 0.3:
            db.orders.delete_one({"_id": key}, **kw)
        else:
            db.orders.replace_one(
                {"_id": key}, {"status": "open", "customer_id": f"c{key % 7}"}, upsert=True, **kw
            )


def _workload(client: Any, db: str, ops: int, rng: random.Random) -> None:
    for _ in range(ops):
        if rng.random() < 0.15:
            with client.start_session() as s, s.start_transaction():
                for _ in range(3):
                    _write(client[db], rng, s)
        else:
            _write(client[db], rng)


def _caught_up(client: Any, db: str, listener: ElasticsearchSync, es_url: str) -> None:
    """Replace a marker customer (new content each time) and wait until it is indexed. Not an
    order: a rebuild triggered by an earlier event may read the marker order as it is already
    (the index then holds newer content under an older version, until its own event), so a
    root cannot tell how far the stream is; a customer is indexed from its own event."""
    mark = uuid.uuid4().hex
    client[db].customers.replace_one({"_id": "~end"}, {"name": mark}, upsert=True)
    assert listener.shape is not None
    es_id = quote(listener.shape.collections["customers"].es_id("~end"), safe="")
    http = connect(es_url)

    def indexed() -> bool:
        status, body = http.request("GET", f"/{db}-customers/_doc/{es_id}")
        return status == 200 and body["_source"].get("name") == mark

    try:
        wait_until(indexed, 120, interval=0.1, what="the marker customer indexed")
    finally:
        http.close()


def _assert_equal(client: Any, es_url: str, listener: ElasticsearchSync) -> dict[str, Any]:
    assert listener.shape is not None
    diffs = compare_shaped(client, es_url, listener.shape)
    assert all(d.ok for d in diffs.values()), {a: str(d) for a, d in diffs.items()}
    return diffs


def test_related_documents_stay_exact_through_writes_on_every_side_and_a_handover(
    mongo_url: str, es_url: str, unique: str
) -> None:
    client: pymongo.MongoClient[dict[str, Any]] = pymongo.MongoClient(mongo_url)
    db = f"rel{unique}"
    rng = random.Random(17)
    _seed(client[db], rng)
    backend = MemoryLeaseBackend()
    store = MongoCheckpointStore(client, database=db)
    a_listener, b_listener = _listener(db, es_url), _listener(db, es_url)
    a = make_runner(mongo_url, db, backend, a_listener, "a", store).start()
    b = None
    try:
        wait_until(lambda: a.status()["state"] == "streaming", 120, what="A synced")
        _caught_up(client, db, a_listener, es_url)
        _assert_equal(client, es_url, a_listener)  # the copy's joins ($lookup)
        http = connect(es_url)
        es_id = quote(a_listener.shape.collections["orders"].es_id(1), safe="")  # type: ignore[union-attr]
        order = client[db].orders.find_one({"_id": 1})
        assert order is not None
        found = http.request("GET", f"/{db}-orders/_doc/{es_id}?routing={order['customer_id']}")
        http.close()
        if order["status"] != "draft":
            assert "customer" in found[1]["_source"] and "lines" in found[1]["_source"]
        _workload(client, db, 250, rng)
        b = make_runner(mongo_url, db, backend, b_listener, "b", store).start()
        a.stop()
        wait_until(lambda: b.status()["state"] == "streaming", 60, what="B streaming")
        _workload(client, db, 250, rng)
        _caught_up(client, db, b_listener, es_url)
        _assert_equal(client, es_url, b_listener)
    finally:
        a.stop()
        if b is not None:
            b.stop()
        a_listener.close()
        b_listener.close()
        client.close()


def test_a_customer_update_fans_out_to_every_order_in_chunks(
    mongo_url: str, es_url: str, unique: str
) -> None:
    client: pymongo.MongoClient[dict[str, Any]] = pymongo.MongoClient(mongo_url)
    db = f"fan{unique}"
    n = 2 * relate.CHUNK + 500  # three chunks
    client[db].customers.insert_one({"_id": "c1", "name": "before"})
    client[db].orders.insert_many(
        [{"_id": i, "status": "open", "customer_id": "c1"} for i in range(n)]
    )
    listener = _listener(db, es_url)
    runner = make_runner(mongo_url, db, MemoryLeaseBackend(), listener, "a").start()
    try:
        wait_until(lambda: runner.status()["state"] == "streaming", 120, what="synced")
        client[db].customers.update_one({"_id": "c1"}, {"$set": {"name": "after"}})
        _caught_up(client, db, listener, es_url)
        diffs = _assert_equal(client, es_url, listener)
        assert diffs[f"{db}-orders"].mongo_count == n
        counts = listener.by_collection.snapshot()["orders"]
        assert counts["rebuilds"] >= n and counts["pending_rebuilds"] == 0
    finally:
        runner.stop()
        listener.close()
        client.close()


def test_partitions_rebuild_only_their_own_roots(mongo_url: str, es_url: str, unique: str) -> None:
    """``partitions = 2``: a customer's event reaches both partitions (whatever the customer's
    own partition), and each rebuilds only the orders of its own ids."""
    client: pymongo.MongoClient[dict[str, Any]] = pymongo.MongoClient(mongo_url)
    db = f"relp{unique}"
    n = 400
    client[db].customers.insert_one({"_id": "c1", "name": "before"})
    client[db].orders.insert_many(
        [{"_id": i, "status": "open", "customer_id": "c1"} for i in range(n)]
    )
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
        client[db].customers.update_one({"_id": "c1"}, {"$set": {"name": "after"}})
        shape = listeners[0].shape
        assert shape is not None

        def equal() -> bool:
            return all(d.ok for d in compare_shaped(client, es_url, shape).values())

        wait_until(equal, 120, interval=0.5, what="both partitions rebuilt their orders")
        rebuilt = [lst.by_collection.snapshot()["orders"]["rebuilds"] for lst in listeners]
        assert sum(rebuilt) == n and all(0 < r < n for r in rebuilt), rebuilt
    finally:
        for runner in runners:
            runner.stop()
        for listener in listeners:
            listener.close()
        client.close()
