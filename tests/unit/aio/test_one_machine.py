"""One state machine, two drivers: the thread Elector and the AsyncElector run the same scripted
scenario (a fake clock, a scripted store with failures, a slow call, a rival, a rotation) and
must make the same decisions, call for call, wait for wait, callback for callback."""

from __future__ import annotations

import asyncio
from typing import Any

from singleton.aio import AsyncElector, AsyncLeases
from singleton.election.elector import Elector
from singleton.errors import BackendUnavailableError
from singleton.lease.leases import Lease, LeaseState
from singleton.testing import FakeClock, MemoryLeaseBackend

NAME = "report"
OPTIONS: dict[str, Any] = {
    "identity": "me",
    "ttl": 3.0,
    "renew_interval": 1.0,
    "renew_deadline": 2.0,
    "retry_interval": 0.5,
    "max_tenure": 9.0,
    "seed": 7,
}
STEPS = 60
#: (operation, how many of them came before) -> what the store does on that call
SCRIPT: dict[tuple[str, int], str] = {
    ("contend", 0): "fail",
    ("renew", 1): "fail",
    ("renew", 3): "slow",  # applied, but its answer comes back after the renew deadline
    ("contend", 9): "fail",
}
#: step -> what happens around us before it
RIVAL_AT = {14: "steal", 40: "wipe"}


class ScriptedStore(MemoryLeaseBackend):
    """The in-memory store, but each call may fail or be slow as ``SCRIPT`` says; every call and
    answer is recorded (holders by identity: the random parts differ between runs)."""

    def __init__(self, clock: FakeClock, trace: list[Any]) -> None:
        super().__init__(clock)
        self.fake = clock
        self.trace = trace
        self.counts: dict[str, int] = {}

    def _scripted(self, op: str) -> str | None:
        n = self.counts.get(op, 0)
        self.counts[op] = n + 1
        what = SCRIPT.get((op, n))
        if what == "fail":
            self.trace.append((op, "fail"))
            raise BackendUnavailableError(f"scripted {op} failure")
        return what

    def contend(self, name: str, holder: str, ttl: float) -> Lease | LeaseState | None:
        self._scripted("contend")
        answer = super().contend(name, holder, ttl)
        self.trace.append(("contend", _shown(answer)))
        return answer

    def renew(self, lease: Lease, ttl: float | None = None) -> Lease | None:
        slow = self._scripted("renew") == "slow"
        answer = super().renew(lease, ttl)
        if slow:
            self.fake.advance(2.2)
        self.trace.append(("renew", _shown(answer)))
        return answer

    def release(self, lease: Lease) -> bool:
        answer = super().release(lease)
        self.trace.append(("release", answer))
        return answer


class AsyncScriptedStore(AsyncLeases):
    """The same store behind awaits (each call yields to the loop once, as real I/O would)."""

    def __init__(self, store: ScriptedStore) -> None:
        self.store = store

    async def contend(self, name: str, holder: str, ttl: float) -> Lease | LeaseState | None:
        await asyncio.sleep(0)
        return self.store.contend(name, holder, ttl)

    async def renew(self, lease: Lease, ttl: float | None = None) -> Lease | None:
        await asyncio.sleep(0)
        return self.store.renew(lease, ttl)

    async def release(self, lease: Lease) -> bool:
        await asyncio.sleep(0)
        return self.store.release(lease)

    async def inspect(self, name: str) -> LeaseState | None:
        return self.store.inspect(name)

    def release_mark(self, name: str) -> int:
        return self.store.release_mark(name)

    async def wait_for_release(
        self, name: str, timeout: float, wake: asyncio.Event | None = None, *, since: Any = None
    ) -> bool:
        raise AssertionError("tick() never waits")

    async def aclose(self) -> None:
        pass


def _shown(answer: object) -> object:
    if isinstance(answer, Lease):
        return ("lease", answer.holder.split("/")[0], answer.token)
    if isinstance(answer, LeaseState):
        return ("held", answer.identity, answer.token, round(answer.ttl_remaining, 6))
    return answer


def _callbacks(trace: list[Any]) -> dict[str, Any]:
    return {
        "on_elected": lambda ld: trace.append(("elected", ld.token)),
        "on_lost": lambda ld, why: trace.append(("lost", ld.token, why)),
        "on_new_leader": lambda who: trace.append(("leader", who)),
    }


def _around(step: int, store: ScriptedStore, trace: list[Any]) -> None:
    what = RIVAL_AT.get(step)
    if what == "steal":  # the store lost our key and a rival was granted the lease
        store.expire(NAME)
        store.try_acquire(NAME, "rival/1", 2.0)
    elif what == "wipe":
        store.reset()
    if what:
        trace.append(("around", what))


def thread_trace() -> list[Any]:
    trace: list[Any] = []
    clock = FakeClock()
    store = ScriptedStore(clock, trace)
    elector = Elector(store, NAME, clock=clock, **OPTIONS, **_callbacks(trace))
    for step in range(STEPS):
        _around(step, store, trace)
        wait = elector.tick()
        trace.append(("wait", round(wait, 6), elector.is_leader))
        clock.advance(max(wait, 0.0))
    for _ in range(STEPS):  # then on until leading, to stop a leader
        if elector.is_leader:
            break
        clock.advance(max(elector.tick(), 0.0))
    elector.stop()
    return trace


def async_trace() -> list[Any]:
    trace: list[Any] = []
    clock = FakeClock()
    store = ScriptedStore(clock, trace)

    async def scenario() -> None:
        elector = AsyncElector(
            AsyncScriptedStore(store), NAME, clock=clock, **OPTIONS, **_callbacks(trace)
        )
        for step in range(STEPS):
            _around(step, store, trace)
            wait = await elector.tick()
            trace.append(("wait", round(wait, 6), elector.is_leader))
            clock.advance(max(wait, 0.0))
        for _ in range(STEPS):
            if elector.is_leader:
                break
            clock.advance(max(await elector.tick(), 0.0))
        await elector.stop()

    asyncio.run(scenario())
    return trace


def test_both_drivers_make_the_same_decisions() -> None:
    threaded, awaited = thread_trace(), async_trace()
    assert awaited == threaded
    # The scenario reaches every kind of decision, or comparing them would prove little.
    lost = {event[2] for event in threaded if event[0] == "lost"}
    assert {"expired", "lost", "released", "stopped"} <= lost, lost
    assert sum(event[0] == "elected" for event in threaded) >= 4
    assert ("contend", "fail") in threaded and ("renew", "fail") in threaded
    assert any(
        e[0] == "contend" and isinstance(e[1], tuple) and e[1][0] == "held" for e in threaded
    )
