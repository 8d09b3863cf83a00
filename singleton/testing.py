"""Test doubles for singleton and for code built on it: a controllable clock and an in-memory
lease backend that keeps the full :class:`~singleton.lease.contract.LeaseBackend` contract.

    clock = FakeClock()
    backend = MemoryLeaseBackend(clock=clock)
    lease = backend.try_acquire("job", "a/1", ttl=10)
    clock.advance(10)                       # exactly at expiry the lease is free
    assert backend.try_acquire("job", "b/1", ttl=10).token > lease.token
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass

from singleton.balance.membership import MemoryMembership
from singleton.clock import SYSTEM_CLOCK, Clock
from singleton.lease.contract import LeaseBackend
from singleton.lease.facts import validate_facts
from singleton.lease.fires import FireClaim, validate_claim
from singleton.lease.leases import Lease, LeaseState, validate_lease_args
from singleton.lease.notify import NotifiedReleases, ReleaseNotifier


class FakeClock:
    """A clock that only moves when told to. Thread-safe."""

    def __init__(self, start: float = 1_000.0, wall_offset: float = 1_700_000_000.0) -> None:
        self._now = float(start)
        self._wall_offset = wall_offset
        self._lock = threading.Lock()

    def monotonic(self) -> float:
        with self._lock:
            return self._now

    def time(self) -> float:
        with self._lock:
            return self._now + self._wall_offset

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError(f"a monotonic clock cannot go backwards (advance({seconds!r}))")
        with self._lock:
            self._now += seconds


@dataclass
class _Entry:
    holder: str
    token: int
    expires_at: float


class MemoryLeaseBackend(NotifiedReleases, LeaseBackend):
    """The contract in one process, with expiry on the injected clock (exact at the boundary:
    a lease granted at ``t`` with ``ttl`` is live for ``t <= now < t + ttl``).

    Tokens are minted like the servers mint them: ``max(counter + 1, clock.time() in ms)``, so
    after :meth:`reset` (the store losing its data) they still exceed every earlier token.
    """

    def __init__(self, clock: Clock | None = None) -> None:
        #: Plays the server's clock: expiry on ``monotonic()``, token minting on ``time()``.
        self.clock = clock or SYSTEM_CLOCK
        self._lock = threading.Lock()
        self._leases: dict[str, _Entry] = {}
        self._counters: dict[str, int] = {}
        self._facts: dict[str, dict[str, str]] = {}
        self._fires: dict[str, list[FireClaim]] = {}
        self._releases: ReleaseNotifier = ReleaseNotifier()
        self._membership = MemoryMembership(self.clock)
        #: Every operation, for tests that count round trips: (operation, name).
        self.calls: list[tuple[str, str]] = []

    def _live(self, name: str) -> _Entry | None:
        entry = self._leases.get(name)
        if entry is not None and self.clock.monotonic() >= entry.expires_at:
            del self._leases[name]
            return None
        return entry

    def _state(self, name: str) -> LeaseState | None:
        entry = self._live(name)
        if entry is None:
            return None
        remaining = entry.expires_at - self.clock.monotonic()
        return LeaseState(name, entry.holder, entry.token, remaining)

    def try_acquire(self, name: str, holder: str, ttl: float) -> Lease | None:
        validate_lease_args(name, holder, ttl)
        with self._lock:
            self.calls.append(("acquire", name))
            entry = self._live(name)
            now = self.clock.monotonic()
            if entry is None:
                token = max(self._counters.get(name, 0) + 1, int(self.clock.time() * 1000))
                self._counters[name] = token
                self._leases[name] = _Entry(holder, token, now + ttl)
                return Lease(name, holder, token, ttl)
            if entry.holder == holder:
                entry.expires_at = now + ttl
                return Lease(name, holder, entry.token, ttl)
            return None

    def renew(self, lease: Lease, ttl: float | None = None) -> Lease | None:
        ttl = lease.ttl if ttl is None else ttl
        validate_lease_args(lease.name, lease.holder, ttl)
        with self._lock:
            self.calls.append(("renew", lease.name))
            entry = self._live(lease.name)
            if entry is None or entry.holder != lease.holder or entry.token != lease.token:
                return None
            entry.expires_at = self.clock.monotonic() + ttl
            return Lease(lease.name, lease.holder, lease.token, ttl)

    def release(self, lease: Lease) -> bool:
        validate_lease_args(lease.name, lease.holder)
        with self._lock:
            self.calls.append(("release", lease.name))
            entry = self._live(lease.name)
            if entry is None or entry.holder != lease.holder or entry.token != lease.token:
                return False
            del self._leases[lease.name]
        self._releases.notify(lease.name)
        return True

    def inspect(self, name: str) -> LeaseState | None:
        validate_lease_args(name)
        with self._lock:
            self.calls.append(("inspect", name))
            return self._state(name)

    def contend(self, name: str, holder: str, ttl: float) -> Lease | LeaseState | None:
        lease = self.try_acquire(name, holder, ttl)
        if lease is not None:
            return lease
        with self._lock:  # one round trip, as on a server: not counted as an inspect
            return self._state(name)

    def has_waiters(self, name: str) -> bool:
        """Whether a candidate waits for ``name``'s release now (a release before it waits is
        seen only by a wait given a :meth:`release_mark` read before that release)."""
        return self._releases.has_waiters(name)

    def remember(self, name: str, facts: Mapping[str, str | int]) -> None:
        fields = validate_facts(name, facts)
        with self._lock:
            self.calls.append(("remember", name))
            self._facts.setdefault(name, {}).update(fields)

    def recall(self, name: str) -> dict[str, str]:
        validate_lease_args(name)
        with self._lock:
            self.calls.append(("recall", name))
            return dict(self._facts.get(name, {}))

    def claim_fire(
        self, lease: Lease, fire_ms: int, keep: int = 100, ahead_ms: int = 10_000
    ) -> bool:
        validate_claim(lease, fire_ms, keep, ahead_ms)
        with self._lock:
            self.calls.append(("claim_fire", lease.name))
            entry = self._live(lease.name)
            if entry is None or entry.holder != lease.holder or entry.token != lease.token:
                return False
            if fire_ms > self.clock.time() * 1000 + ahead_ms:
                return False
            claims = self._fires.setdefault(lease.name, [])
            if claims and claims[0].fire_ms >= fire_ms:
                return False
            claims.insert(0, FireClaim(fire_ms, lease.token, lease.holder))
            del claims[keep:]
            return True

    def fires(self, name: str) -> list[FireClaim]:
        validate_lease_args(name)
        with self._lock:
            self.calls.append(("fires", name))
            return list(self._fires.get(name, []))

    def expire(self, name: str) -> None:
        """Forget the live lease of ``name`` without notifying, as a crashed holder's expiry."""
        with self._lock:
            self._leases.pop(name, None)

    def reset(self) -> None:
        """Lose every lease, fencing counter and remembered fact without notifying, as a store
        that lost its data (Redis ``FLUSHALL`` or a restart without persistence, a dropped
        collection)."""
        with self._lock:
            self._leases.clear()
            self._counters.clear()
            self._facts.clear()
            self._fires.clear()
        self._membership.reset()

    def membership(self) -> MemoryMembership:
        """One :class:`MemoryMembership` per backend, on the same clock."""
        return self._membership
