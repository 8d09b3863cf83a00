"""Exact lease boundaries of MemoryLeaseBackend on a FakeClock: live for t <= now < t + ttl."""

from __future__ import annotations

import pytest

from singleton.abc import Lease
from singleton.testing import FakeClock, MemoryLeaseBackend

TTL = 10.0
EPSILON = 1e-6


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def backend(clock: FakeClock) -> MemoryLeaseBackend:
    return MemoryLeaseBackend(clock=clock)


def grant(backend: MemoryLeaseBackend, holder: str = "a/1") -> Lease:
    lease = backend.try_acquire("job", holder, TTL)
    assert lease is not None, f"{holder} was refused"
    return lease


def assert_live_for(backend: MemoryLeaseBackend, clock: FakeClock, seconds: float) -> None:
    """The lease is held for exactly ``seconds`` more: refused just before, free at the instant."""
    clock.advance(seconds - EPSILON)
    state = backend.inspect("job")
    assert state is not None and state.ttl_remaining == pytest.approx(EPSILON)
    assert backend.try_acquire("job", "b/1", TTL) is None
    clock.advance(EPSILON)
    assert backend.inspect("job") is None


def test_live_until_just_before_ttl_free_at_exactly_ttl(
    backend: MemoryLeaseBackend, clock: FakeClock
) -> None:
    lease = grant(backend)
    assert_live_for(backend, clock, TTL)
    assert grant(backend, "b/1").token == lease.token + 1


def test_renew_restarts_ttl_from_renewal_time(
    backend: MemoryLeaseBackend, clock: FakeClock
) -> None:
    lease = grant(backend)
    clock.advance(TTL - 1)
    assert backend.renew(lease) == lease
    assert_live_for(backend, clock, TTL)


def test_renew_and_release_at_exactly_ttl_fail(
    backend: MemoryLeaseBackend, clock: FakeClock
) -> None:
    lease = grant(backend)
    clock.advance(TTL)
    assert backend.renew(lease) is None
    assert backend.release(lease) is False


def test_same_holder_reacquire_at_expiry_gets_new_token(
    backend: MemoryLeaseBackend, clock: FakeClock
) -> None:
    lease = grant(backend)
    clock.advance(TTL - EPSILON)
    assert grant(backend) == lease  # still live: extended, the token kept
    clock.advance(TTL)
    assert grant(backend).token == lease.token + 1


def test_expire_does_not_wake_waiters_and_keeps_counter(backend: MemoryLeaseBackend) -> None:
    lease = grant(backend)
    backend.expire("job")
    assert backend.wait_for_release("job", 0.01) is False
    assert backend.renew(lease) is None
    assert grant(backend, "b/1") == Lease("job", "b/1", lease.token + 1, TTL)
