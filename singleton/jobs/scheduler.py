"""Leader-only scheduled jobs on APScheduler 3: every fire time runs exactly once across replicas.

Each job has its own lease and :class:`~singleton.election.elector.Elector`, so jobs spread over
replicas. A ``BackgroundScheduler`` computes fire times as usual (triggers, ``coalesce``,
``misfire_grace_time``, ``max_instances``); a job is paused on every replica except while its
lease is held. Before each call the fire time is *claimed* in the lease store
(:meth:`~singleton.lease.contract.LeaseBackend.claim_fire`: one atomic step conditional on the
holder and
token, refused unless later than the latest claim). A new tenure resumes the job at the first
fire time after the latest claim, so the fire times that fell into a takeover run late (as
``coalesce`` and ``misfire_grace_time`` decide) and none runs twice. Fire times that come due while
a call is held up by singleton's own work (a slow claim, a takeover's late fire times) run late in
that call; those that come due while the job's own code runs follow ``max_instances``.

Failure model and clocks: processes crash, pause and lose their network at any instant. Lease
validity stays on each replica's monotonic clock (see :mod:`singleton.election.elector`); fire
times are
wall-clock times by nature, computed by whichever replica leads. Clock skew between replicas can
make a fire time run early or late by the skew (a successor whose clock is behind waits longer;
one ahead runs sooner, or finds a fire time past its misfire grace and skips it), but it cannot
run a fire time twice: the claim is decided by the store, against fire times already claimed,
never by a clock, and a claim far ahead of the store's own clock is refused. A claim whose
outcome is unknown (the store did not answer) is not run: such a fire time may be skipped (at
most once), never doubled. A store that loses its data loses the claims: the next tenure resumes
from "now" (and not before its grant on the store's clock), skipping the fire times of the gap.
"""

from __future__ import annotations

import contextlib
import inspect
import threading
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, TypedDict

from apscheduler.jobstores.base import JobLookupError
from apscheduler.schedulers.background import BackgroundScheduler
from loguru import logger

from singleton.clock import SYSTEM_CLOCK, Clock
from singleton.election.elector import Elector, default_identity
from singleton.election.gate import Gate
from singleton.election.leadership import Leadership
from singleton.errors import ConfigurationError, SingletonError
from singleton.jobs.context import JobContext, JobStatus
from singleton.jobs.fire import ClaimingExecutor, FireRunner, JobFunction, JobState
from singleton.jobs.triggers import ANCHOR, due_fire_times, from_ms, next_fire_after
from singleton.lease.contract import LeaseBackend
from singleton.lease.timings import LeaseTimings
from singleton.options import reject_unknown
from singleton.retry import Backoff

if TYPE_CHECKING:
    from typing_extensions import Unpack  # typing.Unpack from Python 3.11

__all__ = ["JobContext", "JobStatus", "LeaderScheduler", "SchedulerOptions"]

#: Claims kept per job: enough to audit recent runs, bounded whatever the job's frequency.
KEEP_CLAIMS = 100


def _describe(func: Any) -> str:
    """``module:qualname``, as a ``[[jobs]]`` table's ``use`` names it."""
    module = getattr(func, "__module__", None)
    qualname = getattr(func, "__qualname__", None)
    return f"{module}:{qualname}" if module and qualname else repr(func)


class SchedulerOptions(TypedDict, total=False):
    """The keyword options of ``LeaderScheduler(backend, **options)``; every one is optional.

    ``ttl`` (default 15 s) gives every job's lease the default timings, ``timings`` sets them whole
    (and wins); ``clock`` defaults to the system's; ``workers`` (10) bounds the jobs running at
    once; ``keep`` (:data:`KEEP_CLAIMS`) the claims kept per job; ``max_failure_cooldown`` (300 s)
    caps the cooldown after ``max_failures``; ``gate`` is the balancer asked before contending.
    """

    identity: str | None
    ttl: float
    timings: LeaseTimings | None
    clock: Clock | None
    workers: int
    keep: int
    max_failure_cooldown: float
    gate: Gate | None


class LeaderScheduler:
    """Jobs that run only on the replica holding each job's lease; every fire time once.

    ``add_job(func, trigger, name=..., **trigger_args)`` as with APScheduler (``"interval"``
    counts from :data:`~singleton.jobs.triggers.ANCHOR` unless given a ``start_date``); ``func``
    is called as ``func(ctx)`` with a :class:`JobContext`; an ``async def`` one (or any callable
    returning an awaitable) is run to completion on its job thread with ``asyncio.run``, as a
    sync call would be (a generator function is refused). ``max_failures`` consecutive calls
    that raise fail the tenure (one ERROR, the lease resigned for a cooldown doubling from
    ``max(ttl, 1 s)`` to ``max_failure_cooldown``); 0 never does.
    """

    def __init__(self, backend: LeaseBackend, **options: Unpack[SchedulerOptions]) -> None:
        reject_unknown("LeaderScheduler", options, SchedulerOptions.__optional_keys__)
        self.backend = backend
        self._gate = options.get("gate")
        self.identity = options.get("identity") or default_identity()
        self.timings = options.get("timings") or LeaseTimings.of(options.get("ttl", 15.0))
        self.keep = options.get("keep", KEEP_CLAIMS)
        self._clock = options.get("clock") or SYSTEM_CLOCK
        self._max_cooldown = options.get("max_failure_cooldown", 300.0)
        workers = options.get("workers", 10)
        self._jobs: dict[str, JobState] = {}
        self._stopping = threading.Event()
        self._started = False
        self._runner = FireRunner(backend, self._clock, self.keep, self._stopping)
        self.scheduler = BackgroundScheduler(
            timezone=timezone.utc,
            executors={"default": ClaimingExecutor(self._execute, workers)},
        )

    # -- public API -------------------------------------------------------------------------
    def add_job(
        self,
        func: JobFunction,
        trigger: Any = None,
        *,
        name: str,
        coalesce: bool = False,
        misfire_grace_time: float | None = 30.0,
        max_instances: int = 1,
        max_failures: int = 0,
        **trigger_args: Any,
    ) -> None:
        """Add a job (paused until this replica holds its lease ``name``)."""
        self._check_job(func, name, misfire_grace_time, max_failures)
        if trigger == "interval":
            trigger_args.setdefault("start_date", ANCHOR)
        elector = Elector(
            self.backend,
            name,
            identity=self.identity,
            timings=self.timings,
            clock=self._clock,
            gate=self._gate,
        )
        base = max(self.timings.ttl, 1.0)
        job = JobState(
            name,
            func,
            elector,
            max_failures,
            misfire_grace_time,
            Backoff(base, max(base, self._max_cooldown), jitter=0.2),
            JobStatus(name),
        )
        try:
            self.scheduler.add_job(
                func,
                trigger,
                id=name,
                name=name,
                # APScheduler checks func's signature against these: one positional argument,
                # the context, built per call (this placeholder is never passed).
                args=(None,),
                coalesce=coalesce,
                # APScheduler 3 takes whole seconds only, and only run_job (replaced here)
                # reads it: the fire path checks the grace itself, in any unit.
                misfire_grace_time=None,
                max_instances=max_instances,
                next_run_time=None,  # paused: only a tenure resumes it
                **trigger_args,
            )
        except (TypeError, ValueError, LookupError) as exc:
            raise ConfigurationError(f"job {name!r}: {exc}") from None
        elector.subscribe(
            on_elected=lambda ld: self._elected(job, ld),
            on_lost=lambda ld, why: self._lost(job, ld, why),
            before_release=lambda ld: self._drain(job),
        )
        self._jobs[name] = job
        if self._started:  # added to a running scheduler: campaign now
            elector.start()

    def _check_job(
        self, func: JobFunction, name: str, misfire_grace_time: float | None, max_failures: int
    ) -> None:
        if not callable(func):
            raise ConfigurationError(f"job {name!r}: {func!r} is not callable")
        if inspect.isgeneratorfunction(func) or inspect.isasyncgenfunction(func):
            raise ConfigurationError(
                f"job {name!r}: {_describe(func)} is a generator function: calling it runs none"
                " of its code; make it a plain function or an `async def` without `yield`"
            )
        if name in self._jobs:
            raise ConfigurationError(f"job names must be unique, repeated: {name}")
        if isinstance(max_failures, bool) or not isinstance(max_failures, int) or max_failures < 0:
            raise ConfigurationError(f"job {name!r}: max_failures must be an int >= 0")
        if misfire_grace_time is not None and (
            isinstance(misfire_grace_time, bool)
            or not isinstance(misfire_grace_time, (int, float))
            or not misfire_grace_time > 0
        ):
            raise ConfigurationError(
                f"job {name!r}: misfire_grace_time must be None or > 0, got {misfire_grace_time!r}"
            )

    @property
    def names(self) -> list[str]:
        return list(self._jobs)

    def elector(self, name: str) -> Elector:
        return self._jobs[name].elector

    def start(self, *, scheduler: bool = True) -> LeaderScheduler:
        """Start the scheduler thread and campaign for every job's lease. With
        ``scheduler=False`` fire times run only through :meth:`tick` (tests)."""
        if scheduler:
            self.scheduler.start()
        self._started = True
        for job in self._jobs.values():
            job.elector.start()
        return self

    def stop(self, timeout: float | None = None) -> None:
        """Pause every job, let running calls finish (bounded by the lease's
        ``release_timeout``), release every lease (in parallel), stop the scheduler."""
        self._stopping.set()
        threads = [
            threading.Thread(target=j.elector.stop, kwargs={"release": True}, daemon=True)
            for j in self._jobs.values()
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout)
        if self.scheduler.running:
            self.scheduler.shutdown(wait=False)

    def tick(self) -> None:
        """Run every due fire time in the caller's thread, on the injected clock, as the
        scheduler thread would (for deterministic tests with a fake clock)."""
        now = self._now()
        for job in self._jobs.values():
            aps = self.scheduler.get_job(job.name)
            if aps is None:
                continue
            run_times, nxt = due_fire_times(aps.trigger, aps.next_run_time, now)
            if not run_times:
                continue
            self._modify(job, next_run_time=nxt)
            self._execute(aps, run_times[-1:] if aps.coalesce else run_times)

    def status(self) -> list[JobStatus]:
        out = []
        for job in self._jobs.values():
            with job.lock:
                ld = job.leadership
                job.status.leader = ld is not None and ld.valid()
                job.status.token = ld.token if job.status.leader and ld is not None else None
                aps = self.scheduler.get_job(job.name)
                nxt = None if aps is None else aps.next_run_time
                job.status.next_fire = None if nxt is None else nxt.astimezone(timezone.utc)
                out.append(JobStatus(**vars(job.status)))
        return out

    def problems(self) -> list[str]:
        """Why this replica is not ready, one sentence per job (empty: ready)."""
        out = []
        for s in self.status():
            if s.failure is not None:
                out.append(f"job {s.name} failed ({s.consecutive_failures} in a row): {s.failure}")
            if self._jobs[s.name].elector.failing:
                out.append(
                    f"job {s.name}: lease store refuses us: {self._jobs[s.name].elector.last_error}"
                )
        return out

    # -- tenures ----------------------------------------------------------------------------
    def _elected(self, job: JobState, ld: Leadership) -> None:
        with job.lock:
            job.leadership = ld
        threading.Thread(
            target=self._resume, args=(job, ld), name=f"singleton-resume-{job.name}", daemon=True
        ).start()

    def _resume(self, job: JobState, ld: Leadership) -> None:
        """Read the latest claim and resume the job at the first fire time after it."""
        retries = Backoff(min(1.0, self.timings.retry_interval), self.timings.renew_interval)
        while ld.valid():
            try:
                claims = self.backend.fires(job.name)
                break
            except SingletonError as exc:
                logger.warning("job {}: cannot read its latest claim yet: {}", job.name, exc)
                ld.wait_lost(retries.next())
        else:
            return
        last = from_ms(claims[0].fire_ms) if claims else None
        aps = self.scheduler.get_job(job.name)
        if aps is None:
            return
        # Nothing claimed (a new job, or a store that lost its data): start from now, and not
        # before the grant as the store's clock saw it (a token is at least that, in ms), so a
        # replica whose clock is behind does not rerun what was claimed before the loss.
        now = max(self._now(), from_ms(ld.token))
        resume_at = next_fire_after(aps.trigger, last, now)
        with job.lock:
            if job.leadership is not ld or not ld.valid():
                return  # lost meanwhile: _lost paused it
            job.accepting = True  # (first: a fire time handed over at once must find it set)
            self._modify(job, next_run_time=resume_at)
        logger.info(
            "job {} resumed: token={} latest claimed fire time={} next={}",
            job.name,
            ld.token,
            None if last is None else last.isoformat(),
            None if resume_at is None else resume_at.isoformat(),
        )

    def _lost(self, job: JobState, ld: Leadership, why: str) -> None:
        with job.lock:
            if job.leadership is ld:
                job.leadership = None
            job.accepting = False
            self._modify(job, next_run_time=None)
        logger.info("job {} paused: token={} {}", job.name, ld.token, why)

    def _drain(self, job: JobState) -> None:
        """A planned handover: no new call starts; wait for the running ones (the elector bounds
        this by ``release_timeout``)."""
        with job.lock:
            job.accepting = False
            self._modify(job, next_run_time=None)
            job.lock.wait_for(lambda: job.running == 0)

    def _modify(self, job: JobState, **changes: Any) -> None:
        with contextlib.suppress(JobLookupError):  # the scheduler was shut down
            self.scheduler.modify_job(job.name, **changes)

    def _now(self) -> datetime:
        return self._runner.now()

    def _execute(self, aps: Any, run_times: list[datetime]) -> list[Any]:
        return self._runner.run(self._jobs[aps.id], aps, run_times)
