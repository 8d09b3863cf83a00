"""Fenced leases on MongoDB: one ``findOneAndUpdate`` per operation, expiry by the server's clock.

One document per lease name in ``<database>.<collection>`` (default ``singleton.leases``)::

    {_id: <name>,            # the lease name
     holder: <str> | null,   # null once released
     token: <int>,           # fencing token: max(token + 1, $$NOW in ms) on every new grant
     expiresAt: <date>,      # server time; a release sets it to the release instant
     acquiredAt: <date>,     # server time of the grant that minted ``token``
     renewedAt: <date>,      # server time of the last grant or renewal
     contendedAt: <date>,    # server time of the last contend (grant or not), for ttl_remaining
     releasedAt: <date>,     # server time of the last release (absent until one)
     facts: {<str>: <str>},  # Facts.remember's record: no lease operation touches it
     lastFire: <int>,        # the latest fire time claim_fire claimed (epoch ms)
     fires: [{fire, token, holder}]}  # the latest ``keep`` claims, latest first

Indexes: only the default unique ``_id`` index. There is deliberately no TTL index: the TTL
monitor runs once a minute, so liveness is ``expiresAt > $$NOW`` evaluated inside each operation.

Fencing tokens are a hybrid logical clock, as on Redis: a grant takes ``max(token + 1, $$NOW in
ms)``, in the same ``findOneAndUpdate``. So tokens keep growing even when the document is lost
(a dropped collection, a restore from an old backup, a failover that rolled back the last
writes): the next grant starts from the server's clock, above every token minted before, as
long as that clock does not step back and fewer than 1,000 grants a second are made of a name.

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
import time
from collections.abc import Callable, Iterator, Mapping
from datetime import datetime, timezone
from typing import Any, TypeVar

import pymongo
import pymongo.errors as perr
from loguru import logger
from pymongo import ReturnDocument
from pymongo.collection import Collection
from pymongo.write_concern import WriteConcern

from singleton.drivers.mongo import Timeouts, classify, client, translate
from singleton.errors import BackendError, ConfigurationError
from singleton.lease.facts import validate_facts
from singleton.lease.fires import FireClaim, validate_claim
from singleton.lease.leases import Lease, LeaseState, validate_lease_args
from singleton.lease.members import MongoMembership
from singleton.lease.notify import ReleaseFeed
from singleton.lease.server import ServerLeaseBackend
from singleton.redact import redact

Doc = dict[str, Any]
_T = TypeVar("_T")

DEFAULT_TIMEOUT = 2.5
#: How long one change-stream getMore waits server-side; bounds how late ``close()`` ends it.
POLL_MS = 500
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


#: A new grant's fencing token: the stored one + 1, or the server's clock in ms if that is more
#: (a missing document counts as token 0: the clock then still exceeds every earlier token).
_NEXT_TOKEN = {"$max": [{"$add": [{"$ifNull": ["$token", 0]}, 1]}, NOW_MS]}


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
                "token": {"$cond": ["$_new", _NEXT_TOKEN, "$token"]},
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


def check_options(
    database: object, collection: object, clock_skew_warning: object, timeout: object
) -> None:
    """Refuse a bad option of a MongoDB lease backend (thread or asyncio), naming it."""
    for label, value in (("database", database), ("collection", collection)):
        if not isinstance(value, str) or not value or "$" in value:
            raise ConfigurationError(f"{label} must be a non-empty name, got {value!r}")
    for label, number in (("clock_skew_warning", clock_skew_warning), ("timeout", timeout)):
        if isinstance(number, bool) or not isinstance(number, (int, float)) or not number > 0:
            raise ConfigurationError(f"{label} must be a positive number, got {number!r}")


def renew_update(ttl: float) -> list[Doc]:
    """The update of a renewal, with the filter :func:`_owned_by`."""
    return [{"$set": {"expiresAt": {"$add": ["$$NOW", _ttl_ms(ttl)]}, "renewedAt": "$$NOW"}}]


#: The update of a release, with the filter :func:`_owned_by`. The token stays: the next grant
#: computes max(token + 1, now) from it.
RELEASE_UPDATE = [{"$set": {"holder": None, "expiresAt": "$$NOW", "releasedAt": "$$NOW"}}]


def inspect_pipeline(name: str) -> list[Doc]:
    """The aggregation of :meth:`MongoLeaseBackend.inspect`: holder, token and remaining ms."""
    return [
        {"$match": {"_id": name}},
        {
            "$project": {
                "holder": 1,
                "token": 1,
                "remainingMs": {"$subtract": [_ms("$expiresAt"), NOW_MS]},
            }
        },
    ]


def contended(name: str, holder: str, ttl: float, doc: Doc | None) -> Lease | LeaseState | None:
    """What the contend's ``findOneAndUpdate`` returned (the document after), as an answer."""
    if doc is None:  # an upsert always returns the document after; be explicit anyway
        return None
    if doc.get("holder") == holder:
        return Lease(name, holder, int(doc["token"]), ttl)
    return lease_state(name, doc, doc.get("contendedAt"))


def lease_state(name: str, doc: Mapping[str, Any], now: datetime | None) -> LeaseState | None:
    """The live lease in ``doc`` (``now``: the server time it was read at, or ``None`` when the
    document carries ``remainingMs``), or ``None`` if it is free or expired."""
    holder = doc.get("holder")
    remaining_ms: float | None = doc.get("remainingMs")
    if now is not None:
        remaining_ms = _epoch_ms(doc.get("expiresAt")) - _epoch_ms(now)
    if holder is None or remaining_ms is None or remaining_ms <= 0:
        return None
    return LeaseState(name, str(holder), int(doc["token"]), remaining_ms / 1000)


def released_name(change: Mapping[str, Any]) -> str | None:
    """The lease name a change event of the :data:`_RELEASES` stream released, if any."""
    key = change.get("documentKey") or {}
    name = key.get("_id")
    if change.get("operationType") == "replace":
        released = (change.get("fullDocument") or {}).get("holder", 0) is None
    else:
        fields = (change.get("updateDescription") or {}).get("updatedFields") or {}
        released = fields.get("holder") is None
    return name if released and isinstance(name, str) else None


class MongoLeaseBackend(ServerLeaseBackend):
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
        check_options(database, collection, clock_skew_warning, timeout)
        self._timeout = float(timeout)
        self._skew_warning = float(clock_skew_warning)
        # The socket may wait out one change-stream getMore (POLL_MS) on top of the timeout.
        self._client, self._owned = client(
            client_or_url, Timeouts(self._timeout, self._timeout + POLL_MS / 1000)
        )
        if isinstance(client_or_url, str):
            self._url = redact(client_or_url)
        else:
            seeds = self._client.topology_description.server_descriptions()
            self._url = "mongodb://" + ",".join(f"{h}:{p}" for h, p in seeds)
        self.database, self.collection = database, collection
        wc = WriteConcern("majority", wtimeout=int(self._timeout * 1000))
        self._coll: Collection[Doc] = self._client[database].get_collection(
            collection, write_concern=wc
        )
        self._checked = False
        self._resume: Mapping[str, Any] | None = None
        self._releases = ReleaseFeed(
            f"singleton-mongo-watch-{database}.{collection}",
            f"release change stream {self._url} {database}.{collection}",
            self._stream,
            (perr.PyMongoError,),
            open_timeout=self._timeout,
        )

    # -- the contract -----------------------------------------------------------------------
    def contend(self, name: str, holder: str, ttl: float) -> Lease | LeaseState | None:
        validate_lease_args(name, holder, ttl)
        pipeline = _contend_pipeline(holder, ttl)
        doc: Doc | None = self._upsert(
            "acquire",
            name,
            lambda: self._coll.find_one_and_update(
                {"_id": name}, pipeline, upsert=True, return_document=ReturnDocument.AFTER
            ),
        )
        return contended(name, holder, ttl, doc)

    def renew(self, lease: Lease, ttl: float | None = None) -> Lease | None:
        ttl = lease.ttl if ttl is None else ttl
        validate_lease_args(lease.name, lease.holder, ttl)
        with self._translate("renew", lease.name):
            doc = self._coll.find_one_and_update(
                _owned_by(lease), renew_update(ttl), projection={"_id": 1}
            )
        return None if doc is None else Lease(lease.name, lease.holder, lease.token, ttl)

    def release(self, lease: Lease) -> bool:
        validate_lease_args(lease.name, lease.holder)
        with self._translate("release", lease.name):
            doc = self._coll.find_one_and_update(
                _owned_by(lease), RELEASE_UPDATE, projection={"_id": 1}
            )
        if doc is None:
            return False
        self._releases.notify(lease.name)  # local waiters need not wait for the stream
        return True

    def inspect(self, name: str) -> LeaseState | None:
        validate_lease_args(name)
        with self._translate("inspect", name):
            docs = list(self._coll.aggregate(inspect_pipeline(name)))
        if not docs:
            return None
        return lease_state(name, docs[0], None)

    def remember(self, name: str, facts: Mapping[str, str | int]) -> None:
        fields = validate_facts(name, facts)
        update = {"$set": {f"facts.{k}": v for k, v in fields.items()}}
        self._upsert(
            "remember", name, lambda: self._coll.update_one({"_id": name}, update, upsert=True)
        )

    def recall(self, name: str) -> dict[str, str]:
        validate_lease_args(name)
        with self._translate("recall", name):
            doc = self._coll.find_one({"_id": name}, projection={"facts": 1})
        facts = (doc or {}).get("facts") or {}
        return {str(k): str(v) for k, v in facts.items()}

    def claim_fire(
        self, lease: Lease, fire_ms: int, keep: int = 100, ahead_ms: int = 10_000
    ) -> bool:
        validate_claim(lease, fire_ms, keep, ahead_ms)
        # The lease filter (holder, token, live on $$NOW) and "later than the latest claim" are
        # one filter of one findOneAndUpdate: nothing can claim between the test and the write.
        later = {"$or": [{"lastFire": {"$exists": False}}, {"lastFire": {"$lt": fire_ms}}]}
        not_ahead = {"$expr": {"$lte": [fire_ms, {"$add": [NOW_MS, ahead_ms]}]}}
        claim = {"fire": fire_ms, "token": lease.token, "holder": lease.holder}
        update = {
            "$set": {"lastFire": fire_ms},
            "$push": {"fires": {"$each": [claim], "$position": 0, "$slice": keep}},
        }
        with self._translate("claim_fire", lease.name):
            doc = self._coll.find_one_and_update(
                {"$and": [_owned_by(lease), later, not_ahead]}, update, projection={"_id": 1}
            )
        return doc is not None

    def fires(self, name: str) -> list[FireClaim]:
        validate_lease_args(name)
        with self._translate("fires", name):
            doc = self._coll.find_one({"_id": name}, projection={"fires": 1})
        return [
            FireClaim(int(c["fire"]), int(c["token"]), str(c["holder"]))
            for c in (doc or {}).get("fires") or []
        ]

    def membership(self) -> MongoMembership:
        wc = self._coll.write_concern  # majority, like the leases
        members = self._coll.database.get_collection(f"{self.collection}.members", write_concern=wc)
        return MongoMembership(members, self._translate)

    def describe(self) -> str:
        return f"mongo {self._url} {self.database}.{self.collection}"

    def close(self) -> None:
        self._releases.close(POLL_MS / 1000 + self._timeout)
        if self._owned:
            with contextlib.suppress(perr.PyMongoError):
                self._client.close()

    # -- change stream ----------------------------------------------------------------------
    def _stream(self) -> None:
        try:
            with self._coll.watch(
                _RELEASES, max_await_time_ms=POLL_MS, resume_after=self._resume
            ) as stream:
                self._releases.opened()
                while not self._releases.closed.is_set():
                    change = stream.try_next()
                    self._resume = stream.resume_token
                    if change is not None:
                        self._dispatch(change)
                    if not stream.alive:  # invalidated: the collection was dropped or renamed
                        self._resume = None  # nothing to resume after an invalidate
                        raise perr.PyMongoError("release change stream invalidated")
        except perr.PyMongoError as exc:
            if classify(exc) != "transient":
                self._resume = None  # history lost or an unresumable stream: start from now
            raise

    def _dispatch(self, change: Mapping[str, Any]) -> None:
        name = released_name(change)
        if name is not None:
            logger.debug("release observed: lease={}", name)
            self._releases.notify(name)

    # -- helpers ----------------------------------------------------------------------------
    def _upsert(self, op: str, name: str, write: Callable[[], _T]) -> _T:
        """``write`` (an upsert of ``{_id: name}``), once more if a concurrent upsert inserted
        the document first: nothing here deletes documents, so the retry meets that one."""
        for attempt in (1, 2):
            try:
                with self._translate(op, name):
                    return write()
            except BackendError as exc:
                if attempt == 2 or not isinstance(exc.__cause__, perr.DuplicateKeyError):
                    raise
        raise AssertionError("unreachable")

    @contextlib.contextmanager
    def _translate(self, op: str, name: str) -> Iterator[None]:
        """Bound the call, check the clock once, and turn every pymongo error into ours."""
        where = f"mongo {op} of lease {name!r} on {self._url} {self.database}.{self.collection}"
        with translate(where), pymongo.timeout(self._timeout):
            if not self._checked:
                self._check_clock()
            yield

    def _check_clock(self) -> None:
        """Log a warning if this machine's wall clock is far from the server's. Informational:
        expiry never uses this clock. Failures are left to the operation that follows."""
        before = time.time()
        hello = self._client.admin.command("hello")
        after = time.time()
        self._checked = True
        report_clock_skew(hello, before, after, self._skew_warning, self._url)


def report_clock_skew(
    hello: Mapping[str, Any], before: float, after: float, limit: float, url: str
) -> None:
    """Warn if the server's ``localTime`` in ``hello`` (asked between the wall-clock times
    ``before`` and ``after``) is more than ``limit`` seconds off this host's clock, beyond
    what the round trip leaves uncertain (thread and asyncio backends)."""
    server = hello.get("localTime")
    if not isinstance(server, datetime):
        return
    skew = _epoch_ms(server) / 1000 - (before + after) / 2
    if abs(skew) > limit + (after - before) / 2:
        logger.warning(
            "clock skew: this host's wall clock is {:+.3f}s off the MongoDB server's ({});"
            " leases stay correct (expiry uses the server's clock) but logs will disagree",
            -skew,
            url,
        )
    else:
        logger.debug("clock skew vs {}: {:+.3f}s", url, -skew)


def _epoch_ms(value: Any) -> float:
    if not isinstance(value, datetime):
        return 0.0
    if value.tzinfo is None:  # a client passed in may decode dates as naive UTC (the default)
        value = value.replace(tzinfo=timezone.utc)
    return float(value.timestamp()) * 1000
