"""The backend contract: every capability of one store, on one client and one clock.

Each capability is its own ABC and states its own invariants once: leases
(:class:`~singleton.lease.leases.Leases`), facts (:class:`~singleton.lease.facts.Facts`), fire
claims (:class:`~singleton.lease.fires.FireClaims`) and membership
(:class:`~singleton.lease.membership.Membership`). :class:`LeaseBackend` is all of them together;
the Redis, MongoDB and in-memory (:mod:`singleton.testing`) backends implement it.

Invariants every capability keeps, on every backend (``tests/integration/lease/test_contract.py``
checks them per capability):

* **Atomicity.** Each operation is one atomic step on the server (a Lua script, a
  ``findOneAndUpdate``); there is no read-then-write window.
* **Unknown outcomes are errors.** When the server cannot be reached or does not answer in
  time, operations raise :class:`~singleton.errors.BackendUnavailableError` (never return a
  guess). Driver exceptions never leak: they are translated into :mod:`singleton.errors`
  (``raise ... from`` the driver's error).
* **Bad arguments are refused before any I/O**, with a
  :class:`~singleton.errors.ConfigurationError` naming the bad value.
* **One clock, the store's.** Every expiry and every "not too far ahead" is decided by the
  server's own clock, never by a caller's.

Failure model: see :mod:`singleton.lease.leases`.
"""

from __future__ import annotations

from abc import abstractmethod
from types import TracebackType

from singleton.lease.facts import Facts
from singleton.lease.fires import FireClaim, FireClaims
from singleton.lease.leases import (
    HOLDER_SEPARATOR,
    Lease,
    Leases,
    LeaseState,
    identity_of,
    validate_lease_args,
)
from singleton.lease.membership import Member, Membership, validate_heartbeat


class LeaseBackend(Leases, Facts, FireClaims):
    """One store with every capability: leases, facts and fire claims on it, and
    :meth:`membership` handing out its membership.

    Beyond each capability's invariants:

    * **Facts and fire claims last as long as the fencing counters.** A store that loses its
      data loses them with it; nothing else removes them.
    * **Ownership of clients.** A backend closes only a client it created from a URL; every
      capability shares that one client.
    """

    @abstractmethod
    def membership(self) -> Membership:
        """Heartbeats and live members on this backend's own client and clock, for spreading
        leases over replicas (:mod:`singleton.balance.balancer`)."""

    def describe(self) -> str:
        """A short description for logs, with any credentials redacted."""
        return type(self).__name__

    def close(self) -> None:  # not abstract: most backends own nothing to close
        """Release resources this backend created (never a client passed in by the caller)."""

    def __enter__(self) -> LeaseBackend:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


# Names other modules imported from here before the capabilities had modules of their own.
__all__ = [
    "HOLDER_SEPARATOR",
    "FireClaim",
    "Lease",
    "LeaseBackend",
    "LeaseState",
    "Member",
    "Membership",
    "identity_of",
    "validate_heartbeat",
    "validate_lease_args",
]
