"""The membership capability: heartbeats and the live set of a group, on the store's clock.

A backend hands out its :class:`Membership`
(:meth:`~singleton.lease.contract.LeaseBackend.membership`) on the client it already has;
:mod:`singleton.balance.balancer` uses it to spread leases over the live replicas, and
:mod:`singleton.lease.members` holds the Redis and MongoDB implementations.
Membership is advisory: it decides who *tries* to acquire which lease, never who may act on one.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field

from singleton.errors import ConfigurationError
from singleton.lease.facts import validate_facts
from singleton.lease.leases import validate_lease_args


@dataclass(frozen=True)
class Member:
    """One live member: its ``identity``, the seconds its heartbeat has left on the store's
    clock, and the ``info`` it published with it (values as strings)."""

    identity: str
    ttl_remaining: float
    info: Mapping[str, str] = field(default_factory=dict)


class Membership(ABC):
    """Heartbeats and the live set of a group, on the store's clock.

    Invariants every implementation keeps (``tests/integration/balance/test_membership.py`` and
    ``TestMembership`` in ``tests/integration/lease/test_contract.py`` check them against each
    store), beside those every capability keeps (:mod:`singleton.lease.contract`):

    * **Liveness by the store's clock.** A member is live from a :meth:`heartbeat` until ``ttl``
      seconds after its latest one, measured by the store, or until it :meth:`leave` s.
    * **One atomic write.** A heartbeat (record, expiry and ``info`` together) is one atomic
      step; readers never see a member without its ``info``.
    * **One view per store.** Every backend on the same store (every replica) sees the same
      members.
    * **Garbage goes by itself.** Expired members are pruned by the store or by later
      heartbeats; nothing needs a janitor.
    """

    @abstractmethod
    def heartbeat(
        self, group: str, identity: str, ttl: float, info: Mapping[str, str | int]
    ) -> None:
        """Mark ``identity`` live in ``group`` for ``ttl`` seconds from now (store time), with
        ``info`` replacing what it published before."""

    @abstractmethod
    def members(self, group: str) -> list[Member]:
        """The live members of ``group``, sorted by identity."""

    @abstractmethod
    def leave(self, group: str, identity: str) -> None:
        """Drop ``identity`` from ``group`` now (a clean stop), so the others rebalance at once."""


def validate_heartbeat(
    group: str, identity: str, ttl: float, info: Mapping[str, str | int]
) -> dict[str, str]:
    """Check :meth:`Membership.heartbeat`'s arguments before any I/O; ``info`` as strings."""
    validate_lease_args(group, identity, ttl)
    if "\n" in identity:
        raise ConfigurationError(f"member identity must be one line, got {identity!r}")
    return validate_facts(group, info) if info else {}
