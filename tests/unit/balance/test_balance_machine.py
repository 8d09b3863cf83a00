"""The balancing rules (singleton/balance/machine.py) driven by hand: scripted member views, one
replica's holdings and a fake clock; no store, no elector, no thread.

A script plays the driver: it heartbeats what :meth:`Balancing.report` says, hands the machine
the members it "read", and carries out a shed by moving the lease to the least loaded other
member (as those replicas' electors would)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from singleton.balance.machine import READ, Balancing, Holding
from singleton.election.leadership import Leadership
from singleton.errors import BackendUnavailableError
from singleton.lease.contract import Lease
from singleton.lease.membership import Member
from singleton.lease.timings import LeaseTimings
from singleton.testing import FakeClock

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from singleton.balance.machine import BalanceOptions

TTL = 3.0
TIMINGS = LeaseTimings.of(TTL, retry_interval=0.5)  # renew_interval 1 s: one beat a second
ME = "a"


class Script:
    """Replica ``a``'s machine over ``leases`` leases, and what the other members report."""

    def __init__(self, leases: int, others: dict[str, int], **options: Unpack[BalanceOptions]):
        self.clock = FakeClock()
        merged: BalanceOptions = {"clock": self.clock, **options}
        self.machine = Balancing(ME, TIMINGS, **merged)
        self.holdings = {f"l{i}": Holding() for i in range(leases)}
        self.others = dict(others)
        self.cooling: set[str] = set()
        self.sheds: list[tuple[float, str]] = []
        self._tokens = 0

    def hold(self, *names: str) -> None:
        for name in names:
            self._tokens += 1
            lease = Lease(name, f"{ME}/x{self._tokens}", self._tokens, TTL)
            tenure = Leadership(lease, ME, self.clock.monotonic() + TTL, self.clock)
            self.holdings[name] = Holding(tenure)

    def held(self) -> list[str]:
        return sorted(n for n, h in self.holdings.items() if h.tenure is not None)

    def members(self) -> list[Member]:
        mine = {"held": len(self.held())}
        out = [Member(ME, TTL, {k: str(v) for k, v in mine.items()})]
        for identity, held in self.others.items():
            info = {"held": str(held), "cooling": "1" if identity in self.cooling else "0"}
            out.append(Member(identity, TTL, info))
        return sorted(out, key=lambda m: m.identity)

    def beat(self) -> str | None:
        """One heartbeat that reads the members; a shed is carried out at once."""
        info = self.machine.report(self.holdings)
        assert info["held"] == len(self.held())
        shed = self.machine.observed(self.members(), self.holdings)
        if shed is not None:
            self.sheds.append((self.clock.monotonic(), shed))
            self.holdings[shed] = Holding(None, cooling=True)
            taker = min(self.others, key=lambda i: (self.others[i], i))
            self.others[taker] += 1
        return shed

    def run(self, seconds: float) -> None:
        """A beat now, then one every ``renew_interval`` for ``seconds``."""
        end = self.clock.monotonic() + seconds
        self.beat()
        while self.clock.monotonic() + TIMINGS.renew_interval <= end:
            self.clock.advance(TIMINGS.renew_interval)
            self.beat()

    def counts(self) -> dict[str, int]:
        return {ME: len(self.held()), **self.others}


def test_four_leases_reach_two_each_after_settle_one_shed_per_two_beats() -> None:
    s = Script(4, {"b": 0})
    s.hold("l0", "l1", "l2", "l3")
    t0 = s.clock.monotonic()
    s.run(60)
    # the first shed once the same members wanted it for ``settle`` (the ttl), the second two
    # heartbeats later; then the share is reached and nothing moves for the rest of the minute
    assert [t - t0 for t, _ in s.sheds] == [TTL, TTL + 2 * TIMINGS.renew_interval]
    assert s.counts() == {"a": 2, "b": 2}
    assert s.machine.sheds == 2


def test_only_the_surplus_is_shed() -> None:
    s = Script(4, {"b": 1, "c": 0}, settle=0)
    s.hold("l0", "l1", "l2")
    s.run(60)
    assert len(s.sheds) == 1  # 3 -> 2: within one of the least loaded, not over the share
    assert sorted(s.counts().values()) == [1, 1, 2]


def test_the_oldest_tenure_is_the_one_shed() -> None:
    s = Script(2, {"b": 0}, settle=0)
    s.hold("l1")
    s.machine.report(s.holdings)  # l1's tenure is seen first
    s.clock.advance(1)
    s.hold("l0")
    assert s.beat() == "l1"


def test_on_a_tie_only_the_smallest_identity_sheds() -> None:
    first = Script(4, {"b": 2, "c": 0}, settle=0)
    first.hold("l0", "l1")
    assert first.beat() is not None  # "a": two more than "c", and the first of the most loaded
    second = Script(4, {"0": 2, "c": 0}, settle=0)
    second.hold("l0", "l1")
    assert second.beat() is None  # "0" sorts before "a": it sheds, "a" does not


def test_a_replica_in_a_cooldown_counts_as_full() -> None:
    even = Script(4, {"b": 1, "c": 0}, settle=0)
    even.hold("l0", "l1")
    assert even.beat() is not None  # two more than "c": one goes
    s = Script(4, {"b": 1, "c": 0}, settle=0)
    s.cooling.add("c")
    s.hold("l0", "l1")
    s.run(20)
    assert s.sheds == []  # nothing shed for a replica that would not take it


def test_min_tenure_holds_a_lease_to_the_second() -> None:
    s = Script(2, {"b": 0}, min_tenure={"l0": 30.0, "l1": 30.0}, settle=0)
    s.hold("l0", "l1")
    t0 = s.clock.monotonic()
    s.run(29)
    assert s.sheds == []
    s.clock.advance(1)
    assert s.beat() == "l0"
    assert s.clock.monotonic() - t0 == 30


def test_min_tenure_leaves_the_other_lease_movable() -> None:
    s = Script(2, {"b": 0}, min_tenure={"l0": 1e9}, settle=0)
    s.hold("l0", "l1")
    assert s.beat() == "l1"


def test_a_lease_preferred_elsewhere_goes_there_even_when_balanced() -> None:
    s = Script(2, {"b": 1}, prefer={"l0": ["b"]}, settle=0)
    s.hold("l0")
    assert s.beat() == "l0"


def test_the_gate_holds_back_from_a_lease_preferred_elsewhere_while_that_replica_lives() -> None:
    s = Script(2, {"b": 0}, prefer={"l0": ["b"]})
    s.beat()
    assert s.machine.gate("l0", s.holdings) == TIMINGS.renew_interval
    assert s.machine.gate("l1", s.holdings) == 0.0
    alone = Script(2, {}, prefer={"l0": ["b"]})
    alone.beat()
    assert alone.machine.gate("l0", alone.holdings) == 0.0  # "b" not live: anyone's


def test_a_preferred_replica_contends_whatever_its_share() -> None:
    s = Script(2, {"b": 0}, prefer={"l0": [ME]})
    s.hold("l1")  # already at its share of one
    s.beat()
    assert s.machine.gate("l0", s.holdings) == 0.0
    # and it keeps its preferred lease: over its share, it sheds the other one
    s.hold("l0")
    s.run(2 * TTL)
    assert [name for _, name in s.sheds] == ["l1"]


def test_a_stale_view_sheds_nothing_and_opens_the_gate() -> None:
    s = Script(4, {"b": 0})
    s.hold("l0", "l1", "l2")
    s.beat()
    assert s.machine.gate("l3", s.holdings) == TIMINGS.renew_interval  # "b" has room
    down = BackendUnavailableError("store down")
    for _ in range(10):  # reads fail: the driver only reports that, so nothing can be shed
        s.clock.advance(TIMINGS.renew_interval)
        s.machine.unreachable("replicas", down)
    assert s.sheds == [] and s.machine.sheds == 0
    view = s.machine.view(s.holdings)
    assert view.stale and view.held == ("l0", "l1", "l2")
    assert s.machine.gate("l3", s.holdings) == 0.0  # no view: contend as if alone


def test_a_gate_whose_own_read_fails_contends() -> None:
    s = Script(4, {"b": 0})
    s.hold("l0", "l1", "l2")
    s.beat()
    s.clock.advance(1.0)  # the view is older than FRESH, and "b" has room: read again first
    assert s.machine.gate("l3", s.holdings) is READ
    assert s.machine.gate_read("l3", s.holdings, None) == 0.0
    assert s.machine.gate_read("l3", s.holdings, s.members()) == TIMINGS.renew_interval


def test_a_busy_lease_stays_and_the_other_moves() -> None:
    busy = {"l0"}
    s = Script(2, {"b": 0}, settle=0, busy=busy.__contains__)
    s.hold("l0", "l1")  # l0 is the older tenure, the one that would go first
    assert s.beat() == "l1"


def test_busy_leases_move_once_their_work_is_done() -> None:
    busy = {"l0", "l1"}
    s = Script(2, {"b": 0}, settle=0, busy=busy.__contains__)
    s.hold("l0", "l1")
    s.run(20)
    assert s.sheds == []
    busy.clear()
    s.clock.advance(TIMINGS.renew_interval)
    assert s.beat() == "l0"


def test_the_share_counts_contends_admitted_but_not_done() -> None:
    s = Script(4, {"b": 1})
    s.hold("l0")
    s.beat()
    assert s.machine.gate("l1", s.holdings) == 0.0  # one held, share two
    assert s.machine.gate("l2", s.holdings) == TIMINGS.renew_interval  # l1 counts until done
    s.machine.done("l1")
    assert s.machine.gate("l2", s.holdings) == 0.0


def test_a_lease_nobody_holds_opens_every_gate() -> None:
    s = Script(4, {"b": 1})
    s.hold("l0", "l1")  # 3 of 4 held between us: l3 unheld, yet "b" reportedly has room
    s.beat()
    assert s.machine.gate("l3", s.holdings) == TIMINGS.renew_interval
    s.run(TTL + TIMINGS.renew_interval)
    assert s.machine.gate("l3", s.holdings) == 0.0


def test_warm_up_holds_contends_then_reads_the_members_first() -> None:
    s = Script(2, {"b": 0}, warmup=1.0)
    s.beat()
    s.machine.warm_up()
    assert s.machine.gate("l0", s.holdings) == pytest.approx(1.0)
    s.clock.advance(1.0)
    assert s.machine.gate("l0", s.holdings) is READ  # the view predates the warm-up
    assert s.machine.gate_read("l0", s.holdings, s.members()) == 0.0


def test_unknown_options_are_refused_with_a_near_miss() -> None:
    with pytest.raises(TypeError, match="did you mean 'min_tenure'"):
        Balancing(ME, TIMINGS, min_tenur={"l0": 1.0})  # type: ignore[call-arg]
