"""Related documents two levels deep on real servers (SecantusDB, osmem-server): an order embeds
its customer, who embeds her region, and its lines, each of which embeds its product and its
notes. Writes on all six collections (a region renamed, a product retitled, a note moved to
another line, a line moved to another order, a customer moved to another region, transactions)
through a planned handover: the index equals the joined view, document by document, after the
copy (the second level joined by a ``$lookup`` inside the first one's) and after the stream."""

from __future__ import annotations

import random
from typing import Any
from urllib.parse import quote

import pymongo

from listeners.checkpoints.stores import MongoCheckpointStore
from listeners.elasticsearch import ElasticsearchSync
from listeners.elasticsearch.transport import connect
from singleton.service.dev.embedded import wait_until
from singleton.testing import MemoryLeaseBackend
from tests.integration.listener_support import make_runner
from tests.integration.listeners.elasticsearch.test_es_relate import (
    _assert_equal,
    _caught_up,
    mongo_server,  # noqa: F401 (a fixture: a SecantusDB of this module's own, as there)
)
from tests.integration.listeners.elasticsearch.test_es_relate import (
    _listener as first_level_listener,
)

REGIONS, CUSTOMERS, ORDERS, LINES, PRODUCTS, NOTES = 4, 10, 40, 120, 15, 80


def layout() -> dict[str, Any]:
    return {
        "orders": {
            "relate": [
                {
                    "from": "customers",
                    "local": "customer_id",
                    "as": "customer",
                    "fields": ["name"],
                    "relate": [
                        {
                            "from": "regions",
                            "local": "region_id",
                            "as": "region",
                            "fields": ["label"],
                        }
                    ],
                },
                {
                    "from": "order_lines",
                    "foreign": "order_id",
                    "as": "lines",
                    "many": True,
                    "fields": ["sku", "qty"],
                    "sort": {"sku": 1},
                    "relate": [
                        {"from": "products", "local": "sku", "as": "product", "fields": ["title"]},
                        {
                            "from": "line_notes",
                            "foreign": "line_id",
                            "as": "notes",
                            "many": True,
                            "fields": ["text"],
                            "sort": {"text": 1},
                        },
                    ],
                },
            ],
        },
        "customers": {},  # (indexed too: the marker of _caught_up)
    }


def _listener(db: str, es_url: str) -> ElasticsearchSync:
    return first_level_listener(db, es_url, layout())


def _seed(db: Any, rng: random.Random) -> None:
    db.regions.insert_many([{"_id": f"r{i}", "label": f"region {i}"} for i in range(REGIONS)])
    db.customers.insert_many(
        [
            {"_id": f"c{i}", "name": f"n{i}", "region_id": f"r{i % REGIONS}"}
            for i in range(CUSTOMERS)
        ]
    )
    db.orders.insert_many([{"_id": i, "customer_id": f"c{i % CUSTOMERS}"} for i in range(ORDERS)])
    db.products.insert_many([{"_id": f"s{i}", "title": f"t{i}"} for i in range(PRODUCTS)])
    db.order_lines.insert_many(
        [
            {
                "_id": n,
                "order_id": rng.randrange(ORDERS),
                "sku": f"s{rng.randrange(PRODUCTS)}",
                "qty": 1,
            }
            for n in range(LINES)
        ]
    )
    db.line_notes.insert_many(
        [{"_id": n, "line_id": rng.randrange(LINES), "text": f"x{n}"} for n in range(NOTES)]
    )


#: the writes of second-level documents alone (a root's own or a line's event would rebuild
#: it anyway, and hide a second-level change that did not)
SECOND_LEVEL = ("region", "product", "note", "unnote")


def _write(db: Any, rng: random.Random, session: Any = None, kinds: tuple[str, ...] = ()) -> None:
    kw = {"session": session}
    kind = rng.choice(kinds or (*SECOND_LEVEL, "line", "customer", "order"))
    if kind == "region":  # second level, local: every order of every customer of the region
        db.regions.update_one(
            {"_id": f"r{rng.randrange(REGIONS)}"}, {"$set": {"label": f"L{rng.random()}"}}, **kw
        )
    elif kind == "product":  # second level, local: every order with a line of it
        db.products.replace_one(
            {"_id": f"s{rng.randrange(PRODUCTS + 2)}"},
            {"title": f"T{rng.randrange(999)}"},
            upsert=True,
            **kw,
        )
    elif kind == "note":  # second level, foreign: a note written, or moved to another line
        db.line_notes.replace_one(
            {"_id": rng.randrange(NOTES + 20)},
            {"line_id": rng.randrange(LINES + 5), "text": f"y{rng.randrange(99)}"},
            upsert=True,
            **kw,
        )
    elif kind == "unnote":
        db.line_notes.delete_one({"_id": rng.randrange(NOTES + 20)}, **kw)
    elif kind == "line":  # first level: a line moved to another order, or to another product
        db.order_lines.update_one(
            {"_id": rng.randrange(LINES)},
            {
                "$set": rng.choice(
                    [
                        {"order_id": rng.randrange(ORDERS)},
                        {"sku": f"s{rng.randrange(PRODUCTS + 2)}"},
                    ]
                )
            },
            **kw,
        )
    elif kind == "customer":  # first level: a customer moved to another region (or none)
        db.customers.update_one(
            {"_id": f"c{rng.randrange(CUSTOMERS)}"},
            {"$set": {"region_id": f"r{rng.randrange(REGIONS + 1)}"}},
            **kw,
        )
    else:
        db.orders.update_one(
            {"_id": rng.randrange(ORDERS)},
            {"$set": {"customer_id": f"c{rng.randrange(CUSTOMERS)}"}},
            **kw,
        )


def _workload(
    client: Any, db: str, ops: int, rng: random.Random, kinds: tuple[str, ...] = ()
) -> None:
    for _ in range(ops):
        if rng.random() < 0.15:
            with client.start_session() as s, s.start_transaction():
                for _ in range(3):
                    _write(client[db], rng, s, kinds)
        else:
            _write(client[db], rng, kinds=kinds)


def test_two_levels_of_related_documents_stay_exact_through_writes_and_a_handover(
    mongo_url: str, es_url: str, unique: str
) -> None:
    client: pymongo.MongoClient[dict[str, Any]] = pymongo.MongoClient(mongo_url)
    db = f"rel2{unique}"
    rng = random.Random(29)
    _seed(client[db], rng)
    backend = MemoryLeaseBackend()
    store = MongoCheckpointStore(client, database=db)
    a_listener, b_listener = _listener(db, es_url), _listener(db, es_url)
    a = make_runner(mongo_url, db, backend, a_listener, "a", store).start()
    b = None
    try:
        wait_until(lambda: a.status()["state"] == "streaming", 120, what="A synced")
        _caught_up(client, db, a_listener, es_url)
        _assert_equal(client, es_url, a_listener)  # the copy's nested $lookup
        # what one order's document holds, spelled out once
        assert a_listener.shape is not None
        line = client[db].order_lines.find_one({}, sort=[("_id", 1)])
        assert line is not None
        es_id = quote(a_listener.shape.collections["orders"].es_id(line["order_id"]), safe="")
        http = connect(es_url)
        status, found = http.request("GET", f"/{db}-orders/_doc/{es_id}")
        http.close()
        assert status == 200, found
        source = found["_source"]
        assert set(source["customer"]) == {"name", "region"}
        assert set(source["customer"]["region"]) == {"label"}
        mine = next(x for x in source["lines"] if x["sku"] == line["sku"])
        assert set(mine) == {"sku", "qty", "product", "notes"}
        _workload(client, db, 200, rng)
        b = make_runner(mongo_url, db, backend, b_listener, "b", store).start()
        a.stop()
        wait_until(lambda: b.status()["state"] == "streaming", 60, what="B streaming")
        _workload(client, db, 200, rng)
        _caught_up(client, db, b_listener, es_url)
        _assert_equal(client, es_url, b_listener)
        _workload(client, db, 40, rng, SECOND_LEVEL)
        _caught_up(client, db, b_listener, es_url)
        _assert_equal(client, es_url, b_listener)
        counts = b_listener.by_collection.snapshot()["orders"]
        assert counts["rebuilds"] > 0 and counts["pending_rebuilds"] == 0
    finally:
        a.stop()
        if b is not None:
            b.stop()
        a_listener.close()
        b_listener.close()
        client.close()


def test_a_product_retitled_reaches_every_order_with_a_line_of_it(
    mongo_url: str, es_url: str, unique: str
) -> None:
    """The fan-out of a second-level change: one product, 300 lines, 150 orders."""
    client: pymongo.MongoClient[dict[str, Any]] = pymongo.MongoClient(mongo_url)
    db = f"rel2f{unique}"
    client[db].products.insert_one({"_id": "p", "title": "before"})
    client[db].orders.insert_many([{"_id": i, "customer_id": None} for i in range(150)])
    client[db].order_lines.insert_many(
        [{"_id": n, "order_id": n % 150, "sku": "p", "qty": n} for n in range(300)]
    )
    listener = _listener(db, es_url)
    runner = make_runner(mongo_url, db, MemoryLeaseBackend(), listener, "a").start()
    try:
        wait_until(lambda: runner.status()["state"] == "streaming", 120, what="synced")
        client[db].products.update_one({"_id": "p"}, {"$set": {"title": "after"}})
        _caught_up(client, db, listener, es_url)
        diffs = _assert_equal(client, es_url, listener)
        assert diffs[f"{db}-orders"].mongo_count == 150
        assert listener.by_collection.snapshot()["orders"]["rebuilds"] >= 150
    finally:
        runner.stop()
        listener.close()
        client.close()
