"""What the Election and Elector tests share: a callback recorder, a memory backend that can be
made to fail, a log capture, a campaign timer, and electors built on a FakeClock."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from loguru import logger

from singleton import Elector, Leadership
from singleton.errors import BackendUnavailableError, SingletonError
from singleton.lease.contract import Lease, LeaseBackend
from singleton.testing import FakeClock, MemoryLeaseBackend


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[Any, ...]] = []

    def elected(self, ld: Leadership) -> None:
        self.events.append(("elected", ld.identity, ld.token))

    def lost(self, ld: Leadership, reason: str) -> None:
        self.events.append(("lost", ld.identity, ld.token, reason))

    def new_leader(self, identity: str | None) -> None:
        self.events.append(("leader", identity))


class FlakyBackend(MemoryLeaseBackend):
    """A memory backend whose calls fail with ``error`` while ``down`` (by default like an
    unreachable server)."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__(clock)
        self.down = False
        self.error: SingletonError = BackendUnavailableError("injected: server unreachable")

    def _maybe_fail(self) -> None:
        if self.down:
            raise self.error

    def contend(self, name: str, holder: str, ttl: float) -> Any:
        self._maybe_fail()
        return super().contend(name, holder, ttl)

    def renew(self, lease: Lease, ttl: float | None = None) -> Lease | None:
        self._maybe_fail()
        return super().renew(lease, ttl)

    def release(self, lease: Lease) -> bool:
        self._maybe_fail()
        return super().release(lease)

    def describe(self) -> str:
        return "flaky redis://bob:***@10.0.0.7:6379/0"


@contextmanager
def captured_logs(level: str = "WARNING") -> Iterator[list[tuple[str, str]]]:
    """``(level name, message)`` of every log record at ``level`` or above inside the block."""
    records: list[tuple[str, str]] = []
    sink = logger.add(
        lambda m: records.append((m.record["level"].name, m.record["message"])), level=level
    )
    try:
        yield records
    finally:
        logger.remove(sink)


def contend_times(backend: LeaseBackend) -> list[float]:
    """Wrap ``backend.contend`` in place to record when each campaign started (monotonic
    seconds); the list it appends to."""
    times: list[float] = []
    real = backend.contend

    def timed(name: str, holder: str, ttl: float) -> Any:
        times.append(time.monotonic())
        return real(name, holder, ttl)

    backend.contend = timed  # type: ignore[method-assign]
    return times


def make(
    backend: MemoryLeaseBackend, clock: FakeClock, rec: Recorder | None = None, **kw: Any
) -> Elector:
    rec = rec or Recorder()
    kw.setdefault("identity", "a")
    kw.setdefault("ttl", 9.0)
    kw.setdefault("retry_interval", 1.0)
    return Elector(
        backend,
        "job",
        clock=clock,
        jitter=0.0,
        on_elected=rec.elected,
        on_lost=rec.lost,
        on_new_leader=rec.new_leader,
        **kw,
    )


def assert_leads(e: Elector, token: int | None = None) -> Leadership:
    """``e``'s valid tenure, with fencing token ``token`` if given."""
    ld = e.leadership
    assert ld is not None, f"{e!r} does not lead"
    assert token is None or ld.token == token, ld
    return ld


def refused_campaigns(e: Elector, clock: FakeClock, rounds: int) -> list[float]:
    """Tick ``e`` ``rounds`` times, each time moving ``clock`` by the delay it asks for, while the
    store refuses it (it never leads): the delays."""
    delays = []
    for _ in range(rounds):
        delays.append(e.tick())
        clock.advance(delays[-1])
        assert not e.is_leader
    return delays


def leading(
    backend: MemoryLeaseBackend, clock: FakeClock, **kw: Any
) -> tuple[Elector, Recorder, int]:
    """An elector (identity ``a``) that has just won the free lease, its recorder and token."""
    rec = Recorder()
    e = make(backend, clock, rec, **kw)
    e.tick()
    return e, rec, assert_leads(e).token
