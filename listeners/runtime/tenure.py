"""One tenure's work, start to end: open the stream where the checkpoint says, hand each batch to
the sink once, tell the checkpoint policy what the sink answered (the policy saves; the tenure
never goes back into the sink for a batch), recover from stream errors, and end with a
:class:`TenureOutcome`. The sink's :meth:`~listeners.base.ChangeStreamListener.flush` is asked
only while it holds something unacknowledged: before a position past everything delivered is
saved (idle, invalidate, a large event passed), after a dead-letter replay, when a stream
reopens, and at a planned handover with what is left of the drain's budget.

Failure model: the lease may end at any instant, the stream's connection may drop, and the oplog
may roll past the saved position. So every MongoDB call is bounded by half the renew deadline
(opening a stream, a read, by ``open_timeout``), ``ctx.check()`` runs before every
``handle_batch`` and checkpoint write, and a tenure starts by *claiming* the checkpoint (fencing
it with its token); a claim that finds none when this replica or the lease store's marker
(:mod:`listeners.checkpoints.marker`) knows one existed applies ``on_history_lost``, and so does a
saved cluster time that the oplog no longer reaches back to (checked before every stream opened
at one, the server not trusted to say so: :mod:`listeners.stream.history`). Transient
errors (:func:`singleton.drivers.mongo.classify`), and a listener that fails on every event it is
given (:class:`~listeners.deadletters.ListenerFailing`: no poison proven), are retried in place,
from the last acknowledged event, as one :class:`~listeners.runtime.failures.FailureStreak` (one
backoff, one ``failure_budget``, whatever fails); errors that retrying cannot fix, and transient
ones past the budget, end the tenure as ``failed`` and the runner resigns the lease and says so
(:mod:`listeners.runtime.runner`). A change event over 16 MB is neither: the stream reads on past it
without its large fields (:mod:`listeners.stream.large_events`).
"""

from __future__ import annotations

import contextlib
import random
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn

import pymongo
from bson.timestamp import Timestamp
from loguru import logger

from listeners.base import ChangeEvent, ChangeStreamListener, ListenerContext, StopReason
from listeners.checkpoints.marker import CheckpointMarker
from listeners.checkpoints.policy import CheckpointPolicy, CheckpointSettings
from listeners.checkpoints.stores import Checkpoint
from listeners.deadletters import (
    NOT_ABOUT_EVENTS,
    DeadLetterStore,
    ListenerFailing,
    PoisonHandler,
    Replayer,
    with_current_documents,
)
from listeners.runtime.audit import AuditLog, ts_pair
from listeners.runtime.failures import DOING, DeliveryRetries, FailureStreak, Stage, UserErrors
from listeners.runtime.handover import Drained, HandoverGate
from listeners.runtime.status import StatusBoard, TenureOutcome
from listeners.stream import history
from listeners.stream.large_events import LargeEvents
from listeners.stream.reader import StartPosition, StreamReader, oversized_reply
from listeners.stream.tokens import event_time, token_time
from singleton.drivers import mongo
from singleton.errors import (
    HistoryLostError,
    LeaseLostError,
    PermissionDeniedError,
    PoisonEventError,
    SingletonError,
    SinkLostError,
    StaleWriterError,
)
from singleton.retry import Backoff

if TYPE_CHECKING:
    from singleton.clock import Clock
    from singleton.election.leadership import Leadership
    from singleton.lease.contract import LeaseBackend


__all__ = ["Drained", "TenureSettings", "TenureWorker"]


@dataclass(frozen=True)
class TenureSettings:
    """What every tenure of one runner shares, built once by the runner (read-only; see
    ``ListenerRunner`` for the meanings)."""

    listener: ChangeStreamListener
    client: Any
    checkpoints: CheckpointSettings
    dead_letters: DeadLetterStore
    clock: Clock
    max_await_time: float
    op_timeout: float
    #: Opening a stream (a read; the server searches its oplog for the token) may take longer.
    open_timeout: float
    reconnect_backoff: float
    max_reconnect_backoff: float
    rng: random.Random
    audit: AuditLog | None
    failure_budget: float
    #: The elector's lease store, where the checkpoint marker lives.
    lease_store: LeaseBackend


class TenureWorker:
    """Runs one tenure in the calling thread (:meth:`run`). ``drain`` asks for a handover and
    ``gate`` carries it out (:mod:`listeners.runtime.handover`); ``wake`` is set on a drain or a
    loss, and cuts any wait short."""

    def __init__(
        self,
        settings: TenureSettings,
        leadership: Leadership,
        board: StatusBoard,
        *,
        drain: threading.Event,
        wake: threading.Event,
        gate: HandoverGate | None = None,
    ) -> None:
        self._settings = settings
        self._board = board
        self._drain, self._wake = drain, wake
        self._gate = gate or HandoverGate(drain)
        self.name = settings.listener.lease_name
        self.ctx = ListenerContext(
            leadership=leadership,
            client=settings.client,
            logger=logger.bind(listener=self.name, token=leadership.token),
            listener_name=self.name,
            progress=settings.checkpoints.store,
            dead_letters=settings.dead_letters,
            draining=drain,
            clock=settings.clock,
        )
        self._marker = CheckpointMarker(settings.lease_store, self.name, self._bounded)
        self._policy = CheckpointPolicy(
            settings.checkpoints,
            self.ctx,
            bounded=self._bounded,
            routine=self._gate.waiting,
            marker=self._marker,
            board=board,
            audit=settings.audit,
            deployment=settings.listener.deployment(),
        )
        self._replayer = Replayer(settings.dead_letters, self.name, clock=settings.clock)
        self._large = LargeEvents(settings.listener, self._policy, self.ctx)
        #: The bound of a read that may wait (a ``getMore``): ``op_timeout``, doubled (up to
        #: ``open_timeout``) after each read that timed out, for the rest of the tenure - a
        #: server that needs longer than ``op_timeout`` for a read must not keep the tenure
        #: reopening and retrying the same read forever (resetting it on the first step read
        #: after a reopen did exactly that, under load, in the drill). A read writes nothing:
        #: ``ctx.check()`` still runs before every write, so a longer read never outlives the
        #: lease's safety, and a drain does not wait for it.
        self._read_timeout = settings.op_timeout
        #: The getMore batch size after a reply over the driver's message limit (halved each
        #: time, this tenure); ``None``: the listener's ``batch_size``.
        self._reply_batch: int | None = None
        #: Every failure of the tenure, whatever failed: one backoff, one budget.
        self._failures = FailureStreak(
            self.name,
            Backoff(settings.reconnect_backoff, settings.max_reconnect_backoff, rng=settings.rng),
            settings.failure_budget,
            settings.clock,
        )
        #: What the worker is doing: the stage a failure is counted at.
        self._stage: Stage = "start"
        self._oplog_unreadable = False  # said once per tenure
        self._user_errors = UserErrors(self.name)
        self._retries = DeliveryRetries(self._failures, self._user_errors, self._pause)
        #: When this tenure first streamed (monotonic), ``None`` if it never did.
        self.streaming_since: float | None = None
        #: The exception that ended the tenure, if one did.
        self.error: Exception | None = None

    # -- start and end --------------------------------------------------------------------
    def run(self) -> TenureOutcome:
        """Lead until the tenure ends; ``on_stop`` always runs. Never raises an ``Exception``."""
        ld = self.ctx.leadership
        stop: StopReason = "released"
        try:
            if ld.valid():
                logger.info("listener leading: listener={} token={}", self.name, ld.token)
                self._board.set(state="starting", fencing_token=ld.token, last_error=None)
                with self._gate.acting(self._release):
                    self._settings.listener.on_start(self.ctx)
                    self._lead()
            # Over before it began (the previous tenure's worker ended late): nothing was done.
            outcome = TenureOutcome("lost", ld.reason or "expired", True, ld.token)
        except Exception as exc:
            stop, outcome = self._ended(exc)
        try:
            self._settings.listener.on_stop(self.ctx, stop)
        except Exception:
            logger.exception("on_stop failed: listener={}", self.name)
        self._board.batch_size = None  # no reader asks until the next tenure streams
        if self._board.state != "failed":
            self._board.set(state="follower")
        logger.info("listener stopped ({}): listener={} token={}", stop, self.name, ld.token)
        return outcome

    def _ended(self, exc: Exception) -> tuple[StopReason, TenureOutcome]:
        """The outcome of the tenure ``exc`` ended; the runner logs it (one line) and acts."""
        ld = self.ctx.leadership
        if isinstance(exc, Drained):
            return "released", TenureOutcome("completed", "released", True, ld.token)
        self.error = exc
        if isinstance(exc, StaleWriterError):  # the store says a newer tenure has written
            self._board.set(last_error=str(exc))
            return "lost", TenureOutcome("lost", f"stale writer: {exc}", True, ld.token)
        if isinstance(exc, LeaseLostError):
            reason = ld.reason or "expired"
            stop: StopReason = "expired" if reason == "expired" else "lost"
            return stop, TenureOutcome("lost", reason, True, ld.token)
        self._policy.salvage()
        error = f"{type(exc).__name__}: {exc}"
        self._board.set(state="failed", last_error=error)
        return "error", TenureOutcome.failure(error, exc, ld.token)

    # -- streaming ------------------------------------------------------------------------
    def _lead(self) -> NoReturn:
        pos: StartPosition | None = None  # None: the tenure has not claimed its start yet
        while True:
            self.ctx.check()
            try:
                if pos is None:
                    self._stage = "start"
                    pos = self._start()
                    self._failures.succeeded("start")
                pos = self._stream(self._within_history(pos))
                self._failures.succeeded("save")  # an invalidate, a large event: saved past it
            except (LeaseLostError, Drained, PoisonEventError):
                raise
            except Exception as exc:
                pos = self._recover(exc, pos)

    def _start(self) -> StartPosition:
        """Claim the checkpoint; start where it stands, or notice it vanished, or copy first."""
        cp = self._policy.claim()
        last_seen = self._settings.checkpoints.last_seen
        seen = last_seen.checkpoint
        last_seen.saw(cp)
        if cp is not None:
            # Lag counts from the first moment: a sink down at the start shows a growing lag.
            self._board.seen(cp.cluster_time)
            self.ctx.resumed = True
            logger.info(
                "resumed from checkpoint at {}: listener={} token={}",
                cp.cluster_time,
                self.name,
                self.ctx.token,
            )
            with self._bounded():
                pending = self.ctx.unfinished_resync()
            stale = pending or self._settings.listener.stale_sink(self.ctx)
            if stale is not None and self._settings.listener.has_initial_sync():
                self._board.count(sink_lost=1)
                logger.warning(
                    "resyncing: listener={} token={}: {}",
                    self.name,
                    self.ctx.token,
                    stale
                    if pending is None
                    else f"an earlier tenure's resync did not finish ({pending})",
                )
                return self._sync("resync", stale)
            return StartPosition.of(cp)
        gone = self._marker.disappeared(seen)
        if gone is not None:
            return self._history_lost(*gone)
        if self._settings.listener.has_initial_sync():
            return self._sync("initial sync")
        return StartPosition()

    def _within_history(self, pos: StartPosition) -> StartPosition:
        """``pos``, unless it is a cluster time the oplog no longer reaches back to (see
        :mod:`listeners.stream.history`): then ``on_history_lost`` decides."""
        if pos.at_time is None:
            return pos
        self._stage = "open"
        try:
            with self._bounded():
                first = history.lost_since(self._settings.client, pos.at_time)
        except history.OplogUnreadable as exc:
            if not self._oplog_unreadable:
                self._oplog_unreadable = True
                logger.warning(
                    "cannot read the oplog's first entry, so history lost behind a saved cluster"
                    " time is left to the server to detect (grant read on local.oplog.rs):"
                    " listener={}: {}",
                    self.name,
                    exc,
                )
            return pos
        if first is None:
            return pos
        return self._history_lost(
            f"change stream history lost: the saved cluster time {pos.at_time} is older than"
            f" the oplog's first entry {first}",
            pos.at_time,
        )

    def _stream(self, pos: StartPosition) -> StartPosition:
        """Open the stream at ``pos`` and follow it (:meth:`_follow`)."""
        self._stage = "open"
        fresh = self._cluster_time() if pos.fresh else None
        with self._gate.waiting(), pymongo.timeout(self._settings.open_timeout):
            opened = self._large.watch(
                self._settings.client,
                pos,
                max_await_time=self._settings.max_await_time,
                at_time=fresh,
                batch_size=self._reply_batch,
            )
        with opened as stream:
            reader = StreamReader(
                stream,
                self._settings.listener,
                clock=self._settings.clock,
                bounded=self._reading,
                board=self._board,
            )
            self._board.set(state="streaming")
            # What the sink still holds belongs to the previous stream: wait for it and keep
            # none of it (this stream starts after the last acknowledged position).
            self._flush()
            self._policy.opened(reader.resume_token, fresh)
            self._failures.succeeded("open")
            return self._follow(reader, pos)

    def _follow(self, reader: StreamReader, pos: StartPosition) -> StartPosition:
        """Stream until an invalidate (returns where to continue), a drain, or an error."""
        while True:
            self._check_handover()
            self._stage = "read"
            step = reader.read()
            if self._failures.failing:
                self._failures.succeeded("read")
            if step is None:
                continue
            saved = self._policy.last
            if step.batch:
                self._stage = "deliver"
                self._deliver(step.batch, step.token)
            self._stage = "save"
            if step.kind == "full":
                self._policy.after_batch()
            elif step.kind == "idle":
                self._idle(step.token)
            else:
                assert step.event is not None
                return self._invalidated(step.event)
            if self._large.passed(step):  # save past the large event, read full events
                self._flush()
                self._policy.passed(step.token)
                return self._policy.resume_position(pos)
            self._progressed(saved)

    def _idle(self, token: Any) -> None:
        """The stream caught up at ``token``: every event read was handed to the sink."""
        self._board.seen(token_time(token))
        self._stage = "deliver"
        self._flush()  # the idle position is past everything delivered
        self._stage = "save"
        self._policy.caught_up(token)
        self._stage = "deliver"
        self._replayer.poll(self._replay)
        self._settings.listener.on_idle(self.ctx)  # (a SinkLostError: the tenure resyncs)

    def _progressed(self, saved: Checkpoint | None) -> None:
        """After a step: a checkpoint saved ends a failure streak, whatever failed; the first
        step with nothing failing and the sink's work acknowledged (or saved) makes this a
        working tenure, and a failure reported by an earlier one no longer stands."""
        moved = self._policy.last is not saved
        if moved:
            self._failures.succeeded("save")
        if self.streaming_since is not None or self._failures.failing:
            return
        if moved or not self._policy.in_flight.events:
            self.streaming_since = self._settings.clock.monotonic()
            self._board.set(failure=None)

    def _check_handover(self) -> None:
        """On a drain: save what the sink acknowledged, and end; on a loss: end."""
        self._gate.check()
        if self.ctx.leadership.lost.is_set():
            self.ctx.check()

    def _deliver(self, batch: list[ChangeEvent], token: Any) -> None:
        """Hand ``batch`` to the listener (retries, dead letters), once; ``token`` follows it.
        What the sink answered goes to the checkpoint policy."""
        handler = self._handler(reached=self._reached)
        audit = self._settings.audit
        sent = audit.now() if audit is not None else 0.0
        started = self._settings.clock.monotonic()
        try:
            handler.deliver(batch, self.ctx)
        except BaseException:
            # The failed tries count too, and what was done before them (positions reached).
            self._board.count(
                sink_errors=handler.errors,
                dead_lettered=handler.dead_lettered,
                events_handled=handler.handled,
            )
            raise
        last = event_time(batch[-1])
        if audit is not None:
            audit.record("batch", token=self.ctx.token, n=len(batch), ct=ts_pair(last), sent=sent)
        self._board.delivered(
            len(batch),
            dead_lettered=handler.dead_lettered,
            errors=handler.errors,
            seconds=self._settings.clock.monotonic() - started,
            cluster_time=last,
        )
        self._policy.delivered(token, batch)
        if not self._policy.in_flight.events:
            self._failures.succeeded("deliver")

    def _reached(self, event: ChangeEvent) -> None:
        """Every event of the batch up to ``event`` was handled or dead-lettered: once the sink
        acknowledges them, a retry starts after it, not at the batch's start."""
        self._policy.delivered(event["_id"], [event])

    def _handler(self, reached: Callable[[ChangeEvent], None] | None = None) -> PoisonHandler:
        listener, policy = self._settings.listener, self._policy

        def handle(events: Sequence[ChangeEvent], ctx: ListenerContext) -> None:
            # Every call that returns tells the policy its answer; the poison handler retries
            # and splits a failing batch, so a call's events may be fewer than the batch's.
            policy.handed(len(events), listener.handle_batch(events, ctx))

        return PoisonHandler(
            handle,
            self._settings.dead_letters,
            max_retries=listener.max_retries,
            policy=listener.on_poison,
            retries=self._retries,
            reached=reached,
            keep_source=listener.dead_letter_source,
        )

    def _replay(self, events: list[ChangeEvent]) -> None:
        """Dead letters marked for replay: delivered like a batch, and durable before the
        replayer deletes their records. One that fails alone again goes back at once."""
        listener, client = self._settings.listener, self.ctx.client

        def find(database: str | None, collection: str | None, key: Any) -> Any:
            db, coll = database or listener.database, collection or listener.collection
            return None if db is None or coll is None else client[db][coll].find_one({"_id": key})

        events = with_current_documents(events, find, listener.full_document)
        self._handler().deliver(events, self.ctx, replay=True)
        self._flush()
        self._policy.require_acknowledged()

    def _flush(self) -> None:
        """Ask the sink for what it still holds, if anything (``ChangeStreamListener.flush``);
        all of it acknowledged is delivery done. A flush that raises is the listener failing
        (:class:`ListenerFailing`: retried within the budget)."""
        if self._policy.in_flight.events:
            self._sink_flush(None)
            if not self._policy.in_flight.events:
                self._failures.succeeded("deliver")

    def _sink_flush(self, deadline: float | None) -> None:
        try:
            answer = self._settings.listener.flush(deadline, self.ctx)
        except NOT_ABOUT_EVENTS:
            raise
        except Exception as exc:
            self._user_errors.report(exc, "flush")
            raise ListenerFailing(exc, "flush failed") from exc
        self._policy.flushed(answer)

    def _release(self, left: float) -> None:
        """A planned handover (the gate's final act, within ``left`` seconds of the drain's
        budget, on whichever thread closes it): what the sink acknowledged by then is saved."""
        with self._policy.within(left):
            if self._policy.in_flight.events:
                self._sink_flush(self._settings.clock.monotonic() + left)
            self._policy.release()

    def _invalidated(self, event: ChangeEvent) -> StartPosition:
        self._flush()
        self._policy.release()
        logger.info("stream invalidated: listener={} token={}", self.name, self.ctx.token)
        self.ctx.check()
        self._settings.listener.on_invalidate(event, self.ctx)
        self._policy.require_acknowledged()
        self._policy.moved(event["_id"], event_time(event), start_after=True)
        return StartPosition(start_after=event["_id"])

    def _sync(self, why: str, because: str | None = None) -> StartPosition:
        """Take the cluster time first, copy, checkpoint that time, then stream from it. A
        resync (``because``: what the sink lost) is marked next to the checkpoint first, fenced,
        and the mark cleared only after that checkpoint: a tenure that ends mid-copy leaves the
        mark, and its successor - which would otherwise resume from the old checkpoint, into a
        sink that may no longer show what it lost - resyncs (resuming the copy) instead."""
        at = self._cluster_time()
        self._board.seen(at)  # a lag sample while the copy runs (it counts from its start)
        logger.info("{} starting: listener={} token={} from={}", why, self.name, self.ctx.token, at)
        self._board.set(state="syncing")
        self.ctx.check()
        if because is not None:
            with self._bounded():
                self.ctx.begin_resync(because)
        self._settings.listener.initial_sync(self.ctx)
        self._policy.moved(None, at)
        if because is not None:
            with self._bounded():
                self.ctx.end_resync()
        logger.info("{} done: listener={} token={}", why, self.name, self.ctx.token)
        return StartPosition(at_time=at)

    # -- errors ---------------------------------------------------------------------------
    def _recover(self, exc: Exception, pos: StartPosition | None) -> StartPosition | None:
        """Where to reopen after ``exc`` (``None``: claim again), or raise when retrying
        cannot help or the failure budget is spent."""
        if isinstance(exc, SinkLostError):
            return self._sink_lost(exc)
        if oversized_reply(exc) and pos is not None and self._halve_reply_batch(exc):
            self._policy.reload()  # no budget spent: each halving gets nearer a size that fits
            return self._policy.resume_position(pos)
        kind = "transient" if isinstance(exc, ListenerFailing) else mongo.classify(exc)
        if kind == "history_lost":
            since = None if self._policy.last is None else self._policy.last.cluster_time
            return self._history_lost(
                f"change stream history lost: saved position {since}: {exc}", since, exc
            )
        if kind == "permission":
            if isinstance(exc, SingletonError):  # already translated (a checkpoint store)
                raise exc
            raise PermissionDeniedError(
                f"listener {self.name!r}: MongoDB refused the change stream (check the user's "
                f"roles: changeStream and find on {self._settings.listener.database}): {exc}"
            ) from exc
        if kind == "too_large" and pos is not None:  # no budget: the same read would fail again
            self._large.failed(exc)  # reduced mode, from the reloaded checkpoint
            return self._policy.resume_position(pos)
        if kind in ("fatal", "too_large"):
            raise exc
        stage = self._stage
        delay = self._failures.failed(stage, exc)
        if getattr(exc, "timeout", False):  # pymongo's: the server did not answer in time
            self._read_timeout = min(self._settings.open_timeout, self._read_timeout * 2)
        self._reconnect_wait(stage, exc, delay)
        if pos is None:
            return None
        self._policy.reload()
        return self._policy.resume_position(pos)

    def _halve_reply_batch(self, exc: BaseException) -> bool:
        """A ``getMore`` reply was over the driver's message limit: read on with half as many
        events per ``getMore`` (one WARNING); ``False`` once it is 1 already."""
        was = self._reply_batch or self._settings.listener.batch_size
        if was <= 1:
            return False
        self._reply_batch = max(1, was // 2)
        logger.warning(
            "a change-stream reply was over the driver's message limit: reading on with"
            " getMore batches of {} events (was {}): listener={} token={}: {}",
            self._reply_batch,
            was,
            self.name,
            self.ctx.token,
            exc,
        )
        return True

    def _sink_lost(self, exc: SinkLostError) -> StartPosition:
        """The sink lost what it held (``exc``): copy again, or fail without an initial sync.
        Never counted against the failure budget: a copy is the repair, not a retry."""
        if not self._settings.listener.has_initial_sync():
            raise exc
        self._board.count(sink_lost=1)
        logger.error(
            "the sink lost what it held, resyncing: listener={} token={}: {}",
            self.name,
            self.ctx.token,
            exc,
        )
        return self._sync("resync", str(exc))

    def _history_lost(
        self, what: str, since: Timestamp | None, exc: BaseException | None = None
    ) -> StartPosition:
        """The saved position cannot be resumed (``what``): apply ``on_history_lost``. Logged
        at ERROR here when the tenure goes on; a ``fail`` is logged once, by the runner."""
        policy = self._settings.listener.on_history_lost
        self._board.count(history_lost=1)
        if policy == "fail" or (
            policy == "resync" and not self._settings.listener.has_initial_sync()
        ):
            raise HistoryLostError(f"listener {self.name!r}: {what} (policy {policy!r})") from exc
        logger.error("{}: listener={} token={} policy={}", what, self.name, self.ctx.token, policy)
        if policy == "resync":
            return self._sync("resync", what)
        now = self._cluster_time()
        with self._bounded():
            self._settings.dead_letters.record_gap(self.ctx, since, now, what)
        self._policy.moved(None, now)
        return StartPosition(at_time=now)

    def _reconnect_wait(self, stage: Stage, exc: BaseException, delay: float) -> None:
        self._board.count(reconnects=1)
        self._board.set(state="reconnecting", last_error=f"{type(exc).__name__}: {exc}")
        logger.warning(
            "{} failed (attempt {}, {:.1f}s of failure_budget {:g}s), retrying from the last "
            "acknowledged position in {:.2f}s: listener={} token={}: {!r}",
            DOING[stage],
            self._failures.attempts,
            self._failures.spent(),
            self._failures.budget,
            delay,
            self.name,
            self.ctx.token,
            exc,
        )
        self._pause(delay)

    def _pause(self, delay: float) -> None:
        """Wait ``delay`` seconds before a retry; a drain or a loss ends the wait at once."""
        with self._gate.waiting():
            self._wake.wait(delay)
        self.ctx.check()

    # -- bounds ---------------------------------------------------------------------------
    def _bounded(self) -> contextlib.AbstractContextManager[None]:
        """Every MongoDB call of the worker (server selection included) ends within half the
        renew deadline, so a lost lease is noticed in time whatever the network does."""
        return pymongo.timeout(self._settings.op_timeout)

    @contextlib.contextmanager
    def _reading(self) -> Iterator[None]:
        """A read that may wait (a ``getMore``): bounded, and a drain does not wait for it."""
        with self._gate.waiting(), pymongo.timeout(self._read_timeout):
            yield

    def _cluster_time(self) -> Timestamp:
        with self._bounded():
            return mongo.cluster_time(self._settings.client)
