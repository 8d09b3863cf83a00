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


def test_live_until_just_before_ttl_free_at_exactly_ttl(
    backend: MemoryLeaseBackend, clock: FakeClock
) -> None:
    lease = backend.try_acquire("job", "a/1", TTL)
    assert lease is not None
    clock.advance(TTL - EPSILON)
    state = backend.inspect("job")
    assert state is not None and state.ttl_remaining == pytest.approx(EPSILON)
    assert backend.try_acquire("job", "b/1", TTL) is None
    clock.advance(EPSILON)
    assert backend.inspect("job") is None
    successor = backend.try_acquire("job", "b/1", TTL)
    assert successor is not None and successor.token == lease.token + 1


def test_renew_restarts_ttl_from_renewal_time(
    backend: MemoryLeaseBackend, clock: FakeClock
) -> None:
    lease = backend.try_acquire("job", "a/1", TTL)
    assert lease is not None
    clock.advance(TTL - 1)
    assert backend.renew(lease) == lease
    clock.advance(TTL - EPSILON)
    assert backend.try_acquire("job", "b/1", TTL) is None
    clock.advance(EPSILON)
    assert backend.inspect("job") is None


def test_renew_and_release_at_exactly_ttl_fail(
    backend: MemoryLeaseBackend, clock: FakeClock
) -> None:
    lease = backend.try_acquire("job", "a/1", TTL)
    assert lease is not None
    clock.advance(TTL)
    assert backend.renew(lease) is None
    assert backend.release(lease) is False


def test_same_holder_reacquire_at_expiry_gets_new_token(
    backend: MemoryLeaseBackend, clock: FakeClock
) -> None:
    lease = backend.try_acquire("job", "a/1", TTL)
    assert lease is not None
    clock.advance(TTL - EPSILON)
    kept = backend.try_acquire("job", "a/1", TTL)
    assert kept is not None and kept.token == lease.token
    clock.advance(TTL)
    fresh = backend.try_acquire("job", "a/1", TTL)
    assert fresh is not None and fresh.token == lease.token + 1


def test_expire_does_not_wake_waiters_and_keeps_counter(
    backend: MemoryLeaseBackend, clock: FakeClock
) -> None:
    lease = backend.try_acquire("job", "a/1", TTL)
    assert lease is not None
    backend.expire("job")
    assert backend.wait_for_release("job", 0.01) is False
    assert backend.renew(lease) is None
    again = backend.try_acquire("job", "b/1", TTL)
    assert again == Lease("job", "b/1", lease.token + 1, TTL)
