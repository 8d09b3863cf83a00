"""External versions for Elasticsearch, derived from the oplog position of a change event.

Elasticsearch's ``version_type=external`` accepts a write only if its version is greater than the
stored one. If the version of every change event strictly increases in oplog order, replays,
duplicate deliveries and a deposed leader's late writes are all refused (409) and the index can
never go back in time. The encoding, in one signed 64-bit integer (bit 63 stays 0)::

    version = (seconds - EPOCH) << 30  |  increment << 12  |  position

    bits 62..30  (33 bits)  cluster-time seconds since 2020-01-01 UTC: good until the year 2292
    bits 29..12  (18 bits)  cluster-time increment (ordinal within the second): < 262,144
    bits 11..0   (12 bits)  position of the event within its transaction: < 4,096

Monstache's ``(T << 32) | I`` overflows a signed 64-bit version in 2038 and gives every event of
one transaction the same version (they share a cluster time); the ``position`` field fixes the
second flaw and the epoch offset plus 33-bit field the first. A value that does not fit raises
:class:`VersionOverflowError` instead of wrapping silently.

The position must be the same whenever the same event is delivered again (a resumed stream, a
replay by a deposed leader), so it is read from the event's resume token, never counted in memory:

* MongoDB resume tokens are KeyString-encoded ``[clusterTime, version, tokenType, txnOpIndex, ...]``
  and carry ``txnOpIndex`` directly (:func:`keystring_txn_op_index`).
* Servers whose tokens are a BSON document with a global oplog sequence ``s`` (SecantusDB) give
  the position as ``s`` minus the sequence of the transaction's first oplog entry; that anchor is
  a fact of the oplog, looked up once per transaction (:class:`EventVersioner`), by reading a
  cluster-wide change stream on from the resume token of an earlier event (a seek by sequence;
  :func:`first_seqs`). Only without such a token is the stream opened at the cluster time: on
  SecantusDB that decodes its whole oplog under its storage lock, which, once per transaction
  and stream, had stalled every client of a busy server for seconds.
"""

from __future__ import annotations

import struct
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

import bson
import pymongo.errors
from bson.timestamp import Timestamp

from listeners.stream.tokens import TOKEN_S_INT32, TOKEN_T_STAMP, event_time, token_clock
from singleton.errors import VersionOverflowError

#: 2020-01-01T00:00:00Z. Cluster times before it cannot be encoded.
EPOCH = 1_577_836_800
SECONDS_BITS = 33
INCREMENT_BITS = 18
POSITION_BITS = 12
INCREMENT_SHIFT = POSITION_BITS
SECONDS_SHIFT = POSITION_BITS + INCREMENT_BITS
MAX_SECONDS = (1 << SECONDS_BITS) - 1
MAX_INCREMENT = (1 << INCREMENT_BITS) - 1
MAX_POSITION = (1 << POSITION_BITS) - 1
MAX_VERSION = (1 << 63) - 1

#: Looks up the oplog sequence of the first change event at a cluster time ``ts``; given
#: ``after``, the resume token of an earlier event, it may read on from there, and answer for
#: the transactions' cluster times it passed too: ``{cluster time: first sequence}`` (without
#: ``ts`` if unknown).
AnchorLookup = Callable[[Timestamp, "Mapping[str, Any] | None"], "Mapping[Timestamp, int]"]

#: At most this many events are read on from an earlier token to find an anchor; past them,
#: the stream is opened at the cluster time instead.
ANCHOR_READ_LIMIT = 5000


def encode(seconds: int, increment: int, position: int = 0) -> int:
    """The external version of the event at cluster time ``(seconds, increment)``, ``position``
    within its transaction. Strictly increasing in ``(seconds, increment, position)``."""
    s = seconds - EPOCH
    if not 0 <= s <= MAX_SECONDS:
        raise VersionOverflowError(
            f"cluster time {seconds} s is outside the encodable range [{EPOCH}, "
            f"{EPOCH + MAX_SECONDS}] (2020-01-01 .. 2292)"
        )
    if not 0 <= increment <= MAX_INCREMENT:
        raise VersionOverflowError(
            f"cluster-time increment {increment} exceeds {MAX_INCREMENT} ({INCREMENT_BITS} bits)"
        )
    if not 0 <= position <= MAX_POSITION:
        raise VersionOverflowError(
            f"transaction position {position} exceeds {MAX_POSITION} ({POSITION_BITS} bits): "
            "a transaction with more events than that cannot be versioned distinctly"
        )
    return (s << SECONDS_SHIFT) | (increment << INCREMENT_SHIFT) | position


def decode(version: int) -> tuple[int, int, int]:
    """``(seconds, increment, position)`` of a version made by :func:`encode`."""
    if not 0 <= version <= MAX_VERSION:
        raise ValueError(f"not an encoded version: {version}")
    return (
        (version >> SECONDS_SHIFT) + EPOCH,
        (version >> INCREMENT_SHIFT) & MAX_INCREMENT,
        version & MAX_POSITION,
    )


def timestamp_version(ts: Timestamp, position: int = 0) -> int:
    return encode(ts.time, ts.inc, position)


# -- resume tokens -------------------------------------------------------------------------------
_KS_TIMESTAMP = 130
_KS_ZERO = 41
_KS_POS_INT_1 = 43  # positive integers of 1..8 bytes: CTypes 43..50
_KS_POS_INT_8 = 50


def _ks_uint(data: bytes, at: int) -> tuple[int, int]:
    """Decode one non-negative KeyString integer at ``at``; returns ``(value, next offset)``.
    Integers are stored big-endian shifted left by one (the low bit flags a fraction)."""
    ctype = data[at]
    if ctype == _KS_ZERO:
        return 0, at + 1
    if _KS_POS_INT_1 <= ctype <= _KS_POS_INT_8:
        n = ctype - _KS_POS_INT_1 + 1
        raw = int.from_bytes(data[at + 1 : at + 1 + n], "big")
        if raw & 1:
            raise ValueError("fractional number in a resume token")
        return raw >> 1, at + 1 + n
    raise ValueError(f"unexpected KeyString type {ctype} in a resume token")


def keystring_txn_op_index(data: bytes) -> int:
    """``txnOpIndex`` of a MongoDB (KeyString) resume token.

    Layout: clusterTime (CType 130 + 8 bytes), version, then for version >= 1 tokenType, then
    txnOpIndex (``applyOpsIndex`` in version 0 tokens)."""
    if not data or data[0] != _KS_TIMESTAMP:
        raise ValueError("resume token does not start with a cluster time")
    at = 9
    token_version, at = _ks_uint(data, at)
    if token_version >= 1:
        _token_type, at = _ks_uint(data, at)
    index, _ = _ks_uint(data, at)
    return index


def _token_bytes(event: Mapping[str, Any]) -> bytes:
    token = event.get("_id")
    # (``type(...) is dict`` first: the ABC check costs more than the rest of this function.)
    raw = token.get("_data") if type(token) is dict or isinstance(token, Mapping) else None
    if not isinstance(raw, str):
        raise VersionOverflowError(f"change event has no resume token _data: {token!r}")
    try:
        return bytes.fromhex(raw)
    except ValueError as exc:
        raise VersionOverflowError(f"resume token _data is not hex: {raw[:40]!r}") from exc


def _bson_shaped(data: bytes) -> bool:
    """Whether ``data`` looks like a BSON document (its length prefix); cheaper than decoding."""
    return len(data) >= 5 and int.from_bytes(data[:4], "little") == len(data) and data[-1] == 0


def _bson_token(data: bytes) -> Mapping[str, Any] | None:
    if len(data) < 5 or int.from_bytes(data[:4], "little") != len(data):
        return None
    try:
        return bson.decode(data)
    except Exception:  # not BSON: a KeyString token
        return None


#: The head of a SecantusDB resume token: its BSON length, ``s`` as an int32 (skipped), then
#: ``t``, a BSON timestamp (a little-endian uint64: seconds in the high half).
SECANTUS_TOKEN = struct.Struct("<I3s4x3sQ")


#: The BSON timestamps (a little-endian uint64, seconds in the high half) of the cluster times
#: :func:`encode` can encode.
STAMP_LOW, STAMP_HIGH = EPOCH << 32, (EPOCH + MAX_SECONDS + 1) << 32


def plain_version(data: Any) -> int:
    """The version of an event outside a transaction, on a stream without ``clusterTime``,
    whose resume token's ``_data`` is ``data``: from a SecantusDB token
    ``{s: <int32>, t: <Timestamp>, ...}`` (the only event at its cluster time, position 0) or a
    mongod KeyString token (its ``txnOpIndex``); ``-1`` for anything else or anything amiss
    (:meth:`EventVersioner.version` decides, and says what). The commonest case, in as few
    steps as can be: this runs once per event."""
    try:
        raw = bytes.fromhex(data)
    except (TypeError, ValueError):
        return -1
    if len(raw) >= SECANTUS_TOKEN.size:
        head: tuple[int, bytes, bytes, int] = SECANTUS_TOKEN.unpack_from(raw)
        size, s_head, t_head, stamp = head
        increment = stamp & 0xFFFFFFFF
        if size == len(raw) and s_head == TOKEN_S_INT32 and t_head == TOKEN_T_STAMP:
            if STAMP_LOW <= stamp < STAMP_HIGH and increment <= MAX_INCREMENT:
                return (((stamp >> 32) - EPOCH) << SECONDS_SHIFT) | (increment << INCREMENT_SHIFT)
            return -1
    if raw[:1] != _KS_HEAD or _bson_shaped(raw):
        return -1
    try:
        position = keystring_txn_op_index(raw)
    except (ValueError, IndexError):
        return -1
    seconds, increment = int.from_bytes(raw[1:5], "big"), int.from_bytes(raw[5:9], "big")
    fits = 0 <= seconds - EPOCH <= MAX_SECONDS and increment <= MAX_INCREMENT
    return encode(seconds, increment, position) if fits and position <= MAX_POSITION else -1


#: The first byte of a mongod (KeyString) resume token: its cluster time's type.
_KS_HEAD = bytes([_KS_TIMESTAMP])


class EventVersioner:
    """Computes :func:`encode` versions for change events. ``anchor`` is needed only for servers
    with BSON resume tokens (see the module docstring); anchors are cached per cluster time."""

    def __init__(self, anchor: AnchorLookup | None = None, cache_size: int = 4096) -> None:
        self._anchor = anchor
        self._cache: OrderedDict[Timestamp, int] = OrderedDict()
        self._cache_size = cache_size
        #: The resume token of the last event versioned: where an anchor lookup reads on from.
        self._earlier: Any = None

    def version(self, event: Mapping[str, Any], ts: Timestamp | None = None) -> int:
        """``event``'s version; ``ts``: its cluster time when the caller has it already (else
        its ``clusterTime``, else the one in its resume token)."""
        token = event.get("_id")
        plain = ts is None and "txnNumber" not in event and "clusterTime" not in event
        if plain and type(token) is dict:  # (the commonest case first: see plain_version)
            version = plain_version(token.get("_data"))
            if version >= 0:
                self._earlier = token
                return version
        version = self._version(event, ts)
        self._earlier = token
        return version

    def _version(self, event: Mapping[str, Any], ts: Timestamp | None) -> int:
        """:meth:`version` for every other event (and every error)."""
        data = _token_bytes(event)
        if ts is None:
            ts = event.get("clusterTime")
        if isinstance(ts, Timestamp):
            seconds, increment = ts.time, ts.inc
        else:  # left out of the stream (ElasticsearchSync's), or a fragment: the token has it
            clock = token_clock(data)
            if clock is None:
                raise VersionOverflowError(f"change event has no clusterTime: {event.get('_id')!r}")
            seconds, increment = clock
        if "txnNumber" in event or not _bson_shaped(data):
            at = Timestamp(seconds, increment)
            return encode(seconds, increment, self._position(event, at, data))
        # The commonest case, inline (this runs once per event): a BSON token outside a
        # transaction is the only event at its cluster time, at position 0.
        s = seconds - EPOCH
        if 0 <= s <= MAX_SECONDS and 0 <= increment <= MAX_INCREMENT:
            return (s << SECONDS_SHIFT) | (increment << INCREMENT_SHIFT)
        return encode(seconds, increment)  # (out of range: raises)

    def position(self, event: Mapping[str, Any], ts: Timestamp) -> int:
        return self._position(event, ts, _token_bytes(event))

    def _position(self, event: Mapping[str, Any], ts: Timestamp, data: bytes) -> int:
        if "txnNumber" not in event and _bson_shaped(data):
            return 0  # a BSON token outside a transaction: the only event at its cluster time
        doc = _bson_token(data)
        if doc is None:
            return keystring_txn_op_index(data)
        if "txnNumber" not in event:
            return 0
        seq = doc.get("s")
        if not isinstance(seq, int):
            raise VersionOverflowError(f"BSON resume token without a sequence: {doc!r}")
        first = self._first_seq(ts, seq)
        return seq - first

    def _first_seq(self, ts: Timestamp, seq: int) -> int:
        first = self._cache.get(ts)
        if first is None:
            if self._anchor is None:
                raise VersionOverflowError(
                    "transaction events with BSON resume tokens need an anchor lookup"
                )
            found = self._anchor(ts, self._before(ts))
            for at, known in found.items():
                self._cache.setdefault(at, known)
            anchor = found.get(ts)
            first = seq if anchor is None else min(anchor, seq)
            self._cache[ts] = first
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        else:
            self._cache.move_to_end(ts)
        return first

    def _before(self, ts: Timestamp) -> Mapping[str, Any] | None:
        """The last versioned event's resume token if it is a BSON one from before ``ts``."""
        token = self._earlier
        raw = token.get("_data") if isinstance(token, Mapping) else None
        try:
            doc = _bson_token(bytes.fromhex(raw)) if isinstance(raw, str) else None
        except ValueError:
            return None
        at = None if doc is None else doc.get("t")
        return token if isinstance(at, Timestamp) and at < ts else None


def first_seqs(
    client: Any,
    ts: Timestamp,
    after: Mapping[str, Any] | None = None,
    *,
    limit: int = ANCHOR_READ_LIMIT,
) -> dict[Timestamp, int]:
    """:data:`AnchorLookup` on ``client``: read on from ``after`` if given and still resumable
    (the transactions' cluster times passed on the way are answered too), else open the stream
    at ``ts`` (:func:`first_seq_at`)."""
    if after is not None:
        try:
            found = _read_on(client, ts, after, limit)
        except pymongo.errors.PyMongoError:
            found = None  # (e.g. no longer in the oplog): the seek below
        if found is not None:
            return found
    seq = first_seq_at(client, ts)
    return {} if seq is None else {ts: seq}


def _read_on(
    client: Any, ts: Timestamp, after: Mapping[str, Any], limit: int
) -> dict[Timestamp, int] | None:
    """The first sequence of each transaction's cluster time a cluster-wide stream resumed after
    ``after`` (an event before ``ts``) passes, up to ``ts``; ``None`` if it does not get there
    within ``limit`` events. Every event after ``after`` is seen, so the first one seen at a
    later cluster time is the first there."""
    found: dict[Timestamp, int] = {}
    empty = 0
    with client.watch(resume_after=after, max_await_time_ms=200) as stream:
        for _ in range(limit):
            event = stream.try_next()
            if event is None:
                empty += 1
                if empty >= 10:  # the events at ``ts`` exist: a stream that does not get
                    return None  # there is not reading what this expects
                continue
            at = event_time(event)
            doc = _bson_token(_token_bytes(event))
            seq = None if doc is None else doc.get("s")
            if at is None or not isinstance(seq, int):
                return None
            if at >= ts:
                if at == ts:
                    found[ts] = seq
                return found
            if "txnNumber" in event:
                found.setdefault(at, seq)
    return None


def first_seq_at(client: Any, ts: Timestamp) -> int | None:
    """The oplog sequence of the first change event at cluster time ``ts`` on a server with BSON
    resume tokens, read with a cluster-wide change stream that starts at ``ts``."""
    with client.watch(start_at_operation_time=ts, max_await_time_ms=200) as stream:
        event = None
        for _ in range(10):  # an empty first batch is allowed; the entry at ``ts`` exists
            event = stream.try_next()
            if event is not None:
                break
        if event is None or event_time(event) != ts:
            return None
        doc = _bson_token(_token_bytes(event))
        seq = None if doc is None else doc.get("s")
        return seq if isinstance(seq, int) else None
