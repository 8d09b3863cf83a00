"""The external-version encoding: order-preserving, unique, inside a signed 64-bit integer, and
the same for the same event however often it is delivered."""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import Any

import bson
import pytest
from bson.timestamp import Timestamp
from hypothesis import given
from hypothesis import strategies as st

from listeners.elasticsearch import versioning as v
from singleton.errors import VersionOverflowError

seconds = st.integers(v.EPOCH, v.EPOCH + v.MAX_SECONDS)
increments = st.integers(0, v.MAX_INCREMENT)
positions = st.integers(0, v.MAX_POSITION)
points = st.tuples(seconds, increments, positions)


@given(points, points)
def test_order_is_preserved(a: tuple[int, int, int], b: tuple[int, int, int]) -> None:
    va, vb = v.encode(*a), v.encode(*b)
    assert (va < vb) == (a < b)
    assert (va == vb) == (a == b)


@given(points)
def test_range_and_round_trip(p: tuple[int, int, int]) -> None:
    version = v.encode(*p)
    assert 0 <= version <= 2**63 - 1
    assert v.decode(version) == p


def test_centuries_of_headroom() -> None:
    year_2260 = 9_151_488_000
    assert v.encode(year_2260, v.MAX_INCREMENT, v.MAX_POSITION) < 2**63
    assert year_2260 < v.EPOCH + v.MAX_SECONDS


@pytest.mark.parametrize(
    "args",
    [
        (v.EPOCH - 1, 0, 0),
        (v.EPOCH + v.MAX_SECONDS + 1, 0, 0),
        (v.EPOCH, v.MAX_INCREMENT + 1, 0),
        (v.EPOCH, 0, v.MAX_POSITION + 1),
        (v.EPOCH, -1, 0),
    ],
)
def test_overflow_raises(args: tuple[int, int, int]) -> None:
    with pytest.raises(VersionOverflowError):
        v.encode(*args)


def ks_uint(n: int) -> bytes:
    if n == 0:
        return bytes([41])
    raw = n << 1
    size = max(1, (raw.bit_length() + 7) // 8)
    return bytes([42 + size]) + raw.to_bytes(size, "big")


def keystring_token(ts: Timestamp, txn_op_index: int, token_version: int = 2) -> str:
    data = bytes([130]) + ((ts.time << 32) | ts.inc).to_bytes(8, "big")
    data += ks_uint(token_version)
    if token_version >= 1:
        data += ks_uint(128)  # tokenType: event token
    data += ks_uint(txn_op_index) + bytes([110]) + b"\x5a\x10\x04" + bytes(16) + b"\x04"
    return data.hex().upper()


@given(st.integers(0, 2**32 - 1), increments, st.integers(0, 10**6), st.sampled_from([0, 1, 2]))
def test_keystring_txn_op_index(secs: int, inc: int, idx: int, token_version: int) -> None:
    token = keystring_token(Timestamp(secs, inc), idx, token_version)
    assert v.keystring_txn_op_index(bytes.fromhex(token)) == idx


def _lookup(anchors: Mapping[Timestamp, int]) -> v.AnchorLookup:
    """An anchor lookup answering from ``anchors`` for the cluster time asked, alone."""
    return lambda ts, after: {ts: anchors[ts]} if ts in anchors else {}


def secantus_event(seq: int, ts: Timestamp, txn: bool) -> dict[str, object]:
    data = bson.encode({"s": seq, "t": ts, "n": "db.c", "k": {"_id": seq}}).hex()
    event: dict[str, object] = {"_id": {"_data": data}, "clusterTime": ts}
    if txn:
        event["txnNumber"] = 1
    return event


@given(
    st.lists(st.integers(1, 40), min_size=1, max_size=30),
    st.integers(0, 10**9),
    st.data(),
)
def test_versions_of_a_stream_increase_and_survive_a_mid_transaction_resume(
    txn_sizes: list[int], first_seq: int, data: st.DataObject
) -> None:
    """A stream of transactions (events sharing a cluster time, consecutive sequences):
    versions strictly increase, and a versioner started in the middle of a transaction (a resumed
    stream) gives the same versions, because the position comes from the oplog anchor."""
    events = []
    anchors: dict[Timestamp, int] = {}
    seq = first_seq
    for i, size in enumerate(txn_sizes):
        ts = Timestamp(v.EPOCH + 1000 + i // 3, (i % 3) + 1)
        anchors[ts] = seq
        for _ in range(size):
            events.append(secantus_event(seq, ts, txn=size > 1))
            seq += 1
    full = [v.EventVersioner(_lookup(anchors)).version(e) for e in events]
    assert all(a < b for a, b in itertools.pairwise(full))
    cut = data.draw(st.integers(0, len(events) - 1))
    resumed = v.EventVersioner(_lookup(anchors))
    assert [resumed.version(e) for e in events[cut:]] == full[cut:]


def without_cluster_time(event: dict[str, object]) -> dict[str, object]:
    return {k: val for k, val in event.items() if k != "clusterTime"}


@given(
    st.integers(0, 2**63 - 1),
    st.integers(v.EPOCH, 2**32 - 1),  # (a BSON timestamp's seconds are 32 bits)
    increments,
    st.booleans(),
    st.sampled_from(["secantus", "keystring"]),
)
def test_an_event_without_cluster_time_gets_the_same_version_from_its_token(
    seq: int, secs: int, inc: int, txn: bool, kind: str
) -> None:
    """ElasticsearchSync's stream leaves ``clusterTime`` out: the version read from the resume
    token (SecantusDB's BSON with an int32 or int64 sequence, mongod's KeyString; in a
    transaction or not) must equal the one read from ``clusterTime``."""
    ts = Timestamp(secs, inc)
    if kind == "secantus":
        event = secantus_event(seq, ts, txn)
    else:
        event = {"_id": {"_data": keystring_token(ts, seq % 5)}, "clusterTime": ts}
        if txn:
            event["txnNumber"] = 1
    with_time = v.EventVersioner(_lookup({ts: seq - seq % 7})).version(event)
    assert v.EventVersioner(_lookup({ts: seq - seq % 7})).version(without_cluster_time(event)) == (
        with_time
    )
    assert v.decode(with_time)[:2] == (secs, inc)


def test_an_event_with_neither_cluster_time_nor_a_known_token_is_refused() -> None:
    with pytest.raises(VersionOverflowError, match="no clusterTime"):
        v.EventVersioner().version({"_id": {"_data": "00ff"}})


def test_an_anchor_is_looked_up_from_the_previous_event_and_what_it_passed_is_kept() -> None:
    """Each lookup gets the resume token of the event versioned before (from an earlier cluster
    time), to read on from there; the transactions' anchors it reports on the way are cached,
    so the next transaction asks nothing."""
    t0, t1, t2 = (Timestamp(v.EPOCH + 50, i) for i in (1, 2, 3))
    calls: list[tuple[Timestamp, object]] = []

    def lookup(ts: Timestamp, after: Mapping[str, Any] | None) -> Mapping[Timestamp, int]:
        calls.append((ts, after))
        return {t1: 11, t2: 20}

    versioner = v.EventVersioner(lookup)
    plain = secantus_event(10, t0, txn=False)
    first = [secantus_event(11, t1, txn=True), secantus_event(12, t1, txn=True)]
    second = [secantus_event(20, t2, txn=True), secantus_event(21, t2, txn=True)]
    versions = [versioner.version(e) for e in [plain, *first, *second]]
    assert calls == [(t1, plain["_id"])]
    assert [v.decode(x)[2] for x in versions] == [0, 0, 1, 0, 1]
    # No earlier event, or one not from an earlier cluster time: no token to read on from.
    alone = v.EventVersioner(lookup)
    alone.version(first[1])
    alone.version(secantus_event(30, Timestamp(v.EPOCH + 60, 1), txn=True))
    assert calls[1:] == [(t1, None), (Timestamp(v.EPOCH + 60, 1), first[1]["_id"])]
