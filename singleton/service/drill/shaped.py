"""The drill's shaped layout (``singleton drill --shaped``): three collections into two indexes,
a filter, routing, field rules, and a workload that moves documents in and out of the filter,
changes their routing, deletes them and writes across collections in transactions."""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from listeners.elasticsearch.shape.collections import parse_shape
from listeners.elasticsearch.shape.verify import compare_shaped
from listeners.elasticsearch.verify import Diff
from singleton.service.dev.cluster import WriteGate, op_time

#: ``--related``: each order embeds its customer and its lines, and each line its product (two
#: levels, :mod:`listeners.elasticsearch.shape.relate`); lines and products are read by the
#: stream, not indexed.
RELATE = [
    {"from": "customers", "local": "customer_id", "as": "customer", "fields": ["name", "email"]},
    {"from": "order_lines", "foreign": "order_id", "as": "lines", "many": True,
     "fields": ["sku", "qty"], "sort": {"sku": 1},
     "relate": [{"from": "products", "local": "sku", "as": "product", "fields": ["title"]}]},
]  # fmt: skip
LINES = 400
PRODUCTS = 100


def layout(orders_index: str = "drill-orders", related: bool = False) -> dict[str, dict[str, Any]]:
    """``[listeners.collections]`` of the drill's shaped listener (the layout of
    docs/how-to/shaped-index.md),
    legacy orders going into ``orders_index``; with ``related``, orders embed :data:`RELATE`."""
    orders: dict[str, Any] = {"filter": {"status": {"$ne": "draft"}}, "routing": "customer_id"}
    if related:
        orders["relate"] = RELATE
    return {
        "orders": orders,
        "legacy_orders": {"index": orders_index},
        "customers": {
            "include": ["name", "email", "address"],
            "exclude": ["address.geo"],
            "rename": {"address.city": "city"},
        },
    }


LAYOUT = layout()
#: The shaped listener's index template: its aliases are drill-orders (orders and
#: legacy_orders) and drill-customers.
INDEX_TEMPLATE = "drill-{collection}"
STATUSES = ("draft", "open", "paid", "shipped")
CUSTOMERS = 40


def order(rng: random.Random) -> dict[str, Any]:
    return {
        "status": rng.choice(STATUSES),
        "customer_id": f"c{rng.randrange(CUSTOMERS)}",
        "total": rng.randrange(10_000),
        "lines": [{"sku": f"s{rng.randrange(100)}", "qty": rng.randrange(1, 5)}],
    }


def customer(rng: random.Random, key: int) -> dict[str, Any]:
    return {
        "name": f"name-{key}-{rng.randrange(1000)}",
        "email": f"c{key}@example.com",
        "phone": str(rng.randrange(10**9)),
        "address": {
            "city": rng.choice(["Oslo", "Lima", "Pune", "Kyiv"]),
            "street": f"{rng.randrange(100)} Main St",
            "geo": {"lat": rng.random(), "lon": rng.random()},
        },
    }


def seed(db: Any, n: int, rng: random.Random, related: bool = False) -> None:
    """``n`` orders, ``n // 2`` legacy orders (sharing ids with orders) and the customers (and
    with ``related``, order lines)."""
    if related:
        lines = [{"_id": i, **line(rng, n)} for i in range(LINES // 2)]
        db.order_lines.insert_many(lines)
        db.products.insert_many([{"_id": f"s{i}", **product(rng)} for i in range(PRODUCTS)])
    db.orders.insert_many([{"_id": i, **order(rng)} for i in range(n)])
    db.legacy_orders.insert_many([{"_id": i, **order(rng)} for i in range(max(1, n // 2))])
    db.customers.insert_many([{"_id": f"c{i}", **customer(rng, i)} for i in range(CUSTOMERS)])


def line(rng: random.Random, orders: int) -> dict[str, Any]:
    return {"order_id": rng.randrange(orders), "sku": f"s{rng.randrange(PRODUCTS)}", "qty": 1}


def product(rng: random.Random) -> dict[str, Any]:
    return {"title": f"title-{rng.randrange(10_000)}", "cost": rng.randrange(100)}


KINDS = ("insert", "status", "status", "reroute", "delete", "replace", "legacy", "customer")


def one_write(
    db: Any, rng: random.Random, ids: int, session: Any = None, related: bool = False
) -> tuple[str, bool]:
    """One random write; returns its kind and whether it changed anything (an update of a
    missing document writes no change event). ``related``: lines too (added, moved to another
    order, deleted) and products (retitled: every order with a line of it)."""
    kind = rng.choice(KINDS + (("line", "line", "move", "product") if related else ()))
    key = rng.randrange(ids)
    kw = {"session": session}
    res: Any
    if kind == "line" and rng.random() < 0.3:
        res = db.order_lines.delete_one({"_id": rng.randrange(LINES)}, **kw)
    elif kind == "line":
        res = db.order_lines.replace_one(
            {"_id": rng.randrange(LINES)}, line(rng, ids), upsert=True, **kw
        )
    elif kind == "product":
        key_p = f"s{rng.randrange(PRODUCTS)}"
        res = db.products.replace_one({"_id": key_p}, product(rng), upsert=True, **kw)
    elif kind == "move":
        moved = {"$set": {"order_id": rng.randrange(ids)}}
        res = db.order_lines.update_one({"_id": rng.randrange(LINES)}, moved, **kw)
    elif kind == "insert":
        res = db.orders.replace_one({"_id": key}, order(rng), upsert=True, **kw)
    elif kind == "status":  # in and out of the filter
        res = db.orders.update_one({"_id": key}, {"$set": {"status": rng.choice(STATUSES)}}, **kw)
    elif kind == "reroute":
        new = f"c{rng.randrange(CUSTOMERS)}"
        res = db.orders.update_one({"_id": key}, {"$set": {"customer_id": new}}, **kw)
    elif kind == "delete":
        res = db.orders.delete_one({"_id": key}, **kw)
    elif kind == "replace":
        res = db.orders.replace_one({"_id": key}, order(rng), **kw)
    elif kind == "legacy" and rng.random() < 0.3:
        res = db.legacy_orders.delete_one({"_id": key}, **kw)
    elif kind == "legacy":
        res = db.legacy_orders.replace_one({"_id": key}, order(rng), upsert=True, **kw)
    else:
        c = rng.randrange(CUSTOMERS)
        res = db.customers.replace_one({"_id": f"c{c}"}, customer(rng, c), upsert=True, **kw)
    changed = bool(
        getattr(res, "deleted_count", 0)
        or getattr(res, "modified_count", 0)
        or getattr(res, "upserted_id", None) is not None
    )
    return kind, changed


def workload(
    client: Any,
    database: str,
    ops: int,
    rng: random.Random,
    *,
    ids: int = 300,
    between: Callable[[int], None] | None = None,
) -> dict[str, int]:
    """``ops`` random writes (about one in eight a transaction of three, across collections);
    ``between(done)`` runs after each."""
    db = client[database]
    counts: dict[str, int] = {}
    for done in range(ops):
        if rng.random() < 0.125:
            with client.start_session() as session, session.start_transaction():
                for _ in range(3):
                    one_write(db, rng, ids, session)
            counts["txn"] = counts.get("txn", 0) + 1
        else:
            kind, _ = one_write(db, rng, ids)
            counts[kind] = counts.get(kind, 0) + 1
        if between is not None:
            between(done)
    return counts


@dataclass
class ShapedWriter:
    """The drill's writer for ``--shaped`` (the interface of
    :class:`singleton.service.dev.cluster.Writer`): :func:`one_write` at ``rate`` per second,
    about ``txn_share`` of them transactions of three writes across collections."""

    client: Any
    database: str
    rate: float
    seed: int = 7
    txn_share: float = 0.0
    ids: int = 300
    related: bool = False
    ops: int = 0
    failed: int = 0
    transactions: int = 0
    stop_event: threading.Event = field(default_factory=threading.Event)
    gate: WriteGate = field(default_factory=WriteGate)
    #: (ids are reused here: a deleted order may come back, so none is "resurrected")
    deleted: list[Any] = field(default_factory=list)
    log: list[tuple[float, tuple[int, int] | None]] = field(default_factory=list)

    def run(self) -> None:
        rng = random.Random(self.seed)
        db = self.client[self.database]
        next_at = time.monotonic()
        with self.client.start_session() as session:
            while not self.stop_event.is_set():
                with self.gate:
                    self._write(db, rng, session)
                next_at = max(next_at + 1.0 / self.rate, time.monotonic())
                self.stop_event.wait(max(0.0, next_at - time.monotonic()))
            self._last_plain(db, rng, session)

    def _write(self, db: Any, rng: random.Random, session: Any) -> None:
        """One write, or a transaction of three, counted if it was acknowledged."""
        txn = bool(self.txn_share) and rng.random() < self.txn_share
        try:
            if txn:
                with session.start_transaction():
                    changed = [
                        one_write(db, rng, self.ids, session, self.related)[1] for _ in range(3)
                    ]
                self.transactions += 1
            else:
                changed = [one_write(db, rng, self.ids, session, self.related)[1]]
            self.ops += 1
            if any(changed):  # (a write that changed nothing has no event to wait for)
                self.log.append((time.monotonic(), op_time(session, txn)))
        except Exception:  # refused or unknown outcome: not counted
            self.failed += 1

    def _last_plain(self, db: Any, rng: random.Random, session: Any) -> None:
        """Plain writes until one changes something: the log ends with an exact cluster time
        (as :class:`~singleton.service.dev.cluster.Writer` does)."""
        for _ in range(50):
            try:
                changed = one_write(db, rng, self.ids, session, self.related)[1]
            except Exception:  # the store is down: the caller's wait times out and says so
                self.failed += 1
                return
            self.ops += 1
            if changed:
                self.log.append((time.monotonic(), op_time(session)))
                return


def layout_toml(name: str, database: str, index: str, related: bool, **extra: Any) -> str:
    """The ``[[listeners]]`` table of the drill's shaped listener, with its collection tables."""
    lines = [
        "[[listeners]]",
        'use = "elasticsearch"',
        f"name = {json.dumps(name)}",
        f"database = {json.dumps(database)}",
        f"index = {json.dumps(index)}",
        *(f"{k} = {toml_value(v)}" for k, v in extra.items()),
    ]
    for collection, table in layout(related=related).items():
        lines.append(f"[listeners.collections.{collection}]")
        lines += [f"{k} = {toml_value(v)}" for k, v in table.items()]
    return "\n".join(lines) + "\n"


def toml_value(value: Any) -> str:
    """``value`` (strings, numbers, booleans, lists and tables of them) as TOML."""
    if isinstance(value, dict):
        return (
            "{ " + ", ".join(f"{json.dumps(k)} = {toml_value(v)}" for k, v in value.items()) + " }"
        )
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, bool):
        return "true" if value else "false"
    return json.dumps(value)


def compare(client: Any, database: str, es_url: str, related: bool = False) -> Diff:
    """The drill's shaped index against the shaped view of its collections, every alias in
    one :class:`~listeners.elasticsearch.verify.Diff` (ids prefixed by their alias)."""
    shape = parse_shape(database, layout(related=related), default_index=INDEX_TEMPLATE)
    merged = Diff()
    for alias, diff in compare_shaped(client, es_url, shape).items():
        merged.missing += [f"{alias}/{x}" for x in diff.missing]
        merged.stale += [f"{alias}/{x}" for x in diff.stale]
        merged.extra += [f"{alias}/{x}" for x in diff.extra]
        merged.unindexable += diff.unindexable
        merged.mongo_count += diff.mongo_count
        merged.es_count += diff.es_count
    return merged
