"""The lease capability: named, expiring, fenced leases, and the release notifications that
shorten a follower's wait. Its invariants are written once, in :class:`Leases`.

Failure model: processes crash, pause (GC, SIGSTOP) and lose their network at any moment; the
store itself may be slow, unreachable or restarted. Clocks of different machines disagree, so a
store decides expiry with *one* clock, its own server's, and callers make local decisions on
their own monotonic clock with a safety margin (see :class:`singleton.Elector`).
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from dataclasses import dataclass

from singleton.errors import ConfigurationError

HOLDER_SEPARATOR = "/"


def identity_of(holder: str) -> str:
    """``"web-1/3f9c..."`` -> ``"web-1"``: electors build holders as identity + ``/`` + random."""
    return holder.rsplit(HOLDER_SEPARATOR, 1)[0]


@dataclass(frozen=True)
class Lease:
    """A granted lease. Immutable: a renewal returns a new ``Lease`` with the same token.

    ``holder`` is the random per-candidate value that proves ownership; ``token`` is the fencing
    token, an integer that strictly increases with every new acquisition of ``name``.
    """

    name: str
    holder: str
    token: int
    ttl: float


@dataclass(frozen=True)
class LeaseState:
    """What :meth:`Leases.inspect` sees: the current holder of a live lease."""

    name: str
    holder: str
    token: int
    ttl_remaining: float

    @property
    def identity(self) -> str:
        """The human part of ``holder`` (see :func:`identity_of`)."""
        return identity_of(self.holder)


class Leases(ABC):
    """A store that grants named, expiring, fenced leases.

    Invariants every implementation keeps (``tests/integration/lease/test_contract.py``,
    ``TestLeases`` and ``TestReleases``, checks them against each backend), beside those every
    capability keeps (:mod:`singleton.lease.contract`):

    * **Mutual exclusion.** At most one holder has a live lease for a name at any instant of the
      store's own clock. A lease is live from its grant until ``ttl`` seconds after its last
      grant or renewal, measured by the server, or until released.
    * **Fencing.** Every successful grant of a name (:meth:`try_acquire`, :meth:`contend`)
      returns a ``token`` strictly greater than every token previously granted for that name,
      forever, including when the previous lease expired without being released. Renewal and
      a holder's re-acquisition of its live lease keep the token.
    * **Fencing survives losing the store.** A new grant's token is
      ``max(stored token + 1, the server's clock in milliseconds)``, minted in the same atomic
      step, so when the store loses its data (a restart without persistence, a dropped
      collection, a failover that lost the last writes) the next token still exceeds every
      earlier one, and fenced checkpoints accept the new leader. This holds as long as the
      server's clock does not step back and a name gets fewer than 1,000 grants a second.
    * **Ownership.** :meth:`renew` and :meth:`release` succeed only if the stored holder *and*
      token equal the lease's; a non-holder can never extend, release or overwrite a lease.
    * **Releases are observed, never guessed.** :meth:`wait_for_release` returns ``True`` only
      for a release it (or the :meth:`release_mark` it was given) observed; a missed
      notification costs the waiter its timeout, never a false ``True``. Expiry is not a
      release: nobody is told.
    """

    @abstractmethod
    def try_acquire(self, name: str, holder: str, ttl: float) -> Lease | None:
        """Grant ``name`` to ``holder`` for ``ttl`` seconds if it is free or expired.

        Returns the new :class:`Lease` (with a fresh, larger token), or ``None`` if another holder
        has a live lease. If ``holder`` already holds it, the lease is extended, the token kept.
        """

    def contend(self, name: str, holder: str, ttl: float) -> Lease | LeaseState | None:
        """:meth:`try_acquire`; on failure say who holds it, ideally in one round trip.

        Returns the new :class:`Lease`, the current holder's :class:`LeaseState`, or ``None`` if
        the lease was held but vanished before it could be inspected. The default does two calls;
        backends override it with one.
        """
        lease = self.try_acquire(name, holder, ttl)
        if lease is not None:
            return lease
        return self.inspect(name)

    @abstractmethod
    def renew(self, lease: Lease, ttl: float | None = None) -> Lease | None:
        """Extend ``lease`` to ``ttl`` (default ``lease.ttl``) seconds from now, server time.

        Returns the renewed lease, or ``None`` if the stored holder or token differs (or the lease
        expired): the caller has lost it and must stop acting on it.
        """

    @abstractmethod
    def release(self, lease: Lease) -> bool:
        """Free ``lease`` now and wake :meth:`wait_for_release` waiters.

        Returns ``False`` (and changes nothing) unless the stored holder and token equal the
        lease's. The fencing counter is kept, so the next grant gets a larger token.
        """

    @abstractmethod
    def inspect(self, name: str) -> LeaseState | None:
        """The live lease of ``name`` with its remaining time, or ``None`` if it is free."""

    @abstractmethod
    def release_mark(self, name: str) -> int:
        """A counter of the releases of ``name`` this backend has observed, to pass as
        ``since`` to a later :meth:`wait_for_release`. Cheap and local: no I/O, never raises.

        Read it *before* a :meth:`contend` round trip: a release the server applies after that
        contend is observed after the read. A backend that observes no releases (it only polls)
        returns ``0`` for ever: its waits then behave as without ``since``.
        """

    @abstractmethod
    def wait_for_release(
        self,
        name: str,
        timeout: float,
        wake: threading.Event | None = None,
        *,
        since: int | None = None,
    ) -> bool:
        """Block until ``name`` is released, ``timeout`` passes, or ``wake`` is set.

        Returns ``True`` if a release was observed. Backends with notifications wake within
        milliseconds of a release; others may poll at most every ``timeout``. ``wake`` lets the
        caller interrupt the wait (for example on ``stop()``); it is set, never cleared, by the
        backend. ``since``, a :meth:`release_mark` of ``name``, makes the wait return ``True``
        at once if a release was observed after that mark was read, so a release that came
        before the wait began is not missed; a mark that has not moved waits as without it.
        """


def validate_lease_args(name: str, holder: str | None = None, ttl: float | None = None) -> None:
    """Reject bad arguments before any I/O, naming the bad value."""
    if not isinstance(name, str) or not name:
        raise ConfigurationError(f"lease name must be a non-empty string, got {name!r}")
    if holder is not None and (not isinstance(holder, str) or not holder):
        raise ConfigurationError(f"lease holder must be a non-empty string, got {holder!r}")
    if ttl is not None and (
        isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or not ttl > 0
    ):
        raise ConfigurationError(f"lease ttl must be a positive number of seconds, got {ttl!r}")
