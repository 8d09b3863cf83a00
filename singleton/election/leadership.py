"""One tenure of one elector: what the work under a lease consults before every side effect."""

from __future__ import annotations

import threading

from singleton.clock import Clock
from singleton.errors import LeaseLostError
from singleton.lease.contract import Lease

#: Why a tenure ended: a planned rotation, a renew deadline that passed without a confirmed
#: renewal, the store saying another holder owns it, ``Elector.stop()``, or the work under the
#: lease failing for good (``Elector.resign()``, whose default reason is ``"failed"``).
LOSS_REASONS = ("released", "expired", "lost", "stopped", "failed")


class Leadership:
    """A tenure: the lease name, who holds it, the fencing ``token``, and whether it still holds.

    :meth:`valid` is computed from the local monotonic clock: it turns false ``renew_deadline``
    seconds after the last renewal was *sent* (not answered), which is before the server can let
    the lease expire. ``lost`` is set when the elector demotes itself; wait on it to stop work.
    """

    def __init__(
        self,
        lease: Lease,
        identity: str,
        valid_until: float,
        clock: Clock,
        *,
        fenced: bool = True,
    ) -> None:
        self.name = lease.name
        self.identity = identity
        self.holder = lease.holder
        self.token = lease.token
        self.lost = threading.Event()
        self.elected_at = clock.monotonic()
        self._lease = lease
        self._valid_until = valid_until
        self._clock = clock
        self._reason: str | None = None
        #: False only in the failover drill's unsafe mode
        #: (``Elector(unsafe_disable_fencing=True)``): the tenure then acts until told it lost,
        #: and sinks write without fencing.
        self.fenced = fenced

    @property
    def lease(self) -> Lease:
        """The latest renewed :class:`Lease` of this tenure."""
        return self._lease

    @property
    def reason(self) -> str | None:
        """Why the tenure ended (one of ``LOSS_REASONS``, or the reason given to
        ``Elector.resign()``), or ``None`` while it lasts."""
        return self._reason

    def valid(self) -> bool:
        """True while this tenure may act: not demoted and inside the renew deadline."""
        if self.lost.is_set():
            return False
        # The drill's unsafe mode: act until told otherwise, like the naive peers.
        return not self.fenced or self._clock.monotonic() < self._valid_until

    def remaining(self) -> float:
        """Seconds this tenure may still act without another confirmed renewal."""
        if self.lost.is_set():
            return 0.0
        return max(0.0, self._valid_until - self._clock.monotonic())

    def check(self) -> None:
        """Raise :class:`LeaseLostError` unless :meth:`valid`. Call before every side effect."""
        if not self.valid():
            why = self._reason or "renew deadline passed"
            raise LeaseLostError(
                f"lease {self.name!r} (token {self.token}) is no longer held by "
                f"{self.identity!r}: {why}"
            )

    def wait_lost(self, timeout: float | None = None) -> bool:
        """Block until the tenure ends (or ``timeout``); returns whether it ended."""
        return self.lost.wait(timeout)

    # -- used by the Election only --------------------------------------------------------
    def _confirm(self, lease: Lease, valid_until: float) -> None:
        self._lease = lease
        self._valid_until = max(self._valid_until, valid_until)

    def _end(self, reason: str) -> bool:
        if self.lost.is_set():
            return False
        self._reason = reason
        self.lost.set()
        return True

    def __repr__(self) -> str:
        state = "valid" if self.valid() else f"ended ({self._reason or 'deadline'})"
        return f"<Leadership {self.name!r} {self.identity!r} token={self.token} {state}>"
