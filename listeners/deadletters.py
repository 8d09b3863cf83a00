"""Poison events and history gaps: what a listener could not handle, recorded instead of lost.

Failure model: ``handle_batch`` may fail for one event forever (a document the sink rejects) or
for every event for a while (a sink that is down). The two look alike on one call; they differ
in what happens next to the events *around* it. So a failing batch is split until the failing
event is alone, and that event is dead-lettered only once the listener handled a later event
right after it failed (:class:`PoisonHandler`): a failure that every event meets is the
listener's, retried by the tenure within its failure budget, and never a dead letter. Every
record carries the fencing token of the tenure that wrote it, and is written only after
``ctx.check()``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Protocol

from bson.timestamp import Timestamp
from loguru import logger
from pymongo import UpdateOne

from listeners.runtime.handover import Drained
from singleton.clock import Clock
from singleton.drivers import mongo
from singleton.errors import (
    BackendUnavailableError,
    LeaseLostError,
    PermissionDeniedError,
    PoisonEventError,
    SinkLostError,
    SinkRejectedError,
)
from singleton.retry import Backoff

if TYPE_CHECKING:
    from pymongo import MongoClient

    from listeners.base import ChangeEvent, ListenerContext


#: What of a change event holds document values: left out of a dead letter unless the
#: listener's ``dead_letter_source`` is set.
SOURCE_FIELDS = ("fullDocument", "fullDocumentBeforeChange", "updateDescription")


def without_source(event: ChangeEvent) -> dict[str, Any]:
    """``event`` as a dead letter keeps it by default: its position, operation and key, none
    of the document's values (:data:`SOURCE_FIELDS`)."""
    return {k: v for k, v in event.items() if k not in SOURCE_FIELDS}


def with_current_documents(
    events: Sequence[ChangeEvent],
    find: Callable[[str | None, str | None, Any], Mapping[str, Any] | None],
    full_document: str | None,
) -> list[ChangeEvent]:
    """Dead letters recorded without their document (:func:`without_source`), as a replay
    delivers them: an insert or replace, and an update when the listener asks for the full
    document (``full_document``), carry the document as it is now (``None`` if it is gone),
    looked up by ``find(database, collection, _id)`` - what ``updateLookup`` gives. A letter
    that kept its document (its ``fullDocument`` key is there) is left as it was."""
    wanted = {"insert", "replace"}
    if full_document not in (None, "default"):
        wanted.add("update")
    out: list[ChangeEvent] = []
    for event in events:
        if "fullDocument" in event or event.get("operationType") not in wanted:
            out.append(event)
            continue
        ns, key = event.get("ns") or {}, (event.get("documentKey") or {}).get("_id")
        out.append({**event, "fullDocument": find(ns.get("db"), ns.get("coll"), key)})
    return out


class DeadLetterStore:
    """``dead_letters`` and ``gaps`` collections in one database (the service uses its
    ``namespace``; ``singleton`` by default).

    One dead letter per document and listener (``_id: {listener, key}``): a document that fails
    again updates its record (``attempts`` add up, ``last_seen`` moves, ``first_seen`` stays).
    A record holds the change event as it was delivered (by default without the document's
    values: :func:`without_source`, the listener's ``dead_letter_source``), the reason, the
    sink's status code when there is one, and the fencing token that wrote it.
    :meth:`request_replay` marks records; the running leader re-delivers marked events through
    the listener's normal path (see :class:`Replayer`), so a versioned sink can never be
    overwritten with something older.
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
        self.put_many([(event, error, attempts)], ctx)

    def put_many(
        self, letters: Sequence[tuple[ChangeEvent, BaseException, int]], ctx: ListenerContext
    ) -> None:
        """:meth:`put` for each ``(event, error, attempts)``, in one round trip (a sink that
        refuses a whole batch's documents dead-letters them at the rate of that batch)."""
        ctx.check()
        if not letters:
            return
        now = datetime.now(timezone.utc)
        ops = []
        for event, error, attempts in letters:
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
            ops.append(UpdateOne({"_id": key}, update, upsert=True))
        with mongo.translate(f"dead letter for {ctx.listener_name!r}"):
            self.dead_letters.bulk_write(ops, ordered=True)  # (one document twice: the last wins)

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


#: Errors that are not about the events handed over, raised at once (never split, never a dead
#: letter): a lost lease, a handover, a sink or store that is down (transient: the tenure retries
#: it), that refuses every request or our credentials (the tenure fails).
NOT_ABOUT_EVENTS: tuple[type[BaseException], ...] = (
    LeaseLostError,
    Drained,
    BackendUnavailableError,
    PermissionDeniedError,
    SinkRejectedError,
    SinkLostError,
)
#: Events that fail alone one after another, none handled after them, that one delivery tries
#: before it takes them for the listener's failure rather than a run of poison events.
MAX_SUSPECTS = 8


class ListenerFailing(Exception):
    """Not an event's fault: the listener failed on every event it was given since the last one
    it handled, and no later event was handled to prove those poison (see
    :class:`PoisonHandler`). The tenure retries it like a transient error, within its failure
    budget; ``error`` is what the listener raised."""

    def __init__(self, error: Exception, what: str) -> None:
        super().__init__(f"{what}: {type(error).__name__}: {error}")
        self.error = error


class Retries(Protocol):
    """What a :class:`PoisonHandler` reports to the loop around it (the tenure's one failure
    streak, :mod:`listeners.runtime.failures`)."""

    def retry(self, error: Exception, what: str, ctx: ListenerContext) -> None:
        """Count one failed try and wait before the next; raise when retrying is over (the
        budget is spent, the lease lost, a handover began)."""
        ...

    def progressed(self) -> None:
        """A poison event was proven (a later event was handled): the run of failures ended."""
        ...

    def raised(self, error: Exception, where: str) -> None:
        """The listener's own code raised ``error`` (log its traceback, once per error)."""
        ...


class LocalRetries:
    """:class:`Retries` for a handler used on its own (``backoff`` seconds, doubling up to 2 s;
    no budget; a wait ends when the lease is lost)."""

    def __init__(self, backoff: Backoff) -> None:
        self._backoff = backoff

    def retry(self, error: Exception, what: str, ctx: ListenerContext) -> None:
        delay = self._backoff.next()
        logger.warning(
            "{} (attempt {}), retrying in {:.2f}s: listener={}: {!r}",
            what,
            self._backoff.attempts,
            delay,
            ctx.listener_name,
            error,
        )
        if ctx.leadership.lost.wait(delay):
            ctx.check()

    def progressed(self) -> None:
        self._backoff.reset()

    def raised(self, error: Exception, where: str) -> None:
        logger.debug("{} raised: {!r}", where, error)


@dataclass
class _Suspect:
    """An event that failed alone, not yet proven poison: its last error and its tries alone."""

    event: ChangeEvent
    error: Exception
    tries: int


class PoisonHandler:
    """Deliver a batch in order, and tell a poison event from a failing listener.

    An event is poison only when the listener handles *other* events right after it failed on
    it alone: a failing batch is split in halves, in order, until the failing event is alone;
    the first event of a run that fails alone is retried alone ``max_retries - 1`` times (the
    waits are ``retries``'), then the events after it are tried. If one of those calls succeeds,
    the listener works: each event of the run is tried alone once more (if ``max_retries`` >= 1)
    and, failing still, is dead-lettered (or, with policy ``stop``, fails the tenure with
    :class:`PoisonEventError`). If nothing after the run succeeds (there is nothing after it, or
    more than :data:`MAX_SUSPECTS` events fail alone in a row), nothing is dead-lettered: the
    delivery raises :class:`ListenerFailing`, for the tenure to retry within its budget. A lone
    event that fails is therefore the listener's failure until a later event is handled.

    ``handle`` is the listener's ``handle_batch``; ``reached`` is told the last event of each
    call that succeeded with everything before it done (handled or dead-lettered), so that a
    retry starts after it. ``ctx.check()`` runs before every call. ``replay``: the events are
    dead letters already, and one that fails alone again goes back at once.
    """

    def __init__(
        self,
        handle: Callable[[Sequence[ChangeEvent], ListenerContext], object],
        store: DeadLetterStore | None,
        *,
        max_retries: int,
        policy: str,
        backoff: float = 0.05,
        retries: Retries | None = None,
        reached: Callable[[ChangeEvent], None] | None = None,
        keep_source: bool = False,
    ) -> None:
        self._handle, self._store, self._reached = handle, store, reached
        self.keep_source = keep_source
        self.max_retries = max_retries
        self.policy = policy
        self._retries = retries or LocalRetries(Backoff(backoff, max(backoff, 2.0)))
        #: Events written to the dead-letter store during this handler's life.
        self.dead_lettered = 0
        #: ``handle`` calls that raised (every failed attempt counts).
        self.errors = 0
        #: Events of the ``handle`` calls that returned.
        self.handled = 0

    def deliver(
        self, events: Sequence[ChangeEvent], ctx: ListenerContext, *, replay: bool = False
    ) -> None:
        """Return once every event was handled or dead-lettered; raise :class:`ListenerFailing`
        when the listener failed with no event handled after to prove poison, and whatever is
        not about the events (:data:`NOT_ABOUT_EVENTS`) at once."""
        _Delivery(self, ctx, events, replay).run()

    def attempt(self, events: Sequence[ChangeEvent], ctx: ListenerContext) -> Exception | None:
        """One call of ``handle``; the exception it raised about the events, if any."""
        ctx.check()
        try:
            self._handle(events, ctx)
        except NOT_ABOUT_EVENTS:
            raise
        except Exception as exc:
            self.errors += 1
            self._retries.raised(exc, "handle_batch")
            return exc
        self.handled += len(events)
        return None

    def retry(self, suspect: _Suspect, ctx: ListenerContext) -> None:
        what = f"handle_batch failed on event {_event_id(suspect.event)!r} alone"
        self._retries.retry(suspect.error, what, ctx)

    def progressed(self, events: Sequence[ChangeEvent], proven: bool) -> None:
        if proven:
            self._retries.progressed()
        if self._reached is not None:
            self._reached(events[-1])

    def poisoned(self, suspect: _Suspect, ctx: ListenerContext) -> None:
        """``suspect`` is proven poison: a dead letter, or the end of the tenure."""
        if self.policy == "stop" or self._store is None:
            raise PoisonEventError(
                f"listener {ctx.listener_name!r}: event {_event_id(suspect.event)!r} failed alone "
                f"{suspect.tries} times while the events after it were handled: "
                f"{type(suspect.error).__name__}: {suspect.error}"
            ) from suspect.error
        logger.error(
            "poison event dead-lettered after {} tries alone (the events after it were handled): "
            "listener={} token={} event_id={}: {!r}",
            suspect.tries,
            ctx.listener_name,
            ctx.token,
            _event_id(suspect.event),
            suspect.error,
        )
        event = suspect.event if self.keep_source else without_source(suspect.event)
        self._store.put(event, suspect.error, suspect.tries, ctx)
        self.dead_lettered += 1


class _Delivery:
    """One :meth:`PoisonHandler.deliver`: the events in order, and the run of events that
    failed alone since the last call that succeeded (the suspects)."""

    def __init__(
        self,
        handler: PoisonHandler,
        ctx: ListenerContext,
        events: Sequence[ChangeEvent],
        replay: bool,
    ) -> None:
        self.handler, self.ctx, self.events, self.replay = handler, ctx, events, replay
        self.suspects: list[_Suspect] = []

    def run(self) -> None:
        self._segment(self.events)
        if self.suspects:
            raise self._failing() from self.suspects[0].error

    def _segment(self, events: Sequence[ChangeEvent]) -> None:
        error = self.handler.attempt(events, self.ctx)
        if error is None:
            self._succeeded(events)
        elif len(events) > 1:
            mid = len(events) // 2
            self._segment(events[:mid])
            self._segment(events[mid:])
        else:
            self._alone(_Suspect(events[0], error, 1))

    def _alone(self, suspect: _Suspect) -> None:
        """``suspect`` failed alone: the first of a run is retried alone before anything after
        it is tried (so one flaky call neither reorders nor dead-letters an event)."""
        h = self.handler
        first = not self.suspects and not self.replay
        for _ in range(h.max_retries - 1 if first else 0):
            h.retry(suspect, self.ctx)
            error = h.attempt([suspect.event], self.ctx)
            if error is None:
                self._succeeded([suspect.event])
                return
            suspect.error, suspect.tries = error, suspect.tries + 1
        if self.replay:  # a dead letter already: it goes back, updated
            h.poisoned(suspect, self.ctx)
            return
        self.suspects.append(suspect)
        if len(self.suspects) >= MAX_SUSPECTS:
            raise self._failing() from self.suspects[0].error

    def _succeeded(self, events: Sequence[ChangeEvent]) -> None:
        """A call succeeded: the listener works, so the run of suspects before it is poison,
        each once it failed one last try alone (if ``max_retries`` allows one)."""
        proven = bool(self.suspects)
        for suspect in self.suspects:
            if self.handler.max_retries and not self._last_try(suspect):
                continue
            self.handler.poisoned(suspect, self.ctx)
        self.suspects.clear()
        if not self.replay and (proven or events is not self.events):
            self.handler.progressed(events, proven)

    def _last_try(self, suspect: _Suspect) -> bool:
        """Try ``suspect`` alone right after a later call succeeded; True if it failed again."""
        error = self.handler.attempt([suspect.event], self.ctx)
        if error is None:
            logger.warning(
                "event {!r} handled on its last try alone, after the events that followed it "
                "(its failures were not its own): listener={}",
                _event_id(suspect.event),
                self.ctx.listener_name,
            )
            return False
        suspect.error, suspect.tries = error, suspect.tries + 1
        return True

    def _failing(self) -> ListenerFailing:
        first = self.suspects[0]
        return ListenerFailing(
            first.error,
            f"handle_batch failed on {len(self.suspects)} event(s) alone from "
            f"{_event_id(first.event)!r} and on every event tried after them (none handled after "
            "them proves them poison)",
        )


def _event_id(event: ChangeEvent) -> Any:
    key = event.get("documentKey")
    return key.get("_id") if isinstance(key, Mapping) else event.get("_id")
