"""Leader-only jobs on a fake clock and the in-memory backend: each fire time once across a
takeover, coalesce, misfire grace, failing calls and failed tenures, cron, max_instances."""

from __future__ import annotations

import asyncio
import gc
import itertools
import threading
import warnings
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from typing import Any

import pytest
from loguru import logger

from singleton.errors import ConfigurationError
from singleton.jobs.context import JobContext
from singleton.jobs.scheduler import LeaderScheduler
from singleton.jobs.triggers import crontab_weekdays, epoch_ms, make_trigger
from singleton.service.dev.embedded import wait_until
from singleton.testing import FakeClock, MemoryLeaseBackend

JOB = "report"
Record = tuple[datetime, int, str]


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()  # wall 2023-11-14T22:30:00Z: whole minutes for cron


@pytest.fixture
def backend(clock: FakeClock) -> MemoryLeaseBackend:
    return MemoryLeaseBackend(clock=clock)


class Replica:
    """One replica's scheduler driven by hand: electors and fire times tick on the fake clock."""

    def __init__(self, backend: MemoryLeaseBackend, clock: FakeClock, identity: str) -> None:
        self.sched = LeaderScheduler(backend, identity=identity, ttl=15, clock=clock)
        self.clock = clock

    def add(self, func: Callable[[JobContext], Any], **kw: Any) -> Replica:
        kw.setdefault("trigger", "interval")
        if kw["trigger"] == "interval":
            kw.setdefault("seconds", 1)
        self.sched.add_job(func, name=JOB, **kw)
        return self

    def elect(self) -> None:
        self.sched.elector(JOB).tick()
        assert self.sched.elector(JOB).is_leader
        wait_until(  # the tenure resumes the job from a short-lived thread
            lambda: self.sched.scheduler.get_job(JOB).next_run_time is not None,
            5,
            what="the job resumed",
        )

    def step(self, seconds: float = 1.0) -> None:
        self.clock.advance(seconds)
        self.tick()

    def tick(self) -> None:
        """Without moving the clock: renew (or find out about a loss), then run what is due."""
        self.sched.elector(JOB).tick()
        self.sched.tick()

    def stop(self) -> None:
        self.sched.stop(timeout=5)


@pytest.fixture
def made() -> Iterator[list[Replica]]:
    replicas: list[Replica] = []
    yield replicas
    for r in replicas:
        r.stop()


def recorder(log: list[Record], identity: str) -> Callable[[JobContext], None]:
    def call(ctx: JobContext) -> None:
        ctx.check()
        assert ctx.fire_time.tzinfo is timezone.utc and ctx.name == JOB
        log.append((ctx.fire_time, ctx.token, identity))

    return call


#: One log and the replicas ``a`` and ``b`` that record into it.
Pair = tuple[list[Record], Replica, Replica]


@pytest.fixture
def pair(backend: MemoryLeaseBackend, clock: FakeClock, made: list[Replica]) -> Pair:
    """Replicas ``a`` and ``b`` of one job that records each call into one log."""
    log: list[Record] = []
    a = Replica(backend, clock, "a").add(recorder(log, "a"))
    b = Replica(backend, clock, "b").add(recorder(log, "b"))
    made += [a, b]
    return log, a, b


def seconds(log: list[Record], start: datetime) -> list[int]:
    return [round((fire - start).total_seconds()) for fire, _, _ in log]


def wall(clock: FakeClock) -> datetime:
    return datetime.fromtimestamp(clock.time(), timezone.utc)


def test_each_fire_time_once_and_the_successor_runs_the_gap_late(
    backend: MemoryLeaseBackend, clock: FakeClock, pair: Pair
) -> None:
    log, a, b = pair
    t0 = wall(clock)
    a.elect()  # fire times fall on whole seconds from t0 (every: counted from ANCHOR)
    for _ in range(3):
        a.step()
        b.tick()  # a follower: paused, runs nothing
    assert seconds(log, t0) == [0, 1, 2, 3] and {who for *_, who in log} == {"a"}
    backend.expire(JOB)  # a crashes: its lease expires, nothing released
    clock.advance(4)  # the takeover takes 4 s: fire times 4..7 fall into it
    b.elect()
    b.step()
    a.tick()  # a, were it still running, finds its lease gone: it claims nothing
    assert seconds(log, t0) == [0, 1, 2, 3, 4, 5, 6, 7, 8]
    assert [who for *_, who in log] == ["a"] * 4 + ["b"] * 5
    tokens = [token for _, token, _ in log]
    assert tokens == sorted(tokens) and tokens[0] < tokens[-1]
    status = b.sched.status()[0]
    assert status.leader and status.runs == 5 and status.last_outcome == "ok"
    assert status.lateness_seconds == 0.0  # the last one (8) ran on time
    assert [c.fire_ms for c in backend.fires(JOB)][:2] == [
        epoch_ms(fire) for fire, *_ in reversed(log[-2:])
    ]


def test_a_store_that_lost_its_claims_resumes_from_now(
    backend: MemoryLeaseBackend, clock: FakeClock, pair: Pair
) -> None:
    log, a, b = pair
    t0 = wall(clock)
    a.elect()
    a.step()
    a.step()
    backend.reset()  # leases, fencing counters and claims: all gone
    clock.advance(3)
    b.elect()
    b.step()
    a.tick()  # a's renewal is refused: it runs nothing more
    assert seconds(log, t0) == [0, 1, 2, 5, 6]  # 3 and 4 skipped, nothing twice
    assert [who for *_, who in log] == ["a"] * 3 + ["b"] * 2


def test_coalesce_runs_the_missed_fire_times_once_in_all(
    backend: MemoryLeaseBackend, clock: FakeClock, made: list[Replica]
) -> None:
    log: list[Record] = []
    a = Replica(backend, clock, "a").add(recorder(log, "a"), coalesce=True)
    made.append(a)
    t0 = wall(clock)
    a.elect()
    a.step()
    a.step(3.5)  # 2, 3, 4 are due: one call, for the latest
    a.step(0.5)
    assert seconds(log, t0) == [1, 4, 5]  # coalesced on the first tick too: 0 and 1


def test_fire_times_later_than_the_misfire_grace_are_not_run(
    backend: MemoryLeaseBackend, clock: FakeClock, made: list[Replica]
) -> None:
    log: list[Record] = []
    a = Replica(backend, clock, "a").add(recorder(log, "a"), misfire_grace_time=2.5)
    made.append(a)
    t0 = wall(clock)
    a.elect()
    a.step()
    a.step(6)  # 2..7 due at 7: 2, 3 and 4 are more than 2.5 s late
    assert seconds(log, t0) == [0, 1, 5, 6, 7]
    status = a.sched.status()[0]
    assert status.missed == 3 and status.runs == 5


def test_a_call_that_raises_is_counted_and_the_next_fire_time_runs(
    backend: MemoryLeaseBackend, clock: FakeClock, made: list[Replica]
) -> None:
    calls: list[int] = []

    def flaky(ctx: JobContext) -> None:
        calls.append(epoch_ms(ctx.fire_time))
        if len(calls) % 2:
            raise RuntimeError("boom")

    a = Replica(backend, clock, "a").add(flaky)
    made.append(a)
    a.elect()
    for _ in range(3):
        a.step()  # fire times 0..3: the 1st and the 3rd raise
    status = a.sched.status()[0]
    assert len(calls) == 4 and status.runs == 2 and status.failures == 2
    assert status.failure is None and a.sched.problems() == []
    assert backend.recall(JOB)["last_outcome"] == "ok"


def test_consecutive_failures_fail_the_tenure(
    backend: MemoryLeaseBackend, clock: FakeClock, made: list[Replica]
) -> None:
    def broken(ctx: JobContext) -> None:
        raise RuntimeError("database gone")

    errors: list[str] = []
    sink = logger.add(lambda m: errors.append(str(m)), level="ERROR", format="{message}")
    a = Replica(backend, clock, "a").add(broken, max_failures=3)
    made.append(a)
    try:
        a.elect()
        token = a.sched.elector(JOB).leadership.token  # type: ignore[union-attr]
        for _ in range(3):
            a.step()
    finally:
        logger.remove(sink)
    assert backend.inspect(JOB) is None  # resigned: released at once for another replica
    assert not a.sched.elector(JOB).is_leader
    failed = [e for e in errors if "tenure failed" in e]
    assert len(failed) == 1 and f"token={token}" in failed[0] and JOB in failed[0]
    status = a.sched.status()[0]
    assert status.failure is not None and "database gone" in status.failure
    assert a.sched.problems() and "failed" in a.sched.problems()[0]
    assert status.cooldown_until is not None and status.cooldown_until >= clock.monotonic() + 10
    assert backend.recall(JOB)["last_outcome"].startswith("error: RuntimeError")


def test_cron_fire_times_on_a_fake_clock(
    backend: MemoryLeaseBackend, clock: FakeClock, made: list[Replica]
) -> None:
    log: list[Record] = []
    a = Replica(backend, clock, "a").add(
        recorder(log, "a"), trigger=make_trigger(cron="*/5 * * * *")
    )
    made.append(a)
    assert wall(clock).minute == 30 and wall(clock).second == 0
    a.elect()
    for _ in range(11 * 12):
        a.step(5)  # to 22:41, renewing on the way
    assert [fire.strftime("%H:%M:%S") for fire, *_ in log] == ["22:30:00", "22:35:00", "22:40:00"]
    assert a.sched.status()[0].next_fire == datetime(2023, 11, 14, 22, 45, tzinfo=timezone.utc)


def test_crontab_weekdays_count_from_sunday() -> None:
    assert crontab_weekdays("1-5") == "mon,tue,wed,thu,fri"
    assert crontab_weekdays("0") == crontab_weekdays("7") == "sun"
    assert crontab_weekdays("*/2") == "sun,tue,thu,sat"
    trigger = make_trigger(cron="0 9 * * 0")  # Sundays at 09:00
    nxt = trigger.get_next_fire_time(None, datetime(2023, 11, 14, tzinfo=timezone.utc))
    assert nxt is not None and nxt.weekday() == 6 and nxt.day == 19


@pytest.mark.parametrize(
    ("kw", "needle"),
    [
        ({"every": None, "cron": None}, "exactly one"),
        ({"every": 1, "cron": "* * * * *"}, "exactly one"),
        ({"every": 0}, "positive"),
        ({"cron": "* * * *"}, "5 fields"),
        ({"cron": "61 * * * *"}, "not a valid crontab"),
    ],
)
def test_bad_triggers_named(kw: dict[str, Any], needle: str) -> None:
    with pytest.raises(ConfigurationError, match=needle):
        make_trigger(**kw)


def test_a_call_longer_than_its_interval_follows_max_instances(
    backend: MemoryLeaseBackend,
) -> None:
    """On the real scheduler thread: a call that outlasts its interval is not run twice at once
    (max_instances=1); the fire times that came due meanwhile are skipped, not queued."""
    release = threading.Event()
    started: list[datetime] = []
    running = [0, 0]  # now, most at once

    def slow(ctx: JobContext) -> None:
        started.append(ctx.fire_time)
        running[0] += 1
        running[1] = max(running)
        try:
            release.wait(10)
        finally:
            running[0] -= 1

    sched = LeaderScheduler(MemoryLeaseBackend(), identity="a", ttl=3)
    sched.add_job(slow, "interval", name=JOB, seconds=0.1)
    sched.start()
    try:
        wait_until(lambda: len(started) == 1, 10, what="the first call")
        first = started[0]

        def skipped() -> bool:
            nxt = sched.status()[0].next_fire
            return nxt is not None and (nxt - first).total_seconds() > 0.5

        wait_until(  # the scheduler moved past fire times it could not start
            skipped,
            10,
            what="fire times skipped while the call runs",
        )
        assert len(started) == 1
        release.set()
        wait_until(lambda: len(started) >= 3, 10, what="later calls")
    finally:
        release.set()
        sched.stop(timeout=5)
    assert running[1] == 1
    gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(started)]
    assert gaps[0] > 0.5 and len(set(started)) == len(started)


class SlowClaims(MemoryLeaseBackend):
    """An in-memory store whose first claims take the given seconds: of the fake clock when one
    is given (the clock moves on while the claim is in flight), else real ones."""

    def __init__(self, delays: list[float], clock: FakeClock | None = None) -> None:
        if clock is None:
            super().__init__()
        else:
            super().__init__(clock=clock)
        self.delays, self.fake = list(delays), clock

    def claim_fire(self, lease: Any, fire_ms: int, keep: int = 100, ahead_ms: int = 10_000) -> bool:
        delay = self.delays.pop(0) if self.delays else 0.0
        if self.fake is not None:
            self.fake.advance(delay)
        elif delay:
            threading.Event().wait(delay)  # a store answering slowly, not a synchronisation
        return super().claim_fire(lease, fire_ms, keep, ahead_ms)


def test_a_fire_time_that_comes_due_during_a_slow_claim_runs_late_in_the_same_call(
    clock: FakeClock, made: list[Replica]
) -> None:
    """The claim of fire time 0 takes 1.5 s: fire time 1 comes due meanwhile, while singleton,
    not the job, holds the call up. It runs right after 0, late, once (a scheduler would have
    skipped it as max_instances says, the call being still in progress)."""
    log: list[Record] = []
    a = Replica(SlowClaims([1.5], clock), clock, "a").add(recorder(log, "a"))
    made.append(a)
    t0 = wall(clock)
    a.elect()
    a.tick()
    assert seconds(log, t0) == [0, 1]
    assert a.sched.status()[0].lateness_seconds == 0.5
    a.step()  # 2.5 s: fire time 2 runs; 1, handed over again, is refused by its claim
    assert seconds(log, t0) == [0, 1, 2]


def test_a_fire_time_that_comes_due_during_the_job_s_own_call_is_not_picked_up(
    clock: FakeClock, made: list[Replica]
) -> None:
    """The job's own call takes 1.5 s: what came due meanwhile is max_instances' business (the
    scheduler skips it), not a call held up by singleton."""
    log: list[Record] = []

    def slow(ctx: JobContext) -> None:
        log.append((ctx.fire_time, ctx.token, "a"))
        if len(log) == 1:
            clock.advance(1.5)

    a = Replica(MemoryLeaseBackend(clock=clock), clock, "a").add(slow)
    made.append(a)
    t0 = wall(clock)
    a.elect()
    a.tick()
    assert seconds(log, t0) == [0]


def test_slow_claims_on_the_scheduler_thread_skip_no_fire_time() -> None:
    """On the real scheduler thread, claims slower than the interval (0.15 s against 0.1 s):
    every fire time from the first call to the last runs, once, in order; none is skipped."""
    started: list[datetime] = []
    sched = LeaderScheduler(SlowClaims([0.15] * 8), identity="a", ttl=3)
    sched.add_job(lambda ctx: started.append(ctx.fire_time), "interval", name=JOB, seconds=0.1)
    sched.start()
    try:
        wait_until(lambda: len(started) >= 10, 20, what="ten calls")
    finally:
        sched.stop(timeout=5)
    steps = [round((b - a).total_seconds(), 3) for a, b in itertools.pairwise(started)]
    assert steps and set(steps) == {0.1}, steps


def test_an_async_job_runs_each_fire_time_to_completion(
    clock: FakeClock, made: list[Replica]
) -> None:
    """``async def`` jobs ran nothing before (a coroutine never awaited, one RuntimeWarning)."""
    log: list[Record] = []

    async def job(ctx: JobContext) -> str:
        await asyncio.sleep(0)
        ctx.check()
        log.append((ctx.fire_time, ctx.token, "a"))
        return "done"

    a = Replica(MemoryLeaseBackend(clock=clock), clock, "a").add(job)
    made.append(a)
    t0 = wall(clock)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # "coroutine ... was never awaited"
        a.elect()
        a.step()
        a.step()
        gc.collect()
    assert seconds(log, t0) == [0, 1, 2]
    status = a.sched.status()[0]
    assert status.runs == 3 and status.last_outcome == "ok"


class AwaitableJob:
    """A callable returning an awaitable (not itself a coroutine function)."""

    def __init__(self) -> None:
        self.loops: list[asyncio.AbstractEventLoop] = []

    def __call__(self, ctx: JobContext) -> Any:
        async def run() -> None:
            self.loops.append(asyncio.get_running_loop())
            if len(self.loops) == 2:
                raise RuntimeError("async boom")

        return run()


def test_a_callable_returning_an_awaitable_runs_and_its_errors_count(
    clock: FakeClock, made: list[Replica]
) -> None:
    job = AwaitableJob()
    a = Replica(MemoryLeaseBackend(clock=clock), clock, "a").add(job)
    made.append(a)
    a.elect()
    a.step()
    status = a.sched.status()[0]
    assert len(job.loops) == 2 and job.loops[0] is not job.loops[1]  # a loop per call
    assert status.runs == 1 and status.failures == 1
    assert status.last_outcome == "error: RuntimeError: async boom"


def test_an_async_job_that_finds_its_lease_lost_stops_as_a_sync_one_does(
    backend: MemoryLeaseBackend, clock: FakeClock, made: list[Replica]
) -> None:
    calls: list[int] = []

    async def job(ctx: JobContext) -> None:
        calls.append(ctx.token)
        backend.expire(JOB)
        clock.advance(20)  # past the renew deadline: the tenure is over
        await asyncio.sleep(0)
        ctx.check()

    a = Replica(backend, clock, "a").add(job)
    made.append(a)
    a.elect()
    a.tick()
    status = a.sched.status()[0]
    assert len(calls) == 1 and status.last_outcome == "lost" and status.failures == 0


def test_tick_from_a_coroutine_runs_an_async_job_on_a_loop_of_its_own(
    clock: FakeClock, made: list[Replica]
) -> None:
    ran: list[bool] = []

    async def job(ctx: JobContext) -> None:
        ran.append(asyncio.get_running_loop() is not outer)

    a = Replica(MemoryLeaseBackend(clock=clock), clock, "a").add(job)
    made.append(a)
    outer: asyncio.AbstractEventLoop | None = None

    async def test() -> None:
        nonlocal outer
        outer = asyncio.get_running_loop()
        a.elect()
        a.step()

    asyncio.run(test())
    assert ran == [True, True]


def test_an_async_job_on_the_scheduler_thread() -> None:
    threads: list[str] = []

    async def job(ctx: JobContext) -> None:
        await asyncio.sleep(0.01)
        threads.append(threading.current_thread().name)

    sched = LeaderScheduler(MemoryLeaseBackend(), identity="a", ttl=3)
    sched.add_job(job, "interval", name=JOB, seconds=0.1)
    sched.start()
    try:
        wait_until(lambda: len(threads) >= 3, 10, what="three async calls")
    finally:
        sched.stop(timeout=5)
    assert all(name.startswith("singleton-job") for name in threads), threads
    assert sched.status()[0].failures == 0


def _gen(ctx: JobContext) -> Iterator[None]:
    yield


async def _agen(ctx: JobContext) -> Any:
    yield


@pytest.mark.parametrize("func", [_gen, _agen])
def test_generator_job_functions_are_refused_by_name(func: Any) -> None:
    sched = LeaderScheduler(MemoryLeaseBackend(), identity="a")
    with pytest.raises(ConfigurationError, match=rf"{__name__}:{func.__name__} is a generator"):
        sched.add_job(func, "interval", name=JOB, seconds=1)


def test_the_elector_start_line_writes_seconds_as_people_do() -> None:
    lines: list[str] = []
    sink = logger.add(lambda m: lines.append(str(m)), level="INFO", format="{message}")
    sched = LeaderScheduler(MemoryLeaseBackend(), identity="a", ttl=5)
    sched.add_job(lambda ctx: None, "interval", name=JOB, seconds=1)
    try:
        sched.start(scheduler=False)
    finally:
        sched.stop(timeout=5)
        logger.remove(sink)
    [start] = [line for line in lines if "elector starting" in line]
    assert "ttl=5s renew_interval=1.67s renew_deadline=3.33s" in start, start
