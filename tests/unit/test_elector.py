"""The Elector's state machine, driven step by step with ``tick()`` on a FakeClock.

Every lease boundary here is exact: nothing depends on real time passing.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest

from singleton import ConfigurationError, Elector, Leadership, LeaseLostError
from singleton.abc import Lease
from singleton.callbacks import Callbacks
from singleton.election import Election
from singleton.elector import BeforeRelease
from singleton.errors import BackendUnavailableError
from singleton.retry import Backoff
from singleton.testing import FakeClock, MemoryLeaseBackend
from singleton.timings import LeaseTimings


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
    """A memory backend whose calls can be made to fail like an unreachable server."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__(clock)
        self.down = False

    def _maybe_fail(self) -> None:
        if self.down:
            raise BackendUnavailableError("injected: server unreachable")

    def contend(self, name: str, holder: str, ttl: float) -> Any:
        self._maybe_fail()
        return super().contend(name, holder, ttl)

    def renew(self, lease: Lease, ttl: float | None = None) -> Lease | None:
        self._maybe_fail()
        return super().renew(lease, ttl)

    def release(self, lease: Lease) -> bool:
        self._maybe_fail()
        return super().release(lease)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def backend(clock: FakeClock) -> FlakyBackend:
    return FlakyBackend(clock)


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


def leading(backend: MemoryLeaseBackend, clock: FakeClock, **kw: Any) -> tuple[Elector, Recorder]:
    """An elector (identity ``a``) that has just won the free lease, token 1, and its recorder."""
    rec = Recorder()
    e = make(backend, clock, rec, **kw)
    e.tick()
    assert_leads(e, 1)
    return e, rec


# -- construction ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kw", "named"),
    [
        ({"ttl": 10, "renew_deadline": 10}, "renew_deadline=10"),
        ({"ttl": 10, "renew_deadline": 12}, "ttl=10"),
        ({"ttl": 10, "renew_deadline": 6, "renew_interval": 5}, "renew_interval=5"),
        ({"ttl": 10, "renew_interval": 0}, "renew_interval=0"),
        ({"ttl": -1}, "ttl=-1"),
    ],
)
def test_invalid_timings_name_the_values(kw: dict[str, float], named: str) -> None:
    with pytest.raises(ConfigurationError, match="ttl > renew_deadline") as info:
        Elector(MemoryLeaseBackend(), "job", **kw)  # type: ignore[arg-type]
    assert named in str(info.value)


@pytest.mark.parametrize(
    ("kw", "named"),
    [
        ({"ttl": True}, "ttl"),
        ({"ttl": "15"}, "ttl"),
        ({"retry_interval": 0}, "retry_interval"),
        ({"max_tenure": -1.0}, "max_tenure"),
        ({"cooldown": -1.0}, "cooldown"),
        ({"identity": "a/b"}, "identity"),
        ({"identity": ""}, "identity"),
        ({"jitter": 1.0}, "jitter"),
        ({"name": ""}, "lease name"),
    ],
)
def test_invalid_arguments(kw: dict[str, Any], named: str) -> None:
    with pytest.raises(ConfigurationError, match=named):
        Elector(MemoryLeaseBackend(), kw.pop("name", "job"), **kw)


def test_default_timings() -> None:
    e = Elector(MemoryLeaseBackend(), "job", ttl=15)
    assert (e.renew_interval, e.renew_deadline, e.retry_interval) == (5.0, 10.0, 2.0)


def test_holder_is_unique_per_instance_even_with_the_same_identity() -> None:
    b = MemoryLeaseBackend()
    one, two = Elector(b, "job", identity="web"), Elector(b, "job", identity="web")
    assert one.holder != two.holder
    assert one.holder.startswith("web/") and two.holder.startswith("web/")


# -- election and renewal -------------------------------------------------------------------
def test_elected_when_free_then_renews_on_schedule(backend: FlakyBackend, clock: FakeClock) -> None:
    rec = Recorder()
    e = make(backend, clock, rec)  # ttl 9: renew every 3, deadline 6
    assert e.tick() == 0.0
    assert e.is_leader and rec.events == [("leader", "a"), ("elected", "a", 1)]
    ld = assert_leads(e, 1)
    assert ld.remaining() == pytest.approx(6.0)
    assert e.tick() == pytest.approx(3.0)  # nothing due yet
    backend.calls.clear()
    clock.advance(3.0)
    e.tick()
    assert backend.calls == [("renew", "job")]
    assert ld.remaining() == pytest.approx(6.0)  # deadline moved with the confirmed renewal


def test_follower_observes_leader_and_waits_retry_interval(
    backend: FlakyBackend, clock: FakeClock
) -> None:
    leader = make(backend, clock, identity="lead")
    leader.tick()
    rec = Recorder()
    follower = make(backend, clock, rec, identity="follow", retry_interval=2.0)
    assert follower.tick() == pytest.approx(2.0)
    assert not follower.is_leader
    assert rec.events == [("leader", "lead")]


def test_restarted_process_with_same_identity_does_not_inherit_the_lease(
    backend: FlakyBackend, clock: FakeClock
) -> None:
    crashed = make(backend, clock, identity="web")
    crashed.tick()
    reborn = make(backend, clock, identity="web")
    reborn.tick()
    assert not reborn.is_leader
    clock.advance(9.0)  # the crashed one's lease expires unrenewed
    reborn.tick()
    assert_leads(reborn, 2)


# -- stop before expiry ---------------------------------------------------------------------
def test_unconfirmed_renewal_demotes_at_the_deadline_before_the_lease_expires(
    backend: FlakyBackend, clock: FakeClock
) -> None:
    e, rec = leading(backend, clock)  # ttl 9, renew_deadline 6
    ld = assert_leads(e)
    backend.down = True
    clock.advance(3.0)
    e.tick()  # the renewal fails: still valid, retrying
    assert ld.valid()
    clock.advance(3.0 - 1e-6)
    assert ld.valid()
    clock.advance(1e-6)  # exactly renew_deadline after the last confirmed renewal
    assert not ld.valid()  # valid() is computed: it turns false on time even before tick()
    with pytest.raises(LeaseLostError, match="token 1"):
        ld.check()
    e.tick()
    assert rec.events[-1] == ("lost", "a", 1, "expired")
    assert ld.lost.is_set() and not e.is_leader
    # ...while the store still holds the lease for us: nobody else can have been granted it.
    backend.down = False
    state = backend.inspect("job")
    assert state is not None and state.token == 1 and state.ttl_remaining == pytest.approx(3.0)
    assert backend.try_acquire("job", "other/x", 9.0) is None


def test_deadline_counts_from_when_the_renewal_was_sent(
    backend: FlakyBackend, clock: FakeClock
) -> None:
    class SlowRenew(FlakyBackend):
        def renew(self, lease: Lease, ttl: float | None = None) -> Lease | None:
            result = super().renew(lease, ttl)
            clock.advance(2.0)  # the answer arrives 2 s after the server applied it
            return result

    slow = SlowRenew(clock)
    e = make(slow, clock)
    e.tick()
    ld = assert_leads(e)
    clock.advance(3.0)
    e.tick()
    assert ld.remaining() == pytest.approx(4.0)  # 6 s from the send, 2 s of which have passed


def test_renew_refused_means_lost(backend: FlakyBackend, clock: FakeClock) -> None:
    e, rec = leading(backend, clock)
    backend.expire("job")
    assert backend.try_acquire("job", "thief/1", 9.0) is not None
    clock.advance(3.0)
    e.tick()
    assert rec.events[-1] == ("lost", "a", 1, "lost")
    assert not e.is_leader


def test_after_demotion_a_new_tenure_gets_a_new_token(
    backend: FlakyBackend, clock: FakeClock
) -> None:
    e, _ = leading(backend, clock)
    backend.down = True
    clock.advance(6.0)
    e.tick()
    backend.down = False
    e.tick()  # our old lease is still live under the old holder value: refused
    assert not e.is_leader
    clock.advance(3.0)  # it expires
    e.tick()
    assert_leads(e, 2)


# -- rotation -------------------------------------------------------------------------------
def test_rotation_drains_then_releases_then_cools_down(
    backend: FlakyBackend, clock: FakeClock
) -> None:
    drained: list[bool] = []

    def before_release(ld: Leadership) -> None:
        drained.append(ld.valid())
        state = backend.inspect("job")
        assert state is not None and state.token == ld.token  # not yet released

    e, rec = leading(backend, clock, max_tenure=4.0, cooldown=2.0, before_release=before_release)
    clock.advance(3.0)
    e.tick()  # renew
    clock.advance(1.0)
    e.tick()  # tenure over
    assert drained == [True]
    assert rec.events[-1] == ("lost", "a", 1, "released")
    assert backend.inspect("job") is None
    backend.calls.clear()
    assert e.tick() == pytest.approx(2.0)  # sitting out the cooldown: no commands
    assert backend.calls == []
    clock.advance(2.0)
    e.tick()  # a lone replica takes it back after the cooldown
    assert_leads(e, 2)


def _raising_drain(ld: Leadership) -> None:
    raise RuntimeError("drain bug")


@pytest.mark.parametrize("before_release", [None, _raising_drain], ids=["plain", "drain-raises"])
def test_rotate_now_releases(
    backend: FlakyBackend, clock: FakeClock, before_release: BeforeRelease | None
) -> None:
    e, rec = leading(backend, clock, before_release=before_release)
    e.rotate()
    e.tick()
    assert rec.events[-1] == ("lost", "a", 1, "released")
    other = make(backend, clock, identity="b")
    other.tick()
    assert_leads(other, 2)


def test_failed_drain_does_not_release(backend: FlakyBackend, clock: FakeClock) -> None:
    gate = threading.Event()
    e, _ = leading(backend, clock, before_release=lambda ld: gate.wait(5), release_timeout=0.05)
    e.rotate()
    e.tick()
    gate.set()
    assert not e.is_leader
    state = backend.inspect("job")
    assert state is not None and state.token == 1  # left to expire, not released mid-drain


# -- failures of the store ------------------------------------------------------------------
def test_unreachable_store_backs_off_and_never_leads(
    backend: FlakyBackend, clock: FakeClock
) -> None:
    backend.down = True
    e = make(backend, clock, retry_interval=1.0)
    delays = []
    for _ in range(5):
        delays.append(e.tick())
        clock.advance(delays[-1])
        assert not e.is_leader
    assert delays == sorted(delays) and delays[-1] >= 8 * delays[0]
    backend.down = False
    e.tick()
    assert e.is_leader


def test_callback_errors_do_not_stop_the_elector(backend: FlakyBackend, clock: FakeClock) -> None:
    def bad(ld: Leadership) -> None:
        raise RuntimeError("user bug")

    e = Elector(backend, "job", clock=clock, ttl=9, on_elected=bad, jitter=0)
    e.tick()
    assert e.is_leader


# -- stopping -------------------------------------------------------------------------------
@pytest.mark.parametrize("release", [True, False], ids=["release", "let-expire"])
def test_stop(backend: FlakyBackend, clock: FakeClock, release: bool) -> None:
    e, rec = leading(backend, clock)
    e.stop(release=release)
    assert rec.events[-1] == ("lost", "a", 1, "stopped")
    assert not e.is_leader
    assert (backend.inspect("job") is None) == release


# -- threads, real clock ----------------------------------------------------------------------
def test_lead_blocks_until_elected_and_releases_on_exit() -> None:
    b = MemoryLeaseBackend()
    holder = Elector(b, "job", identity="first", ttl=2.0, retry_interval=0.05)
    with holder.lead(timeout=5) as ld:
        assert ld.valid() and ld.token == 1
        waiting = Elector(b, "job", identity="second", ttl=2.0, retry_interval=5.0)
        waiting.start()
    # The release notification wakes the waiting candidate long before its 5 s retry.
    got = threading.Event()
    waiting.subscribe(on_elected=lambda _ld: got.set())
    assert got.wait(3) or waiting.is_leader
    assert_leads(waiting, 2)
    waiting.stop()
    assert b.inspect("job") is None


def test_lead_times_out() -> None:
    b = MemoryLeaseBackend()
    assert b.try_acquire("job", "other/1", 30) is not None
    e = Elector(b, "job", ttl=3.0, retry_interval=0.05)
    with pytest.raises(TimeoutError), e.lead(timeout=0.2):
        pass
    assert not e.running


def test_watchdog_demotes_a_leader_stuck_in_a_renew_call() -> None:
    stuck = threading.Event()
    release_call = threading.Event()

    class Hanging(MemoryLeaseBackend):
        def renew(self, lease: Lease, ttl: float | None = None) -> Lease | None:
            stuck.set()
            release_call.wait(10)
            return super().renew(lease, ttl)

    lost: list[tuple[str, float]] = []
    lost_evt = threading.Event()
    e = Elector(
        Hanging(),
        "job",
        ttl=1.2,
        renew_interval=0.1,
        renew_deadline=0.6,
        retry_interval=0.05,
        on_lost=lambda ld, r: (lost.append((r, ld.remaining())), lost_evt.set()),
    )
    e.start()
    try:
        assert stuck.wait(5)
        assert lost_evt.wait(5), "the watchdog must end the tenure while renew() hangs"
        assert lost[0][0] == "expired"
    finally:
        release_call.set()
        e.stop()


def test_rotate_on_a_follower_is_ignored(backend: FlakyBackend, clock: FakeClock) -> None:
    leader = make(backend, clock, identity="lead")
    leader.tick()
    rec = Recorder()
    follower = make(backend, clock, rec, identity="follow")
    follower.tick()
    follower.rotate()  # nothing to hand over; must not cut its next tenure short
    leader.stop()
    follower.tick()
    follower.tick()
    assert follower.is_leader
    assert [e for e in rec.events if e[0] == "lost"] == []


def test_the_election_runs_without_a_driver(backend: FlakyBackend, clock: FakeClock) -> None:
    """The state machine alone, as another driver (asyncio) would use it: it starts no thread."""
    changes: list[str | None] = []

    def run_inline(work: Callable[[], None], timeout: float) -> bool:
        work()
        return True

    callbacks = Callbacks("job")
    callbacks.add(before_release=lambda ld: changes.append("drained"))
    election = Election(
        backend,
        "job",
        "a",
        LeaseTimings.of(9.0, retry_interval=1.0),
        clock=clock,
        backoff=Backoff(1.0, 30.0, jitter=0.0),
        callbacks=callbacks,
        run_bounded=run_inline,
        changed=lambda: changes.append(None),
    )
    threads = threading.active_count()
    assert election.tick() == 0.0
    assert election.leadership is not None and election.leadership.token == 1
    assert election.tick() == pytest.approx(3.0)
    assert election.rotate()
    assert election.tick() == 0.0
    assert election.leadership is None and backend.inspect("job") is None
    assert changes == [None, None, "drained", None]  # elected, renewed for the drain, ended
    assert threading.active_count() == threads
