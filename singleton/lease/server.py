"""What the server backends (Redis, MongoDB) share beyond the contract in
:mod:`singleton.lease.contract`.

Both answer :meth:`~singleton.lease.leases.Leases.contend` in one atomic round trip, so
``try_acquire`` is that call with the holder's state dropped; and both feed
:meth:`~singleton.lease.leases.Leases.wait_for_release` and its release marks from a
:class:`ReleaseFeed` (a pub/sub subscription, a change stream) that only ever shortens waits.
"""

from __future__ import annotations

from abc import abstractmethod

from singleton.lease.contract import LeaseBackend
from singleton.lease.leases import Lease, LeaseState
from singleton.lease.notify import NotifiedReleases, ReleaseFeed


class ServerLeaseBackend(NotifiedReleases, LeaseBackend):
    """A backend whose ``contend`` is one round trip and whose releases arrive on ``_releases``."""

    _releases: ReleaseFeed

    @abstractmethod
    def contend(self, name: str, holder: str, ttl: float) -> Lease | LeaseState | None: ...

    def try_acquire(self, name: str, holder: str, ttl: float) -> Lease | None:
        result = self.contend(name, holder, ttl)
        return result if isinstance(result, Lease) else None
