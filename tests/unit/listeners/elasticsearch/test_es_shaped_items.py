"""A shaped listener's bulk actions, without servers: which writes and deletes an event makes,
under which routing and version, and where a document is looked for when no pre-image tells."""

from __future__ import annotations

import json
from typing import Any

import pytest
from bson import ObjectId

from listeners.elasticsearch.bulk import BulkItem, DeadLetter
from listeners.elasticsearch.shape.collections import (
    moved_version,
    parse_shape,
    routing_value,
    write_version,
)
from listeners.elasticsearch.shape.items import ShapedItems, pending_key, touches
from listeners.elasticsearch.versioning import EventVersioner, timestamp_version
from singleton.errors import UnindexableError, VersionOverflowError

LAYOUT = {
    "orders": {"filter": {"status": {"$ne": "draft"}}, "routing": "customer_id"},
    "legacy_orders": {"index": "orders"},
    "customers": {"include": ["name"]},
}


class Versions(EventVersioner):
    """The version of an event is its ``v`` field (the tests' own oplog order)."""

    def version(self, event: Any, ts: Any = None) -> int:
        return int(event["v"])


def _items(asked: list[tuple[str, str]] | None = None, held: set[Any] | None = None) -> Any:
    dead: list[DeadLetter] = []

    def routes(index: str, es_id: str) -> set[str | None]:
        if asked is not None:
            asked.append((index, es_id))
        return set(held or ())

    shape = parse_shape("shop", LAYOUT, default_index="{collection}")
    return ShapedItems(shape, dead.extend, lambda c, k: None, routes), dead


def _event(op: str, coll: str, key: Any, v: int, **fields: Any) -> dict[str, Any]:
    return {
        "_id": {"_data": f"{v:08x}"},
        "operationType": op,
        "ns": {"db": "shop", "coll": coll},
        "documentKey": {"_id": key},
        "v": v,
        **fields,
    }


def _actions(items: ShapedItems, *events: dict[str, Any]) -> list[dict[str, Any]]:
    pending: dict[str, BulkItem] = {}
    assert items.collect(list(events), 0, Versions(), pending, {}) == len(events)
    out = []
    for item in pending.values():
        head = json.loads(item.lines.split(b"\n", 1)[0])
        ((op, meta),) = head.items()
        out.append({"op": op, **meta})
    return sorted(out, key=lambda a: (a["_id"], a.get("routing") or "", a["version"]))


def test_a_move_deletes_the_old_copy_under_an_older_version_than_the_write() -> None:
    items, _ = _items()
    old = {"_id": 1, "status": "open", "customer_id": "c1"}
    new = {"_id": 1, "status": "open", "customer_id": "c2"}
    actions = _actions(
        items, _event("update", "orders", 1, 10, fullDocument=new, fullDocumentBeforeChange=old)
    )
    assert actions == [
        {"op": "delete", "_index": "orders", "_id": "orders$~i:1", "routing": "c1",
         "version": 20, "version_type": "external"},
        {"op": "index", "_index": "orders", "_id": "orders$~i:1", "routing": "c2",
         "version": 21, "version_type": "external"},
    ]  # fmt: skip
    assert moved_version(10) < write_version(10) < moved_version(11)


def test_leaving_the_filter_deletes_under_the_current_routing() -> None:
    items, _ = _items()
    doc = {"_id": 1, "status": "draft", "customer_id": "c1"}
    pre = {**doc, "status": "open"}
    actions = _actions(
        items, _event("update", "orders", 1, 5, fullDocument=doc, fullDocumentBeforeChange=pre)
    )
    assert [(a["op"], a["routing"], a["version"]) for a in actions] == [("delete", "c1", 11)]


def test_a_delete_goes_to_the_routing_of_its_pre_image() -> None:
    items, _ = _items()
    pre = {"_id": 1, "status": "open", "customer_id": "c7"}
    actions = _actions(items, _event("delete", "orders", 1, 5, fullDocumentBeforeChange=pre))
    assert [(a["op"], a["routing"], a["version"]) for a in actions] == [("delete", "c7", 11)]


def test_without_a_pre_image_the_index_is_asked_and_the_batch_counts() -> None:
    asked: list[tuple[str, str]] = []
    items, _ = _items(asked, held={"c3"})
    doc = {"_id": 1, "status": "open", "customer_id": "c9"}
    actions = _actions(
        items,
        _event("insert", "orders", 1, 4, fullDocument=doc),  # no lookup: nothing before it
        _event("delete", "orders", 1, 5),
    )
    assert asked == [("orders", "orders$~i:1")]
    # the index held it under c3; this batch's own insert under c9: both are deleted
    assert [(a["op"], a["routing"], a["version"]) for a in actions] == [
        ("delete", "c3", 11),
        ("delete", "c9", 11),
    ]


def test_an_update_that_leaves_the_routing_field_alone_asks_nothing() -> None:
    asked: list[tuple[str, str]] = []
    items, _ = _items(asked)
    doc = {"_id": 1, "status": "paid", "customer_id": "c1"}
    described = {"updatedFields": {"status": "paid"}, "removedFields": []}
    _actions(items, _event("update", "orders", 1, 4, fullDocument=doc, updateDescription=described))
    assert asked == []
    moved = {"updatedFields": {"customer_id": "c1"}, "removedFields": []}
    _actions(items, _event("update", "orders", 1, 5, fullDocument=doc, updateDescription=moved))
    assert asked == [("orders", "orders$~i:1")]


def test_collections_sharing_an_index_get_their_own_ids_and_fields_apply() -> None:
    items, _ = _items()
    actions = _actions(
        items,
        _event("insert", "legacy_orders", 1, 3, fullDocument={"_id": 1, "x": 1}),
        _event("insert", "customers", "c1", 4, fullDocument={"_id": "c1", "name": "A", "pw": 1}),
    )
    assert [(a["_index"], a["_id"]) for a in actions] == [
        ("customers", "c1"),
        ("orders", "legacy_orders$~i:1"),
    ]
    pending: dict[str, BulkItem] = {}
    items.collect(
        [_event("insert", "customers", "c1", 4, fullDocument={"_id": "c1", "name": "A", "pw": 1})],
        0,
        Versions(),
        pending,
        {},
    )
    (item,) = pending.values()
    assert json.loads(item.lines.split(b"\n")[1]) == {"name": "A"}


def test_events_of_other_collections_are_skipped_and_drops_stop_the_batch() -> None:
    items, _ = _items()
    pending: dict[str, BulkItem] = {}
    events = [
        _event("insert", "other", 1, 3, fullDocument={"_id": 1}),
        {"operationType": "drop", "ns": {"db": "shop", "coll": "orders"}, "v": 4},
        _event("insert", "customers", "c1", 5, fullDocument={"_id": "c1"}),
    ]
    assert items.collect(events, 0, Versions(), pending, {}) == 1
    assert pending == {}
    assert items.counts.snapshot() == {}


def test_a_routing_of_the_wrong_type_is_a_dead_letter() -> None:
    items, dead = _items()
    doc = {"_id": 1, "status": "open", "customer_id": [1, 2]}
    assert _actions(items, _event("insert", "orders", 1, 3, fullDocument=doc)) == []
    (letter,) = dead
    assert "routing field customer_id holds a list" in letter.reason


def test_routing_values() -> None:
    assert routing_value("c1", "p") == "c1"
    assert routing_value(7, "p") == "7"
    oid = ObjectId()
    assert routing_value(oid, "p") == str(oid)
    assert routing_value(None, "p") is None
    for bad in ("", 1.5, True, {"a": 1}):
        with pytest.raises(UnindexableError):
            routing_value(bad, "p")


def test_touches_names_the_path_its_parents_and_children() -> None:
    assert touches({"updatedFields": {"a.b": 1}}, "a.b")
    assert touches({"updatedFields": {"a": {}}}, "a.b")
    assert touches({"removedFields": ["a.b.c"]}, "a.b")
    assert not touches({"updatedFields": {"a.bc": 1}}, "a.b")
    assert touches({"truncatedArrays": [{"field": "a", "newSize": 1}]}, "a.b")


def test_the_digest_names_the_rules_of_each_index() -> None:
    shape = parse_shape("shop", LAYOUT, default_index="{collection}")
    other = parse_shape(
        "shop", {**LAYOUT, "orders": {"routing": "customer_id"}}, default_index="{collection}"
    )
    assert shape.digest("orders") != other.digest("orders")
    assert shape.digest("customers") == other.digest("customers")
    assert pending_key("i", "1", None) != pending_key("i", "1", "c1")


def test_versions_stay_within_sixty_three_bits() -> None:
    from bson.timestamp import Timestamp

    v = timestamp_version(Timestamp(2**32 - 1, 0))
    assert write_version(v) < 2**63
    with pytest.raises(VersionOverflowError):
        write_version(2**62)


def test_a_dead_letter_of_a_shaped_listener_replays_as_an_event_of_its_collection() -> None:
    """``singleton dead-letters replay`` re-delivers the record as a change event: it must name
    the collection (the shape picks the rules by it) and the MongoDB ``_id`` (not the prefixed
    Elasticsearch id)."""
    from listeners.elasticsearch.deadletters import letter_record

    items, dead = _items()
    doc = {"_id": 1, "status": "open", "customer_id": 2.5}  # a routing of the wrong type
    _actions(items, _event("insert", "legacy_orders", 1, 3, fullDocument={"_id": 1, "x": 1}))
    _actions(items, _event("insert", "orders", 1, 4, fullDocument=doc))
    (letter,) = dead
    record = letter_record(letter)
    assert record["ns"] == {"coll": "orders"}
    assert record["documentKey"] == {"_id": 1} and record["doc_id"] == "orders$~i:1"
    assert record["operationType"] == "insert" and record["_id"] == {"_data": f"{4:08x}"}
