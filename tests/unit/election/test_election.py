"""The election's state machine, driven step by step with ``tick()`` on a FakeClock.

Every lease boundary here is exact: nothing depends on real time passing.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from singleton import ConfigurationError, Elector, Leadership, LeaseLostError
from singleton.election.elector import BeforeRelease
from singleton.election.settings import EXPIRY_MARGIN, MAX_RETRY_BACKOFF
from singleton.errors import PermissionDeniedError
from singleton.lease.contract import Lease
from singleton.testing import FakeClock
from tests.unit.election.election_support import (
    FlakyBackend,
    Recorder,
    assert_leads,
    captured_logs,
    leading,
    make,
    refused_campaigns,
)

#: A step below any boundary that the clock represents exactly (1000 + 5 - EPS + EPS == 1005).
EPS = 2.0**-20


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def backend(clock: FakeClock) -> FlakyBackend:
    return FlakyBackend(clock)


# -- election and renewal -------------------------------------------------------------------
def test_elected_when_free_then_renews_on_schedule(backend: FlakyBackend, clock: FakeClock) -> None:
    rec = Recorder()
    e = make(backend, clock, rec)  # ttl 9: renew every 3, deadline 6
    assert e.tick() == 0.0
    ld = assert_leads(e)
    assert rec.events == [("leader", "a"), ("elected", "a", ld.token)]
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


def test_a_follower_takes_over_a_crashed_leader_at_the_lease_expiry_exactly(
    backend: FlakyBackend, clock: FakeClock
) -> None:
    leader = make(backend, clock, identity="lead")  # ttl 9, renew every 3
    leader.tick()
    clock.advance(3.0)
    leader.tick()  # the last renewal: the lease now runs out 9 s from here
    expiry = clock.monotonic() + 9.0
    rec = Recorder()
    follower = make(backend, clock, rec, identity="follow", retry_interval=2.0)
    clock.advance(0.5)  # the leader is gone (it never ticks again)
    delays = refused_campaigns(follower, clock, 4)  # each refusal: the ceiling, retry_interval
    assert delays == [2.0, 2.0, 2.0, 2.0]
    last = follower.tick()  # 0.5 s left by the store's clock: come back then, not in 2 s
    assert last == pytest.approx(0.5 + EXPIRY_MARGIN, abs=1e-9) and not follower.is_leader
    clock.advance(last)
    assert clock.monotonic() == pytest.approx(expiry + EXPIRY_MARGIN, abs=1e-9)
    follower.tick()
    assert_leads(follower)
    assert rec.events[-1][:2] == ("elected", "follow")


def test_restarted_process_with_same_identity_does_not_inherit_the_lease(
    backend: FlakyBackend, clock: FakeClock
) -> None:
    crashed = make(backend, clock, identity="web")
    crashed.tick()
    old = assert_leads(crashed).token
    reborn = make(backend, clock, identity="web")
    reborn.tick()
    assert not reborn.is_leader
    clock.advance(9.0)  # the crashed one's lease expires unrenewed
    reborn.tick()
    assert assert_leads(reborn).token > old


# -- stop before expiry ---------------------------------------------------------------------
def test_unconfirmed_renewal_demotes_at_the_deadline_before_the_lease_expires(
    backend: FlakyBackend, clock: FakeClock
) -> None:
    e, rec, token = leading(backend, clock)  # ttl 9, renew_deadline 6
    ld = assert_leads(e)
    backend.down = True
    clock.advance(3.0)
    e.tick()  # the renewal fails: still valid, retrying
    assert ld.valid()
    assert e.last_error is not None and "unreachable" in e.last_error and not e.failing
    clock.advance(3.0 - EPS)
    assert ld.valid()
    clock.advance(EPS)  # exactly renew_deadline after the last confirmed renewal
    assert not ld.valid()  # valid() is computed: it turns false on time even before tick()
    with pytest.raises(LeaseLostError, match=f"token {token}"):
        ld.check()
    e.tick()
    assert rec.events[-1] == ("lost", "a", token, "expired")
    assert ld.lost.is_set() and not e.is_leader
    # ...while the store still holds the lease for us: nobody else can have been granted it.
    backend.down = False
    state = backend.inspect("job")
    assert state is not None and (state.token, state.ttl_remaining) == (token, pytest.approx(3))
    assert backend.try_acquire("job", "other/x", 9.0) is None


def test_deadline_counts_from_when_the_renewal_was_sent(clock: FakeClock) -> None:
    class SlowRenew(FlakyBackend):
        def renew(self, lease: Lease, ttl: float | None = None) -> Lease | None:
            result = super().renew(lease, ttl)
            clock.advance(2.0)  # the answer arrives 2 s after the server applied it
            return result

    e = make(SlowRenew(clock), clock)
    e.tick()
    ld = assert_leads(e)
    clock.advance(3.0)
    e.tick()
    assert ld.remaining() == pytest.approx(4.0)  # 6 s from the send, 2 s of which have passed


def test_renew_refused_means_lost(backend: FlakyBackend, clock: FakeClock) -> None:
    e, rec, token = leading(backend, clock)
    backend.expire("job")
    assert backend.try_acquire("job", "thief/1", 9.0) is not None
    clock.advance(3.0)
    e.tick()
    assert rec.events[-1] == ("lost", "a", token, "lost")
    assert not e.is_leader


def test_after_demotion_a_new_tenure_gets_a_new_token(
    backend: FlakyBackend, clock: FakeClock
) -> None:
    e, _, token = leading(backend, clock)
    backend.down = True
    clock.advance(6.0)
    e.tick()
    backend.down = False
    e.tick()  # our old lease is still live under the old holder value: refused
    assert not e.is_leader
    clock.advance(3.0)  # it expires
    e.tick()
    assert assert_leads(e).token > token


# -- rotation -------------------------------------------------------------------------------
def test_rotation_drains_then_releases_then_cools_down(
    backend: FlakyBackend, clock: FakeClock
) -> None:
    drained: list[bool] = []

    def before_release(ld: Leadership) -> None:
        drained.append(ld.valid())
        state = backend.inspect("job")
        assert state is not None and state.token == ld.token  # not yet released

    e, rec, token = leading(backend, clock, max_tenure=4, cooldown=2, before_release=before_release)
    clock.advance(3.0)
    e.tick()  # renew
    clock.advance(1.0)
    e.tick()  # tenure over
    assert drained == [True]
    assert rec.events[-1] == ("lost", "a", token, "released")
    assert backend.inspect("job") is None
    backend.calls.clear()
    assert e.tick() == pytest.approx(2.0)  # sitting out the cooldown: no commands
    assert backend.calls == []
    clock.advance(2.0)
    e.tick()  # a lone replica takes it back after the cooldown
    assert assert_leads(e).token > token


def _raising_drain(ld: Leadership) -> None:
    raise RuntimeError("drain bug")


@pytest.mark.parametrize("before_release", [None, _raising_drain], ids=["plain", "drain-raises"])
def test_rotate_now_releases(
    backend: FlakyBackend, clock: FakeClock, before_release: BeforeRelease | None
) -> None:
    e, rec, token = leading(backend, clock, before_release=before_release)
    e.rotate()
    e.tick()
    assert rec.events[-1] == ("lost", "a", token, "released")
    other = make(backend, clock, identity="b")
    other.tick()
    assert assert_leads(other).token > token


def test_overrunning_drain_is_released_anyway_and_fenced(
    backend: FlakyBackend, clock: FakeClock
) -> None:
    gate, finished = threading.Event(), threading.Event()
    after: list[bool] = []

    def drain(ld: Leadership) -> None:  # in-flight work that outlives the bound
        gate.wait(5)
        after.append(ld.valid())
        finished.set()

    e, rec, token = leading(backend, clock, before_release=drain, release_timeout=0.05)
    released: list[tuple[int, bool]] = []
    e.subscribe(on_released=lambda ld, ok: released.append((ld.token, ok)))
    with captured_logs() as logs:
        e.rotate()
        e.tick()
    assert rec.events[-1] == ("lost", "a", token, "released")
    assert backend.inspect("job") is None  # released, not left to expire
    assert released == [(token, True)]
    assert any("releasing anyway" in m for lvl, m in logs if lvl == "WARNING")
    other = make(backend, clock, identity="b")
    other.tick()
    assert assert_leads(other).token > token  # the successor takes over at once
    gate.set()
    assert finished.wait(5)
    assert after == [False]  # the drain still running may not act: demoted before the release


def test_stop_releases_a_tenure_past_its_deadline(backend: FlakyBackend, clock: FakeClock) -> None:
    e, rec, token = leading(backend, clock)
    clock.advance(e.renew_deadline)  # the deadline passed, the store still holds it (ttl)
    e.stop()
    assert rec.events[-1] == ("lost", "a", token, "expired")
    assert backend.inspect("job") is None


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


# -- resign: the work under the lease failed for good ----------------------------------------
def test_resign_releases_at_once_and_sits_out_exactly_the_cooldown(
    backend: FlakyBackend, clock: FakeClock
) -> None:
    drains: list[Leadership] = []
    e, rec, token = leading(backend, clock, before_release=drains.append)
    ld = assert_leads(e)
    backend.calls.clear()
    assert e.resign(5.0) is True
    assert rec.events[-1] == ("lost", "a", token, "failed")
    assert ld.reason == "failed" and ld.lost.is_set() and not e.is_leader
    assert drains == []  # the work has stopped already: nothing to drain
    assert backend.calls == [("release", "job")]  # no renewal for a drain either
    assert backend.inspect("job") is None and e.stats.resignations == 1
    other = make(backend, clock, identity="b")
    other.tick()  # another replica takes over at once, without waiting for expiry
    assert assert_leads(other).token > token
    backend.calls.clear()
    assert e.tick() == pytest.approx(5.0)
    clock.advance(5.0 - EPS)
    assert e.tick() == pytest.approx(EPS)
    assert backend.calls == []  # no campaign during the cooldown
    clock.advance(EPS)
    e.tick()  # exactly at its end it contends again (and sees b lead)
    assert backend.calls == [("acquire", "job")]
    assert rec.events[-1] == ("leader", "b")


def test_resign_changes_nothing_on_a_follower_or_for_an_older_tenure(
    backend: FlakyBackend, clock: FakeClock
) -> None:
    e, rec, _ = leading(backend, clock, cooldown=1.0)
    old = assert_leads(e)
    e.rotate()
    e.tick()  # released
    assert e.resign(60.0) is False  # a follower now
    clock.advance(1.0)
    e.tick()  # the rotation's cooldown only: it leads again
    current = assert_leads(e)
    assert e.resign(60.0, leadership=old) is False  # a late call about the older tenure
    assert e.leadership is current and current.reason is None
    assert rec.events[-1][0] == "elected" and e.stats.resignations == 0


@pytest.mark.parametrize("cooldown", [-1.0, float("inf"), True])
def test_resign_rejects_bad_arguments(
    backend: FlakyBackend, clock: FakeClock, cooldown: Any
) -> None:
    e, _, _ = leading(backend, clock)
    with pytest.raises(ConfigurationError, match="cooldown"):
        e.resign(cooldown)
    with pytest.raises(ConfigurationError, match="reason"):
        e.resign(1.0, "")
    assert_leads(e)


# -- failures of the store ------------------------------------------------------------------
def test_unreachable_store_backs_off_says_so_and_never_leads(
    backend: FlakyBackend, clock: FakeClock
) -> None:
    backend.down = True
    e = make(backend, clock, retry_interval=1.0)
    with captured_logs() as logs:
        delays = refused_campaigns(e, clock, 5)
    assert delays == [1.0, 2.0, 4.0, 8.0, 16.0]
    assert [level for level, _ in logs] == ["WARNING"] * 5  # transient: a warning per retry
    assert e.last_error == "BackendUnavailableError: injected: server unreachable"
    assert not e.failing and e.stats.consecutive_failures == 5 and e.stats.fatal_errors == 0
    backend.down = False
    e.tick()
    assert e.is_leader and e.last_error is None and e.stats.consecutive_failures == 0


def test_refused_credentials_are_an_error_every_retry_and_the_elector_says_so(
    backend: FlakyBackend, clock: FakeClock
) -> None:
    backend.down = True
    backend.error = PermissionDeniedError(
        "redis acquire of lease 'job' on redis://bob:***@10.0.0.7:6379/0: WRONGPASS invalid"
    )
    e = make(backend, clock, retry_interval=1.0)
    with captured_logs() as logs:
        delays = refused_campaigns(e, clock, 7)
    assert not e.is_leader and e.stats.elections == 0
    assert delays == [1.0, 2.0, 4.0, 8.0, 16.0, MAX_RETRY_BACKOFF, MAX_RETRY_BACKOFF]
    assert [level for level, _ in logs] == ["ERROR"] * 7  # one per retry, none dropped
    assert all("bob:***@10.0.0.7" in msg and "WRONGPASS" in msg for _, msg in logs), logs
    assert e.failing and e.last_error is not None
    assert e.last_error.startswith("PermissionDeniedError: ") and "WRONGPASS" in e.last_error
    stats = e.stats
    assert (stats.contend_failures, stats.fatal_errors, stats.consecutive_failures) == (7, 7, 7)
    assert "failing" in repr(e)
    backend.down = False  # the operator fixed the password
    e.tick()
    assert e.is_leader and not e.failing and e.last_error is None


def test_refused_renewal_is_an_error_and_the_deadline_still_bites(
    backend: FlakyBackend, clock: FakeClock
) -> None:
    e, rec, token = leading(backend, clock)
    backend.down = True
    backend.error = PermissionDeniedError("NOPERM this user has no permissions")
    with captured_logs() as logs:
        clock.advance(3.0)
        e.tick()
    assert logs and logs[0][0] == "ERROR" and "NOPERM" in logs[0][1]
    assert e.failing and e.stats.renew_failures == 1
    clock.advance(3.0)
    e.tick()
    assert rec.events[-1] == ("lost", "a", token, "expired")


def test_callback_errors_do_not_stop_the_elector(backend: FlakyBackend, clock: FakeClock) -> None:
    def bad(ld: Leadership) -> None:
        raise RuntimeError("user bug")

    e = Elector(backend, "job", clock=clock, ttl=9, on_elected=bad, jitter=0)
    rec = Recorder()
    e.subscribe(on_elected=rec.elected)
    e.tick()
    assert e.is_leader
    assert [kind for kind, *_ in rec.events] == ["elected"]  # the others still hear the news


# -- stopping -------------------------------------------------------------------------------
@pytest.mark.parametrize("release", [True, False], ids=["release", "let-expire"])
def test_stop(backend: FlakyBackend, clock: FakeClock, release: bool) -> None:
    e, rec, token = leading(backend, clock)
    e.stop(release=release)
    assert rec.events[-1] == ("lost", "a", token, "stopped")
    assert not e.is_leader
    assert (backend.inspect("job") is None) == release
