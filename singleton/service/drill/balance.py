"""Balance after every fault: every lease held, and the leases per live replica differ by <= 1.

:class:`BalanceSampler` reads, on the drill's own direct connection to the lease store, the
membership group's live replicas (heartbeats on the store's clock,
:mod:`singleton.balance.membership`)
and the holder of every lease (each listener's partitions and the drill's job) every
``interval``, and keeps every change of the resulting :class:`BalanceSample`.

A sample is *balanced* when the store's live members are exactly the replica processes running
(a killed replica not yet restarted, or not yet heartbeating, is not counted: the store has to
agree with the processes), every lease is held by one of them, and the number of leases each
holds differs by at most one (zero included).

After a fault that ended at ``end``, the time to balance is ``t - end`` for the first ``t >= end``
from which every sample stays balanced until ``max(t, end + ttl) + confirm``: a lease a killed
process held stays in the store, naming the (restarted) identity, for up to one ttl after the
kill, so a view that only *looks* balanced because of it is not taken. The verdict requires
``t - end <= bound``, the bound being ``3 x ttl + BALANCE_SLACK`` (the issue's "settles within
3 x ttl", plus the few seconds a restarted ``singleton run`` needs to start on a loaded box).

Failure model: the store may not answer (``redis-pause``, ``redis-restart``): such a sample is
unbalanced, never an error.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from loguru import logger

from singleton.balance.balancer import DEFAULT_GROUP
from singleton.lease.contract import LeaseBackend

#: seconds on top of 3 x ttl that a fault may take to settle (process start-up on a busy box)
BALANCE_SLACK = 5.0


def balance_bound(ttl: float) -> float:
    """Seconds after a fault's end within which the leases must be balanced."""
    return round(3 * ttl + BALANCE_SLACK, 3)


@dataclass(frozen=True)
class BalanceSample:
    """What the lease store said at ``at`` (monotonic): leases held per live identity, the
    leases not held by a live member, and whether it answered at all."""

    at: float
    held: Mapping[str, int]
    unheld: tuple[str, ...] = ()
    #: live members the drill does not run, or running replicas the store does not list
    strangers: tuple[str, ...] = ()
    answered: bool = True

    @property
    def balanced(self) -> bool:
        if not self.answered or self.unheld or self.strangers or not self.held:
            return False
        return max(self.held.values()) - min(self.held.values()) <= 1

    def key(self) -> tuple[Any, ...]:
        return (sorted(self.held.items()), self.unheld, self.strangers, self.answered)

    def as_dict(self) -> dict[str, Any]:
        return {
            "at": self.at,
            "balanced": self.balanced,
            "held": dict(self.held),
            "unheld": list(self.unheld),
            "strangers": list(self.strangers),
            "answered": self.answered,
        }


def sample_of(
    at: float,
    live: Iterable[str],
    holders: Mapping[str, str | None],
    running: Iterable[str],
) -> BalanceSample:
    """A :class:`BalanceSample` from the live members, each lease's holder identity and the
    identities of the replica processes running."""
    live_set, running_set = set(live), set(running)
    held = dict.fromkeys(sorted(live_set & running_set), 0)
    unheld = []
    for name, holder in sorted(holders.items()):
        if holder in held:
            held[holder] += 1
        else:
            unheld.append(name)
    strangers = tuple(sorted(live_set ^ running_set))
    return BalanceSample(at, held, tuple(unheld), strangers)


def time_to_balance(
    samples: Sequence[BalanceSample], end: float, now: float, *, ttl: float, confirm: float
) -> float | None:
    """Seconds from ``end`` to the balance that held (see the module docstring), or ``None``
    if none is confirmed by ``now``. ``samples`` are the changes, oldest first."""
    start = max((i for i, s in enumerate(samples) if s.at <= end), default=0)
    for i in range(start, len(samples)):
        if not samples[i].balanced:
            continue
        t = max(end, samples[i].at)
        j = i + 1
        while j < len(samples) and samples[j].balanced:
            j += 1
        until = samples[j].at if j < len(samples) else now
        if until >= max(t, end + ttl) + confirm:
            return t - end
    return None


@dataclass
class FaultBalance:
    """One fault's balance result."""

    index: int
    kind: str
    seconds: float | None
    bound: float
    held: dict[str, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.seconds is not None and self.seconds <= self.bound

    def as_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "kind": self.kind,
            "seconds": None if self.seconds is None else round(self.seconds, 3),
            "ok": self.ok,
            "held": dict(self.held),
        }


def balance_failures(results: Sequence[FaultBalance]) -> list[str]:
    """One sentence for the faults after which the leases were not balanced in time."""
    bad = [r for r in results if not r.ok]
    if not bad:
        return []
    first = bad[0]
    return [
        f"{len(bad)} faults not followed by balanced leases within {first.bound:.1f}s "
        f"(first: fault {first.index} {first.kind}, leases held per replica {first.held})"
    ]


class BalanceSampler:
    """Polls the membership and every lease in a thread until :meth:`stop`."""

    def __init__(
        self,
        backend: LeaseBackend,
        leases: Sequence[str],
        running: Callable[[], Iterable[str]],
        interval: float = 0.05,
    ) -> None:
        self._backend = backend
        self._membership = backend.membership()
        self.leases = list(leases)
        self._running = running
        self.interval = interval
        self.samples: list[BalanceSample] = []
        #: monotonic time of the last poll (samples keep changes only)
        self.polled = 0.0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, name="drill-balance", daemon=True)

    def start(self) -> BalanceSampler:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def read(self) -> BalanceSample:
        try:
            live = [m.identity for m in self._membership.members(DEFAULT_GROUP)]
            holders: dict[str, str | None] = {}
            for name in self.leases:
                state = self._backend.inspect(name)
                holders[name] = None if state is None else state.identity
        except Exception as exc:  # the store is down or paused: part of the drill
            logger.debug("balance sample failed: {}", exc)
            return BalanceSample(time.monotonic(), {}, answered=False)
        return sample_of(time.monotonic(), live, holders, self._running())

    def _poll(self) -> None:
        while not self._stop.is_set():
            sample = self.read()
            with self._lock:
                if not self.samples or self.samples[-1].key() != sample.key():
                    self.samples.append(sample)
                self.polled = sample.at
            self._stop.wait(self.interval)

    def settled(self, end: float, *, ttl: float, confirm: float) -> float | None:
        with self._lock:
            samples, now = list(self.samples), self.polled
        return time_to_balance(samples, end, now, ttl=ttl, confirm=confirm)

    def held_at(self, at: float) -> dict[str, int]:
        """Leases held per live replica in the last sample at or before ``at``."""
        with self._lock:
            before = [s for s in self.samples if s.at <= at]
        return dict(before[-1].held) if before else {}
