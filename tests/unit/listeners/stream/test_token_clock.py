"""The cluster time inside a resume token (``listeners.stream.tokens.token_clock``): what a stream
that
leaves ``clusterTime`` out (ElasticsearchSync's) reads instead, once per event."""

from __future__ import annotations

import bson
import pytest
from bson.int64 import Int64
from bson.son import SON
from bson.timestamp import Timestamp
from hypothesis import given
from hypothesis import strategies as st

from listeners.stream.tokens import event_time, token_clock, token_time

stamps = st.builds(Timestamp, st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1))


@given(stamps, st.integers(-(2**63), 2**63 - 1))
def test_secantus_tokens_int32_or_int64_sequence(ts: Timestamp, seq: int) -> None:
    raw = bson.encode({"s": seq, "t": ts, "n": "db.c", "k": {"_id": 1}})
    assert token_clock(raw) == (ts.time, ts.inc)


@given(stamps)
def test_other_bson_layouts_are_decoded_whole(ts: Timestamp) -> None:
    for doc in (SON([("t", ts), ("s", 1)]), SON([("s", Int64(5)), ("x", 1), ("t", ts)])):
        assert token_clock(bson.encode(doc)) == (ts.time, ts.inc)


@given(stamps, st.binary(max_size=20))
def test_mongod_keystring_tokens(ts: Timestamp, rest: bytes) -> None:
    raw = bytes([0x82]) + ((ts.time << 32) | ts.inc).to_bytes(8, "big") + rest
    assert token_clock(raw) == (ts.time, ts.inc)
    assert token_time({"_data": raw.hex()}) == ts


@pytest.mark.parametrize(
    "raw",
    [b"", b"\x00\x01", bson.encode({"s": 1}), bson.encode({"t": 5}), b"\x10\x00\x00\x00garbage!"],
)
def test_unknown_tokens_have_no_time(raw: bytes) -> None:
    assert token_clock(raw) is None


def test_event_time_falls_back_to_the_token() -> None:
    ts = Timestamp(1_800_000_000, 7)
    token = {"_data": bson.encode({"s": 3, "t": ts}).hex()}
    assert event_time({"_id": token}) == ts  # clusterTime projected away
    other = Timestamp(1_800_000_001, 1)
    assert event_time({"_id": token, "clusterTime": other}) == other  # the event's own first
    assert event_time({"_id": {"_data": "zz"}}) is None
    assert event_time({}) is None
