"""Exact lease boundaries of MemoryLeaseBackend on a FakeClock: live for t <= now < t + ttl; and
its tokens, minted as the servers mint them: max(counter + 1, the clock's time in ms)."""

from __future__ import annotations

import pytest

from singleton.lease.leases import Lease
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
    assert grant(backend, "b/1").token > lease.token


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
    assert grant(backend).token > lease.token


def test_expire_does_not_wake_waiters_and_keeps_counter(backend: MemoryLeaseBackend) -> None:
    lease = grant(backend)
    backend.expire("job")
    assert backend.wait_for_release("job", 0.01) is False
    assert backend.renew(lease) is None
    assert grant(backend, "b/1") == Lease("job", "b/1", lease.token + 1, TTL)  # the same ms


def ms(clock: FakeClock) -> int:
    return int(clock.time() * 1000)


def test_tokens_are_the_clock_in_ms_or_one_more_than_the_last(
    backend: MemoryLeaseBackend, clock: FakeClock
) -> None:
    first = grant(backend)
    assert first.token == ms(clock)
    assert backend.release(first)
    assert grant(backend).token == first.token + 1  # within the same millisecond: counter + 1
    clock.advance(TTL)
    assert grant(backend, "b/1").token == ms(clock)  # later: the clock, far above the counter


def test_tokens_keep_growing_after_the_store_loses_its_data(
    backend: MemoryLeaseBackend, clock: FakeClock
) -> None:
    tokens = []
    for holder in ("a/1", "a/2", "a/3"):  # three grants in one ms: the counter runs ahead
        lease = grant(backend, holder)
        tokens.append(lease.token)
        assert backend.release(lease)
    assert tokens == [ms(clock), ms(clock) + 1, ms(clock) + 2]
    held = grant(backend, "b/1")
    backend.reset()
    assert backend.inspect("job") is None and backend.renew(held) is None
    clock.advance(0.005)  # a loss lasts longer than the counter's lead over the clock (3 ms)
    after = grant(backend, "c/1")
    assert after.token > max(*tokens, held.token), (tokens, held, after)
    assert after.token == ms(clock)
    assert backend.release(held) is False  # the old holder cannot free the new lease


def test_facts_outlive_expiry_and_expire_but_not_reset(
    backend: MemoryLeaseBackend, clock: FakeClock
) -> None:
    grant(backend)
    backend.remember("job", {"checkpointed": "1", "token": 3})
    clock.advance(TTL)  # expired exactly at the boundary
    assert backend.inspect("job") is None
    grant(backend, "b/1")
    backend.expire("job")  # a crashed holder
    assert backend.recall("job") == {"checkpointed": "1", "token": "3"}
    backend.reset()
    assert backend.recall("job") == {}
    assert [c for c in backend.calls if c[0] in ("remember", "recall")] == [
        ("remember", "job"),
        ("recall", "job"),
        ("recall", "job"),
    ]
