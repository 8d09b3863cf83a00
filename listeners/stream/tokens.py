"""Resume tokens, parsed in one place: the cluster time inside a token, with and without
building a :class:`~bson.timestamp.Timestamp`.

A stream may project ``clusterTime`` away (ElasticsearchSync's does, to save decoding one per
event); the time is then read from the token, whose format depends on the server: mongod's
KeyString, or SecantusDB's BSON document.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import bson
from bson.timestamp import Timestamp


def event_time(event: Mapping[str, Any]) -> Timestamp | None:
    """The cluster time of a change event: its ``clusterTime``, else the one in its resume
    token (a stream may project ``clusterTime`` away, see :func:`token_clock`); ``None`` when
    it has neither."""
    ts = event.get("clusterTime")
    return ts if isinstance(ts, Timestamp) else token_time(event.get("_id"))


def token_time(token: Any) -> Timestamp | None:
    """The cluster time inside a resume token (``{"_data": hex}``), when its format is known
    (see :func:`token_clock`); ``None`` otherwise."""
    if not isinstance(token, Mapping) or not isinstance(token.get("_data"), str):
        return None
    try:
        raw = bytes.fromhex(token["_data"])
    except ValueError:
        return None
    clock = token_clock(raw)
    return None if clock is None else Timestamp(*clock)


#: SecantusDB's BSON token as it writes it: ``s`` (int32 or int64) first, then ``t`` (the
#: element heads: type byte, name, NUL). Public for the sinks that parse tokens inline.
TOKEN_S_INT32 = b"\x10s\x00"
TOKEN_S_INT64 = b"\x12s\x00"
TOKEN_T_STAMP = b"\x11t\x00"


def token_clock(raw: bytes) -> tuple[int, int] | None:
    """``(seconds, increment)`` of the cluster time inside a resume token's ``_data`` bytes,
    without building a :class:`~bson.timestamp.Timestamp` (this runs once per event where a
    stream leaves ``clusterTime`` out, which saves decoding one per event):

    * mongod's KeyString: ``0x82`` then the 8-byte timestamp, big-endian;
    * SecantusDB's BSON document ``{s: <sequence>, t: <Timestamp>, ...}`` (a BSON timestamp is
      the increment then the seconds, little-endian); any other BSON layout is decoded whole.

    ``None`` for a format it does not know."""
    if len(raw) >= 9 and raw[0] == 0x82:
        return int.from_bytes(raw[1:5], "big"), int.from_bytes(raw[5:9], "big")
    if len(raw) < 5 or int.from_bytes(raw[:4], "little") != len(raw):
        return None
    head = raw[4:7]
    at = 11 if head == TOKEN_S_INT32 else 15 if head == TOKEN_S_INT64 else 0
    if at and raw[at : at + 3] == TOKEN_T_STAMP and len(raw) >= at + 11:
        return int.from_bytes(raw[at + 7 : at + 11], "little"), int.from_bytes(
            raw[at + 3 : at + 7], "little"
        )
    try:
        t = bson.decode(raw).get("t")
    except Exception:  # not BSON after all
        return None
    return (t.time, t.inc) if isinstance(t, Timestamp) else None
