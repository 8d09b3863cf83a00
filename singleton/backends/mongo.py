"""Fenced leases on MongoDB: one ``findOneAndUpdate`` per operation, expiry by the server's clock.

One document per lease name in ``<database>.<collection>`` (default ``singleton.leases``)::

    {_id: <name>,            # the lease name
     holder: <str> | null,   # null once released
     token: <int>,           # fencing counter: +1 on every new grant, never reset by a release
     expiresAt: <date>,      # server time; a release sets it to the release instant
     acquiredAt: <date>,     # server time of the grant that minted ``token``
     renewedAt: <date>,      # server time of the last grant or renewal
     contendedAt: <date>,    # server time of the last contend (grant or not), for ttl_remaining
     releasedAt: <date>}     # server time of the last release (absent until one)

Indexes: only the default unique ``_id`` index. There is deliberately no TTL index: the TTL
monitor runs once a minute, so liveness is ``expiresAt > $$NOW`` evaluated inside each operation.
Documents are never deleted (the token would restart from 1): drop one only when no replica runs.

Failure model: replicas' clocks disagree, so every expiry decision compares against ``$$NOW``,
the server's clock, inside the write itself. Writes use majority write concern; a timeout or a
network error leaves the outcome unknown and raises ``BackendUnavailableError`` (the caller is
not leader). The change stream only shortens waits: when it is down, waiters use their timeout.
``$$NOW`` is fixed when a command starts, before it waits for the document: a late ``$$NOW`` only
makes "is it expired?" more conservative, and a grant's expiry never precedes its request.
Dates are compared as ``$toLong`` milliseconds: SecantusDB (0.7) answers ``$gt`` between a stored
date and ``$$NOW`` with false both ways, and ``$subtract`` of the two with an internal error.
"""

from __future__ import annotations

import contextlib
import math
import random
import threading
import time
from collections.abc import Iterator, Mapping
from datetime import datetime, timezone
from typing import Any

import pymongo
import pymongo.errors as perr
from loguru import logger
from pymongo import ReturnDocument
from pymongo.collection import Collection
from pymongo.write_concern import WriteConcern

from singleton.abc import Lease, LeaseBackend, LeaseState, validate_lease_args
from singleton.backends._notify import ReleaseNotifier
from singleton.errors import (
    BackendError,
    BackendUnavailableError,
    ConfigurationError,
    PermissionDeniedError,
)
from singleton.redact import redact

Doc = dict[str, Any]

DEFAULT_TIMEOUT = 2.5
#: How long one change-stream getMore waits server-side; bounds how late ``close()`` ends it.
POLL_MS = 500
MAX_BACKOFF = 5.0
#: Unauthorized, AuthenticationFailed, UserNotFound, Atlas "not allowed".
_PERMISSION_CODES = frozenset({13, 18, 11, 8000})
#: Server answers that mean "try again later": outcome unknown, not a bug.
_UNAVAILABLE_CODES = frozenset(
    {6, 7, 50, 64, 89, 91, 189, 262, 9001, 10107, 11600, 11602, 13435, 13436}
)
#: Release events: a release is the only write that sets ``releasedAt``.
_RELEASES = [
    {
        "$match": {
            "$or": [
                {
                    "operationType": "update",
                    "updateDescription.updatedFields.releasedAt": {"$exists": True},
                },
                {"operationType": "replace"},
            ]
        }
    }
]


def _ms(field: str) -> Doc:
    return {"$toLong": field}


NOW_MS = _ms("$$NOW")
#: The stored lease is live: it has a holder and ``now < expiresAt`` (server clock).
_LIVE = {
    "$and": [{"$ne": [{"$ifNull": ["$holder", None]}, None]}, {"$gt": [_ms("$expiresAt"), NOW_MS]}]
}


def _ttl_ms(ttl: float) -> int:
    return max(1, math.ceil(round(ttl * 1000, 6)))


def _contend_pipeline(holder: str, ttl: float) -> list[Doc]:
    """The update of :meth:`MongoLeaseBackend.contend`, with the filter ``{_id: name}`` only.

    Why this is atomic: the filter matches the one document whatever its state, and every field
    is a ``$cond`` on flags computed from that same pre-image inside the same write, so the
    "free, expired or mine?" test and "mark as mine" cannot be separated by another writer
    (mongod holds the document's write lock across the pipeline; SecantusDB re-asserts the filter
    under its collection lock). A writer that loses changes nothing and gets the winner's
    document back. Two upserts of a missing ``_id`` race on the unique index: one inserts, the
    other gets DuplicateKey and retries once against the now existing document.
    """
    me = {"$literal": holder}  # a holder starting with "$" must not read as a field path
    grant = {"$or": ["$_new", "$_mine"]}
    return [
        {"$set": {"_live": _LIVE}},
        {
            "$set": {
                "_new": {"$not": ["$_live"]},
                "_mine": {"$and": ["$_live", {"$eq": ["$holder", me]}]},
            }
        },
        {
            "$set": {
                "holder": {"$cond": [grant, me, "$holder"]},
                "token": {"$cond": ["$_new", {"$add": [{"$ifNull": ["$token", 0]}, 1]}, "$token"]},
                "expiresAt": {"$cond": [grant, {"$add": ["$$NOW", _ttl_ms(ttl)]}, "$expiresAt"]},
                "acquiredAt": {"$cond": ["$_new", "$$NOW", "$acquiredAt"]},
                "renewedAt": {"$cond": [grant, "$$NOW", "$renewedAt"]},
                "contendedAt": "$$NOW",
            }
        },
        {"$unset": ["_live", "_new", "_mine"]},
    ]


def _owned_by(lease: Lease) -> Doc:
    """Filter: ``lease`` is the stored, live one (holder *and* token, never ``_id`` alone)."""
    return {
        "_id": lease.name,
        "holder": lease.holder,
        "token": lease.token,
        "$expr": {"$gt": [_ms("$expiresAt"), NOW_MS]},
    }


class MongoLeaseBackend(LeaseBackend):
    """Leases on MongoDB. Pass a ``MongoClient`` (never closed here) or a URL (the client built
    from it has bounded timeouts and is closed by :meth:`close`)."""

    def __init__(
        self,
        client_or_url: pymongo.MongoClient[Doc] | str,
        database: str = "singleton",
        collection: str = "leases",
        *,
        clock_skew_warning: float = 0.5,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> None:
        for label, value in (("database", database), ("collection", collection)):
            if not isinstance(value, str) or not value or "$" in value:
                raise ConfigurationError(f"{label} must be a non-empty name, got {value!r}")
        for label, number in (("clock_skew_warning", clock_skew_warning), ("timeout", timeout)):
            if isinstance(number, bool) or not isinstance(number, (int, float)) or not number > 0:
                raise ConfigurationError(f"{label} must be a positive number, got {number!r}")
        self._timeout = float(timeout)
        self._skew_warning = float(clock_skew_warning)
        self._owned = isinstance(client_or_url, str)
        if isinstance(client_or_url, str):
            self._url = redact(client_or_url)
            ms = int(self._timeout * 1000)
            try:
                self._client: pymongo.MongoClient[Doc] = pymongo.MongoClient(
                    client_or_url,
                    serverSelectionTimeoutMS=ms,
                    connectTimeoutMS=ms,
                    socketTimeoutMS=ms + POLL_MS,
                    connect=False,
                )
            except (perr.PyMongoError, ValueError, TypeError) as exc:
                raise ConfigurationError(
                    f"invalid MongoDB URL {self._url}: {redact(str(exc))}"
                ) from exc
        elif isinstance(client_or_url, pymongo.MongoClient):
            self._client = client_or_url
            seeds = client_or_url.topology_description.server_descriptions()
            self._url = "mongodb://" + ",".join(f"{h}:{p}" for h, p in seeds)
        else:
            raise ConfigurationError(
                f"expected a pymongo.MongoClient or a URL string, got {type(client_or_url)!r}"
            )
        self.database, self.collection = database, collection
        wc = WriteConcern("majority", wtimeout=int(self._timeout * 1000))
        self._coll: Collection[Doc] = self._client[database].get_collection(
            collection, write_concern=wc
        )
        self._notifier = ReleaseNotifier()
        self._lock = threading.Lock()
        self._checked = False
        self._closed = threading.Event()
        self._stream_tried = threading.Event()
        self._watcher: threading.Thread | None = None

    # -- the contract -----------------------------------------------------------------------
    def try_acquire(self, name: str, holder: str, ttl: float) -> Lease | None:
        result = self.contend(name, holder, ttl)
        return result if isinstance(result, Lease) else None

    def contend(self, name: str, holder: str, ttl: float) -> Lease | LeaseState | None:
        validate_lease_args(name, holder, ttl)
        pipeline = _contend_pipeline(holder, ttl)
        doc: Doc | None = None
        for attempt in (1, 2):
            try:
                with self._translate("acquire", name):
                    doc = self._coll.find_one_and_update(
                        {"_id": name}, pipeline, upsert=True, return_document=ReturnDocument.AFTER
                    )
                break
            except BackendError as exc:
                # Documents are never deleted, so the second try cannot race an insert again.
                if attempt == 2 or not isinstance(exc.__cause__, perr.DuplicateKeyError):
                    raise
        if doc is None:  # an upsert always returns the document after; be explicit anyway
            return None
        if doc.get("holder") == holder:
            return Lease(name, holder, int(doc["token"]), ttl)
        return self._state(name, doc, doc.get("contendedAt"))

    def renew(self, lease: Lease, ttl: float | None = None) -> Lease | None:
        ttl = lease.ttl if ttl is None else ttl
        validate_lease_args(lease.name, lease.holder, ttl)
        update = [{"$set": {"expiresAt": {"$add": ["$$NOW", _ttl_ms(ttl)]}, "renewedAt": "$$NOW"}}]
        with self._translate("renew", lease.name):
            doc = self._coll.find_one_and_update(_owned_by(lease), update, projection={"_id": 1})
        return None if doc is None else Lease(lease.name, lease.holder, lease.token, ttl)

    def release(self, lease: Lease) -> bool:
        validate_lease_args(lease.name, lease.holder)
        # The token stays: the next grant computes token + 1 from it.
        update = [{"$set": {"holder": None, "expiresAt": "$$NOW", "releasedAt": "$$NOW"}}]
        with self._translate("release", lease.name):
            doc = self._coll.find_one_and_update(_owned_by(lease), update, projection={"_id": 1})
        if doc is None:
            return False
        self._notifier.notify(lease.name)  # local waiters need not wait for the stream
        return True

    def inspect(self, name: str) -> LeaseState | None:
        validate_lease_args(name)
        pipeline: list[Doc] = [
            {"$match": {"_id": name}},
            {
                "$project": {
                    "holder": 1,
                    "token": 1,
                    "remainingMs": {"$subtract": [_ms("$expiresAt"), NOW_MS]},
                }
            },
        ]
        with self._translate("inspect", name):
            docs = list(self._coll.aggregate(pipeline))
        if not docs:
            return None
        return self._state(name, docs[0], None)

    def wait_for_release(
        self, name: str, timeout: float, wake: threading.Event | None = None
    ) -> bool:
        validate_lease_args(name)
        self._ensure_watcher()
        # Only the first waiters wait here, for the stream's first open attempt.
        if not self._stream_tried.is_set():
            timeout -= self._wait_stream(min(timeout, self._timeout), wake)
        if wake is not None and wake.is_set():
            return False
        return self._notifier.wait(name, timeout, wake)

    def describe(self) -> str:
        return f"mongo {self._url} {self.database}.{self.collection}"

    def close(self) -> None:
        self._closed.set()
        watcher = self._watcher
        if watcher is not None and watcher is not threading.current_thread():
            watcher.join(POLL_MS / 1000 + self._timeout)
        if self._owned:
            with contextlib.suppress(perr.PyMongoError):
                self._client.close()

    # -- change stream ----------------------------------------------------------------------
    def _ensure_watcher(self) -> None:
        with self._lock:
            if self._watcher is not None or self._closed.is_set():
                return
            self._watcher = threading.Thread(
                target=self._watch,
                name=f"singleton-mongo-watch-{self.database}.{self.collection}",
                daemon=True,
            )
            self._watcher.start()

    def _wait_stream(self, budget: float, wake: threading.Event | None) -> float:
        """Wait up to ``budget`` for the first open attempt (or ``wake``); return time spent."""
        start = time.monotonic()
        while not self._stream_tried.is_set() and not self._closed.is_set():
            left = budget - (time.monotonic() - start)
            if left <= 0 or (wake is not None and wake.is_set()):
                break
            self._stream_tried.wait(min(0.01, left))
        return time.monotonic() - start

    def _watch(self) -> None:
        backoff = 0.1
        resume: Mapping[str, Any] | None = None
        while not self._closed.is_set():
            try:
                with self._coll.watch(
                    _RELEASES, max_await_time_ms=POLL_MS, resume_after=resume
                ) as stream:
                    self._stream_tried.set()
                    backoff = 0.1
                    while not self._closed.is_set():
                        change = stream.try_next()
                        resume = stream.resume_token
                        if change is not None:
                            self._dispatch(change)
            except perr.PyMongoError as exc:
                self._stream_tried.set()
                if self._closed.is_set():
                    return
                if not isinstance(exc, (perr.ConnectionFailure, perr.ExecutionTimeout)):
                    resume = None  # history lost or an unresumable stream: start from now
                delay = backoff * random.uniform(0.8, 1.2)
                logger.warning(
                    "release change stream down, reopening in {:.2f}s (waiters fall back to their"
                    " timeout): {} {}.{}: {}",
                    delay,
                    self._url,
                    self.database,
                    self.collection,
                    redact(str(exc)),
                )
                self._closed.wait(delay)
                backoff = min(backoff * 2, MAX_BACKOFF)

    def _dispatch(self, change: Mapping[str, Any]) -> None:
        key = change.get("documentKey") or {}
        name = key.get("_id")
        if change.get("operationType") == "replace":
            released = (change.get("fullDocument") or {}).get("holder", 0) is None
        else:
            fields = (change.get("updateDescription") or {}).get("updatedFields") or {}
            released = fields.get("holder") is None
        if released and isinstance(name, str):
            logger.debug("release observed: lease={}", name)
            self._notifier.notify(name)

    # -- helpers ----------------------------------------------------------------------------
    @staticmethod
    def _state(name: str, doc: Mapping[str, Any], now: datetime | None) -> LeaseState | None:
        holder = doc.get("holder")
        remaining_ms: float | None = doc.get("remainingMs")
        if now is not None:
            remaining_ms = _epoch_ms(doc.get("expiresAt")) - _epoch_ms(now)
        if holder is None or remaining_ms is None or remaining_ms <= 0:
            return None
        return LeaseState(name, str(holder), int(doc["token"]), remaining_ms / 1000)

    @contextlib.contextmanager
    def _translate(self, op: str, name: str) -> Iterator[None]:
        """Bound the call, check the clock once, and turn every pymongo error into ours."""
        where = f"mongo {op} of lease {name!r} on {self._url} {self.database}.{self.collection}"
        try:
            with pymongo.timeout(self._timeout):
                if not self._checked:
                    self._check_clock()
                yield
        except perr.OperationFailure as exc:
            detail = redact(str(exc.details.get("errmsg", exc) if exc.details else exc))
            if exc.code in _PERMISSION_CODES:
                raise PermissionDeniedError(f"{where}: permission denied: {detail}") from exc
            if exc.code in _UNAVAILABLE_CODES or exc.timeout:
                raise BackendUnavailableError(f"{where}: outcome unknown: {detail}") from exc
            raise BackendError(f"{where}: {detail} (code {exc.code})") from exc
        except perr.PyMongoError as exc:
            if isinstance(exc, perr.ConfigurationError):
                raise ConfigurationError(f"{where}: {redact(str(exc))}") from exc
            if isinstance(exc, perr.ConnectionFailure) or getattr(exc, "timeout", False):
                raise BackendUnavailableError(
                    f"{where}: outcome unknown: {type(exc).__name__}: {redact(str(exc))}"
                ) from exc
            raise BackendError(f"{where}: {type(exc).__name__}: {redact(str(exc))}") from exc

    def _check_clock(self) -> None:
        """Log a warning if this machine's wall clock is far from the server's. Informational:
        expiry never uses this clock. Failures are left to the operation that follows."""
        before = time.time()
        hello = self._client.admin.command("hello")
        after = time.time()
        self._checked = True
        server = hello.get("localTime")
        if not isinstance(server, datetime):
            return
        skew = _epoch_ms(server) / 1000 - (before + after) / 2
        if abs(skew) > self._skew_warning + (after - before) / 2:
            logger.warning(
                "clock skew: this host's wall clock is {:+.3f}s off the MongoDB server's ({});"
                " leases stay correct (expiry uses the server's clock) but logs will disagree",
                -skew,
                self._url,
            )
        else:
            logger.debug("clock skew vs {}: {:+.3f}s", self._url, -skew)


def _epoch_ms(value: Any) -> float:
    if not isinstance(value, datetime):
        return 0.0
    if value.tzinfo is None:  # pymongo decodes BSON dates as naive UTC by default
        value = value.replace(tzinfo=timezone.utc)
    return float(value.timestamp()) * 1000
