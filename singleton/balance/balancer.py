"""The balancer: the :class:`~singleton.balance.machine.Balancing` rules run on a heartbeat thread.

The rules (who contends, who sheds, hysteresis, affinity) are the machine's; this module does
their I/O: it heartbeats ``identity`` into ``group`` every ``renew_interval`` (at once when one
of its electors' leadership changes), reads the members, and rotates the lease the machine names.
Pass the balancer as each balanced elector's ``gate``.

Failure model: a membership call may fail or hang up to the store's own timeout. A failed
heartbeat or read is logged and skipped (the machine's view goes stale a ttl later and every
gate opens); a crash inside a step is logged and the next heartbeat runs anyway, so a bug never
stops the heartbeat silently. The gate reads the members on the elector's thread, bounded the
same way, and contends as if alone when that read fails.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Protocol

from loguru import logger

from singleton.balance.machine import (
    BalanceOptions,
    BalanceView,
    Balancing,
    Holding,
    Read,
    share_of,
)
from singleton.election.leadership import Leadership
from singleton.errors import SingletonError
from singleton.lease.contract import LeaseBackend
from singleton.lease.membership import Member, Membership
from singleton.lease.timings import LeaseTimings

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from singleton.election.callbacks import Subscribers

__all__ = ["DEFAULT_GROUP", "BalanceOptions", "BalanceView", "Balanced", "Balancer", "share_of"]

#: The membership group every replica of a namespace joins unless told otherwise.
DEFAULT_GROUP = "replicas"


class Balanced(Protocol):
    """What the balancer needs of an elector."""

    @property
    def name(self) -> str: ...

    @property
    def leadership(self) -> Leadership | None: ...

    @property
    def cooling(self) -> bool: ...

    def rotate(self) -> None: ...

    def subscribe(self, **callbacks: Unpack[Subscribers]) -> None: ...


class Balancer:
    """Heartbeats ``identity`` into ``group`` every ``renew_interval`` and balances the electors
    :meth:`add` ed to it. Pass the balancer as each of those electors' ``gate``.

    ``options`` are the rules' (:class:`~singleton.balance.machine.BalanceOptions`)."""

    def __init__(
        self,
        backend: LeaseBackend,
        identity: str,
        timings: LeaseTimings,
        *,
        group: str = DEFAULT_GROUP,
        **options: Unpack[BalanceOptions],
    ) -> None:
        self.membership: Membership = backend.membership()
        self.identity = identity
        self.group = group
        self.timings = timings
        #: The rules; every decision is made there.
        self.machine = Balancing(identity, timings, **options)
        self._electors: dict[str, Balanced] = {}
        self._stop = threading.Event()
        self._poked = threading.Event()  # heartbeat now: our holdings changed, or a stale view
        self._thread: threading.Thread | None = None

    @property
    def settle(self) -> float:
        return self.machine.settle

    @property
    def warmup(self) -> float:
        return self.machine.warmup

    @property
    def sheds(self) -> int:
        """Leases this replica has handed over to balance."""
        return self.machine.sheds

    # -- wiring ---------------------------------------------------------------------------
    def add(self, elector: Balanced) -> None:
        """Balance ``elector``'s lease with the others (before :meth:`start`). Every change of
        its leadership is published at once (a heartbeat), not at the next interval."""
        self._electors[elector.name] = elector
        elector.subscribe(on_elected=lambda _ld: self._poked.set())
        elector.subscribe(on_lost=lambda _ld, _reason: self._poked.set())

    def start(self) -> Balancer:
        """Heartbeat once now (so the first contends already see the members), then every
        ``renew_interval`` in a thread."""
        self.beat()
        self.machine.warm_up()
        self._thread = threading.Thread(
            target=self._run, name=f"singleton-balancer-{self.group}", daemon=True
        )
        self._thread.start()
        return self

    def stop(self, timeout: float | None = None) -> None:
        """Stop heartbeating and leave the group, so the others rebalance at once."""
        self._stop.set()
        self._poked.set()
        if self._thread is not None:
            self._thread.join(timeout)
        try:
            self.membership.leave(self.group, self.identity)
        except SingletonError as exc:
            logger.warning("could not leave group {} (expires instead): {}", self.group, exc)

    # -- the gate (elector threads) --------------------------------------------------------
    def gate(self, name: str) -> float:
        """0 if this replica may contend for ``name`` now, else the seconds to wait first."""
        wait = self.machine.gate(name, self._holdings())
        if not isinstance(wait, Read):
            return wait
        members: list[Member] | None
        try:
            members = self.membership.members(self.group)
        except SingletonError:
            members = None
        return self.machine.gate_read(name, self._holdings(), members)

    def done(self, name: str) -> None:
        """The contend :meth:`gate` admitted has returned (won, lost or failed)."""
        self.machine.done(name)

    # -- the heartbeat (balancer thread) ---------------------------------------------------
    def beat(self) -> None:
        """One heartbeat, one read of the members, and at most one shed."""
        info = self.machine.report(self._holdings())
        try:
            self.membership.heartbeat(self.group, self.identity, self.timings.ttl, info)
            members = self.membership.members(self.group)
        except SingletonError as exc:
            self.machine.unreachable(self.group, exc)
            return
        # holdings read again: a tenure may have ended during the round trip
        shed = self.machine.observed(members, self._holdings())
        if shed is not None:
            self._electors[shed].rotate()

    def view(self) -> BalanceView:
        """What this replica sees now (for ``/status`` and metrics)."""
        return self.machine.view(self._holdings())

    def poked(self) -> bool:
        """Take a pending request for an early heartbeat (for drivers of :meth:`beat`)."""
        poked = self._poked.is_set()
        self._poked.clear()
        return poked

    def _holdings(self) -> dict[str, Holding]:
        return {
            name: Holding(elector.leadership, elector.cooling)
            for name, elector in self._electors.items()
        }

    def _run(self) -> None:
        if self.warmup > 0 and not self._stop.wait(self.warmup):
            self.beat()  # the view the first contends use
        while not self._stop.is_set():
            self._poked.wait(self.timings.renew_interval)
            if self._stop.is_set():
                return
            self._poked.clear()
            try:
                self.beat()
            except Exception:  # a bug must not stop the heartbeat silently
                logger.exception("balancer step crashed: group={}", self.group)
