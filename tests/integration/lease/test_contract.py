"""The backend contract (singleton/lease/contract.py), one class per capability, each run
against every backend by the ``backend`` fixture: a capability's invariants are checked once.

Membership's per-group invariants are in ``test_membership.py`` (the same fixture); here what
every backend adds to them."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

import pytest

from singleton.election.elector import Elector
from singleton.election.leadership import Leadership
from singleton.errors import ConfigurationError
from singleton.lease.contract import LeaseBackend
from singleton.lease.fires import FireClaim
from singleton.lease.leases import Lease, LeaseState
from singleton.lease.membership import Membership
from singleton.lease.mongo import MongoLeaseBackend
from singleton.lease.redis import RedisLeaseBackend
from singleton.service.dev.embedded import wait_until
from singleton.testing import MemoryLeaseBackend
from tests.conftest import BACKENDS

TTL = 5.0
SHORT = 0.3


def expire(backend: LeaseBackend, name: str) -> None:
    """Wait (bounded) until the server let ``name`` expire."""
    wait_until(lambda: backend.inspect(name) is None, timeout=10, what=f"{name} expired")


def acquire(backend: LeaseBackend, name: str, holder: str, ttl: float = TTL) -> Lease:
    lease = backend.try_acquire(name, holder, ttl)
    assert lease is not None, f"{holder} could not acquire free lease {name}"
    return lease


def lose_all_data(backend: LeaseBackend) -> None:
    """The store forgets everything, leases and fencing counters alike: Redis ``FLUSHALL`` (as a
    restart without persistence), a dropped Mongo collection, a reset memory store."""
    if isinstance(backend, MemoryLeaseBackend):
        backend.reset()
    elif isinstance(backend, RedisLeaseBackend):
        backend._client.flushall()  # every test's keys live under its own namespace
    elif isinstance(backend, MongoLeaseBackend):
        backend._client[backend.database].drop_collection(backend.collection)
    else:
        raise AssertionError(f"no way to wipe {backend!r}")


def store_ms(backend: LeaseBackend) -> int:
    """The store's own clock, in ms: what it mints tokens from."""
    if isinstance(backend, MemoryLeaseBackend):
        return int(backend.clock.time() * 1000)
    if isinstance(backend, RedisLeaseBackend):
        seconds, micros = backend._client.time()
        return int(seconds) * 1000 + int(micros) // 1000
    assert isinstance(backend, MongoLeaseBackend)
    now: datetime = backend._client.admin.command("hello")["localTime"]
    return int(now.replace(tzinfo=now.tzinfo or timezone.utc).timestamp() * 1000)


def clock_passes(backend: LeaseBackend, token: int) -> None:
    """Wait until the store's clock passes ``token`` ms, as it has long done when a real store
    comes back from losing its data: tokens then come from that clock."""
    wait_until(lambda: store_ms(backend) > token, 10, what=f"the store's clock passing {token}")


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


def assert_rejected_before_io(
    backend: LeaseBackend, call: Callable[[LeaseBackend], object]
) -> None:
    with pytest.raises(ConfigurationError):
        call(backend)
    if isinstance(backend, MemoryLeaseBackend):
        assert backend.calls == []
    assert backend.inspect("job") is None  # nothing was granted on the way
    assert backend.recall("job") == {}  # nor remembered


LEASE_BAD_CALLS: list[tuple[str, Callable[[LeaseBackend], object]]] = [
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
    ("release empty name", lambda b: b.release(Lease("", "a/1", 1, 1))),
    ("release empty holder", lambda b: b.release(Lease("job", "", 1, 1))),
    ("inspect empty name", lambda b: b.inspect("")),
    ("wait_for_release empty name", lambda b: b.wait_for_release("", 0.01)),
]
FACT_BAD_CALLS: list[tuple[str, Callable[[LeaseBackend], object]]] = [
    ("remember empty name", lambda b: b.remember("", {"a": "1"})),
    ("remember no facts", lambda b: b.remember("job", {})),
    ("remember dotted field", lambda b: b.remember("job", {"a.b": "1"})),
    ("remember $ field", lambda b: b.remember("job", {"$set": "1"})),
    ("remember bool value", lambda b: b.remember("job", {"a": True})),
    ("remember float value", lambda b: b.remember("job", {"a": 1.5})),  # type: ignore[dict-item]
    ("recall empty name", lambda b: b.recall("")),
]
FIRE_BAD_CALLS: list[tuple[str, Callable[[LeaseBackend], object]]] = [
    ("claim_fire empty name", lambda b: b.claim_fire(Lease("", "a/1", 1, 1), 1)),
    ("claim_fire negative", lambda b: b.claim_fire(Lease("job", "a/1", 1, 1), -1)),
    ("claim_fire float", lambda b: b.claim_fire(Lease("job", "a/1", 1, 1), 1.5)),  # type: ignore[arg-type]
    ("claim_fire keep 0", lambda b: b.claim_fire(Lease("job", "a/1", 1, 1), 1, keep=0)),
    ("claim_fire ahead < 0", lambda b: b.claim_fire(Lease("job", "a/1", 1, 1), 1, ahead_ms=-1)),
    ("fires empty name", lambda b: b.fires("")),
]


def bad_calls(
    table: list[tuple[str, Callable[[LeaseBackend], object]]],
) -> pytest.MarkDecorator:
    return pytest.mark.parametrize("call", [c for _, c in table], ids=[i for i, _ in table])


class TestLeases:
    """:class:`~singleton.lease.leases.Leases`: exclusion, fencing, ownership, contend."""

    def test_acquire_free_lease(self, backend: LeaseBackend, unique: str) -> None:
        lease = acquire(backend, "job", "a/1")
        assert (lease.name, lease.holder, lease.ttl) == ("job", "a/1", TTL)
        assert lease.token >= 1
        state = backend.inspect("job")
        assert state is not None
        assert (state.holder, state.token, state.identity) == ("a/1", lease.token, "a")

    def test_second_holder_refused(self, backend: LeaseBackend) -> None:
        lease = acquire(backend, "job", "a/1")
        assert backend.try_acquire("job", "b/1", TTL) is None
        state = backend.inspect("job")
        assert state is not None and (state.holder, state.token) == ("a/1", lease.token)

    def test_same_holder_reacquire_keeps_token_and_extends(self, backend: LeaseBackend) -> None:
        first = acquire(backend, "job", "a/1", ttl=2.0)
        again = acquire(backend, "job", "a/1", ttl=TTL)
        assert again.token == first.token
        state = backend.inspect("job")
        assert state is not None and state.ttl_remaining > 2.0

    def test_tokens_strictly_increase_across_release_and_expiry(
        self, backend: LeaseBackend
    ) -> None:
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

    def test_foreign_renew_and_release_refused(self, backend: LeaseBackend) -> None:
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

    def test_renew_and_release_after_expiry_fail(self, backend: LeaseBackend) -> None:
        lease = acquire(backend, "job", "a/1", ttl=SHORT)
        expire(backend, "job")
        assert backend.renew(lease) is None
        assert backend.release(lease) is False
        assert backend.inspect("job") is None

    def test_renew_extends_from_now(self, backend: LeaseBackend) -> None:
        lease = acquire(backend, "job", "a/1", ttl=1.0)
        renewed = backend.renew(lease, ttl=TTL)
        assert renewed == Lease("job", "a/1", lease.token, TTL)
        state = backend.inspect("job")
        assert state is not None and 1.0 < state.ttl_remaining <= TTL

    def test_inspect(self, backend: LeaseBackend) -> None:
        assert backend.inspect("job") is None
        lease = acquire(backend, "job", "a/1")
        state = backend.inspect("job")
        assert state is not None
        assert (state.name, state.holder, state.token) == ("job", "a/1", lease.token)
        assert 0 < state.ttl_remaining <= TTL

    def test_contend(self, backend: LeaseBackend) -> None:
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

    def test_tokens_keep_growing_after_the_store_loses_all_its_data(
        self, backend: LeaseBackend
    ) -> None:
        issued = []
        for holder in ("a/1", "b/1", "a/2"):
            lease = acquire(backend, "job", holder)
            issued.append(lease.token)
            assert backend.release(lease)
        issued.append(acquire(backend, "job", "b/2").token)  # live when the data is lost
        lose_all_data(backend)
        assert backend.inspect("job") is None
        clock_passes(backend, max(issued))
        after = acquire(backend, "job", "c/1")
        assert after.token > max(issued), (
            f"tokens restarted after the loss: {issued} -> {after.token}"
        )
        again = acquire(backend, "job", "c/1")
        assert again.token == after.token  # an extension, not a new grant
        assert backend.release(after)
        assert acquire(backend, "job", "a/1").token > after.token

    @pytest.mark.parametrize("kind", BACKENDS)
    def test_a_leader_whose_store_lost_its_data_is_demoted_and_fenced_out(
        self, kind: str, backend_factory: Any
    ) -> None:
        """Leader A holds token t; the store loses everything; B acquires with a token above t;
        A's next renewal is refused, so A stops within a renew interval; A can never release B's
        lease."""
        a_backend: LeaseBackend = backend_factory(kind)
        b_backend: LeaseBackend = backend_factory(kind)
        gate, held_back = threading.Event(), threading.Event()
        gate.set()
        answers: list[Lease | None] = []
        real_renew = a_backend.renew

        def gated_renew(lease: Lease, ttl: float | None = None) -> Lease | None:
            if not gate.is_set():  # hold A's next renewal until B holds the lease
                held_back.set()
                gate.wait(10)
            answers.append(real_renew(lease, ttl))
            return answers[-1]

        a_backend.renew = gated_renew  # type: ignore[method-assign]
        tenures: list[Leadership] = []
        lost: list[tuple[str, float]] = []
        elected, demoted = threading.Event(), threading.Event()

        def on_elected(ld: Leadership) -> None:
            tenures.append(ld)
            elected.set()

        def on_lost(ld: Leadership, reason: str) -> None:
            lost.append((reason, time.monotonic()))
            demoted.set()

        renew_interval = 0.5
        timings: dict[str, Any] = {"ttl": 3.0, "renew_deadline": 2.0, "retry_interval": 0.2}
        a = Elector(a_backend, "job", identity="a", renew_interval=renew_interval, **timings)
        a.subscribe(on_elected=on_elected, on_lost=on_lost)
        try:
            a.start()
            assert elected.wait(10)
            ld = tenures[0]
            gate.clear()
            assert held_back.wait(5), "A never renewed"
            lose_all_data(b_backend)
            clock_passes(b_backend, ld.token)
            b_lease = b_backend.try_acquire("job", "b/1", 30.0)
            assert b_lease is not None, "the lost lease was not free"
            assert b_lease.token > ld.token
            b_acquired = time.monotonic()
            gate.set()
            assert demoted.wait(5), "A went on leading after the store lost its lease"
            assert lost[0][0] == "lost" and answers[-1] is None and not ld.valid()
            assert lost[0][1] - b_acquired <= renew_interval
            assert a_backend.release(ld.lease) is False
            assert a_backend.renew(ld.lease) is None
            a.stop()  # a follower now: nothing to release
            state = b_backend.inspect("job")
            assert state is not None and (state.holder, state.token) == ("b/1", b_lease.token)
            assert b_backend.release(b_lease)
        finally:
            gate.set()
            a.stop()


def test_a_follower_takes_over_a_crashed_holder_at_its_expiry_not_a_retry_later(
    backend: LeaseBackend,
) -> None:
    """A refused contend learns from the store when the lease runs out, and the follower comes
    back then: with a 30 s ``retry_interval`` the takeover still follows the expiry closely."""
    ttl = 1.0
    before = time.monotonic()
    crashed = backend.try_acquire("job", "crashed/1", ttl)  # and never renews nor releases
    assert crashed is not None
    elected = threading.Event()
    tenures: list[tuple[Leadership, float]] = []

    def on_elected(ld: Leadership) -> None:
        tenures.append((ld, time.monotonic()))
        elected.set()

    follower = Elector(backend, "job", identity="b", ttl=10.0, retry_interval=30.0)
    follower.subscribe(on_elected=on_elected)
    try:
        follower.start()
        assert elected.wait(10), "the follower waited for retry_interval, not the expiry"
        ld, at = tenures[0]
        assert ld.token > crashed.token
        # The store's ttl started after `before`: never granted sooner. The bound after it is
        # the margin plus round trips and scheduling on a loaded box, far below retry_interval.
        assert ttl <= at - before <= ttl + 0.5, at - before
    finally:
        follower.stop()


class TestReleases:
    """:class:`~singleton.lease.leases.Leases`, its release half: waits, wakes and release
    marks; every backend takes ``since``."""

    def test_release_frees_and_wakes_waiters(self, backend: LeaseBackend) -> None:
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

    def test_release_of_another_name_does_not_wake(self, backend: LeaseBackend) -> None:
        other = acquire(backend, "other", "a/1")
        waiter, result, _ = in_thread(lambda: backend.wait_for_release("job", timeout=1.0))
        assert backend.release(other)
        waiter.join(10)
        assert result == [False]

    def test_wait_for_release_times_out(self, backend: LeaseBackend) -> None:
        acquire(backend, "job", "a/1")
        assert backend.wait_for_release("job", timeout=0.2) is False

    def test_wait_for_release_returns_early_on_wake(self, backend: LeaseBackend) -> None:
        acquire(backend, "job", "a/1")
        wake = threading.Event()
        waiter, result, _ = in_thread(lambda: backend.wait_for_release("job", 60, wake=wake))
        wake.set()
        waiter.join(10)
        assert not waiter.is_alive(), "wait_for_release ignored wake"
        assert result == [False]
        assert wake.is_set()

    def test_a_release_after_the_mark_ends_a_later_wait_at_once(
        self, backend: LeaseBackend
    ) -> None:
        """The race a candidate runs: mark, contend refused, the holder releases, then the wait."""
        assert backend.wait_for_release("job", timeout=0.2) is False  # a feed starts and listens
        lease = acquire(backend, "job", "a/1")
        mark = backend.release_mark("job")
        assert backend.try_acquire("job", "b/1", TTL) is None
        assert backend.release(lease)
        wait_until(lambda: backend.release_mark("job") > mark, timeout=10, what="release counted")
        started = time.monotonic()
        assert backend.wait_for_release("job", timeout=60, since=mark) is True
        assert time.monotonic() - started < 5
        # No check that a mark read now stays put: MongoDB's backend counts a release of its own
        # twice (at once, then from its change stream), a spurious wake the contract allows.

    def test_a_mark_that_has_not_moved_waits_as_without_it(self, backend: LeaseBackend) -> None:
        lease = acquire(backend, "job", "a/1")
        other = acquire(backend, "other", "a/1")
        mark = backend.release_mark("job")
        assert backend.release(other)  # another name's release
        assert backend.release(Lease("job", "b/1", lease.token, TTL)) is False  # a refused one
        assert backend.wait_for_release("job", timeout=0.3, since=mark) is False
        assert backend.release_mark("job") == mark
        assert backend.renew(lease) == lease

    def test_expiry_wakes_nobody(self, backend: LeaseBackend) -> None:
        """Expiry is not a release: a follower waits for it on its own clock, never told."""
        acquire(backend, "job", "a/1", ttl=SHORT)
        mark = backend.release_mark("job")
        assert backend.wait_for_release("job", timeout=3 * SHORT, since=mark) is False
        expire(backend, "job")
        assert backend.release_mark("job") == mark


class TestFacts:
    """:class:`~singleton.lease.facts.Facts`: merged records that outlive every lease."""

    def test_remember_and_recall(self, backend: LeaseBackend) -> None:
        assert backend.recall("job") == {}
        backend.remember("job", {"checkpointed": "1", "token": 7})
        backend.remember("job", {"token": 8, "at": "1700000000"})  # merged, not replaced
        assert backend.recall("job") == {"checkpointed": "1", "token": "8", "at": "1700000000"}
        assert backend.recall("other") == {}

    def test_facts_outlive_every_lease_operation(self, backend: LeaseBackend) -> None:
        backend.remember("job", {"before": "any lease"})  # a name that never had a lease
        assert backend.inspect("job") is None  # remembering grants nothing
        a = acquire(backend, "job", "a/1", ttl=SHORT)
        backend.remember("job", {"during": a.token})
        renewed = backend.renew(a, ttl=SHORT)
        assert renewed is not None
        assert acquire(backend, "job", "a/1", ttl=SHORT).token == a.token  # an extension
        expire(backend, "job")
        b = acquire(backend, "job", "b/1")
        assert b.token > a.token  # the fencing counter is not disturbed by the record either
        assert backend.release(b)
        assert backend.recall("job") == {"before": "any lease", "during": str(a.token)}
        c = acquire(backend, "job", "c/1")
        assert c.token > b.token and backend.recall("job")["during"] == str(a.token)


class TestFireClaims:
    """:class:`~singleton.lease.fires.FireClaims`: each fire time once, fenced, bounded."""

    def test_claim_fire_once_per_fire_time_and_only_later(self, backend: LeaseBackend) -> None:
        a = acquire(backend, "job", "a/1")
        assert backend.fires("job") == []
        assert backend.claim_fire(a, 1_000)
        assert not backend.claim_fire(a, 1_000)  # the same fire time: never twice
        assert not backend.claim_fire(a, 999)  # an earlier one: never after a later one
        assert backend.claim_fire(a, 2_000)
        assert backend.fires("job") == [
            FireClaim(2_000, a.token, "a/1"),
            FireClaim(1_000, a.token, "a/1"),
        ]
        assert backend.fires("other") == []

    def test_claim_fire_is_fenced(self, backend: LeaseBackend) -> None:
        a = acquire(backend, "job", "a/1", ttl=SHORT)
        assert backend.claim_fire(a, 1_000)
        assert not backend.claim_fire(Lease("job", "b/1", a.token, TTL), 2_000)  # another holder
        assert not backend.claim_fire(Lease("job", "a/1", a.token + 1, TTL), 2_000)  # another token
        expire(backend, "job")
        assert not backend.claim_fire(a, 2_000)  # expired: a paused leader claims nothing
        b = acquire(backend, "job", "b/1")
        assert not backend.claim_fire(a, 3_000)  # deposed
        assert backend.claim_fire(b, 2_000)  # the successor continues after the latest claim
        assert backend.release(b)
        assert not backend.claim_fire(b, 4_000)  # released
        assert [c.fire_ms for c in backend.fires("job")] == [2_000, 1_000]
        assert [c.token for c in backend.fires("job")] == [b.token, a.token]

    def test_claim_fire_keeps_the_latest(self, backend: LeaseBackend) -> None:
        a = acquire(backend, "job", "a/1")
        for fire in range(1, 8):
            assert backend.claim_fire(a, fire * 1_000, keep=3)
        assert [c.fire_ms for c in backend.fires("job")] == [7_000, 6_000, 5_000]
        assert not backend.claim_fire(a, 4_000, keep=3)  # trimmed claims still bound the next one
        backend.remember("job", {"note": "x"})
        assert backend.recall("job") == {"note": "x"}  # facts and claims do not mix
        assert len(backend.fires("job")) == 3

    def test_claim_fire_refuses_fire_times_ahead_of_the_store_clock(
        self, backend: LeaseBackend
    ) -> None:
        a = acquire(backend, "job", "a/1")
        now = store_ms(backend)
        assert not backend.claim_fire(a, now + 60_000, ahead_ms=10_000)  # a clock far ahead
        assert backend.fires("job") == []
        assert backend.claim_fire(a, now + 5_000, ahead_ms=10_000)
        assert backend.fires("job")[0].fire_ms == now + 5_000

    def test_claim_fire_races_one_winner(self, backend: LeaseBackend) -> None:
        a = acquire(backend, "job", "a/1")
        results: list[bool] = []
        go = threading.Event()

        def claim() -> None:
            go.wait(10)
            results.append(backend.claim_fire(a, 5_000))

        threads = [threading.Thread(target=claim) for _ in range(6)]
        for t in threads:
            t.start()
        go.set()
        for t in threads:
            t.join(30)
        assert sorted(results) == [False] * 5 + [True]
        assert len(backend.fires("job")) == 1


class TestTheStore:
    """:class:`~singleton.lease.contract.LeaseBackend`: what the capabilities share, one store."""

    @bad_calls(LEASE_BAD_CALLS + FACT_BAD_CALLS + FIRE_BAD_CALLS)
    def test_bad_arguments_rejected_before_io(
        self, backend: LeaseBackend, call: Callable[[LeaseBackend], object]
    ) -> None:
        """Every capability (leases, facts, fire claims) checks its arguments before any I/O."""
        assert_rejected_before_io(backend, call)

    def test_facts_are_lost_with_the_store(self, backend: LeaseBackend) -> None:
        backend.remember("job", {"checkpointed": "1"})
        assert backend.claim_fire(acquire(backend, "job", "a/1"), 1_000)
        lose_all_data(backend)
        assert backend.recall("job") == {}
        assert backend.fires("job") == []
        backend.remember("job", {"checkpointed": "2"})
        assert backend.recall("job") == {"checkpointed": "2"}


class TestMembership:
    """:class:`~singleton.lease.membership.Membership` as every backend hands it out."""

    @pytest.mark.parametrize("kind", BACKENDS)
    def test_every_backend_on_one_store_sees_the_same_members(
        self, kind: str, backend_factory: Any
    ) -> None:
        a, b = backend_factory(kind), backend_factory(kind)  # two replicas, one store
        assert isinstance(a.membership(), Membership)
        a.membership().heartbeat("g", "a", 30, {"held": 1})
        b.membership().heartbeat("g", "b", 30, {})
        for replica in (a, b):
            seen = [(m.identity, dict(m.info)) for m in replica.membership().members("g")]
            assert seen == [("a", {"held": "1"}), ("b", {})]
        a.membership().leave("g", "a")
        assert [m.identity for m in b.membership().members("g")] == ["b"]
