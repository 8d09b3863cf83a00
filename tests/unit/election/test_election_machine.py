"""The Election state machine on its own: scripted results, no backend object, no thread.

Each test plays the driver: it takes the action :meth:`Election.tick` returns, makes up the
store's answer, and reports it back. So these tests pin the rules themselves, the ones any
driver (the thread one, a later asyncio one) inherits, on a FakeClock with exact boundaries.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from singleton.election.actions import Action, Contend, Contended, Drain, Release, Renew, Wait
from singleton.election.leadership import Leadership
from singleton.election.machine import Election
from singleton.election.settings import EXPIRY_MARGIN, ElectorOptions, ElectorSettings
from singleton.errors import BackendUnavailableError, PermissionDeniedError
from singleton.lease.contract import Lease, LeaseState
from singleton.testing import FakeClock

#: A step below any boundary that the clock represents exactly (1000 + 6 - EPS + EPS == 1006).
EPS = 2.0**-20
TTL, RENEW_INTERVAL, RENEW_DEADLINE, RETRY = 9.0, 3.0, 6.0, 1.0


class Events:
    """What the election told its subscribers, in order."""

    def __init__(self) -> None:
        self.log: list[tuple[Any, ...]] = []
        self.changes = 0

    def subscribe(self, election: Election) -> None:
        election.callbacks.add(
            on_elected=lambda ld: self.log.append(("elected", ld.token)),
            on_lost=lambda ld, why: self.log.append(("lost", ld.token, why)),
            on_new_leader=lambda who: self.log.append(("leader", who)),
            on_released=lambda ld, ok: self.log.append(("released", ld.token, ok)),
        )

    def changed(self) -> None:
        self.changes += 1


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def machine(
    clock: FakeClock, events: Events | None = None, **options: Any
) -> tuple[Election, Events]:
    events = events or Events()
    given: ElectorOptions = {
        "identity": "a",
        "ttl": TTL,
        "retry_interval": RETRY,
        "jitter": 0.0,
        "clock": clock,
    }
    given.update(options)  # type: ignore[typeddict-item]
    election = Election(
        "job", ElectorSettings.of(**given), store="scripted", changed=events.changed
    )
    events.subscribe(election)
    return election, events


def lease(holder: str, token: int = 7) -> Lease:
    return Lease("job", holder, token, TTL)


def contend(election: Election) -> Contend:
    action = election.tick()
    assert isinstance(action, Contend), action
    return action


def elected(election: Election, clock: FakeClock, token: int = 7) -> Leadership:
    """Answer the due contend with a grant sent now; the new tenure."""
    action = contend(election)
    assert (action.name, action.holder, action.ttl) == ("job", election.holder, TTL)
    granted = Contended.of(lease(action.holder, token), sent_at=clock.monotonic())
    assert election.contended(action, granted) == Wait(0.0)
    ld = election.leadership
    assert ld is not None and ld.token == token
    return ld


def renew(election: Election) -> Renew:
    action = election.tick()
    assert isinstance(action, Renew), action
    return action


def leading(clock: FakeClock, **options: Any) -> tuple[Election, Events, Leadership]:
    """A machine (``options`` as for :func:`machine`) elected just now, token 7: the election,
    what it told its subscribers, and the tenure."""
    election, events = machine(clock, **options)
    return election, events, elected(election, clock)


def renew_due(election: Election, clock: FakeClock) -> Renew:
    """Let the renew interval pass: the renewal then due."""
    clock.advance(RENEW_INTERVAL)
    return renew(election)


# -- leading ----------------------------------------------------------------------------------
def test_a_granted_contend_leads_and_renews_on_schedule(clock: FakeClock) -> None:
    election, events, ld = leading(clock)
    assert events.log == [("leader", "a"), ("elected", 7)]
    assert ld.remaining() == RENEW_DEADLINE
    assert election.tick() == Wait(RENEW_INTERVAL)  # nothing due before the renew interval
    clock.advance(RENEW_INTERVAL - EPS)
    assert election.tick() == Wait(EPS)
    clock.advance(EPS)
    action = renew(election)
    assert action.leadership is ld and action.lease.token == 7 and action.ttl == TTL
    assert election.renewed(action, lease(ld.holder), sent_at=clock.monotonic()) == Wait(0.0)
    assert ld.remaining() == RENEW_DEADLINE  # the deadline moved with the confirmed renewal
    assert election.tick() == Wait(RENEW_INTERVAL)
    assert election.stats.renewals == 1 and events.log[-1] == ("elected", 7)


def test_the_deadline_counts_from_when_the_renewal_was_sent(clock: FakeClock) -> None:
    election, _, ld = leading(clock)
    action = renew_due(election, clock)
    sent_at = clock.monotonic()
    clock.advance(2.0)  # the answer arrives 2 s after the request left
    election.renewed(action, lease(ld.holder), sent_at=sent_at)
    assert ld.remaining() == RENEW_DEADLINE - 2.0


def test_a_renewal_never_confirmed_ends_the_tenure_at_renew_deadline_before_ttl(
    clock: FakeClock,
) -> None:
    election, events, ld = leading(clock)
    granted_at = clock.monotonic()
    hanging = renew_due(election, clock)  # sent; its answer never comes while the deadline runs
    clock.advance(RENEW_DEADLINE - RENEW_INTERVAL - EPS)
    election.check_deadline()  # the watchdog, while the call hangs
    assert ld.valid() and election.leadership is ld
    clock.advance(EPS)
    assert not ld.valid()  # computed: false on time, before anyone demotes it
    election.check_deadline()
    assert events.log[-1] == ("lost", 7, "expired") and ld.reason == "expired"
    assert clock.monotonic() - granted_at == RENEW_DEADLINE < TTL
    # The answer, when it finally comes, revives nothing (and wakes no one): the tenure is over.
    changes = events.changes
    election.renewed(hanging, lease(ld.holder), sent_at=granted_at + RENEW_INTERVAL)
    assert election.leadership is None and election.tenure is None and not ld.valid()
    assert events.changes == changes
    assert isinstance(election.tick(), Contend)


def test_a_refused_renewal_is_a_loss_and_a_failed_one_is_retried_before_the_deadline(
    clock: FakeClock,
) -> None:
    election, events, ld = leading(clock)
    action = renew_due(election, clock)
    election.renewed(action, BackendUnavailableError("injected"), sent_at=clock.monotonic())
    assert ld.valid() and election.stats.renew_failures == 1
    # Retried at half the shorter of renew_interval and retry_interval.
    assert election.tick() == Wait(min(RENEW_INTERVAL, RETRY) / 2)
    clock.advance(min(RENEW_INTERVAL, RETRY) / 2)
    action = renew(election)
    election.renewed(action, None, sent_at=clock.monotonic())
    assert events.log[-1] == ("lost", 7, "lost") and election.leadership is None


def test_a_new_tenure_campaigns_with_a_new_holder_value(clock: FakeClock) -> None:
    election, _, first = leading(clock)
    clock.advance(RENEW_DEADLINE)
    election.check_deadline()
    # The old lease may still be ours on the server: a new value never inherits it.
    assert contend(election).holder != first.holder


# -- following and failing --------------------------------------------------------------------
def test_a_refused_contend_follows_the_holder_and_waits_for_a_release(clock: FakeClock) -> None:
    election, events = machine(clock)
    action = contend(election)
    held = LeaseState("job", "b/1", 3, 5.0)
    answer = Contended.of(held, sent_at=clock.monotonic(), release_mark=11)
    # Wait retry_interval, or less if the lease is released after the mark read before the call.
    assert election.contended(action, answer) == Wait(RETRY, for_release=True, since=11)
    assert events.log == [("leader", "b")] and election.leadership is None
    assert isinstance(election.tick(), Contend)  # woken (by a release or the timeout): again


def test_a_refused_contend_comes_back_when_the_store_says_the_lease_runs_out(
    clock: FakeClock,
) -> None:
    election, _ = machine(clock)
    action = contend(election)
    held = LeaseState("job", "b/1", 3, 0.25)  # the holder stopped renewing 8.75 s ago
    answer = Contended.of(held, sent_at=clock.monotonic(), release_mark=4)
    # At the store's expiry plus the clock margin, not after retry_interval (1 s); a release
    # still wakes it sooner.
    wait = election.contended(action, answer)
    assert wait == Wait(0.25 + EXPIRY_MARGIN, for_release=True, since=4)
    clock.advance(wait.seconds)
    action = contend(election)
    # A holder that renewed meanwhile: its new expiry lies past retry_interval, which is the
    # ceiling, so a renewing holder costs one contend per retry_interval.
    renewed = Contended.of(LeaseState("job", "b/1", 3, TTL), sent_at=clock.monotonic())
    assert election.contended(action, renewed) == Wait(RETRY, for_release=True)
    action = contend(election)
    # Right at the boundary: never sooner than the margin, never a busy loop.
    at_zero = Contended.of(LeaseState("job", "b/1", 3, 0.0), sent_at=clock.monotonic())
    assert election.contended(action, at_zero) == Wait(EXPIRY_MARGIN, for_release=True)


def test_a_lease_that_vanished_between_the_calls_is_contended_again_at_once(
    clock: FakeClock,
) -> None:
    election, _ = machine(clock)
    action = contend(election)
    assert election.contended(action, Contended.of(None, sent_at=clock.monotonic())) == Wait(0.0)


def test_a_failing_store_backs_off_ever_longer_until_it_answers(clock: FakeClock) -> None:
    election, _ = machine(clock)
    waits = []
    for _ in range(5):
        action = contend(election)
        failed = Contended.of(BackendUnavailableError("down"), sent_at=clock.monotonic())
        wait = election.contended(action, failed)
        assert isinstance(wait, Wait) and wait.for_release
        waits.append(wait.seconds)
        clock.advance(wait.seconds)
    assert waits == [1.0, 2.0, 4.0, 8.0, 16.0]
    assert election.health.last_error == "BackendUnavailableError: down"
    assert not election.health.failing and election.stats.contend_failures == 5
    action = contend(election)  # the store answers (a refusal): the backoff starts over
    election.contended(action, Contended.of(LeaseState("job", "b/1", 3, 5.0), sent_at=0.0))
    assert election.health.last_error is None
    action = contend(election)
    failed = Contended.of(PermissionDeniedError("WRONGPASS"), sent_at=clock.monotonic())
    assert election.contended(action, failed) == Wait(1.0, for_release=True)
    assert election.health.failing  # retrying will not fix that one


# -- planned ends -------------------------------------------------------------------------------
def test_a_planned_release_drains_while_valid_then_demotes_then_releases(clock: FakeClock) -> None:
    election, events = machine(clock)
    election.callbacks.add(before_release=lambda ld: None)  # someone drains
    ld = elected(election, clock)
    clock.advance(1.0)
    action: Action = election.finish(release=True)
    assert isinstance(action, Renew)  # a fresh deadline for the drain first
    action = election.renewed(action, lease(ld.holder), sent_at=clock.monotonic())
    assert action == Drain(ld, timeout=RENEW_DEADLINE / 2)  # bounded by release_timeout
    assert ld.valid() and ld.remaining() == RENEW_DEADLINE
    action = election.drained(action, finished=True)
    assert action == Release(ld) and action.lease.token == 7
    assert ld.lost.is_set() and events.log[-1] == ("lost", 7, "stopped")  # before the release
    assert election.released(action, True) == Wait(0.0)
    assert events.log[-2:] == [("lost", 7, "stopped"), ("released", 7, True)]


def test_an_overrunning_drain_is_released_anyway(clock: FakeClock) -> None:
    election, _ = machine(clock)
    election.callbacks.add(before_release=lambda ld: None)
    ld = elected(election, clock)
    action = election.finish(release=True)
    assert isinstance(action, Renew)
    action = election.renewed(action, lease(ld.holder), sent_at=clock.monotonic())
    assert isinstance(action, Drain)
    assert election.drained(action, finished=False) == Release(ld)
    assert not ld.valid()


def test_stopping_without_release_lets_the_lease_expire(clock: FakeClock) -> None:
    election, events, _ = leading(clock)
    assert election.finish(release=False) == Wait(0.0)  # no drain asked for, nothing to send
    assert events.log[-1] == ("lost", 7, "stopped")


def test_rotation_releases_then_sits_out_the_cooldown(clock: FakeClock) -> None:
    election, _, ld = leading(clock, cooldown=2.0)
    assert election.rotate()
    action = election.tick()
    assert action == Release(ld) and ld.reason == "released"  # no drain: demoted, then released
    assert election.released(action, True) == Wait(0.0)
    assert election.cooling() and election.tick() == Wait(2.0)  # no contend during the cooldown
    clock.advance(2.0 - EPS)
    assert isinstance(election.tick(), Wait)
    clock.advance(EPS)
    assert contend(election).holder != ld.holder
    assert not election.rotate()  # a follower has nothing to hand over


def test_max_tenure_rotates_on_its_own(clock: FakeClock) -> None:
    election, events, ld = leading(clock, max_tenure=4.0)
    action = renew_due(election, clock)
    election.renewed(action, lease(ld.holder), sent_at=clock.monotonic())
    assert election.tick() == Wait(1.0)  # the tenure's end comes before the next renewal
    clock.advance(1.0)
    assert election.tick() == Release(ld)
    assert events.log[-1] == ("lost", 7, "released")


def test_resign_hands_its_release_to_the_caller_without_disturbing_the_step(
    clock: FakeClock,
) -> None:
    election, events, ld = leading(clock)
    in_flight = renew_due(election, clock)  # the elector thread is inside a renewal
    release = election.resign(5.0, leadership=ld)
    assert release == Release(ld) and events.log[-1] == ("lost", 7, "failed")
    assert election.released(release, True) == Wait(0.0)  # from the resigning thread
    assert election.renewed(in_flight, None, sent_at=clock.monotonic()) == Wait(0.0)
    assert election.tick() == Wait(5.0)  # the resignation's cooldown, nothing else
    assert election.resign(5.0) is None  # a follower now


def test_a_resign_during_a_drain_leaves_the_handover_to_finish(clock: FakeClock) -> None:
    election, events = machine(clock, cooldown=2.0)
    election.callbacks.add(before_release=lambda ld: None)
    ld = elected(election, clock)
    election.rotate()
    action = election.tick()
    assert isinstance(action, Renew)
    drain = election.renewed(action, lease(ld.holder), sent_at=clock.monotonic())
    assert isinstance(drain, Drain)
    release = election.resign(0.5, leadership=ld)  # the work failed while draining
    assert release is not None and events.log[-1] == ("lost", 7, "failed")
    assert election.released(release, True) == Wait(0.0)  # the resigning thread's own release
    # The elector thread's step goes on: its release (refused now, harmlessly), its cooldown.
    final = election.drained(drain, finished=True)
    assert final == Release(ld)
    assert election.released(final, False) == Wait(0.0)
    assert election.tick() == Wait(2.0)


# -- the gate and a crashed step ----------------------------------------------------------------
class CountingGate:
    def __init__(self, wait: float = 0.0) -> None:
        self.wait = wait
        self.admitted = 0
        self.done_calls = 0

    def gate(self, name: str) -> float:
        if self.wait == 0:
            self.admitted += 1
        return self.wait

    def done(self, name: str) -> None:
        self.done_calls += 1


def test_the_gate_holds_contends_back_and_hears_when_each_returned(clock: FakeClock) -> None:
    gate = CountingGate(wait=3.0)
    election, _ = machine(clock, gate=gate)
    assert election.tick() == Wait(3.0, for_release=True)
    gate.wait = 0.0
    action = contend(election)
    assert (gate.admitted, gate.done_calls) == (1, 0)  # in flight
    election.contended(action, Contended.of(lease(action.holder), sent_at=clock.monotonic()))
    assert gate.done_calls == 1 and election.leadership is not None
    clock.advance(RENEW_DEADLINE)
    election.check_deadline()
    contend(election)
    assert gate.admitted == 2
    election.crashed(RuntimeError("a bug in the driver"))  # the contend never reported
    assert gate.done_calls == 2


def test_a_crashed_step_demotes_a_leader(clock: FakeClock) -> None:
    election, events, _ = leading(clock)
    wait = election.crashed(RuntimeError("bug"))
    assert wait == Wait(RETRY, for_release=True)
    assert events.log[-1] == ("lost", 7, "lost") and election.health.last_error is not None


def test_the_machine_starts_no_thread(clock: FakeClock) -> None:
    threads = threading.active_count()
    election, _, _ = leading(clock)
    election.rotate()
    action = election.tick()
    assert isinstance(action, Release)
    election.released(action, True)
    assert threading.active_count() == threads
