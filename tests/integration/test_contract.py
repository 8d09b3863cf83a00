"""The LeaseBackend contract (singleton/abc.py), one suite run against every backend."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest

from singleton.abc import Lease, LeaseBackend, LeaseState
from singleton.errors import ConfigurationError
from singleton.service.embedded import wait_until
from singleton.testing import MemoryLeaseBackend

TTL = 5.0
SHORT = 0.3


def expire(backend: LeaseBackend, name: str) -> None:
    """Wait (bounded) until the server let ``name`` expire."""
    wait_until(lambda: backend.inspect(name) is None, timeout=10, what=f"{name} expired")


def acquire(backend: LeaseBackend, name: str, holder: str, ttl: float = TTL) -> Lease:
    lease = backend.try_acquire(name, holder, ttl)
    assert lease is not None, f"{holder} could not acquire free lease {name}"
    return lease


def in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, list[Any], threading.Event]:
    """Run ``fn`` in a thread; returns it, a list that receives the result, and a start event."""
    out: list[Any] = []
    started = threading.Event()

    def run() -> None:
        started.set()
        out.append(fn())

    t = threading.Thread(target=run, daemon=True)
    t.start()
    assert started.wait(10)
    return t, out, started


def test_acquire_free_lease(backend: LeaseBackend, unique: str) -> None:
    lease = acquire(backend, "job", "a/1")
    assert (lease.name, lease.holder, lease.ttl) == ("job", "a/1", TTL)
    assert lease.token >= 1
    state = backend.inspect("job")
    assert state is not None
    assert (state.holder, state.token, state.identity) == ("a/1", lease.token, "a")


def test_second_holder_refused(backend: LeaseBackend) -> None:
    lease = acquire(backend, "job", "a/1")
    assert backend.try_acquire("job", "b/1", TTL) is None
    state = backend.inspect("job")
    assert state is not None and (state.holder, state.token) == ("a/1", lease.token)


def test_same_holder_reacquire_keeps_token_and_extends(backend: LeaseBackend) -> None:
    first = acquire(backend, "job", "a/1", ttl=2.0)
    again = acquire(backend, "job", "a/1", ttl=TTL)
    assert again.token == first.token
    state = backend.inspect("job")
    assert state is not None and state.ttl_remaining > 2.0


def test_tokens_strictly_increase_across_release_and_expiry(backend: LeaseBackend) -> None:
    a = acquire(backend, "job", "a/1")
    renewed = backend.renew(a)
    assert renewed is not None and renewed.token == a.token
    assert backend.release(a)
    b = acquire(backend, "job", "b/1", ttl=SHORT)
    assert b.token > a.token
    expire(backend, "job")  # never released: the fencing counter must survive expiry
    c = acquire(backend, "job", "b/1")
    assert c.token > b.token
    assert backend.release(c)
    d = acquire(backend, "job", "a/1")
    assert d.token > c.token


def test_foreign_renew_and_release_refused(backend: LeaseBackend) -> None:
    old = acquire(backend, "job", "a/1")
    assert backend.release(old)
    live = acquire(backend, "job", "a/1")  # same holder, new tenure, larger token
    assert live.token > old.token
    wrong_holder = Lease("job", "b/1", live.token, TTL)
    for impostor in (wrong_holder, old):
        assert backend.renew(impostor) is None, impostor
        assert backend.release(impostor) is False, impostor
    state = backend.inspect("job")
    assert state is not None and (state.holder, state.token) == ("a/1", live.token)
    assert backend.try_acquire("job", "b/1", TTL) is None
    assert backend.renew(live) == live
    assert backend.release(live)


def test_renew_and_release_after_expiry_fail(backend: LeaseBackend) -> None:
    lease = acquire(backend, "job", "a/1", ttl=SHORT)
    expire(backend, "job")
    assert backend.renew(lease) is None
    assert backend.release(lease) is False
    assert backend.inspect("job") is None


def test_renew_extends_from_now(backend: LeaseBackend) -> None:
    lease = acquire(backend, "job", "a/1", ttl=1.0)
    renewed = backend.renew(lease, ttl=TTL)
    assert renewed == Lease("job", "a/1", lease.token, TTL)
    state = backend.inspect("job")
    assert state is not None and 1.0 < state.ttl_remaining <= TTL


def test_release_frees_and_wakes_waiters(backend: LeaseBackend) -> None:
    lease = acquire(backend, "job", "a/1")
    waiter, result, _ = in_thread(lambda: backend.wait_for_release("job", timeout=10))
    # The waiter may not be listening yet when we release: release again (a new tenure each
    # time) until it reports one. Every True it returns is a release it really observed.
    released_at_least_once = False
    while waiter.is_alive():
        assert backend.release(lease)
        released_at_least_once = True
        assert backend.inspect("job") is None
        waiter.join(0.3)
        if waiter.is_alive():
            lease = acquire(backend, "job", "a/1")
    assert released_at_least_once
    assert result == [True]


def test_release_of_another_name_does_not_wake(backend: LeaseBackend) -> None:
    other = acquire(backend, "other", "a/1")
    waiter, result, _ = in_thread(lambda: backend.wait_for_release("job", timeout=1.0))
    assert backend.release(other)
    waiter.join(10)
    assert result == [False]


def test_wait_for_release_times_out(backend: LeaseBackend) -> None:
    acquire(backend, "job", "a/1")
    assert backend.wait_for_release("job", timeout=0.2) is False


def test_wait_for_release_returns_early_on_wake(backend: LeaseBackend) -> None:
    acquire(backend, "job", "a/1")
    wake = threading.Event()
    waiter, result, _ = in_thread(lambda: backend.wait_for_release("job", 60, wake=wake))
    wake.set()
    waiter.join(10)
    assert not waiter.is_alive(), "wait_for_release ignored wake"
    assert result == [False]
    assert wake.is_set()


def test_inspect(backend: LeaseBackend) -> None:
    assert backend.inspect("job") is None
    lease = acquire(backend, "job", "a/1")
    state = backend.inspect("job")
    assert state is not None
    assert (state.name, state.holder, state.token) == ("job", "a/1", lease.token)
    assert 0 < state.ttl_remaining <= TTL


def test_contend(backend: LeaseBackend) -> None:
    won = backend.contend("job", "a/1", TTL)
    assert isinstance(won, Lease) and won.holder == "a/1"
    lost = backend.contend("job", "b/1", TTL)
    assert isinstance(lost, LeaseState)
    assert (lost.holder, lost.token) == ("a/1", won.token)
    assert 0 < lost.ttl_remaining <= TTL
    again = backend.contend("job", "a/1", TTL)
    assert again == won
    assert backend.release(won)
    after = backend.contend("job", "b/1", TTL)
    assert isinstance(after, Lease) and after.token > won.token


BAD_CALLS: list[tuple[str, Callable[[LeaseBackend], object]]] = [
    ("acquire empty name", lambda b: b.try_acquire("", "a/1", 1)),
    ("acquire empty holder", lambda b: b.try_acquire("job", "", 1)),
    ("acquire ttl 0", lambda b: b.try_acquire("job", "a/1", 0)),
    ("acquire ttl < 0", lambda b: b.try_acquire("job", "a/1", -1)),
    ("acquire ttl True", lambda b: b.try_acquire("job", "a/1", True)),
    ("acquire ttl str", lambda b: b.try_acquire("job", "a/1", "1")),  # type: ignore[arg-type]
    ("contend empty name", lambda b: b.contend("", "a/1", 1)),
    ("contend ttl 0", lambda b: b.contend("job", "a/1", 0)),
    ("renew ttl 0", lambda b: b.renew(Lease("job", "a/1", 1, 1), ttl=0)),
    ("renew ttl True", lambda b: b.renew(Lease("job", "a/1", 1, True))),
    ("renew empty name", lambda b: b.renew(Lease("", "a/1", 1, 1))),
    ("inspect empty name", lambda b: b.inspect("")),
]


@pytest.mark.parametrize("call", [c for _, c in BAD_CALLS], ids=[i for i, _ in BAD_CALLS])
def test_bad_arguments_rejected_before_io(
    backend: LeaseBackend, call: Callable[[LeaseBackend], object]
) -> None:
    with pytest.raises(ConfigurationError):
        call(backend)
    if isinstance(backend, MemoryLeaseBackend):
        assert backend.calls == []
    assert backend.inspect("job") is None  # nothing was granted on the way
