"""Fencing end to end, as a Hypothesis state machine: a lease store (``MemoryLeaseBackend`` on a
fake clock, tokens minted as the servers mint them) and a checkpoint store (the real
``RedisCheckpointStore`` Lua scripts on fakeredis), driven by replicas that acquire, renew, let
leases expire, lose the whole lease store, restart, claim the checkpoint at tenure start, and keep
writing late after they were deposed (a paused process does not know it lost).

Invariants: a write from an older token after a newer one claimed or wrote is refused; the stored
position never moves back; a tenure holding the newest token is never refused for the position
it found (the FLUSHALL bug: the deposed leader advanced the checkpoint after the new leader
loaded it, and the new leader then stopped on "position would move back")."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

import fakeredis
from bson.timestamp import Timestamp
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from listeners import Checkpoint, RedisCheckpointStore
from listeners.checkpoints.stores import Deployment
from singleton.errors import StaleWriterError
from singleton.lease.contract import Lease
from singleton.testing import FakeClock, MemoryLeaseBackend

NAME = "db.coll"
TTL = 1.0
DEPLOYMENT = {"listener": "tests:Model", "namespace": "db.coll", "sink": ""}


@dataclass
class Tenure:
    """One replica's tenure as that replica's worker sees it (it may be long deposed)."""

    replica: int
    token: int
    holder: str
    claimed: bool = False
    #: The position this tenure resumes from or last saved (None: nothing known yet).
    known: Timestamp | None = None


class FencingModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.clock = FakeClock()
        self.leases = MemoryLeaseBackend(self.clock)
        self.store = RedisCheckpointStore(fakeredis.FakeRedis(), namespace=uuid.uuid4().hex)
        self.tenures: list[Tenure] = []  # every tenure still acting, deposed or not
        self.minted: list[int] = []
        # The model of the checkpoint record.
        self.stored_token = -1
        self.stored_position: Timestamp | None = None
        self.positions: list[Timestamp] = []

    @initialize()
    def start(self) -> None:
        self.clock.advance(0.001)

    def _tick(self) -> None:
        self.clock.advance(0.01)  # time passes between any two steps, as on real machines

    def _pick(self, i: int) -> Tenure:
        return self.tenures[i % len(self.tenures)]

    # -- the lease store ------------------------------------------------------------------
    @rule(replica=st.integers(0, 2))
    def acquire(self, replica: int) -> None:
        self._tick()
        holder = f"r{replica}/{len(self.minted)}"
        lease = self.leases.try_acquire(NAME, holder, TTL)
        if lease is None:
            return
        assert not self.minted or lease.token > self.minted[-1], (
            f"token {lease.token} minted after {self.minted[-1]}: fencing cannot tell them apart"
        )
        self.minted.append(lease.token)
        self.tenures.append(Tenure(replica, lease.token, holder))

    @rule()
    def expire(self) -> None:
        self.clock.advance(TTL)

    @rule()
    def wipe_lease_store(self) -> None:
        self._tick()
        self.leases.reset()

    @precondition(lambda self: bool(self.tenures))
    @rule(i=st.integers(0, 20))
    def restart(self, i: int) -> None:
        """A replica's process restarts: its tenure stops acting (it writes nothing late)."""
        gone = self._pick(i)
        self.tenures = [t for t in self.tenures if t.replica != gone.replica]

    # -- the checkpoint store -------------------------------------------------------------
    @precondition(lambda self: bool(self.tenures))
    @rule(i=st.integers(0, 20))
    def claim(self, i: int) -> None:
        """A tenure starts (or an old one starts late): it claims the checkpoint."""
        self._tick()
        t = self._pick(i)
        if t.claimed:
            return
        newest = t.token >= self.stored_token
        try:
            found = self.store.claim(NAME, t.token, t.holder, DEPLOYMENT)
        except StaleWriterError:
            assert not newest, f"claim by the newest token {t.token} refused"
            t.claimed, t.known = True, None
            self.tenures.remove(t)  # a refused claim ends the tenure
            return
        assert newest, f"claim by token {t.token} accepted over stored {self.stored_token}"
        self.stored_token = t.token
        found_at = None if found is None else found.cluster_time
        assert found_at == self.stored_position, "the claim did not return the stored position"
        t.claimed, t.known = True, found_at

    @precondition(lambda self: any(t.claimed for t in self.tenures))
    @rule(i=st.integers(0, 20), step=st.integers(0, 3), inc=st.integers(0, 1))
    def save(self, i: int, step: int, inc: int) -> None:
        """A claimed tenure (current or deposed: a late writer) saves a position ahead of
        what it knows."""
        self._tick()
        t = self._pick(i)
        if not t.claimed:
            return
        base = t.known or Timestamp(100, 0)
        position = Timestamp(base.time + step, inc if step else base.inc + inc)
        cp = Checkpoint(NAME, {"_data": f"{position.time:x}"}, position, t.token, t.holder)
        newest = t.token >= max(self.minted)  # and its claim succeeded: it is in self.tenures
        try:
            self.store.save(cp)
        except StaleWriterError:
            # The FLUSHALL bug: a newest tenure refused for a position at or after what it found.
            assert not newest, f"the newest tenure {t.token} was refused at {position}"
            assert t.token < self.stored_token or (
                self.stored_position is not None and position < self.stored_position
            )
            self.tenures.remove(t)  # a refused writer stops
            return
        assert t.token >= self.stored_token, (
            f"token {t.token} wrote after token {self.stored_token} claimed or wrote"
        )
        assert self.stored_position is None or position >= self.stored_position
        self.stored_token, self.stored_position = t.token, position
        self.positions.append(position)
        t.known = position

    @rule()
    def renew_current(self) -> None:
        self._tick()
        state = self.leases.inspect(NAME)
        for t in self.tenures:
            if state is not None and t.holder == state.holder:
                assert self.leases.renew(Lease(NAME, t.holder, t.token, TTL)) is not None

    # -- invariants -----------------------------------------------------------------------
    @invariant()
    def position_never_moves_back(self) -> None:
        assert self.positions == sorted(self.positions)
        cp = self.store.load(NAME)
        if self.stored_position is None:
            assert cp is None
        else:
            assert cp is not None
            assert (cp.cluster_time, cp.fencing_token) == (self.stored_position, self.stored_token)

    @invariant()
    def stored_token_is_the_newest_that_claimed_or_wrote(self) -> None:
        acted = [t.token for t in self.tenures if t.claimed]
        assert not acted or self.stored_token >= max(acted)


def test_fencing_model() -> None:
    stores = settings.get_profile("stores")
    run_state_machine_as_test(
        FencingModel, settings=settings(stores, max_examples=300, stateful_step_count=25)
    )


def test_the_model_sees_a_store_without_claim() -> None:
    """The model can fail: with a claim that only loads (the old tenure start), the deposed
    leader's late save is accepted and the newest tenure is refused for its position."""

    class LoadOnly(RedisCheckpointStore):
        def claim(
            self, name: str, fencing_token: int, holder: str, deployment: Deployment
        ) -> Checkpoint | None:
            return self.load(name)

    store = LoadOnly(fakeredis.FakeRedis(), namespace=uuid.uuid4().hex)
    store.save(Checkpoint(NAME, None, Timestamp(10, 0), 1, "a"))
    found = store.claim(NAME, 2, "b", DEPLOYMENT)  # B starts at (10, 0)
    store.save(Checkpoint(NAME, None, Timestamp(12, 0), 1, "a"))  # A, deposed, writes late
    assert found is not None
    try:
        store.save(Checkpoint(NAME, None, found.cluster_time, 2, "b"))
    except StaleWriterError as exc:
        assert "would move back" in str(exc)
    else:
        raise AssertionError("expected the load-only start to get stuck")
