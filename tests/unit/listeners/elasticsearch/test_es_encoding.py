"""orjson and the standard encoder give every document the same meaning (Hypothesis over
BSON-typed documents): the same JSON value, or the same error, NaN and infinities included; and
bulk action lines built as bytes are exactly what ``json.dumps`` gives."""

from __future__ import annotations

import datetime
import json
import uuid
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import pytest
from bson import ObjectId
from bson.binary import Binary
from bson.code import Code
from bson.dbref import DBRef
from bson.decimal128 import Decimal128
from bson.int64 import Int64
from bson.max_key import MaxKey
from bson.min_key import MinKey
from bson.regex import Regex
from bson.son import SON
from bson.timestamp import Timestamp
from bson.tz_util import utc
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from listeners.elasticsearch.bulk import BulkItem
from listeners.elasticsearch.documents import _standard_source, source_of
from singleton.errors import NonFiniteNumberError

NAN, INF = float("nan"), float("inf")

_keys = st.text(st.characters(exclude_characters="\x00.$"), min_size=1, max_size=5)
_offsets = st.integers(-(23 * 3600 + 59 * 60), 23 * 3600 + 59 * 60).map(
    lambda s: datetime.timezone(datetime.timedelta(seconds=s))  # seconds: orjson gets them wrong
)
_datetimes = st.one_of(
    st.datetimes(),  # naive: UTC, as with tz_aware=False
    st.datetimes().map(lambda d: d.replace(tzinfo=utc)),  # what tz_aware=True decodes
    st.datetimes(timezones=_offsets),  # from a transform
)
_binaries = st.one_of(
    st.binary(max_size=20),  # subtype 0 decodes as bytes
    st.builds(lambda b: Binary(b, 4), st.binary(min_size=16, max_size=16)),
    st.builds(lambda b: Binary(b, 3), st.binary(min_size=16, max_size=16)),
    st.builds(Binary, st.binary(max_size=20), st.sampled_from([1, 2, 5, 128])),
)
_decimals = st.one_of(
    st.decimals(allow_nan=True, allow_infinity=True, places=4)
    # (Decimal128 holds 34 significant digits and refuses more: such a value is not BSON)
    .filter(lambda d: not d.is_finite() or len(d.as_tuple().digits) <= 34)
    .map(lambda d: Decimal128(str(d)) if not d.is_nan() else Decimal128("NaN")),
    st.sampled_from([Decimal128("Infinity"), Decimal128("-Infinity"), Decimal128("-0")]),
    st.decimals(allow_nan=True, allow_infinity=True, places=3),  # Python Decimal: a transform's
)
_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**31), 2**31 - 1),
    st.integers(-(2**63), 2**63 - 1).map(Int64),
    st.integers(),  # beyond 64 bits (a transform's): orjson refuses them, json writes them
    st.floats(),  # NaN and the infinities too
    st.text(max_size=20),  # non-ASCII: UTF-8 from orjson, escapes from json
    st.text(st.characters(categories=["Cs"]), min_size=1, max_size=2),  # lone surrogates
    st.builds(lambda b: ObjectId(bytes(b)), st.binary(min_size=12, max_size=12)),
    _datetimes,
    st.dates(),
    _binaries,
    _decimals,
    st.uuids(),
    st.builds(Timestamp, st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1)),
    st.builds(Regex, st.text(max_size=8), st.sampled_from(["", "i", "mx"])),
    st.builds(Code, st.text(max_size=8)),
    st.sampled_from([MinKey(), MaxKey(), datetime.time(1, 2, 3)]),
    st.builds(DBRef, st.text(min_size=1, max_size=5), st.integers(0, 9)),
)
_values = st.recursive(
    _scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.lists(inner, max_size=3).map(tuple),
        st.dictionaries(_keys, inner, max_size=4),
        st.dictionaries(_keys, inner, max_size=3).map(lambda d: SON(list(d.items()))),
    ),
    max_leaves=12,
)
_documents = st.dictionaries(_keys, _values, max_size=6).map(lambda d: {"_id": 1, **d})


def _outcome(encode: Callable[[], bytes | None]) -> tuple[str, str]:
    """What an encoding means: its JSON value (floats by repr, key order kept) or its error."""
    try:
        out = encode()
    except (NonFiniteNumberError, ValueError, TypeError) as exc:
        return type(exc).__name__, str(exc)
    assert out is not None
    return "json", json.dumps(json.loads(out))


#: The first draws build Unicode tables for the strategies above: slow once, not a problem.
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_documents)
@example({"_id": 1, "a": {"b": [1.0, NAN]}, "n": None})
@example({"_id": 1, "x": None, "y": "null"})
@example({"_id": 1, "d": Decimal128("NaN"), "f": INF})
@example({"_id": 1, "big": 2**64, "s": "\ud800"})
@example({"_id": 1, "d": Decimal("NaN"), "t": datetime.time(1, 2)})
def test_orjson_and_json_give_the_same_meaning(doc: dict[str, Any]) -> None:
    clean = {k: v for k, v in doc.items() if k != "_id"}
    assert _outcome(lambda: source_of(doc)) == _outcome(lambda: _standard_source(dict(clean)))


def test_deep_documents_are_encoded_as_json_would() -> None:
    deep: Any = 1
    for _ in range(300):  # deeper than orjson goes
        deep = {"a": [deep]}
    doc = {"_id": 1, "deep": deep}
    assert _outcome(lambda: source_of(doc)) == _outcome(lambda: _standard_source({"deep": deep}))


def test_common_documents_take_orjson() -> None:
    # UTF-8 rather than escapes: the fast encoder wrote it (the tested path is the one used).
    doc = {"_id": 1, "name": "café", "at": datetime.datetime(2024, 5, 1, 12, tzinfo=utc)}
    assert source_of(doc) == '{"name":"café","at":"2024-05-01T12:00:00Z"}'.encode()
    assert source_of({"_id": 1, "k": uuid.UUID(int=1), "n": None}) == (
        b'{"k":"00000000-0000-0000-0000-000000000001","n":null}'
    )


@pytest.mark.parametrize(
    "doc",
    [
        {"_id": 1, "x": None, "f": NAN},
        {"_id": 1, "l": [None, (1, -INF)]},
        {"_id": 1, "s": SON([("v", INF)]), "n": None},
    ],
)
def test_a_non_finite_float_next_to_a_null_is_refused(doc: dict[str, Any]) -> None:
    with pytest.raises(NonFiniteNumberError, match=r"^non-finite number at path "):
        source_of(doc)


@given(
    st.sampled_from(["index", "delete"]),
    st.text(max_size=12),
    st.text(max_size=12),
    st.integers(0, 2**63 - 1),
    st.one_of(st.none(), st.just(b'{"a":"\xc3\xa9"}')),
    st.booleans(),
)
def test_action_lines_are_what_json_dumps_gives(
    op: str, index: str, doc_id: str, version: int, source: bytes | None, versioned: bool
) -> None:
    target: dict[str, Any] = {"_index": index, "_id": doc_id}
    if versioned:
        target |= {"version": version, "version_type": "external"}
    expected = (json.dumps({op: target}, separators=(",", ":")) + "\n").encode()
    if op == "index":
        expected += (source or b"{}") + b"\n"
    assert BulkItem(op, index, doc_id, version, source).encoded(versioned) == expected
