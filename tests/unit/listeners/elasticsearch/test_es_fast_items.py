"""The stream's bulk body, made by :meth:`ItemMaker.collect` with its inline case, is byte for byte
the body of the per-event mapping it replaced: each event's id by ``doc_id``, its version from its
resume token, its source by ``source_of``, its action line as ``json.dumps`` writes it, the last
write of each document kept. Over BSON-decoded documents of every type (Hypothesis), ids of every
kind, every write operation, drops, dead letters, and SecantusDB and mongod tokens."""

from __future__ import annotations

import datetime
import json
import uuid
from collections.abc import Sequence
from decimal import Decimal
from typing import Any

import bson
import pytest
from bson import ObjectId
from bson.binary import Binary, UuidRepresentation
from bson.codec_options import CodecOptions
from bson.decimal128 import Decimal128
from bson.int64 import Int64
from bson.timestamp import Timestamp
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from listeners.elasticsearch.bulk import BulkItem, DeadLetter
from listeners.elasticsearch.deadletters import letter_record
from listeners.elasticsearch.documents import doc_id, source_of
from listeners.elasticsearch.items import DROPS, ItemMaker
from listeners.elasticsearch.versioning import EventVersioner
from singleton.errors import UnindexableError

#: As the replica's client decodes (``singleton.drivers.mongo.client``: tz-aware datetimes).
CODEC = CodecOptions(tz_aware=True, uuid_representation=UuidRepresentation.STANDARD)
NAN, INF = float("nan"), float("inf")

_keys = st.text(st.characters(exclude_characters="\x00.$"), min_size=1, max_size=5)
_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**31), 2**31 - 1),
    st.integers(-(2**63), 2**63 - 1),  # int64 past int32 (decoded as Int64)
    st.floats(),  # 0.1, -0.0, NaN, the infinities
    st.text(max_size=20),  # non-ASCII too
    st.builds(lambda b: ObjectId(bytes(b)), st.binary(min_size=12, max_size=12)),
    st.datetimes(
        min_value=datetime.datetime(1, 1, 1), max_value=datetime.datetime(9999, 12, 31)
    ).map(lambda d: d.replace(microsecond=d.microsecond // 1000 * 1000)),
    st.binary(max_size=20),
    st.builds(lambda b: Binary(b, 4), st.binary(min_size=16, max_size=16)),
    st.builds(Binary, st.binary(max_size=20), st.sampled_from([1, 2, 5, 128])),
    st.decimals(
        min_value=-(10**20), max_value=10**20, allow_nan=False, allow_infinity=False, places=4
    )
    .filter(lambda d: len(d.as_tuple().digits) <= 34)  # (what Decimal128 holds)
    .map(Decimal128),
    st.sampled_from([Decimal128("NaN"), Decimal128("-0"), Decimal128("1E+300")]),
    st.uuids(),
    st.builds(Timestamp, st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1)),
)
_values = st.recursive(
    _scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(_keys, inner, max_size=4)),
    max_leaves=12,
)
_ids = st.one_of(
    st.integers(-(2**31), 2**31 - 1),
    st.integers(2**31, 2**63 - 1),
    st.builds(lambda b: ObjectId(bytes(b)), st.binary(min_size=12, max_size=12)),
    st.text(max_size=6),
    st.sampled_from(["~x", "", "65a0f0000000000000000001", "x" * 600]),
    st.none(),
    st.booleans(),
    st.dictionaries(_keys, st.integers(0, 9), max_size=2),
)
_OPS = ["insert", "insert", "update", "replace", "delete"]


def _token(i: int, mongod: bool) -> dict[str, str]:
    """A resume token as SecantusDB writes it (BSON ``{s, t, ...}``) or as mongod does
    (KeyString: the cluster time, version 1, token type 128, txnOpIndex 0)."""
    seconds, inc = 1_796_000_000 + i // 7, i % 7 + 1
    if mongod:
        raw = bytes([130]) + seconds.to_bytes(4, "big") + inc.to_bytes(4, "big")
        return {"_data": (raw + bytes([43, 2, 44, 1, 0, 41, 4])).hex()}
    raw = bson.encode({"s": 1000 + i, "t": Timestamp(seconds, inc), "n": "db.c", "k": {"_id": i}})
    return {"_data": raw.hex()}


def _events(
    writes: Sequence[tuple[str, Any, dict[str, Any] | None]], mongod: bool = False
) -> list[dict[str, Any]]:
    """Change events as the stream decodes them (BSON encoded, then decoded with the replica's
    codec), the sync's fields only."""
    events = []
    for i, (op, key, doc) in enumerate(writes):
        event: dict[str, Any] = {"_id": _token(i, mongod), "operationType": op}
        if op in DROPS:
            events.append(event)
            continue
        if op != "delete":
            event["fullDocument"] = None if doc is None else {"_id": key, **doc}
        event["documentKey"] = {"_id": key}
        events.append(event)
    try:
        raw = bson.encode({"events": events}, codec_options=CODEC)
    except (bson.errors.InvalidDocument, OverflowError, ValueError):
        assume(False)  # (no BSON form: the stream cannot carry it)
    decoded: list[dict[str, Any]] = bson.decode(raw, CODEC)["events"]
    return decoded


def _reference(events: Sequence[dict[str, Any]], index: str) -> tuple[list[bytes], list[str]]:
    """The per-event mapping as it was: each write's item (and why one was dead-lettered),
    the last write per document kept, stopping at a drop."""
    versioner = EventVersioner()
    pending: dict[str, bytes] = {}
    dead: list[str] = []
    for event in events:
        op = event["operationType"]
        if op in DROPS:
            break
        key = event["documentKey"]["_id"]
        version = versioner._version(event, None)  # (the general path: the old code)
        doc = event.get("fullDocument")
        if op == "update" and doc is None:
            continue  # looked up after a later delete: that delete follows
        try:
            es_id = doc_id(key)
            source = None if op == "delete" else source_of(doc or {})
        except (UnindexableError, ValueError, TypeError) as exc:
            dead.append(f"cannot index: {exc}")
            continue
        action = "delete" if source is None else "index"
        target = {"_index": index, "_id": es_id, "version": version, "version_type": "external"}
        line = (json.dumps({action: target}, separators=(",", ":")) + "\n").encode()
        pending[es_id] = line + (b"" if source is None else source + b"\n")
    return list(pending.values()), dead


def _collected(events: Sequence[dict[str, Any]], index: str) -> tuple[list[bytes], list[str], int]:
    dead: list[DeadLetter] = []
    maker = ItemMaker(None, dead.extend, lambda _key: None)
    pending: dict[str, BulkItem] = {}
    at = maker.collect(events, 0, EventVersioner(), index, pending)
    return [item.encoded() for item in pending.values()], [d.reason for d in dead], at


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(st.sampled_from(_OPS), _ids, st.dictionaries(_keys, _values, max_size=5)),
        min_size=1,
        max_size=8,
    ),
    st.booleans(),
)
@example([("insert", 1, {"f": 0.1, "big": 2**62, "s": "é\u2028", "n": None})], False)
@example([("insert", 7, {"x": NAN, "n": None}), ("insert", 8, {"x": INF})], False)
@example([("insert", 3, {"d": Decimal128("NaN")}), ("insert", 3, {"d": Decimal128("1.5")})], True)
@example(
    [
        ("insert", "a", {"u": uuid.UUID(int=5)}),
        ("update", "a", {"at": datetime.datetime(2026, 12, 2)}),
    ],
    False,
)
def test_the_bulk_body_is_the_per_event_mappings(
    writes: list[tuple[str, Any, dict[str, Any]]], mongod: bool
) -> None:
    events = _events(writes, mongod)
    lines, dead, at = _collected(events, "shop.orders")
    assert (lines, dead) == _reference(events, "shop.orders")
    assert at == len(events)
    # The stream without a transform projects the document's ``_id`` away (``UNUSED_WITH_ID``):
    # the same body.
    assert _collected(_without_document_ids(events), "shop.orders")[:2] == (lines, dead)
    # SecantusDB tags every event of a stream with the split stage as one fragment of one.
    tagged = [{**e, "splitEvent": {"fragment": 1, "of": 1}} for e in events]
    assert _collected(tagged, "shop.orders") == (lines, dead, len(events))


def _without_document_ids(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for event in events:
        doc = event.get("fullDocument")
        if isinstance(doc, dict):
            event = {**event, "fullDocument": {k: v for k, v in doc.items() if k != "_id"}}
        out.append(event)
    return out


def test_large_documents_and_every_value_type() -> None:
    doc = {
        "nested": {"a": [1, {"b": [2.5, None, True]}], "c": {}},
        "text": "lorem ipsum " * 170,
        "oid": ObjectId("65a0f0000000000000000001"),
        "at": datetime.datetime(2026, 12, 2, 1, 2, 3, 4000),
        "dec": Decimal128("12345.6789"),
        "bin": b"\x00\xff",
        "uuid": Binary(uuid.UUID(int=7).bytes, 4),
        "ts": Timestamp(5, 6),
        "long": Int64(2**40),
        "neg0": -0.0,
        "floats": [0.1, 1e300, 5e-324],
        "unicode": "naïve ✓ \U0001f600",
    }
    events = _events([("insert", i, doc) for i in range(5)] + [("replace", 2, doc)])
    lines, dead, _ = _collected(events, "i")
    assert (lines, dead) == _reference(events, "i")
    assert len(lines) == 5 and not dead


def test_a_drop_or_a_fragment_stops_the_collection_where_it_stands() -> None:
    events = _events([("insert", 1, {}), ("drop", None, None), ("insert", 2, {})])
    lines, _, at = _collected(events, "i")
    assert at == 1 and len(lines) == 1
    events[1] = {**events[2], "splitEvent": {"fragment": 1, "of": 2}}
    assert _collected(events, "i")[2] == 1


def test_a_transform_and_a_lookup_take_the_per_event_path() -> None:
    events = _events([("insert", 1, {"a": 1}), ("update", 2, {"a": 2})])
    maker = ItemMaker(lambda d: {**d, "t": True}, lambda _d: None, lambda _key: None)
    pending: dict[str, BulkItem] = {}
    maker.collect(events, 0, EventVersioner(), "i", pending)
    assert [item.source_json() for item in pending.values()] == [b'{"a":1,"t":true}'] * 1 + [
        b'{"a":2,"t":true}'
    ]


def test_an_unversioned_writer_gets_unversioned_lines() -> None:
    events = _events([("insert", 1, {"a": 1})])
    maker = ItemMaker(None, lambda _d: None, lambda _key: None, versioned=False)
    pending: dict[str, BulkItem] = {}
    maker.collect(events, 0, EventVersioner(), "i", pending)
    assert [i.encoded(False) for i in pending.values()] == [
        b'{"index":{"_index":"i","_id":"~i:1"}}\n{"a":1}\n'
    ]


@pytest.mark.parametrize("value", [Decimal("1.5"), datetime.date(2026, 1, 2)])
def test_a_dead_letter_keeps_the_source_of_an_item_made_with_its_lines(value: Any) -> None:
    maker = ItemMaker(lambda d: {**d, "v": value}, lambda _d: None, lambda _key: None)
    item = maker.item({"_id": 1}, 1, 5, {"op": "insert"}, "i")
    assert item is not None and item.source is None
    record = letter_record(DeadLetter(item, 400, "mapping"), keep_source=True)
    assert record["source"] == json.dumps({"v": str(value)}, separators=(",", ":"))


def test_a_dead_letter_of_a_stream_item_is_its_change_event_again() -> None:
    events = _events([("update", 5, {"a": 1}), ("insert", "k", {"b": 2})])
    maker = ItemMaker(None, lambda _d: None, lambda _key: None)
    pending: dict[str, BulkItem] = {}
    maker.collect(events, 0, EventVersioner(), "i", pending)
    letters = [DeadLetter(item, 400, "mapping") for item in pending.values()]
    records = [letter_record(letter, keep_source=True) for letter in letters]
    assert [(r["_id"], r["operationType"], r["documentKey"]) for r in records] == [
        (events[0]["_id"], "update", {"_id": 5}),
        (events[1]["_id"], "insert", {"_id": "k"}),
    ]
    assert [r["source"] for r in records] == ['{"a":1}', '{"b":2}']
    # by default (dead_letter_source = false) the same records hold none of the documents
    assert [letter_record(letter)["source"] for letter in letters] == [None, None]
