"""The fire-claims capability: a scheduled job's fire times, each claimed once, under a lease.

:mod:`singleton.jobs.scheduler` claims a fire time before it runs the job for it, so a leader
that was deposed while it paused, or a successor that already ran that time, never runs it again.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

from singleton.errors import ConfigurationError
from singleton.lease.leases import Lease, validate_lease_args


@dataclass(frozen=True)
class FireClaim:
    """One fire time of a scheduled job, claimed under a lease by :meth:`FireClaims.claim_fire`:
    ``fire_ms`` (the scheduled time, epoch milliseconds, UTC), and the claimer's ``token`` and
    ``holder``."""

    fire_ms: int
    token: int
    holder: str


class FireClaims(ABC):
    """Fire times claimed under the leases of the same store.

    Invariants every implementation keeps (``tests/integration/lease/test_contract.py``,
    ``TestFireClaims``, checks them against each backend), beside those every capability keeps
    (:mod:`singleton.lease.contract`):

    * **Fenced.** A claim is one atomic step conditional on the stored lease's holder *and*
      token, so a deposed, released or expired holder claims nothing.
    * **Once, and only later.** A fire time is claimed only if it is later than every one
      claimed before for that name, by anyone: no fire time is claimed twice, and among racing
      claimers of one time exactly one wins.
    * **Bounded by the store's clock.** A fire time further ahead of the store's clock than
      the claimer allows is refused, so a claimer whose wall clock runs far ahead cannot claim
      the future away from its successors.
    * **Kept like facts.** Grants, renewals, releases and expiry leave claims alone; only the
      latest ``keep`` are kept (trimmed claims still bound the next one); claims are lost only
      with the store's data, with the fencing counter.
    """

    @abstractmethod
    def claim_fire(
        self, lease: Lease, fire_ms: int, keep: int = 100, ahead_ms: int = 10_000
    ) -> bool:
        """Claim the fire time ``fire_ms`` (epoch ms) of the job run under ``lease``.

        Succeeds (returns ``True``) only if ``lease`` is live with the stored holder *and*
        token, ``fire_ms`` is greater than the latest fire time claimed for ``lease.name``, and
        ``fire_ms`` is at most ``ahead_ms`` later than the store's own clock; it then records
        :class:`FireClaim` ``(fire_ms, token, holder)`` as the latest and keeps only the latest
        ``keep`` claims. Otherwise changes nothing and returns ``False``.
        """

    @abstractmethod
    def fires(self, name: str) -> list[FireClaim]:
        """The claims :meth:`claim_fire` kept for ``name``, latest first (empty if none, or if
        the store lost its data since)."""


def validate_claim(lease: Lease, fire_ms: int, keep: int, ahead_ms: int) -> None:
    """Check :meth:`FireClaims.claim_fire`'s arguments before any I/O."""
    validate_lease_args(lease.name, lease.holder)
    for label, value, least in (
        ("fire_ms", fire_ms, 0),
        ("keep", keep, 1),
        ("ahead_ms", ahead_ms, 0),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise ConfigurationError(f"{label} must be an int >= {least}, got {value!r}")
