"""Poison events and history gaps: what a listener could not handle, recorded instead of lost.

Failure model: ``handle_batch`` may fail for one event forever (a document the sink rejects) or
for a while (a sink that is down). Retrying with backoff covers the second; bisecting the batch
isolates the first, so one bad event does not stop the stream. Every record carries the fencing
token of the tenure that wrote it, and is written only after ``ctx.check()``.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from bson.timestamp import Timestamp
from loguru import logger

from listeners.runtime.handover import Drained
from singleton.clock import Clock
from singleton.drivers import mongo
from singleton.errors import (
    LeaseLostError,
    PoisonEventError,
    SinkRejectedError,
    SinkUnavailableError,
)
from singleton.retry import Backoff

if TYPE_CHECKING:
    from pymongo import MongoClient

    from listeners.base import ChangeEvent, ListenerContext


class DeadLetterStore:
    """``dead_letters`` and ``gaps`` collections in one database (the service uses its
    ``namespace``; ``singleton`` by default).

    One dead letter per document and listener (``_id: {listener, key}``): a document that fails
    again updates its record (``attempts`` add up, ``last_seen`` moves, ``first_seen`` stays).
    A record holds the change event as it was delivered, the reason, the sink's status code when
    there is one, and the fencing token that wrote it. :meth:`request_replay` marks records; the
    running leader re-delivers marked events through the listener's normal path (see
    :class:`Replayer`), so a versioned sink can never be overwritten with something older.
    """

    def __init__(
        self,
        client_or_url: MongoClient[dict[str, Any]] | str,
        database: str = "singleton",
        collection: str = "dead_letters",
        gaps_collection: str = "gaps",
    ) -> None:
        self._client, self._owned = mongo.client(client_or_url, mongo.Timeouts.STORE)
        self.dead_letters = self._client[database][collection]
        self.gaps = self._client[database][gaps_collection]

    def put(
        self,
        event: ChangeEvent,
        error: BaseException,
        attempts: int,
        ctx: ListenerContext,
    ) -> None:
        """Record (or update) the dead letter of ``event``'s document (after ``ctx.check()``)."""
        ctx.check()
        now = datetime.now(timezone.utc)
        update = {
            "$set": {
                "event": dict(event),
                "reason": f"{type(error).__name__}: {error}",
                "status": getattr(error, "status", None),
                "last_seen": now,
                "fencing_token": ctx.token,
                "holder": ctx.leadership.holder,
            },
            "$setOnInsert": {"first_seen": now},
            "$inc": {"attempts": attempts},
            "$unset": {"replay": ""},
        }
        key = {"listener": ctx.listener_name, "key": _event_id(event)}
        with mongo.translate(f"dead letter for {ctx.listener_name!r}"):
            self.dead_letters.update_one({"_id": key}, update, upsert=True)

    def letters(self, listener: str, limit: int = 0) -> list[dict[str, Any]]:
        """The dead letters of ``listener``, oldest first."""
        with mongo.translate(f"list dead letters of {listener!r}"):
            cursor = self.dead_letters.find({"_id.listener": listener}).sort("first_seen", 1)
            return list(cursor.limit(limit))

    def request_replay(self, listener: str) -> int:
        """Mark every dead letter of ``listener`` for replay by its running leader."""
        with mongo.translate(f"request replay of {listener!r}"):
            result = self.dead_letters.update_many(
                {"_id.listener": listener}, {"$set": {"replay": True}}
            )
        return int(result.modified_count)

    def purge(self, listener: str) -> int:
        """Delete every dead letter of ``listener``; returns how many."""
        with mongo.translate(f"purge dead letters of {listener!r}"):
            return int(self.dead_letters.delete_many({"_id.listener": listener}).deleted_count)

    def replays(self, listener: str, limit: int) -> list[dict[str, Any]]:
        with mongo.translate(f"read replays of {listener!r}"):
            query = {"_id.listener": listener, "replay": True}
            return list(self.dead_letters.find(query, limit=limit))

    def replayed(self, records: Sequence[Mapping[str, Any]]) -> None:
        """Delete the records whose replay succeeded (a record that failed again was updated
        by :meth:`put`, which clears its ``replay`` mark, and stays)."""
        ids = [r["_id"] for r in records]
        with mongo.translate("delete replayed dead letters"):
            self.dead_letters.delete_many({"_id": {"$in": ids}, "replay": True})

    def record_gap(
        self,
        ctx: ListenerContext,
        from_time: Timestamp | None,
        to_time: Timestamp,
        reason: str,
    ) -> None:
        """Record that events between ``from_time`` and ``to_time`` were never delivered."""

        ctx.check()
        doc = {
            "listener": ctx.listener_name,
            "from_cluster_time": from_time,
            "to_cluster_time": to_time,
            "reason": reason,
            "fencing_token": ctx.token,
            "holder": ctx.leadership.holder,
            "time": datetime.now(timezone.utc),
        }
        with mongo.translate(f"record a gap for {ctx.listener_name!r}"):
            self.gaps.insert_one(doc)

    def not_replayable(self, records: Sequence[Mapping[str, Any]]) -> None:
        """Clear the replay mark of records that hold no change event (they stay)."""
        ids = [r["_id"] for r in records]
        with mongo.translate("unmark dead letters"):
            self.dead_letters.update_many(
                {"_id": {"$in": ids}},
                {"$unset": {"replay": ""}, "$set": {"note": "not a change event: verify --repair"}},
            )

    def close(self) -> None:
        if self._owned:
            self._client.close()


class Replayer:
    """Re-delivers the dead letters marked for replay (``singleton dead-letters replay``), from
    the running leader's tenure, at most every ``interval`` seconds and only while its stream is
    idle. They go through the listener's normal path (the poison handler, ``ctx.check()``), so a
    versioned sink refuses anything older than what it holds; a record that fails again is
    updated (attempts, reason) and stays; one that succeeds is deleted."""

    def __init__(
        self,
        store: DeadLetterStore,
        listener: str,
        *,
        clock: Clock,
        interval: float = 5.0,
        batch: int = 100,
    ) -> None:
        self._store, self._listener, self._clock = store, listener, clock
        self.interval, self.batch = interval, batch
        self._next = 0.0

    def poll(self, deliver: Callable[[list[ChangeEvent]], None]) -> int:
        """Replay one batch if one is waiting and it is time; returns how many were replayed."""
        now = self._clock.monotonic()
        if now < self._next:
            return 0
        self._next = now + self.interval
        records = self._store.replays(self._listener, self.batch)
        # A record without a resume token is no change event (a document the initial copy could
        # not write): there is nothing to re-deliver. It stays, unmarked, for `verify --repair`.
        events = [r for r in records if isinstance(r.get("event"), Mapping) and "_id" in r["event"]]
        others = [r for r in records if r not in events]
        if others:
            self._store.not_replayable(others)
            logger.warning(
                "{} dead letters of {} are not change events (initial copy); once the cause is "
                "fixed, `singleton verify --repair` indexes them",
                len(others),
                self._listener,
            )
        if not events:
            return 0
        deliver([r["event"] for r in events])
        self._store.replayed(events)
        logger.info("replayed {} dead letters: listener={}", len(records), self._listener)
        return len(records)


class PoisonHandler:
    """Deliver a batch: retry with backoff, then bisect to isolate and dead-letter bad events.

    ``handle`` is the listener's ``handle_batch``. The wait between retries returns early when
    the tenure ends (``ctx.leadership.lost``), and ``ctx.check()`` runs before every attempt,
    so a lost lease stops delivery within one attempt.
    """

    def __init__(
        self,
        handle: Callable[[Sequence[ChangeEvent], ListenerContext], None],
        store: DeadLetterStore | None,
        *,
        max_retries: int,
        policy: str,
        backoff: float = 0.05,
        max_backoff: float = 2.0,
        rng: random.Random | None = None,
        stop: threading.Event | None = None,
    ) -> None:
        self._handle, self._store, self._stop = handle, store, stop
        self.max_retries = max_retries
        self.policy = policy
        self._backoff = Backoff(backoff, max_backoff, rng=rng)
        #: Events written to the dead-letter store during this handler's life.
        self.dead_lettered = 0
        #: ``handle`` calls that raised (every failed attempt counts).
        self.errors = 0

    def deliver(self, events: Sequence[ChangeEvent], ctx: ListenerContext) -> None:
        """Return once every event was handled or dead-lettered; raise on loss or ``stop``."""
        error, attempts = self._attempts(events, ctx, self.max_retries + 1)
        if error is None:
            return
        if self.policy == "stop" or self._store is None:
            raise PoisonEventError(
                f"listener {ctx.listener_name!r}: handle_batch failed {attempts} times on a batch "
                f"of {len(events)}: {error}"
            ) from error
        self._isolate(events, ctx, error, attempts)

    def _attempts(
        self, events: Sequence[ChangeEvent], ctx: ListenerContext, tries: int
    ) -> tuple[Exception | None, int]:
        error: Exception | None = None
        self._backoff.reset()  # each run of attempts (a batch, a half, one event) starts low
        for attempt in range(1, tries + 1):
            ctx.check()
            try:
                self._handle(events, ctx)
                return None, attempt
            except (LeaseLostError, SinkUnavailableError, SinkRejectedError, Drained):
                # Not about these events: a lost lease, a handover, or a sink that is down or
                # refuses every request. Retrying them one by one would only dead-letter good
                # events.
                raise
            except Exception as exc:
                error = exc
                self.errors += 1
                if attempt == tries:
                    break
                delay = self._backoff.next()
                logger.warning(
                    "handle_batch failed (attempt {}/{}), retrying in {:.2f}s: listener={} "
                    "events={}: {!r}",
                    attempt,
                    tries,
                    delay,
                    ctx.listener_name,
                    len(events),
                    exc,
                )
                self._wait(ctx, delay)
        return error, tries

    def _wait(self, ctx: ListenerContext, delay: float) -> None:
        if ctx.leadership.lost.wait(delay):
            ctx.check()
        if self._stop is not None and self._stop.is_set():
            ctx.check()

    def _isolate(
        self, events: Sequence[ChangeEvent], ctx: ListenerContext, error: Exception, attempts: int
    ) -> None:
        """Bisect in order: halves that succeed are done, single events that keep failing are
        retried up to ``max_retries`` more times, then dead-lettered."""
        if len(events) == 1:
            if attempts <= self.max_retries:
                err, more = self._attempts(events, ctx, self.max_retries + 1 - attempts)
                if err is None:
                    return
                error, attempts = err, attempts + more
            self._dead_letter(events[0], ctx, error, attempts)
            return
        mid = len(events) // 2
        for half in (events[:mid], events[mid:]):
            err, _ = self._attempts(half, ctx, 1)
            if err is not None:
                self._isolate(half, ctx, err, 1)

    def _dead_letter(
        self, event: ChangeEvent, ctx: ListenerContext, error: Exception, attempts: int
    ) -> None:
        assert self._store is not None
        logger.error(
            "poison event dead-lettered after {} attempts: listener={} token={} event_id={}: {!r}",
            attempts,
            ctx.listener_name,
            ctx.token,
            _event_id(event),
            error,
        )
        self._store.put(event, error, attempts, ctx)
        self.dead_lettered += 1


def _event_id(event: ChangeEvent) -> Any:
    key = event.get("documentKey")
    return key.get("_id") if isinstance(key, Mapping) else event.get("_id")
