"""How far back the change stream's history reaches: the oplog's first entry.

Failure model: a stream opened with ``startAtOperationTime`` older than the oplog cannot see the
events in between, and not every server says so (MongoDB answers 286 for a resume token that
fell off, but a stand-in may start at its oldest entry instead, and the position a listener
saves right after an initial sync or a resync is a bare cluster time). So before a stream is
opened at a cluster time, the tenure compares that time with the oplog's first entry itself, as
mongod does for tokens: a first entry newer than the time means entries in between may be gone.
A deployment that does not let us read ``local.oplog.rs`` (a user without that privilege, a
``mongos``) leaves the check to the server; the caller says so once.
"""

from __future__ import annotations

from typing import Any

from bson import Timestamp
from pymongo.errors import OperationFailure

from singleton.errors import SingletonError


class OplogUnreadable(SingletonError):
    """``local.oplog.rs`` cannot be read here (the server's answer is the message)."""


def oplog_start(client: Any) -> Timestamp | None:
    """The time of the oplog's first entry (``None``: the oplog is empty). Raises
    :class:`OplogUnreadable` when the server refuses the read; other driver errors (a timeout,
    a dropped connection) propagate, to be retried like any read."""
    try:
        first = client["local"]["oplog.rs"].find_one(
            {}, projection={"ts": 1, "_id": 0}, sort=[("$natural", 1)]
        )
    except OperationFailure as exc:
        raise OplogUnreadable(str(exc)) from exc
    ts = None if first is None else first.get("ts")
    return ts if isinstance(ts, Timestamp) else None


def lost_since(client: Any, at: Timestamp) -> Timestamp | None:
    """The oplog's first entry if it is newer than ``at`` (history between them may be lost),
    else ``None``. Raises :class:`OplogUnreadable` as :func:`oplog_start` does."""
    first = oplog_start(client)
    return first if first is not None and first > at else None
