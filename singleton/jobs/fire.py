"""One fire time of a leader-only job: misfire check, fenced claim, call, outcome.

The scheduler (:mod:`singleton.jobs.scheduler`) decides *when* a tenure takes fire times; this
module is what happens to each one it hands over, and the order is what makes a fire time run
at most once per claim and exactly once across a takeover: the claim is the only gate, taken in
the store under the job's lease (holder *and* token) before the call, and refused for a fire time
at or before the latest claimed one. A claim with an unknown outcome is not run.

An async job (a coroutine function, or any callable returning an awaitable) is run to completion
on its job thread, in an event loop of its own per call (``asyncio.run``), so that it claims,
counts, drains and loses its lease exactly as a sync call does: the job thread is busy until it
returns or raises.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import threading
import traceback
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from apscheduler.events import (
    EVENT_JOB_ERROR,
    EVENT_JOB_EXECUTED,
    EVENT_JOB_MISSED,
    JobExecutionEvent,
)
from apscheduler.executors.pool import BasePoolExecutor
from loguru import logger

from singleton.clock import Clock
from singleton.election.elector import Elector
from singleton.election.leadership import Leadership
from singleton.errors import LeaseLostError, SingletonError
from singleton.jobs.context import JobContext, JobStatus
from singleton.jobs.triggers import due_fire_times, epoch_ms
from singleton.lease.contract import LeaseBackend
from singleton.retry import Backoff
from singleton.stdlog import seconds

JobFunction = Callable[[JobContext], Any]
#: APScheduler's name for the one job store the scheduler uses (in memory, per replica).
JOBSTORE = "default"


def call_job(func: JobFunction, ctx: JobContext) -> Any:
    """``func(ctx)``; when that is an awaitable (an async job), what it returns once run to
    completion in an event loop of its own."""
    result = func(ctx)
    if not inspect.isawaitable(result):
        return result
    awaitable = result

    async def complete() -> Any:
        return await awaitable

    try:
        asyncio.get_running_loop()
    except RuntimeError:  # a job thread: no loop runs here
        return asyncio.run(complete())
    # LeaderScheduler.tick() called from a coroutine: that loop is this thread's, and busy
    # until tick() returns, so the job gets a loop on a thread of its own.
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="singleton-job") as pool:
        return pool.submit(asyncio.run, complete()).result()


class ClaimingExecutor(BasePoolExecutor):  # type: ignore[misc]
    """APScheduler's thread pool, running each fire time through the claim instead of
    ``run_job`` (the scheduler still enforces ``max_instances`` before submitting)."""

    def __init__(self, run: Callable[[Any, list[datetime]], list[Any]], workers: int) -> None:
        pool = concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="singleton-job")
        super().__init__(pool)
        self._run = run

    def _do_submit_job(self, job: Any, run_times: list[datetime]) -> None:
        def done(f: concurrent.futures.Future[list[Any]]) -> None:
            exc = f.exception()
            if exc is not None:
                self._run_job_error(job.id, exc, exc.__traceback__)
            else:
                self._run_job_success(job.id, f.result())

        self._pool.submit(self._run, job, run_times).add_done_callback(done)


@dataclass
class JobState:
    """One job in one replica: its function, elector, current tenure and counters."""

    name: str
    func: JobFunction
    elector: Elector
    max_failures: int
    #: Seconds a fire time may be late and still run (``None``: any lateness).
    misfire_grace: float | None
    cooldowns: Backoff
    status: JobStatus
    lock: threading.Condition = field(default_factory=threading.Condition)
    leadership: Leadership | None = None
    running: int = 0
    #: Whether the current tenure takes fire times: set when it resumes the job, cleared when it
    #: pauses it (a loss, a planned handover). Fire times handed over before a pause are left
    #: unclaimed, for the successor.
    accepting: bool = False


class FireRunner:
    """Runs the fire times APScheduler (or ``LeaderScheduler.tick``) hands over."""

    def __init__(
        self, backend: LeaseBackend, clock: Clock, keep: int, stopping: threading.Event
    ) -> None:
        self.backend = backend
        self.keep = keep
        self._clock = clock
        self._stopping = stopping

    def now(self) -> datetime:
        return datetime.fromtimestamp(self._clock.time(), timezone.utc)

    def run(self, job: JobState, aps: Any, run_times: list[datetime]) -> list[Any]:
        """Run ``run_times`` in order, then the fire times that came due meanwhile while this
        call was held up by singleton's own work (see :meth:`_held_up`)."""
        events = []
        missed: list[datetime] = []
        calls: list[tuple[datetime, datetime]] = []  # when the job's own code ran
        pending = deque(run_time.astimezone(timezone.utc) for run_time in run_times)
        while pending:
            fire = pending.popleft()
            late = (self.now() - fire).total_seconds()
            if job.misfire_grace is not None and late > job.misfire_grace:
                missed.append(fire)
                events.append(JobExecutionEvent(EVENT_JOB_MISSED, job.name, JOBSTORE, fire))
            else:
                event = self._fire(job, fire, late, calls)
                if event is not None:
                    events.append(event)
            if not pending:
                pending.extend(self._held_up(job, aps, fire, calls))
        if missed:
            self._missed(job, missed)
        return events

    def _held_up(
        self, job: JobState, aps: Any, after: datetime, calls: list[tuple[datetime, datetime]]
    ) -> list[datetime]:
        """The fire times after ``after`` that are due now and did not come due while the job's
        own code ran (``calls``). APScheduler skipped them because this call was still running
        (``max_instances``), but what held it up was singleton's work: a slow claim or record,
        or the late fire times of a takeover. They run late, once each (once in all with
        ``coalesce``), as the fire times of a takeover do. Those that came due during a call
        stay skipped, as ``max_instances`` says."""
        with job.lock:
            ld = job.leadership
            if ld is None or not ld.valid() or not job.accepting or self._stopping.is_set():
                return []
        now = self.now()
        due, _ = due_fire_times(aps.trigger, aps.trigger.get_next_fire_time(after, now), now)
        held = [
            fire.astimezone(timezone.utc)
            for fire in due
            if not any(start <= fire < end for start, end in calls)
        ]
        return held[-1:] if aps.coalesce else held

    def _missed(self, job: JobState, missed: list[datetime]) -> None:
        """One line for a run of missed fire times (a wall clock that jumped may miss many)."""
        with job.lock:
            job.status.missed += len(missed)
            job.status.last_outcome = "missed"
        logger.warning(
            "job {} missed {} fire time(s) from {} to {}: later than misfire_grace {}, not run",
            job.name,
            len(missed),
            missed[0].isoformat(),
            missed[-1].isoformat(),
            seconds(job.misfire_grace),
        )

    def _fire(
        self, job: JobState, fire: datetime, late: float, calls: list[tuple[datetime, datetime]]
    ) -> Any:
        with job.lock:
            ld = job.leadership
            if ld is None or not ld.valid() or not job.accepting or self._stopping.is_set():
                return None  # left unclaimed: the successor runs it
            job.running += 1
        try:
            return self._claim_and_call(job, ld, fire, late, calls)
        finally:
            with job.lock:
                job.running -= 1
                job.lock.notify_all()

    def _claim_and_call(
        self,
        job: JobState,
        ld: Leadership,
        fire: datetime,
        late: float,
        calls: list[tuple[datetime, datetime]],
    ) -> Any:
        try:
            claimed = self.backend.claim_fire(ld.lease, epoch_ms(fire), self.keep)
        except SingletonError as exc:
            logger.warning(
                "job {}: claim of fire time {} has an unknown outcome, not running it: {}",
                job.name,
                fire.isoformat(),
                exc,
            )
            return None
        if not claimed:
            logger.info(
                "job {}: fire time {} not claimed (already claimed, lease lost, or ahead of the"
                " store's clock): token={}",
                job.name,
                fire.isoformat(),
                ld.token,
            )
            return None
        logger.debug("job {} running fire time {} token={}", job.name, fire.isoformat(), ld.token)
        started = self.now()
        try:
            retval = call_job(job.func, JobContext(job.name, ld.token, fire, ld))
        except Exception as exc:
            return self._failed(job, ld, fire, late, exc)
        finally:
            calls.append((started, self.now()))
        with job.lock:
            s = job.status
            s.runs += 1
            s.last_fire, s.lateness_seconds, s.last_outcome = fire, late, "ok"
            s.consecutive_failures, s.failure, s.cooldown_until = 0, None, None
            job.cooldowns.reset()
        self._remember(job, fire, "ok")
        return JobExecutionEvent(EVENT_JOB_EXECUTED, job.name, JOBSTORE, fire, retval=retval)

    def _failed(
        self, job: JobState, ld: Leadership, fire: datetime, late: float, exc: Exception
    ) -> Any:
        event = JobExecutionEvent(
            EVENT_JOB_ERROR,
            job.name,
            JOBSTORE,
            fire,
            exception=exc,
            traceback="".join(traceback.format_tb(exc.__traceback__)),
        )
        if isinstance(exc, LeaseLostError) and not ld.valid():
            with job.lock:
                job.status.last_fire, job.status.last_outcome = fire, "lost"
            logger.info("job {} stopped at fire time {}: {}", job.name, fire.isoformat(), exc)
            return event
        outcome = f"error: {type(exc).__name__}: {exc}"
        with job.lock:
            s = job.status
            s.failures += 1
            s.consecutive_failures += 1
            s.last_fire, s.lateness_seconds, s.last_outcome = fire, late, outcome
            in_a_row = s.consecutive_failures
        logger.opt(exception=exc).error(
            "job {} raised at fire time {} (token {}, {} in a row): {}",
            job.name,
            fire.isoformat(),
            ld.token,
            in_a_row,
            outcome,
        )
        self._remember(job, fire, outcome)
        if 0 < job.max_failures <= in_a_row:
            self._fail_tenure(job, ld, outcome, in_a_row)
        return event

    def _fail_tenure(self, job: JobState, ld: Leadership, outcome: str, in_a_row: int) -> None:
        """As a listener's failed tenure: one ERROR, the lease resigned for a doubling cooldown,
        not ready until a later tenure's call succeeds."""
        cooldown = job.cooldowns.next()
        failure = f"{in_a_row} calls in a row raised, the last: {outcome}"
        with job.lock:
            job.status.failure = failure
            job.status.cooldown_until = self._clock.monotonic() + cooldown
        logger.error(
            "job {} tenure failed: token={} {}; releasing the lease, not contending for {:.1f}s",
            job.name,
            ld.token,
            failure,
            cooldown,
        )
        job.elector.resign(cooldown, "failed", leadership=ld)

    def _remember(self, job: JobState, fire: datetime, outcome: str) -> None:
        """Leave the outcome beside the lease for ``singleton status`` (informational)."""
        try:
            self.backend.remember(
                job.name, {"last_outcome": outcome[:200], "last_outcome_fire": epoch_ms(fire)}
            )
        except SingletonError as exc:
            logger.debug("job {}: outcome not recorded: {}", job.name, exc)
