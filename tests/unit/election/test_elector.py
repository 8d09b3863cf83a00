"""The Elector as a driver: construction and validation, and its threads on the real clock
(``lead()``, the release notification, the watchdog, ``resign()`` from another thread). The state
machine's rules, step by step on a FakeClock, are in ``test_election.py``.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from singleton import ConfigurationError, Elector, Leadership
from singleton.lease.contract import Lease, LeaseState
from singleton.testing import MemoryLeaseBackend
from tests.unit.election.election_support import assert_leads


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


def test_an_unknown_option_is_a_type_error_naming_the_near_miss() -> None:
    with pytest.raises(TypeError, match=r"'renew_dedline' .*did you mean 'renew_deadline'"):
        Elector(MemoryLeaseBackend(), "job", renew_dedline=5)  # type: ignore[call-arg]


def test_the_options_are_one_validated_settings_value() -> None:
    e = Elector(MemoryLeaseBackend(), "job", identity="web", ttl=9, max_tenure=30, seed=3)
    assert (e.settings.identity, e.settings.seed, e.settings.fenced) == ("web", 3, True)
    assert e.settings.timings == e.timings and e.timings.max_tenure == 30.0
    unsafe = Elector(MemoryLeaseBackend(), "job", unsafe_disable_fencing=True)
    assert unsafe.settings.fenced is False


def test_default_timings() -> None:
    e = Elector(MemoryLeaseBackend(), "job", ttl=15)
    assert (e.renew_interval, e.renew_deadline, e.retry_interval) == (5.0, 10.0, 2.0)


def test_holder_is_unique_per_instance_even_with_the_same_identity() -> None:
    b = MemoryLeaseBackend()
    one, two = Elector(b, "job", identity="web"), Elector(b, "job", identity="web")
    assert one.holder != two.holder
    assert one.holder.startswith("web/") and two.holder.startswith("web/")


# -- threads, real clock ----------------------------------------------------------------------
def test_lead_blocks_until_elected_and_releases_on_exit() -> None:
    b = MemoryLeaseBackend()
    holder = Elector(b, "job", identity="first", ttl=2.0, retry_interval=0.05)
    with holder.lead(timeout=5) as ld:
        assert ld.valid()
        first = ld.token
        waiting = Elector(b, "job", identity="second", ttl=2.0, retry_interval=5.0)
        waiting.start()
        deadline = time.monotonic() + 5  # until it waits: this test is about the notification
        while not b.has_waiters("job") and time.monotonic() < deadline:
            threading.Event().wait(0.005)
        assert b.has_waiters("job")
    # The release notification wakes the waiting candidate long before its 5 s retry.
    got = threading.Event()
    waiting.subscribe(on_elected=lambda _ld: got.set())
    assert got.wait(3) or waiting.is_leader
    assert assert_leads(waiting).token > first
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


def test_resign_from_the_worker_thread_hands_over_at_once_then_cools_down() -> None:
    b = MemoryLeaseBackend()
    lost: list[tuple[str, str]] = []
    a_elected, b_elected = threading.Event(), threading.Event()
    a_elected_at: list[float] = []

    def on_elected_a(ld: Leadership) -> None:
        a_elected_at.append(time.monotonic())
        a_elected.set()

    def on_lost_a(ld: Leadership, reason: str) -> None:
        lost.append((reason, threading.current_thread().name))

    a = Elector(b, "job", identity="a", ttl=30.0, retry_interval=0.05, on_elected=on_elected_a)
    a.subscribe(on_lost=on_lost_a)
    # A 30 s ttl: "b" leads within seconds only if "a" really released the lease.
    other = Elector(b, "job", identity="b", ttl=30.0, retry_interval=1.0)
    other.subscribe(on_elected=lambda ld: b_elected.set())
    try:
        a.start()
        assert a_elected.wait(10)
        a_elected.clear()
        ld = assert_leads(a)
        other.start()
        resigned_at = time.monotonic()
        worker = threading.Thread(
            target=lambda: a.resign(2.0, leadership=ld), name="listener-worker"
        )
        worker.start()
        worker.join(10)
        assert lost == [("failed", "listener-worker")]  # on_lost ran on the resigning thread
        assert b_elected.wait(10), "the other replica waited for the lease to expire"
        assert a.leadership is None and ld.reason == "failed"
        other.stop()  # releases: "a" may lead again, but only after its cooldown
        assert a_elected.wait(10)
        assert a_elected_at[-1] >= resigned_at + 2.0
    finally:
        other.stop()
        a.stop()


class ReleasedAfterAFailedContend(MemoryLeaseBackend):
    """The holder's lease, released right after a candidate's contend was refused: after the
    candidate read its release mark and before it waits for a release."""

    def __init__(self) -> None:
        super().__init__()
        self.held: Lease | None = None
        self.released = threading.Event()

    def contend(self, name: str, holder: str, ttl: float) -> Lease | LeaseState | None:
        result = super().contend(name, holder, ttl)
        if isinstance(result, LeaseState) and self.held is not None and not self.released.is_set():
            assert self.release(self.held)
            self.released.set()
        return result


def test_a_release_between_a_failed_contend_and_the_wait_is_not_missed() -> None:
    b = ReleasedAfterAFailedContend()
    b.held = b.try_acquire("job", "holder/1", 60)
    assert b.held is not None
    elected = threading.Event()
    # A 30 s retry: elected within 10 s only if the wait saw the release it began after.
    e = Elector(b, "job", identity="b", ttl=60.0, retry_interval=30.0, jitter=0.0)
    e.subscribe(on_elected=lambda _ld: elected.set())
    e.start()
    try:
        assert elected.wait(10), "the candidate missed the release and waited its retry"
        assert b.released.is_set()
        assert assert_leads(e).token > b.held.token
    finally:
        e.stop()
