"""Who is alive, in one process: the membership contract (:mod:`singleton.lease.membership`)
kept in memory, for tests and single-process use.

A group (by default every replica of one deployment) is the set of members whose last heartbeat
has not expired, on the *store's* clock: one atomic write per heartbeat, no connection of its
own (a backend hands out a :class:`Membership` on the client it already has, see
:meth:`singleton.lease.contract.LeaseBackend.membership`). :mod:`singleton.balance.balancer` uses
it to spread leases over the live replicas.

Failure model: a member that crashes, pauses or loses the store simply stops heartbeating and
drops out ``ttl`` seconds after its last heartbeat, measured by the store. Membership is advisory:
it decides who *tries* to acquire which lease, never who may act on one (leases and fencing
tokens decide that), so a wrong view costs at most an extra handover, never safety.

The contract itself (:class:`Membership`, :class:`Member`) is one of the lease stores'
capabilities, documented once in :mod:`singleton.lease.membership`.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping

from singleton.clock import SYSTEM_CLOCK, Clock
from singleton.lease.leases import validate_lease_args
from singleton.lease.membership import Member, Membership, validate_heartbeat


class MemoryMembership(Membership):
    """The contract in one process, expiry on the injected clock (the store's clock in tests)."""

    def __init__(self, clock: Clock | None = None) -> None:
        self.clock = clock or SYSTEM_CLOCK
        self._lock = threading.Lock()
        self._groups: dict[str, dict[str, tuple[float, dict[str, str]]]] = {}

    def heartbeat(
        self, group: str, identity: str, ttl: float, info: Mapping[str, str | int]
    ) -> None:
        fields = validate_heartbeat(group, identity, ttl, info)
        with self._lock:
            self._groups.setdefault(group, {})[identity] = (self.clock.monotonic() + ttl, fields)

    def members(self, group: str) -> list[Member]:
        validate_lease_args(group)
        now = self.clock.monotonic()
        with self._lock:
            live = self._groups.get(group, {})
            for identity in [i for i, (until, _) in live.items() if until <= now]:
                del live[identity]
            return [
                Member(identity, until - now, dict(info))
                for identity, (until, info) in sorted(live.items())
            ]

    def leave(self, group: str, identity: str) -> None:
        validate_lease_args(group, identity)
        with self._lock:
            self._groups.get(group, {}).pop(identity, None)

    def reset(self) -> None:
        """Lose every record (the store losing its data)."""
        with self._lock:
            self._groups.clear()


__all__ = ["MemoryMembership"]
