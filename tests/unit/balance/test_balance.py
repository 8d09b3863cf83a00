"""The balancer (singleton/balance/) in a deterministic simulation: replicas of electors driven
by ``tick()`` on one fake clock over one in-memory store; crashes are replicas that stop ticking."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pytest

from singleton.balance.balancer import BalanceOptions, Balancer, share_of
from singleton.balance.membership import MemoryMembership
from singleton.election.elector import Elector
from singleton.errors import BackendUnavailableError
from singleton.lease.membership import Member
from singleton.lease.timings import LeaseTimings
from singleton.testing import FakeClock, MemoryLeaseBackend

if TYPE_CHECKING:
    from typing_extensions import Unpack

TTL = 3.0
STEP = 0.1
TIMINGS = LeaseTimings.of(TTL, retry_interval=0.5)


@dataclass
class Replica:
    balancer: Balancer
    electors: list[Elector]
    next_beat: float
    alive: bool = True


@dataclass
class Sim:
    leases: int
    clock: FakeClock = field(default_factory=FakeClock)
    replicas: dict[str, Replica] = field(default_factory=dict)
    changes: int = 0
    prefer: dict[str, list[str]] = field(default_factory=dict)
    #: Leases in work a handover would interrupt (an initial sync), on every replica.
    busy: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.backend = MemoryLeaseBackend(self.clock)
        self.holders = self.owners()

    def add(self, identity: str, **options: Unpack[BalanceOptions]) -> None:
        """Start replica ``identity``; ``options`` replace the simulation's own."""
        defaults: BalanceOptions = {
            "clock": self.clock,
            "prefer": self.prefer,
            "busy": self.busy.__contains__,
        }
        merged: BalanceOptions = {**defaults, **options}
        balancer = Balancer(self.backend, identity, TIMINGS, **merged)
        electors = [
            Elector(
                self.backend,
                f"l{i}",
                identity=identity,
                timings=TIMINGS,
                clock=self.clock,
                gate=balancer,
                jitter=0,
                seed=i,
            )
            for i in range(self.leases)
        ]
        for e in electors:
            balancer.add(e)
        balancer.beat()
        self.replicas[identity] = Replica(balancer, electors, self.clock.monotonic())

    def crash(self, identity: str) -> None:
        self.replicas[identity].alive = False

    def step(self) -> None:
        self.clock.advance(STEP)
        now = self.clock.monotonic()
        for r in self.replicas.values():
            if not r.alive:
                continue
            if now >= r.next_beat or r.balancer.poked():
                r.balancer.beat()
                r.next_beat = now + TIMINGS.renew_interval
            for e in r.electors:
                e.tick()
        owners = self.owners()
        self.changes += sum(1 for n in owners if owners[n] != self.holders.get(n))
        self.holders = owners

    def run(self, seconds: float) -> None:
        for _ in range(round(seconds / STEP)):
            self.step()

    def owners(self) -> dict[str, str | None]:
        out: dict[str, str | None] = {}
        for i in range(self.leases):
            state = self.backend.inspect(f"l{i}")
            out[f"l{i}"] = None if state is None else state.identity
        return out

    def counts(self) -> dict[str, int]:
        alive = [i for i, r in self.replicas.items() if r.alive]
        return {i: sum(1 for h in self.holders.values() if h == i) for i in alive}

    def balanced(self) -> bool:
        c = self.counts()
        every = all(h in c for h in self.holders.values())  # held, and by a live replica
        return every and max(c.values()) - min(c.values()) <= 1

    def settle_within(self, seconds: float) -> float:
        """Run until balanced; return how long it took (fails after ``seconds``)."""
        t0 = self.clock.monotonic()
        while not self.balanced():
            assert self.clock.monotonic() - t0 <= seconds, (
                f"not balanced within {seconds}s: {self.holders}"
            )
            self.step()
        return self.clock.monotonic() - t0


def started(leases: int, *identities: str) -> Sim:
    sim = Sim(leases)
    for identity in identities:
        sim.add(identity)
    return sim


def test_share_is_the_ceiling() -> None:
    assert [share_of(4, r) for r in (1, 2, 3, 4, 5)] == [4, 2, 2, 1, 1]
    assert share_of(3, 0) == 3


def test_four_leases_over_three_replicas_settle_at_one_or_two_each() -> None:
    sim = started(4, "a", "b", "c")
    sim.settle_within(3 * TTL)
    assert sorted(sim.counts().values()) == [1, 1, 2]


def test_steady_state_never_hands_over() -> None:
    sim = started(4, "a", "b", "c")
    sim.settle_within(3 * TTL)
    sim.changes = 0
    sim.run(60)
    assert sim.changes == 0
    assert sum(r.balancer.sheds for r in sim.replicas.values()) <= 2


def test_a_crash_and_a_return_each_settle_within_three_ttls() -> None:
    sim = started(4, "a", "b", "c")
    sim.settle_within(3 * TTL)
    busiest = max(sim.counts(), key=lambda i: (sim.counts()[i], i))
    sim.crash(busiest)
    sim.settle_within(3 * TTL)
    assert sorted(sim.counts().values()) == [2, 2]
    sim.replicas.pop(busiest)
    sim.add(busiest)  # a new process with the same identity
    sim.settle_within(3 * TTL)
    assert sim.counts()[busiest] >= 1


def test_a_joining_replica_gets_work_from_the_busiest() -> None:
    sim = started(4, "a", "b")
    sim.settle_within(3 * TTL)
    assert sorted(sim.counts().values()) == [2, 2]
    sim.add("c")
    sim.settle_within(3 * TTL)
    assert sim.counts()["c"] == 1
    sim.changes = 0
    sim.run(30)
    assert sim.changes == 0


def test_a_busy_lease_is_not_moved_until_its_work_is_done() -> None:
    """A listener in its initial sync: balancing would only make the successor redo part of it,
    so the lease stays until ``busy`` clears, then moves as usual."""
    sim = Sim(2, busy={"l0", "l1"})
    sim.add("a")
    sim.run(2)
    assert sim.counts() == {"a": 2}
    sim.add("b")
    sim.run(4 * TTL)
    assert sim.counts() == {"a": 2, "b": 0}  # "a" holds more than its share, but both are busy
    assert sim.replicas["a"].balancer.sheds == 0
    sim.busy.clear()
    sim.settle_within(3 * TTL)
    assert sim.counts() == {"a": 1, "b": 1}


def test_a_busy_predicate_that_raises_does_not_stop_balancing() -> None:
    asked: list[str] = []

    def broken(name: str) -> bool:
        asked.append(name)
        raise RuntimeError("boom")

    sim = Sim(2)
    sim.add("a", busy=broken)
    sim.run(2)
    sim.add("b")
    sim.settle_within(3 * TTL)
    assert sim.counts() == {"a": 1, "b": 1}
    assert asked  # the shed was decided with the broken predicate, not around it


def test_affinity_puts_a_lease_on_its_preferred_replica() -> None:
    sim = Sim(4, prefer={"l0": ["c"]})
    sim.add("a")
    sim.run(2)
    assert sim.holders["l0"] == "a"  # alone, "a" takes everything, preferred or not
    sim.add("b")
    sim.add("c")
    sim.settle_within(3 * TTL)
    sim.run(3 * TTL)
    assert sim.holders["l0"] == "c"
    assert sim.balanced()
    sim.crash("c")  # the preferred replica gone: someone else takes the lease
    sim.run(3 * TTL)
    assert sim.holders["l0"] in ("a", "b")


def test_without_membership_every_lease_still_gets_a_leader() -> None:
    sim = started(3, "a", "b")

    def down(*_: object) -> list[Member]:
        raise BackendUnavailableError("store down")

    for r in sim.replicas.values():
        r.balancer.membership.heartbeat = down  # type: ignore[method-assign,assignment]
        r.balancer.membership.members = down  # type: ignore[method-assign,assignment]
    sim.run(2 * TTL)
    assert None not in sim.holders.values()


def test_min_tenure_pins_a_lease() -> None:
    sim = Sim(2)
    sim.add("a", min_tenure={"l0": 1e9, "l1": 1e9})
    sim.run(1)
    assert set(sim.holders.values()) == {"a"}
    sim.add("b")
    sim.run(4 * TTL)
    assert set(sim.holders.values()) == {"a"}  # unbalanced, but pinned


def test_view_reports_members_and_share() -> None:
    sim = started(4, "a", "b", "c")
    sim.settle_within(3 * TTL)
    sim.run(TIMINGS.renew_interval * 2)
    view = sim.replicas["a"].balancer.view()
    assert set(view.members) == {"a", "b", "c"}
    assert view.share == 2 and view.leases == 4
    assert sum(view.members.values()) == 4
    assert view.as_dict()["held"] == list(view.held)


def test_membership_expires_on_the_store_clock() -> None:
    clock = FakeClock()
    m = MemoryMembership(clock)
    m.heartbeat("g", "a", 1.0, {"held": 1})
    clock.advance(0.99)
    assert [x.identity for x in m.members("g")] == ["a"]
    clock.advance(0.01)
    assert m.members("g") == []


@pytest.mark.parametrize("bad", [0, -1.0])
def test_bad_settle_is_refused(bad: float) -> None:
    backend = MemoryLeaseBackend()
    if bad < 0:
        with pytest.raises(Exception, match="settle"):
            Balancer(backend, "a", TIMINGS, settle=bad)
    else:
        assert Balancer(backend, "a", TIMINGS, settle=bad).settle == 0


def test_a_lease_given_up_is_taken_at_once_even_before_the_view_drops_its_holder() -> None:
    sim = started(3, "a", "b", "c")
    sim.settle_within(3 * TTL)
    sim.run(2 * TIMINGS.renew_interval)  # steady: every member has published what it holds
    assert sorted(sim.counts().values()) == [1, 1, 1]
    leaving = sim.holders["l0"]
    assert leaving is not None
    r = sim.replicas[leaving]
    r.electors[0].stop()  # a planned stop releases l0; its heartbeat is still listed
    r.alive = False
    sim.step()
    sim.step()
    assert sim.holders["l0"] not in (None, leaving)


def test_a_crashed_replicas_lease_is_taken_when_it_expires() -> None:
    sim = started(3, "a", "b", "c")
    sim.settle_within(3 * TTL)
    victim = sim.holders["l1"]
    assert victim is not None
    sim.crash(victim)
    sim.run(TTL + 2 * STEP)  # the lease has expired; the heartbeat may still be listed
    assert sim.holders["l1"] not in (None, victim)


def test_a_tenure_ending_during_the_heartbeat_round_trip_does_not_crash_the_beat() -> None:
    sim = started(4, "a")
    sim.run(2)
    sim.add("b")  # "a" now holds more than its share: the beat will pick a lease to hand over
    balancer = sim.replicas["a"].balancer
    beat = balancer.membership.heartbeat

    def heartbeat_while_a_lease_is_lost(*args: object, **kwargs: object) -> None:
        beat(*args, **kwargs)  # type: ignore[arg-type]
        assert sim.replicas["a"].electors[0].resign(60.0)  # l0's tenure ends now
        balancer.view()  # another thread reads the view meanwhile

    balancer.membership.heartbeat = heartbeat_while_a_lease_is_lost  # type: ignore[method-assign]
    balancer.beat()  # raised KeyError when it decided on the holdings read before the call
    assert "l0" not in balancer.view().held


def test_a_replica_whose_work_failed_is_not_left_leases_and_nothing_flaps() -> None:
    sim = started(4, "a", "b", "c")
    sim.settle_within(3 * TTL)
    sim.run(2 * TIMINGS.renew_interval)
    failed = min(sim.counts(), key=lambda i: (sim.counts()[i], i))  # holds one lease
    (lease,) = [n for n, h in sim.holders.items() if h == failed]
    elector = sim.replicas[failed].electors[int(lease[1:])]
    assert elector.resign(600.0)  # its work failed for good: it sits out 10 minutes
    sim.run(TTL + TIMINGS.renew_interval)
    assert sim.holders[lease] not in (None, failed)  # the others took it, not waiting for it
    sim.changes = 0
    sim.run(30)
    assert sim.changes == 0  # no shedding towards the replica that cannot take work


def test_a_replica_that_cannot_reach_the_store_still_contends() -> None:
    backend = MemoryLeaseBackend()

    def down(*_: object) -> list[Member]:
        raise BackendUnavailableError("store down")

    balancer = Balancer(backend, "a", TIMINGS, warmup=0)
    balancer.membership.heartbeat = down  # type: ignore[method-assign,assignment]
    balancer.membership.members = down  # type: ignore[method-assign,assignment]
    balancer.add(Elector(backend, "l0", identity="a", timings=TIMINGS, gate=balancer))
    balancer.start()
    try:
        assert balancer.gate("l0") == 0.0  # and so its contend fails visibly, not silently
    finally:
        balancer.stop(1)
