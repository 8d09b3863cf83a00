"""The BSON ``_id`` -> Elasticsearch ``_id`` mapping is injective and reversible over BSON ids
(Hypothesis), readable for strings and ObjectIds, and refuses ids Elasticsearch cannot hold."""

from __future__ import annotations

import datetime
from typing import Any

import bson
import pytest
from bson import ObjectId
from bson.binary import Binary
from bson.decimal128 import Decimal128
from bson.int64 import Int64
from bson.max_key import MaxKey
from bson.min_key import MinKey
from bson.timestamp import Timestamp
from hypothesis import assume, example, given
from hypothesis import strategies as st

from listeners.elasticsearch.ids import MAX_ID_BYTES, bson_id_of, doc_id
from singleton.errors import UnindexableIdError


def _bson(value: Any) -> bytes:
    """BSON values compare by their encoding (NaN == NaN, int32 != int64, key order counts)."""
    return bson.encode({"v": value})


_text = st.text(st.characters(exclude_categories=["Cs"]), max_size=40)
_keys = st.text(
    st.characters(exclude_categories=["Cs"], exclude_characters="\x00.$"),
    min_size=1,
    max_size=6,
)
_scalars = st.one_of(
    _text,
    st.from_regex(r"[0-9a-f]{24}", fullmatch=True),  # strings that look like ObjectIds
    st.sampled_from(["", "~", "~i:1", "1", "null", "true", "~n", "~s:x"]),
    st.builds(lambda b: ObjectId(bytes(b)), st.binary(min_size=12, max_size=12)),
    st.integers(-(2**31), 2**31 - 1),
    st.builds(Int64, st.integers(-(2**63), 2**63 - 1)),
    # One NaN: extended JSON (and MongoDB's _id index) do not tell NaN payloads apart.
    st.floats(allow_nan=False, allow_infinity=True) | st.just(float("nan")),
    st.booleans(),
    st.none(),
    st.builds(Decimal128, st.decimals(-(10**9), 10**9, places=3).map(str)),
    st.datetimes(
        min_value=datetime.datetime(1900, 1, 1), max_value=datetime.datetime(2200, 1, 1)
    ).map(lambda d: d.replace(microsecond=d.microsecond // 1000 * 1000)),
    st.builds(Binary, st.binary(max_size=16), st.sampled_from([0, 4, 128])),
    st.builds(Timestamp, st.integers(0, 2**31), st.integers(0, 2**31)),
    st.just(MinKey()),
    st.just(MaxKey()),
)
bson_ids = st.recursive(
    _scalars,
    lambda inner: st.dictionaries(_keys, st.one_of(inner, st.lists(inner, max_size=3)), max_size=3),
    max_leaves=8,
)


@given(bson_ids)
@example({"a": 1, "b": 2})
@example("65a0c0ffee0000000000beef")
def test_reversible(value: Any) -> None:
    try:
        es_id = doc_id(value)
    except UnindexableIdError:
        assume(False)
        return
    assert len(es_id.encode()) <= MAX_ID_BYTES
    assert _bson(bson_id_of(es_id)) == _bson(value)


@given(st.lists(bson_ids, max_size=12))
def test_injective(values: list[Any]) -> None:
    distinct = {_bson(v): v for v in values}
    ids: dict[str, bytes] = {}
    for encoded, value in distinct.items():
        try:
            es_id = doc_id(value)
        except UnindexableIdError:
            continue
        assert ids.setdefault(es_id, encoded) == encoded, (es_id, value)


@pytest.mark.parametrize(
    ("a", "b"),
    [
        (1, "1"),
        (None, "null"),
        (True, "true"),
        (1, Int64(1)),
        (1, 1.0),
        (0.0, -0.0),
        ({"a": 1, "b": 2}, {"b": 2, "a": 1}),
        (ObjectId("65a0c0ffee0000000000beef"), "65a0c0ffee0000000000beef"),
        ("", "~s:"),
    ],
)
def test_the_classic_collisions_are_kept_apart(a: Any, b: Any) -> None:
    assert doc_id(a) != doc_id(b)


def test_strings_and_object_ids_stay_readable() -> None:
    oid = ObjectId("65a0c0ffee0000000000beef")
    assert doc_id(oid) == "65a0c0ffee0000000000beef"
    assert doc_id("order-17") == "order-17"
    assert doc_id("65A0C0FFEE0000000000BEEF") == "65A0C0FFEE0000000000BEEF"  # not lower-case hex
    assert doc_id(7) == "~i:7"
    assert doc_id({"a": 1, "b": "x"}).startswith("~j:")


def test_ids_over_512_bytes_are_refused() -> None:
    assert doc_id("x" * MAX_ID_BYTES) == "x" * MAX_ID_BYTES
    with pytest.raises(UnindexableIdError, match="512"):
        doc_id("x" * (MAX_ID_BYTES + 1))
    with pytest.raises(UnindexableIdError):
        doc_id("é" * 257)  # 514 UTF-8 bytes
    with pytest.raises(ValueError):
        bson_id_of("~q:nope")
