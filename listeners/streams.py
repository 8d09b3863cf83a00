"""Change-stream helpers the runner needs: where a stream starts, what an error means, how much
oplog is left. Kept apart from the runner so that each reads in one sitting.

Error classes follow the drivers' change-streams spec: network errors, ``CursorNotFound`` and the
``ResumableChangeStreamError`` label are transient; 286 (``ChangeStreamHistoryLost``), 280
(``ChangeStreamFatalError``, "resume token was not found") and their messages mean the saved
position is gone and retrying it would loop forever; authentication errors will not heal.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import bson
from bson.timestamp import Timestamp
from loguru import logger

from listeners.checkpoint import Checkpoint, CheckpointStore, ResumeToken
from singleton.errors import BackendUnavailableError, ConfigurationError, SingletonError

if TYPE_CHECKING:
    from listeners.base import ChangeStreamListener

ErrorKind = Literal["history_lost", "permission", "transient", "fatal"]

HISTORY_LOST_CODES = frozenset({286, 280})
HISTORY_LOST_MESSAGES = (
    "no longer be in the oplog",
    "resume token was not found",
    "changestreamhistorylost",
    "resume point may no longer",
)
PERMISSION_CODES = frozenset({11, 13, 18, 31, 33, 8000})
# The spec's resumable server codes (besides the label), CursorNotFound (43) included, and
# MaxTimeMSExpired (50): the runner's own bound on every call.
RESUMABLE_CODES = frozenset(
    {
        6,
        7,
        43,
        50,
        63,
        89,
        91,
        133,
        150,
        189,
        234,
        262,
        9001,
        10107,
        11600,
        11602,
        13388,
        13435,
        13436,
    }
)


@dataclass(frozen=True)
class StartPosition:
    """How to open the next stream. All ``None``: "now" (and save it before handling)."""

    resume_after: ResumeToken | None = None
    start_after: ResumeToken | None = None
    at_time: Timestamp | None = None

    @classmethod
    def of(cls, cp: Checkpoint) -> StartPosition:
        if cp.resume_token is None:
            return cls(at_time=cp.cluster_time)
        if cp.start_after:
            return cls(start_after=cp.resume_token)
        return cls(resume_after=cp.resume_token)

    @property
    def fresh(self) -> bool:
        return self.resume_after is None and self.start_after is None and self.at_time is None

    def watch_kwargs(self) -> dict[str, Any]:
        if self.resume_after is not None:
            return {"resume_after": self.resume_after}
        if self.start_after is not None:
            return {"start_after": self.start_after}
        if self.at_time is not None:
            return {"start_at_operation_time": self.at_time}
        return {}


def classify(exc: BaseException) -> ErrorKind:
    """Which of the four error classes ``exc`` belongs to (see the module docstring)."""
    import pymongo.errors as pe

    if isinstance(exc, pe.OperationFailure):
        message = str(exc).lower()
        if exc.code in HISTORY_LOST_CODES or any(m in message for m in HISTORY_LOST_MESSAGES):
            return "history_lost"
        if exc.code in PERMISSION_CODES or "not authorized" in message:
            return "permission"
        if exc.has_error_label("ResumableChangeStreamError") or exc.code in RESUMABLE_CODES:
            return "transient"
        return "fatal"
    if isinstance(exc, (pe.ConnectionFailure, BackendUnavailableError)):
        return "transient"
    if isinstance(exc, (pe.InvalidOperation, pe.ConfigurationError, SingletonError)):
        return "fatal"
    if isinstance(exc, pe.PyMongoError):
        return "transient"
    return "fatal"


def token_time(token: ResumeToken | None) -> Timestamp | None:
    """The cluster time inside a resume token, when its format is known: SecantusDB's BSON
    document (field ``t``) or mongod's keystring (``0x82`` then the 8-byte timestamp)."""
    if not isinstance(token, Mapping) or not isinstance(token.get("_data"), str):
        return None
    try:
        raw = bytes.fromhex(token["_data"])
    except ValueError:
        return None
    try:
        t = bson.decode(raw).get("t")
        return t if isinstance(t, Timestamp) else None
    except Exception:  # not BSON: try the keystring layout
        pass
    if len(raw) >= 9 and raw[0] == 0x82:
        return Timestamp(int.from_bytes(raw[1:5], "big"), int.from_bytes(raw[5:9], "big"))
    return None


def cluster_time(client: Any) -> Timestamp:
    """The deployment's current cluster time (from a ``ping`` reply)."""
    reply = client.admin.command("ping")
    ts = reply.get("operationTime") or (reply.get("$clusterTime") or {}).get("clusterTime")
    if not isinstance(ts, Timestamp):
        raise ConfigurationError(
            "the MongoDB deployment reports no cluster time: change streams need a replica set"
        )
    return ts


def oplog_bounds(client: Any) -> tuple[Timestamp, Timestamp] | None:
    """``(oldest, newest)`` oplog entry times from ``local.oplog.rs``, or ``None`` if unreadable
    (no permission, or a deployment that hides it)."""
    oplog = client["local"]["oplog.rs"]
    oldest = oplog.find_one({}, {"ts": 1}, sort=[("$natural", 1)])
    newest = oplog.find_one({}, {"ts": 1}, sort=[("$natural", -1)])
    if oldest is None or newest is None:
        return None
    return oldest["ts"], newest["ts"]


class StandbyChecker:
    """On a follower, every ``interval`` seconds: can the saved token still be resumed (open and
    close a stream with it), and how far is the checkpoint from the oldest oplog entry? Warns
    when the headroom is below ``headroom_warning`` of the oplog window. Not on the safety path:
    it only reads, and its result is advice for operators (``ListenerRunner.status()``).

    Limitation: the window is measured in seconds between the oldest and newest oplog entries;
    a burst of writes can shrink it faster than one ``interval``.
    """

    def __init__(
        self,
        client: Any,
        checkpoints: CheckpointStore,
        listener: ChangeStreamListener,
        *,
        interval: float | None,
        headroom_warning: float,
        is_leading: Callable[[], bool],
        stopping: threading.Event,
    ) -> None:
        self._client = client
        self._checkpoints = checkpoints
        self._listener = listener
        self.interval = interval
        self.headroom_warning = headroom_warning
        self._is_leading = is_leading
        self._stopping = stopping
        self._result: dict[str, Any] = {"checked_at": None}
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self.interval is None or self._thread is not None:
            return
        self._thread = threading.Thread(
            target=self._loop, name=f"listener-standby-{self._listener.name}", daemon=True
        )
        self._thread.start()

    def stop(self, timeout: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def result(self) -> dict[str, Any]:
        return dict(self._result)

    def _loop(self) -> None:
        assert self.interval is not None
        while True:
            if not self._is_leading():
                try:
                    self.check()
                except Exception as exc:  # advice only: never let it kill the thread
                    logger.warning("standby check failed: listener={}: {!r}", self._listener, exc)
            if self._stopping.wait(self.interval):
                return

    def check(self) -> dict[str, Any]:
        """Run one check now and return (and keep) its result."""
        import pymongo

        with pymongo.timeout(10):
            return self._check()

    def _check(self) -> dict[str, Any]:
        lst = self._listener
        cp = self._checkpoints.load(lst.lease_name)
        result: dict[str, Any] = {
            "checked_at": time.time(),
            "checkpoint_cluster_time": None if cp is None else cp.cluster_time,
            "resumable": None,
            "error": None,
            "oplog_headroom_seconds": None,
            "oplog_window_seconds": None,
            "at_risk": False,
        }
        if cp is not None:
            target: Any = self._client[lst.database or ""]
            if lst.collection is not None:
                target = target[lst.collection]
            try:
                with target.watch(
                    list(lst.pipeline), max_await_time_ms=1, **StartPosition.of(cp).watch_kwargs()
                ):
                    pass
                result["resumable"] = True
            except Exception as exc:
                result["resumable"] = False if classify(exc) == "history_lost" else None
                result["error"] = f"{type(exc).__name__}: {exc}"
            try:
                bounds = oplog_bounds(self._client)
            except Exception as exc:
                bounds = None
                result["error"] = result["error"] or f"oplog unreadable: {exc}"
            if bounds is not None:
                oldest, newest = bounds
                headroom = cp.cluster_time.time - oldest.time
                window = newest.time - oldest.time
                result["oplog_headroom_seconds"] = headroom
                result["oplog_window_seconds"] = window
                result["at_risk"] = headroom < self.headroom_warning * window
            if result["resumable"] is False or result["at_risk"]:
                logger.warning(
                    "standby: checkpoint of listener={} at {} is {} (oplog headroom {}s of {}s)",
                    lst.lease_name,
                    cp.cluster_time,
                    "no longer resumable" if result["resumable"] is False else "close to expiry",
                    result["oplog_headroom_seconds"],
                    result["oplog_window_seconds"],
                )
        self._result = result
        return result
