"""AsyncElector's own promises, on the in-memory store behind awaits: options checked when built,
coroutine callbacks, a bounded async drain, and the fate of work that raises or returns."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import pytest

from singleton.aio import AsyncElector, AsyncLeases
from singleton.election.leadership import Leadership
from singleton.errors import ConfigurationError, ElectionTimeoutError
from singleton.lease.leases import Lease, LeaseState
from singleton.testing import MemoryLeaseBackend

FAST: dict[str, Any] = {"ttl": 1.5, "renew_interval": 0.3, "renew_deadline": 0.9}


class AsyncMemory(AsyncLeases):
    """The in-memory store, awaited; its waits only time out (which costs latency, never
    safety), so these tests never depend on release notifications."""

    def __init__(self) -> None:
        self.store = MemoryLeaseBackend()

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
        return 0

    async def wait_for_release(
        self, name: str, timeout: float, wake: asyncio.Event | None = None, *, since: Any = None
    ) -> bool:
        if wake is None:
            await asyncio.sleep(timeout)
            return False
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(wake.wait(), timeout)
        return False

    async def aclose(self) -> None:
        pass


def test_options_are_checked_when_the_elector_is_built() -> None:
    backend = AsyncMemory()
    with pytest.raises(ConfigurationError, match="renew_deadline"):
        AsyncElector(backend, "job", ttl=1, renew_deadline=2)
    with pytest.raises(ConfigurationError, match="lease name"):
        AsyncElector(backend, "")
    with pytest.raises(TypeError, match="ttll"):
        AsyncElector(backend, "job", ttll=3)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="on_electd"):
        AsyncElector(backend, "job").subscribe(on_electd=print)


def test_coroutine_callbacks_run_and_a_slow_async_drain_is_bounded() -> None:
    heard: list[str] = []

    async def scenario() -> float:
        backend = AsyncMemory()

        async def elected(ld: Leadership) -> None:
            heard.append(f"elected {ld.token}")

        async def before_release(ld: Leadership) -> None:
            heard.append("draining")
            await asyncio.sleep(30)  # never finishes: the handover must not wait for it

        elector = AsyncElector(
            backend,
            "job",
            **FAST,
            release_timeout=0.2,
            on_elected=elected,
            before_release=before_release,
        )
        async with elector.lead(timeout=5):
            await asyncio.sleep(0.05)
            started = time.monotonic()
        took = time.monotonic() - started
        assert backend.store.inspect("job") is None  # released all the same
        return took

    took = asyncio.run(scenario())
    assert heard[0].startswith("elected") and heard[1] == "draining"
    assert 0.15 < took < 1.0


def test_work_that_raises_resigns_at_once_and_work_that_returns_hands_over() -> None:
    async def scenario() -> tuple[AsyncElector, list[str]]:
        backend = AsyncMemory()
        elector = AsyncElector(backend, "job", **FAST, cooldown=0.1)
        runs: list[str] = []

        async def work(ld: Leadership) -> None:
            runs.append("run")
            if len(runs) == 1:
                raise ValueError("the sink said no")
            if len(runs) == 2:
                return  # done: hand over
            await elector.stop()

        await asyncio.wait_for(elector.run(work), 10)
        return elector, runs

    elector, runs = asyncio.run(scenario())
    assert runs == ["run", "run", "run"]
    assert elector.stats.resignations == 1  # the failure; the return was a rotation
    assert elector.stats.elections == 3


def test_lead_times_out_while_another_holds_the_lease() -> None:
    async def scenario() -> None:
        backend = AsyncMemory()
        backend.store.try_acquire("job", "rival/1", 30)
        with pytest.raises(ElectionTimeoutError, match="job"):
            async with AsyncElector(backend, "job", **FAST).lead(timeout=0.3):
                raise AssertionError("elected while a rival holds the lease")

    asyncio.run(scenario())


class Door:
    """A gate (what a balancer is to an election) that holds contends back until opened."""

    def __init__(self) -> None:
        self.open = False
        self.asked = self.returned = 0

    def gate(self, name: str) -> float:
        self.asked += 1
        return 0.0 if self.open else 0.05

    def done(self, name: str) -> None:
        self.returned += 1


def test_a_gate_holds_the_async_elector_back_until_it_admits_a_contend() -> None:
    """``gate=`` on AsyncElector: while the gate says wait, the free lease is not taken; once it
    admits, the elector contends and leads, and tells the gate the contend returned."""
    door = Door()

    async def scenario() -> None:
        backend = AsyncMemory()
        elector = AsyncElector(backend, "job", gate=door, **FAST)
        elector.start()
        while door.asked < 5:
            await asyncio.sleep(0.01)
        assert not elector.is_leader and backend.store.inspect("job") is None
        door.open = True
        async with elector.lead(timeout=5) as ld:
            assert ld.valid() and door.returned >= 1
        await elector.stop()

    asyncio.run(asyncio.wait_for(scenario(), 20))
