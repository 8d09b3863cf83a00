"""Spreading leases over the live replicas, as decisions: no I/O, thread or sleep.

With ``L`` leases (listeners, partitions, jobs: every :class:`~singleton.election.elector.Elector`
a :class:`~singleton.balance.balancer.Balancer` balances) over ``R`` live replicas, a replica
contends for a lease only while it holds fewer than its share, ``ceil(L / R)``, or when no other
live replica reports fewer than its share (so a lease that a stopping or crashed replica gave up
is taken at once, even before the members' view drops it); a replica holding more than its
share, or two more than the least loaded replica, hands one lease over the planned way
(:meth:`Elector.rotate`: drain, checkpoint, release), then waits two heartbeats (for the others
to take it and report) before the next. The replica that sheds on a tie is the most loaded one
with the smallest identity, so two replicas never shed at once.

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

The protocol, for a driver (:class:`~singleton.balance.balancer.Balancer` is the thread one):
every call passes what this replica holds now (:class:`Holding` per balanced lease, read from
its electors just before). Each heartbeat publishes :meth:`Balancing.report`, reads the members
and passes them to :meth:`~Balancing.observed`, which names the lease to rotate, if any; a read
that failed goes to :meth:`~Balancing.unreachable`. Before contending an elector asks
:meth:`~Balancing.gate`: seconds to wait, or :data:`READ` (read the members and ask
:meth:`~Balancing.gate_read`); then :meth:`~Balancing.done`.
"""

from __future__ import annotations

import enum
import math
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypedDict

from loguru import logger

from singleton.clock import SYSTEM_CLOCK, Clock
from singleton.election.leadership import Leadership
from singleton.errors import ConfigurationError, SingletonError
from singleton.lease.membership import Member
from singleton.lease.timings import LeaseTimings
from singleton.options import reject_unknown

if TYPE_CHECKING:
    from typing_extensions import Unpack  # typing.Unpack from Python 3.11

#: A view older than this is read again before a contend is refused on it.
FRESH = 0.05
#: How long an admitted contend counts against the share if :meth:`Balancing.done` never comes.
CONTEND_WINDOW = 5.0


class Read(enum.Enum):
    """:meth:`Balancing.gate`'s answer when it must see the members first."""

    MEMBERS = "read the members"


#: Read the members, then ask :meth:`Balancing.gate_read`.
READ = Read.MEMBERS


@dataclass(frozen=True)
class Holding:
    """One balanced lease as this replica's elector stands on it now: the tenure it holds (a
    new :class:`Leadership` object is a new tenure) and whether it sits out a cooldown."""

    tenure: Leadership | None = None
    cooling: bool = False


@dataclass(frozen=True)
class BalanceView:
    """One replica's view: the live members and the leases each reports holding, the number of
    leases balanced, this replica's share and what it holds now."""

    identity: str
    members: Mapping[str, int]
    leases: int
    share: int
    held: tuple[str, ...]
    sheds: int = 0
    stale: bool = False

    def as_dict(self) -> dict[str, object]:
        return {
            "identity": self.identity,
            "members": dict(self.members),
            "leases": self.leases,
            "share": self.share,
            "held": list(self.held),
            "sheds": self.sheds,
            "stale": self.stale,
        }


def share_of(leases: int, members: int) -> int:
    """``ceil(leases / members)``: the most leases one replica should hold."""
    return math.ceil(leases / members) if members > 0 else leases


class BalanceOptions(TypedDict, total=False):
    """The keyword options of :class:`Balancing` (and of the
    :class:`~singleton.balance.balancer.Balancer` that drives it); every one is optional.

    ``prefer``: lease name -> identities that should hold it. ``min_tenure``: lease name ->
    seconds a tenure is kept before it may be shed. ``settle``: seconds the same member set must
    want a shed (default: the ttl). ``warmup``: seconds without contending after the start
    (default: ``min(renew_interval, 1)``). ``busy(name)``: true while a handover would only
    interrupt work in progress. ``clock``: the system's by default.
    """

    prefer: Mapping[str, Sequence[str]] | None
    min_tenure: Mapping[str, float] | None
    settle: float | None
    warmup: float | None
    clock: Clock | None
    busy: Callable[[str], bool] | None


@dataclass
class _Seen:
    members: list[Member] = field(default_factory=list)
    at: float = -math.inf


class Balancing:
    """The balancing rules of one replica (see the module docstring).

    Thread-safe: the gate is asked from every elector's thread while the driver heartbeats.
    """

    def __init__(
        self, identity: str, timings: LeaseTimings, **options: Unpack[BalanceOptions]
    ) -> None:
        reject_unknown("Balancer", options, BalanceOptions.__annotations__)
        settle = options.get("settle")
        warmup = options.get("warmup")
        self.identity = identity
        self.timings = timings
        self.settle = timings.ttl if settle is None else settle
        if not self.settle >= 0:
            raise ConfigurationError(f"settle must be >= 0 seconds, got {settle!r}")
        #: Seconds after :meth:`warm_up` without contending, so that replicas started together
        #: see each other before the first of them takes every lease.
        self.warmup = min(timings.renew_interval, 1.0) if warmup is None else warmup
        self._warm_at = -math.inf
        self._prefer = {k: tuple(v) for k, v in (options.get("prefer") or {}).items()}
        self._min_tenure = dict(options.get("min_tenure") or {})
        self._busy = options.get("busy") or (lambda _name: False)
        self._clock = options.get("clock") or SYSTEM_CLOCK
        self._lock = threading.Lock()
        self._seen = _Seen()
        self._pending: dict[str, float] = {}
        self._since: dict[str, tuple[Leadership, float]] = {}
        self._vacant_since: float | None = None
        self._want: tuple[tuple[str, ...], float] | None = None
        self._last_shed = -math.inf
        self._failed = False
        #: Leases handed over so far.
        self.sheds = 0

    def warm_up(self) -> None:
        """The driver has started (after its first heartbeat): hold contends for ``warmup``."""
        with self._lock:
            self._warm_at = self._clock.monotonic() + self.warmup

    # -- the heartbeat ----------------------------------------------------------------------
    def report(self, holdings: Mapping[str, Holding]) -> dict[str, str | int]:
        """The ``info`` to heartbeat: leases held, balanced, and cooling without a tenure."""
        with self._lock:
            held = self._held(holdings, self._clock.monotonic())
        cooling = sum(1 for h in holdings.values() if h.cooling and h.tenure is None)
        return {"held": len(held), "leases": len(holdings), "cooling": cooling}

    def observed(self, members: list[Member], holdings: Mapping[str, Holding]) -> str | None:
        """The members read after a heartbeat (``holdings`` read after that read: a tenure may
        have ended during the round trip); returns the lease to rotate now, if any."""
        self._failed = False
        now = self._clock.monotonic()
        with self._lock:
            self._seen = _Seen(members, now)
            held = self._held(holdings, now)
            counts = self._counts(members, held)
            if sum(counts.values()) < len(holdings):
                if self._vacant_since is None:
                    self._vacant_since = now
            else:
                self._vacant_since = None
            leases = len(holdings)
            return self._decide(self._room(members, counts, leases), held, leases, now)

    def unreachable(self, group: str, exc: SingletonError) -> None:
        """The heartbeat or the read failed: nothing is shed on the old view, which goes stale
        (the gate opens) a ttl after the last good read."""
        (logger.debug if self._failed else logger.warning)(
            "membership heartbeat failed (balancing paused): group={}: {}", group, exc
        )
        self._failed = True

    def view(self, holdings: Mapping[str, Holding]) -> BalanceView:
        """What this replica sees now (for ``/status`` and metrics)."""
        now = self._clock.monotonic()
        with self._lock:
            held = self._held(holdings, now)
            members = self._live(now)
            counts = self._counts(members or [], held)
        leases = len(holdings)
        return BalanceView(
            self.identity,
            counts,
            leases,
            share_of(leases, len(counts)),
            tuple(held),
            self.sheds,
            stale=members is None,
        )

    # -- the gate ---------------------------------------------------------------------------
    def gate(self, name: str, holdings: Mapping[str, Holding]) -> float | Read:
        """0 if this replica may contend for ``name`` now, else the seconds to wait first; or
        :data:`READ`: before refusing because another member reportedly has room, the members
        are read once more (unless read within :data:`FRESH` seconds), since reports change
        with every election."""
        wait = self._gate(name, holdings, refresh=True)
        return READ if wait is None else wait

    def gate_read(
        self, name: str, holdings: Mapping[str, Holding], members: list[Member] | None
    ) -> float:
        """:meth:`gate` after the read it asked for; ``members`` ``None``: the read failed, so
        contend as if alone (the failure is logged where it happened)."""
        if members is None:
            return 0.0
        with self._lock:
            self._seen = _Seen(members, self._clock.monotonic())
        return self._gate(name, holdings, refresh=False) or 0.0

    def done(self, name: str) -> None:
        """The contend :meth:`gate` admitted has returned (won, lost or failed)."""
        with self._lock:
            self._pending.pop(name, None)

    def _gate(self, name: str, holdings: Mapping[str, Holding], *, refresh: bool) -> float | None:
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
            held = set(self._held(holdings, now)) | set(self._pending)
            share = share_of(len(holdings), len(members))
            if len(held) < share or vacant:
                return self._admit(name, now)
            counts = self._room(members, self._counts(members, sorted(held)), len(holdings))
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

    # -- decisions (under the lock) ---------------------------------------------------------
    def _decide(
        self, counts: Mapping[str, int], held: list[str], leases: int, now: float
    ) -> str | None:
        """The lease to hand over now, if the same member set has wanted one for ``settle``."""
        want = self._pick(counts, held, leases, now)
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
            leases,
            share_of(leases, len(counts)),
            dict(counts),
        )
        return want

    def _pick(
        self, counts: Mapping[str, int], held: list[str], leases: int, now: float
    ) -> str | None:
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
        over = mine > share_of(leases, len(counts))
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

    def _held(self, holdings: Mapping[str, Holding], now: float) -> list[str]:
        """The leases held, and when each tenure was first seen (for ``min_tenure``)."""
        out = []
        for name, holding in holdings.items():
            ld = holding.tenure
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

    def _room(
        self, members: list[Member], counts: Mapping[str, int], leases: int
    ) -> dict[str, int]:
        """``counts`` for deciding who has room: a member sitting out a cooldown on some lease
        (it just handed one over, or its work there failed) counts as full, so that nobody
        leaves a lease to it, or sheds one for it."""
        share = share_of(leases, len(members))
        cooling = {m.identity for m in members if m.info.get("cooling", "0") not in ("", "0")}
        return {i: max(c, share) if i in cooling else c for i, c in counts.items()}
