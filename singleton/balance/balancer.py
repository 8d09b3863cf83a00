"""Spreading leases over the live replicas: membership heartbeats, a contend gate, and shedding.

With ``L`` leases (listeners, partitions, jobs: every :class:`~singleton.election.elector.Elector`
added
here) over ``R`` live replicas, a replica contends for a lease only while it holds fewer than its
share, ``ceil(L / R)``, or when no other live replica reports fewer than its share (so a lease
that a stopping or crashed replica gave up is taken at once, even before the members' view
drops it); a replica holding more than its share, or two more than the least loaded
replica, hands one lease over the planned way (:meth:`Elector.rotate`: drain, checkpoint,
release), then waits two heartbeats (for the others to take it and report) before the next.
The replica that sheds on a tie is the most loaded one with the smallest identity, so two
replicas never shed at once.

Hysteresis: shedding starts only after the same member set has wanted it for ``settle`` seconds
(default: the lease ttl), and never of a lease held for less than its ``min_tenure``, so a member
that flickers in and out, or a late heartbeat, moves nothing. Nor of a lease that ``busy(name)``
says is in work a handover would only interrupt (a listener's initial sync or resync, which its
successor would resume and replay again): it moves once that work is done.

Affinity: ``prefer[name]`` lists identities that should hold ``name``. While one of them is live,
other replicas do not contend for it and a holder that is not preferred hands it over; a
preferred replica contends for it whatever its share.

Failure model: membership is advisory. If the store cannot be reached, or the view is older
than a ttl, the gate opens and every replica contends as if alone (plain election): balance is
lost, never availability. A lease that stays unheld for ``ttl + renew_interval`` (the live
members together report fewer than ``L`` held) opens every gate until it is taken, so a wrong
view cannot leave a lease without a leader.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from loguru import logger

from singleton.balance.membership import Member, Membership
from singleton.balance.view import Balanced, BalanceView, share_of
from singleton.clock import SYSTEM_CLOCK, Clock
from singleton.election.gate import Gate
from singleton.election.leadership import Leadership
from singleton.errors import ConfigurationError, SingletonError
from singleton.lease.contract import LeaseBackend
from singleton.lease.timings import LeaseTimings

__all__ = ["DEFAULT_GROUP", "BalanceView", "Balanced", "Balancer", "Gate", "share_of"]

#: The membership group every replica of a namespace joins unless told otherwise.
DEFAULT_GROUP = "replicas"
#: A view older than this is read again before a contend is refused on it.
FRESH = 0.05
#: How long an admitted contend counts against the share if :meth:`Balancer.done` never comes.
CONTEND_WINDOW = 5.0


@dataclass
class _Seen:
    members: list[Member] = field(default_factory=list)
    at: float = -math.inf


class Balancer:
    """Heartbeats ``identity`` into ``group`` every ``renew_interval`` and balances the electors
    :meth:`add` ed to it. Pass the balancer as each of those electors' ``gate``."""

    def __init__(
        self,
        backend: LeaseBackend,
        identity: str,
        timings: LeaseTimings,
        *,
        group: str = DEFAULT_GROUP,
        prefer: Mapping[str, Sequence[str]] | None = None,
        min_tenure: Mapping[str, float] | None = None,
        settle: float | None = None,
        warmup: float | None = None,
        clock: Clock | None = None,
        busy: Callable[[str], bool] | None = None,
    ) -> None:
        self.membership: Membership = backend.membership()
        self.identity = identity
        self.group = group
        self.timings = timings
        self.settle = timings.ttl if settle is None else settle
        if not self.settle >= 0:
            raise ConfigurationError(f"settle must be >= 0 seconds, got {settle!r}")
        #: Seconds after start() without contending, so that replicas started together see
        #: each other before the first of them takes every lease.
        self.warmup = min(timings.renew_interval, 1.0) if warmup is None else warmup
        self._warm_at = -math.inf
        self._prefer = {k: tuple(v) for k, v in (prefer or {}).items()}
        self._min_tenure = dict(min_tenure or {})
        self._busy = busy or (lambda _name: False)
        self._clock = clock or SYSTEM_CLOCK
        self._lock = threading.Lock()
        self._electors: dict[str, Balanced] = {}
        self._seen = _Seen()
        self._pending: dict[str, float] = {}
        self._since: dict[str, tuple[Leadership, float]] = {}
        self._vacant_since: float | None = None
        self._want: tuple[tuple[str, ...], float] | None = None
        self._last_shed = -math.inf
        self._failed = False
        self.sheds = 0
        self._stop = threading.Event()
        self._poked = threading.Event()  # heartbeat now: our holdings changed, or a stale view
        self._thread: threading.Thread | None = None

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
        self._warm_at = self._clock.monotonic() + self.warmup
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
        """0 if this replica may contend for ``name`` now, else the seconds to wait first.

        Before refusing because another member reportedly has room, the members are read once
        more (unless read within :data:`FRESH` seconds): reports change with every election."""
        wait = self._gate(name, refresh=True)
        if wait is not None:
            return wait
        try:
            members = self.membership.members(self.group)
        except SingletonError:
            return 0.0  # membership unknown: contend as if alone (its failure is logged there)
        with self._lock:
            self._seen = _Seen(members, self._clock.monotonic())
        return self._gate(name, refresh=False) or 0.0

    def _gate(self, name: str, *, refresh: bool) -> float | None:
        """:meth:`gate`'s decision; ``None``: read the members again first."""
        now = self._clock.monotonic()
        with self._lock:
            self._pending = {
                n: t
                for n, t in self._pending.items()
                if n != name and now - t < min(CONTEND_WINDOW, self.timings.renew_deadline)
            }
            if now < self._warm_at:
                return self._warm_at - now
            members = self._live(now)
            if members is None:
                return 0.0  # no fresh view: plain election, never stuck
            if refresh and self._seen.at < self._warm_at:
                return None  # the first contends after the warm-up read the members first
            live = {m.identity for m in members}
            vacant = (
                self._vacant_since is not None
                and now - self._vacant_since >= self.timings.ttl + self.timings.renew_interval
            )
            preferred = self._prefer.get(name, ())
            if self.identity in preferred:
                return self._admit(name, now)
            if live & set(preferred) and not vacant:
                return self.timings.renew_interval
            held = set(self._held(now)) | set(self._pending)
            share = share_of(len(self._electors), len(members))
            if len(held) < share or vacant:
                return self._admit(name, now)
            counts = self._room(members, self._counts(members, sorted(held)))
            if all(c >= share for i, c in counts.items() if i != self.identity):
                # nobody else has room either (a member that just stopped or crashed may still
                # be listed): a free lease is anyone's, and balancing evens it out later
                return self._admit(name, now)
            if refresh and now - self._seen.at > FRESH:
                return None
            return self.timings.renew_interval

    def _admit(self, name: str, now: float) -> float:
        self._pending[name] = now  # until done(): two gates cannot overfill a share
        return 0.0

    def done(self, name: str) -> None:
        """The contend :meth:`gate` admitted has returned (won, lost or failed)."""
        with self._lock:
            self._pending.pop(name, None)

    # -- the heartbeat (balancer thread) ---------------------------------------------------
    def beat(self) -> None:
        """One heartbeat, one read of the members, and at most one shed."""
        now = self._clock.monotonic()
        with self._lock:
            held = self._held(now)
        cooling = sum(1 for e in self._electors.values() if e.cooling and e.leadership is None)
        info = {"held": len(held), "leases": len(self._electors), "cooling": cooling}
        try:
            self.membership.heartbeat(self.group, self.identity, self.timings.ttl, info)
            members = self.membership.members(self.group)
        except SingletonError as exc:
            (logger.debug if self._failed else logger.warning)(
                "membership heartbeat failed (balancing paused): group={}: {}", self.group, exc
            )
            self._failed = True
            return
        self._failed = False
        now = self._clock.monotonic()
        with self._lock:
            self._seen = _Seen(members, now)
            held = self._held(now)  # again: a tenure may have ended during the round trip
            counts = self._counts(members, held)
            if sum(counts.values()) < len(self._electors):
                if self._vacant_since is None:
                    self._vacant_since = now
            else:
                self._vacant_since = None
            shed = self._decide(self._room(members, counts), held, now)
        if shed is not None:
            self._electors[shed].rotate()

    def view(self) -> BalanceView:
        """What this replica sees now (for ``/status`` and metrics)."""
        now = self._clock.monotonic()
        with self._lock:
            held = self._held(now)
            members = self._live(now)
            counts = self._counts(members or [], held)
        return BalanceView(
            self.identity,
            counts,
            len(self._electors),
            share_of(len(self._electors), len(counts)),
            tuple(held),
            self.sheds,
            stale=members is None,
        )

    # -- decisions (under the lock) ----------------------------------------------------------
    def _decide(self, counts: Mapping[str, int], held: list[str], now: float) -> str | None:
        """The lease to hand over now, if the same member set has wanted one for ``settle``."""
        want = self._pick(counts, held, now)
        key = tuple(sorted(counts))
        if want is None:
            self._want = None
            return None
        if self._want is None or self._want[0] != key:
            self._want = (key, now)
        # Hysteresis: the same members must have wanted it for ``settle``; then one lease per
        # two heartbeats (time for the others to take it and say so) while it still holds.
        gap = 2 * self.timings.renew_interval
        if now - self._want[1] < self.settle or now - self._last_shed < gap:
            return None
        self._last_shed = now
        self.sheds += 1
        logger.info(
            "balancing: handing over {} (holding {} of {} leases, share {}, members {})",
            want,
            len(held),
            len(self._electors),
            share_of(len(self._electors), len(counts)),
            dict(counts),
        )
        return want

    def _pick(self, counts: Mapping[str, int], held: list[str], now: float) -> str | None:
        movable = [
            n
            for n in held
            if now - self._since[n][1] >= self._min_tenure.get(n, 0.0) and not self._is_busy(n)
        ]
        for name in movable:  # affinity first: a preferred replica is live, and it is not us
            preferred = self._prefer.get(name, ())
            if preferred and self.identity not in preferred and set(preferred) & set(counts):
                return name
        mine = len(held)
        most = max(counts.values(), default=0)
        first_of_most = min((i for i, c in counts.items() if c == most), default=None)
        over = mine > share_of(len(self._electors), len(counts))
        uneven = mine - min(counts.values(), default=mine) >= 2 and first_of_most == self.identity
        if not (over or uneven):
            return None
        ours = [n for n in movable if self.identity not in self._prefer.get(n, ())]
        return min(ours, key=lambda n: self._since[n][1], default=None)

    def _is_busy(self, name: str) -> bool:
        try:
            return bool(self._busy(name))
        except Exception:  # a broken predicate must not stop balancing: movable, as without it
            logger.opt(exception=True).warning("balancing: busy({!r}) failed", name)
            return False

    def _held(self, now: float) -> list[str]:
        out = []
        for name, elector in self._electors.items():
            ld = elector.leadership
            if ld is None:
                self._since.pop(name, None)
                continue
            if self._since.get(name, (None, 0.0))[0] is not ld:
                self._since[name] = (ld, now)
            out.append(name)
        return sorted(out)

    def _live(self, now: float) -> list[Member] | None:
        seen = self._seen
        return seen.members if now - seen.at <= self.timings.ttl else None

    def _counts(self, members: list[Member], held: list[str]) -> dict[str, int]:
        counts = {}
        for m in members:
            try:
                counts[m.identity] = int(m.info.get("held", "0"))
            except ValueError:
                counts[m.identity] = 0
        counts[self.identity] = len(held)  # our own count is known, not reported
        return counts

    def _room(self, members: list[Member], counts: Mapping[str, int]) -> dict[str, int]:
        """``counts`` for deciding who has room: a member sitting out a cooldown on some lease
        (it just handed one over, or its work there failed) counts as full, so that nobody
        leaves a lease to it, or sheds one for it."""
        share = share_of(len(self._electors), len(members))
        cooling = {m.identity for m in members if m.info.get("cooling", "0") not in ("", "0")}
        return {i: max(c, share) if i in cooling else c for i, c in counts.items()}

    def poked(self) -> bool:
        """Take a pending request for an early heartbeat (for drivers of :meth:`beat`)."""
        poked = self._poked.is_set()
        self._poked.clear()
        return poked

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
