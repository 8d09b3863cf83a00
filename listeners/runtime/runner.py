"""Run one :class:`~listeners.base.ChangeStreamListener` while an Elector leads.

This module is the tenure lifecycle; the work of a tenure is :mod:`listeners.runtime.tenure`, when
and what to checkpoint is :mod:`listeners.checkpoints.policy`, reading the stream is
:mod:`listeners.stream.reader`.

Failure model: the process may lose its lease at any instant (pause, partition, a stale renew).
So:

* one worker thread per tenure, started only after the previous tenure's worker has ended
  (tenures never overlap in one process, even when a hung worker outlives its lease);
* the elector's callbacks only start, signal and wait for workers, and return quickly;
* ``before_release`` (planned handover) stops the worker reading at once and waits, at most
  ``drain_timeout``, for the act in hand (a ``handle_batch``, a checkpoint write), never for a
  read; then what the sink acknowledged is checkpointed (:mod:`listeners.runtime.handover`), so the
  successor replays nothing. If the act outlasts the bound, the elector releases the lease
  anyway, demoted first: the act's late checkpoint is refused and the successor replays it;
* each tenure ends with a :class:`~listeners.runtime.status.TenureOutcome`, kept in :meth:`status`.

Never stuck, never silent: a replica never holds a lease while not doing its work. A transient
failure is retried in place for at most ``failure_budget`` seconds; a permanent one, or a
transient one past the budget, ends the tenure as ``failed``: what the sink acknowledged is
checkpointed (if the tenure still may), one ERROR line names the listener, the token and the
reason, the status turns not ready (:attr:`RunnerStatus.failure`), and the runner resigns the
lease (``Elector.resign``) for a cooldown that doubles with each consecutive failed tenure
(jittered, from ``max(ttl, 1 s)`` up to ``max_failure_cooldown``), so that replicas failing the
same way hand the lease around a few times a minute at most, never in a tight loop. A tenure
whose checkpoint write is refused (a newer token has written) resigns after ``retry_interval``.
"""

from __future__ import annotations

import random
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypedDict

from loguru import logger

from listeners.base import ChangeStreamListener, DrainFlag
from listeners.checkpoints.policy import CheckpointSettings, LastSeen
from listeners.checkpoints.stores import CheckpointStore, MongoCheckpointStore
from listeners.deadletters import DeadLetterStore
from listeners.runtime.audit import AuditLog
from listeners.runtime.handover import HandoverGate
from listeners.runtime.standby import StandbyChecker
from listeners.runtime.status import RunnerStatus, StatusBoard, TenureOutcome
from listeners.runtime.tenure import TenureSettings, TenureWorker
from singleton.clock import SYSTEM_CLOCK, Clock
from singleton.drivers import mongo
from singleton.errors import ConfigurationError, SingletonError, StaleWriterError
from singleton.options import reject_unknown
from singleton.retry import Backoff
from singleton.stdlog import seconds

if TYPE_CHECKING:
    from pymongo import MongoClient
    from typing_extensions import Unpack  # typing.Unpack from Python 3.11

    from singleton.election.elector import Elector
    from singleton.election.leadership import Leadership


#: Seconds opening a change stream may take (see ``TenureSettings.open_timeout``).
OPEN_TIMEOUT = 5.0
#: Seconds a planned handover waits for the act in hand (capped by ``release_timeout``).
DRAIN_TIMEOUT = 0.25


class _Tenure:
    """One tenure's worker thread and the flags the elector's callbacks set for it."""

    def __init__(self, ld: Leadership, previous: _Tenure | None, drain_timeout: float) -> None:
        self.ld = ld
        self.previous = previous
        self.drain = DrainFlag()  # before_release: stop reading, checkpoint, end
        self.gate = HandoverGate(self.drain, drain_timeout)
        self.wake = threading.Event()  # a drain or a loss: cut any wait short
        self.done = threading.Event()
        self.thread: threading.Thread | None = None


class RunnerOptions(TypedDict, total=False):
    """The keyword options of ``ListenerRunner(listener, elector, client_or_url, **options)``;
    every one is optional, their meaning and defaults are :class:`RunnerSettings`'."""

    checkpoints: CheckpointStore | None
    dead_letters: DeadLetterStore | None
    clock: Clock | None
    max_await_time: float
    checkpoint_interval: float
    idle_checkpoint_interval: float
    reconnect_backoff: float
    max_reconnect_backoff: float
    standby_interval: float | None
    oplog_headroom_warning: float
    failure_budget: float
    max_failure_cooldown: float
    seed: int | None
    audit: AuditLog | None
    drain_timeout: float


@dataclass(frozen=True)
class RunnerSettings:
    """A runner's options with their defaults (see :class:`ListenerRunner`), checked once."""

    checkpoints: CheckpointStore | None = None
    dead_letters: DeadLetterStore | None = None
    clock: Clock | None = None
    max_await_time: float = 0.1  # also bounds how long a drain waits on an idle stream
    checkpoint_interval: float = 1.0
    idle_checkpoint_interval: float = 5.0
    reconnect_backoff: float = 0.1
    max_reconnect_backoff: float = 5.0
    standby_interval: float | None = 30.0
    oplog_headroom_warning: float = 0.1
    failure_budget: float = 60.0
    max_failure_cooldown: float = 300.0
    seed: int | None = None
    audit: AuditLog | None = None
    drain_timeout: float = DRAIN_TIMEOUT

    def validate(self, elector: Elector) -> None:
        if not 0 < self.max_await_time <= elector.renew_deadline / 4:
            raise ConfigurationError(
                f"max_await_time must be > 0 and <= renew_deadline / 4 so that a lost lease is "
                f"noticed in time, got max_await_time={self.max_await_time!r}, "
                f"renew_deadline={elector.renew_deadline!r}"
            )
        backoffs = (self.reconnect_backoff, self.max_reconnect_backoff)
        if self.idle_checkpoint_interval <= 0 or not 0 < backoffs[0] <= backoffs[1]:
            raise ConfigurationError(
                "need idle_checkpoint_interval > 0 and 0 < reconnect_backoff <= "
                f"max_reconnect_backoff, got {self.idle_checkpoint_interval!r}, "
                f"{self.reconnect_backoff!r}, {self.max_reconnect_backoff!r}"
            )
        if not self.failure_budget > 0:
            raise ConfigurationError(
                f"failure_budget must be > 0 seconds, got {self.failure_budget!r}"
            )


class ListenerRunner:
    """Subscribe ``listener`` to ``elector``; stream, handle and checkpoint while it leads.

    ``max_await_time`` bounds each ``getMore`` and must be at most a quarter of the elector's
    ``renew_deadline``. Under sustained load the checkpoint is saved after a batch at most every
    ``checkpoint_interval`` seconds (0 = after every batch), and always as soon as the stream
    has caught up, before a handover and before an invalidate. ``idle_checkpoint_interval`` is
    how often an idle stream's advancing resume token is saved. Reconnects back off from
    ``reconnect_backoff`` to ``max_reconnect_backoff`` with jitter. Followers check every
    ``standby_interval`` seconds that the saved token can still be resumed (``None``: never).
    ``audit`` (the failover drill's evidence, see :mod:`listeners.runtime.audit`) stays the
    caller's.

    ``failure_budget`` (default 60 s: longer than a replica-set election or a short partition,
    short enough that a leader stuck on a dead dependency hands over within a minute) bounds how
    long transient failures are retried in place before the tenure fails; it is also how long a
    tenure must stream for its failure count to start over; a listener's own ``failure_budget``
    option, when set, wins (``failure_budget = 30`` in its ``[[listeners]]`` table). Every
    failure of a tenure counts against the same budget, and only getting past what failed
    starts it over (:mod:`listeners.runtime.failures`). After a failed tenure the runner
    sits out a cooldown from ``max(ttl, 1)`` doubling up to ``max_failure_cooldown`` seconds.

    ``drain_timeout`` (at most the elector's ``release_timeout``) bounds how long a planned
    handover waits for the act in hand before the lease is released without it.
    """

    def __init__(
        self,
        listener: ChangeStreamListener,
        elector: Elector,
        client_or_url: MongoClient[dict[str, Any]] | str,
        **options: Unpack[RunnerOptions],
    ) -> None:
        reject_unknown("ListenerRunner", options, RunnerOptions.__optional_keys__)
        o = RunnerSettings(**options)
        o.validate(elector)
        self.listener, self.elector, self.name = listener, elector, listener.lease_name
        self._client, self._owns_client = mongo.client(client_or_url, mongo.Timeouts.STORE)
        self.checkpoints = o.checkpoints or MongoCheckpointStore(self._client)
        self.dead_letters = o.dead_letters or DeadLetterStore(self._client)
        clock = o.clock or SYSTEM_CLOCK
        #: The listener's own ``failure_budget``, else the runner's.
        self.failure_budget = (
            o.failure_budget if listener.failure_budget is None else listener.failure_budget
        )
        self.drain_timeout = min(o.drain_timeout, elector.release_timeout)
        self.last_seen = LastSeen()
        rng = random.Random(o.seed)
        base = max(elector.ttl, 1.0)
        self._cooldowns = Backoff(base, max(base, o.max_failure_cooldown), jitter=0.2, rng=rng)
        self._refusals = 0  # consecutive tenures whose checkpoint claim or save was refused
        #: What every tenure of this runner shares (read-only).
        self.settings = TenureSettings(
            listener=listener,
            client=self._client,
            checkpoints=CheckpointSettings(
                self.checkpoints, o.checkpoint_interval, o.idle_checkpoint_interval, self.last_seen
            ),
            dead_letters=self.dead_letters,
            clock=clock,
            max_await_time=o.max_await_time,
            op_timeout=elector.renew_deadline / 2,
            open_timeout=max(elector.renew_deadline / 2, OPEN_TIMEOUT),
            reconnect_backoff=o.reconnect_backoff,
            max_reconnect_backoff=o.max_reconnect_backoff,
            rng=rng,
            audit=o.audit,
            failure_budget=self.failure_budget,
            lease_store=elector.backend,
        )
        self._lock = threading.Lock()
        self._tenure: _Tenure | None = None
        self._stopping, self._started = threading.Event(), False
        self._board = StatusBoard(self.name)
        self.standby = StandbyChecker(
            self._client,
            self.checkpoints,
            listener,
            interval=o.standby_interval,
            headroom_warning=o.oplog_headroom_warning,
            is_leading=lambda: self.elector.is_leader,
            stopping=self._stopping,
            clock=clock,
            on_seen=self.last_seen.saw,
        )

    # -- lifecycle ------------------------------------------------------------------------
    def start(self) -> ListenerRunner:
        """Subscribe to the elector and start it (idempotent), and the standby checks."""
        with self._lock:
            if self._started:
                return self
            self._started = True
        self.elector.subscribe(
            on_elected=self._on_elected,
            on_lost=self._on_lost,
            before_release=self._drain,
            on_released=self._on_released,
        )
        logger.info("listener runner starting: listener={} elector={}", self.name, self.elector)
        self.elector.start()
        ld = self.elector.leadership
        if ld is not None:  # elected before we subscribed
            self._on_elected(ld)
        self.standby.start()
        return self

    def stop(self, release: bool = True, timeout: float | None = 30.0) -> None:
        """Stop the elector (draining first when leading), the worker and the standby checks."""
        self._stopping.set()
        self.elector.stop(release=release, timeout=timeout)
        tenure = self._tenure
        if tenure is not None and tenure.thread is not None:
            tenure.thread.join(timeout)
        self.standby.stop(timeout)
        self._board.set(state="stopped")
        if self._owns_client:
            self._client.close()
        logger.info("listener runner stopped: listener={}", self.name)

    def status(self) -> RunnerStatus:
        """A snapshot: state, last checkpoint, counters, last error and tenure outcome, standby
        readiness (``.as_dict()`` for JSON)."""
        return self._board.snapshot(leader=self.elector.is_leader, standby=self.standby.result())

    # -- elector callbacks (elector threads: return quickly) -------------------------------
    def _on_elected(self, ld: Leadership) -> None:
        with self._lock:
            if self._stopping.is_set() or (self._tenure is not None and self._tenure.ld is ld):
                return
            tenure = _Tenure(ld, self._tenure, self.drain_timeout)
            self._tenure = tenure
        if self.settings.audit is not None:
            self.settings.audit.record("elected", token=ld.token)
        tenure.thread = threading.Thread(
            target=self._run_tenure, args=(tenure,), name=f"listener-{self.name}", daemon=True
        )
        tenure.thread.start()

    def _on_lost(self, ld: Leadership, reason: str) -> None:
        logger.info("listener tenure over ({}): listener={} token={}", reason, self.name, ld.token)
        if self.settings.audit is not None:
            self.settings.audit.record("lost", token=ld.token, reason=reason)
        tenure = self._tenure
        if tenure is not None and tenure.ld is ld:
            tenure.wake.set()

    def _on_released(self, ld: Leadership, released: bool) -> None:
        if self.settings.audit is not None:  # the drill counts handovers that waited for expiry
            self.settings.audit.record("released", token=ld.token, ok=released)

    def _drain(self, ld: Leadership) -> None:
        tenure = self._tenure
        if tenure is None or tenure.ld is not ld:
            return
        logger.info("draining before release: listener={} token={}", self.name, ld.token)
        self._board.set(state="draining")
        tenure.drain.set()
        tenure.wake.set()
        if not tenure.gate.close(self.drain_timeout):
            logger.warning(
                "handing over without the act in hand (over {}): listener={} token={}; the "
                "successor replays what it had not acknowledged; the act: {}",
                seconds(self.drain_timeout),
                self.name,
                ld.token,
                tenure.gate.where_acting(),
            )

    # -- one tenure (its own thread) ------------------------------------------------------
    def _run_tenure(self, tenure: _Tenure) -> None:
        prev = tenure.previous
        if prev is not None and prev.thread is not None:
            prev.thread.join()  # tenures never overlap in one process
        tenure.previous = None
        try:
            worker = TenureWorker(
                self.settings,
                tenure.ld,
                self._board,
                drain=tenure.drain,
                wake=tenure.wake,
                gate=tenure.gate,
            )
            outcome = worker.run()
            self._board.set(last_outcome=outcome)
            logger.info(
                "listener tenure outcome: listener={} token={} outcome={} reason={} retryable={}",
                self.name,
                tenure.ld.token,
                outcome.kind,
                outcome.reason,
                outcome.retryable,
            )
            self._conclude(tenure.ld, worker, outcome)
        finally:
            tenure.done.set()

    def _conclude(self, ld: Leadership, worker: TenureWorker, outcome: TenureOutcome) -> None:
        """Never hold a lease without doing its work: a failed tenure resigns and says so."""
        clock = self.settings.clock
        streamed = worker.streaming_since
        if streamed is not None:
            self._refusals = 0
        if outcome.kind == "completed" or (
            streamed is not None and clock.monotonic() - streamed >= self.failure_budget
        ):
            self._cooldowns.reset()
        stale = isinstance(worker.error, StaleWriterError)
        if stale and streamed is None:
            self._refusals += 1
        if outcome.kind == "failed" or self._refusals >= 2:
            # Failed, or refused by the checkpoint store tenure after tenure without ever
            # streaming (the stored token is ahead of every token the lease store mints).
            self._fail(ld, worker, outcome)
        elif stale and not ld.lost.is_set():
            logger.warning(
                "checkpoint refused, resigning the lease: listener={} token={}: {}",
                self.name,
                ld.token,
                worker.error,
            )
            self._resign(ld, self.elector.retry_interval, "lost")

    def _fail(self, ld: Leadership, worker: TenureWorker, outcome: TenureOutcome) -> None:
        cooldown = self._cooldowns.next()
        self._board.set(
            state="failed",
            failure=outcome.reason,
            failed_tenures=self._cooldowns.attempts,
            cooldown_until=self.settings.clock.monotonic() + cooldown,
        )
        bug = worker.error is not None and not isinstance(worker.error, SingletonError)
        logger.opt(exception=worker.error if bug else None).error(
            "listener failed, resigning the lease for {:.1f}s: listener={} identity={} token={} "
            "retryable={} reason={}",
            cooldown,
            self.name,
            self.elector.identity,
            ld.token,
            outcome.retryable,
            outcome.reason,
        )
        self._resign(ld, cooldown, "failed")

    def _resign(self, ld: Leadership, cooldown: float, reason: str) -> None:
        """Give the lease up now, unless the runner is stopping (``stop`` releases it). Passing
        ``ld`` makes a late call harmless: a newer tenure is not this worker's to end."""
        if not self._stopping.is_set():
            self.elector.resign(cooldown, reason, leadership=ld)
