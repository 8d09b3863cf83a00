"""The drill's verdict: every invariant, computed from what was recorded (no process is asked).

Invariants (exit 0 only if all hold):

* **Index equals collection**: no ``missing`` id, no ``stale`` document, no ``resurrected`` id
  (deleted by the writer, still in the index), no other ``extra`` id.
* **The checkpoint never moved backwards**: neither in the samples of the checkpoint store, nor in
  the replicas' audit (an acknowledged save that began after a save of a later position was
  acknowledged).
* **No write from an older fencing token was accepted after a newer one**: an acknowledged batch
  or checkpoint of token T that *began* after a tenure with a token > T had been elected. This is
  sound: a successor is elected only after T's lease expired in the store, and T's own renew
  deadline (checked before every write) passed earlier still.
* **Liveness**: after every fault a leader was streaming again within the drill's bound.
* **Balance**: after every fault, within ``3 x ttl + 5 s`` of its end, every lease is held by a
  live replica and the leases per live replica differ by at most one (:mod:`.balance`).
* **Planned handovers never wait for expiry**: after every ``term`` and ``rotate`` fault the old
  tenure's lease was given back (an audit ``released`` record with ``ok``); one left to expire
  counts in ``planned_expired``.

Fencing tokens and checkpoint positions are comparable only within one lease: with several
listeners or partitions, each invariant is computed per lease (:func:`per_lease`; the audit
records carry their lease's name).

Takeover gaps: for each fault followed by the election of a newer token before the next fault,
from the old tenure's last acknowledged write (or its release, for ``term`` and ``rotate``), or the
fault if that is later, to that election.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from listeners.elasticsearch.documents import doc_id
from singleton.service.drill.balance import FaultBalance, balance_failures
from singleton.service.drill.converge import FaultEqual, equal_failures
from singleton.service.drill.faults import PLANNED, FaultRecord
from singleton.service.drill.history import CheckpointSample

WRITES = ("batch", "checkpoint")


def per_lease(records: Iterable[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Audit records by their lease's name (``""``: records that name none)."""
    out: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        out.setdefault(str(r.get("lease") or ""), []).append(r)
    return out


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile (``q`` in 0..100); ``None`` for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def summary(values: Sequence[float]) -> dict[str, Any]:
    def r(v: float | None) -> float | None:
        return None if v is None else round(v, 4)

    return {
        "p50": r(percentile(values, 50)),
        "p99": r(percentile(values, 99)),
        "max": r(max(values) if values else None),
    }


def fencing_violations(
    records: Sequence[dict[str, Any]], overlap: Sequence[tuple[float, float]] = ()
) -> list[dict[str, Any]]:
    """Acknowledged writes of a token that began after a newer token had been elected.

    ``overlap`` lists the documented windows (monotonic ``(start, end)``) after the lease store
    lost its data: there the old tenure may act until its next renewal is refused (at most its
    renew deadline), and fencing (the checkpoint claim, external versions) makes that harmless.
    Such writes are marked ``"overlap": True`` instead of being violations."""
    marks = sorted(
        (r["mono"], r["token"])
        for r in records
        if r.get("kind") in ("elected", *WRITES) and r.get("token") is not None
    )
    times = [m for m, _ in marks]
    prefix: list[int] = []
    best = -1
    for _, token in marks:
        best = max(best, token)
        prefix.append(best)
    out = []
    for r in records:
        if r.get("kind") not in WRITES:
            continue
        i = bisect.bisect_left(times, r["sent"])
        newer = prefix[i - 1] if i else -1
        if newer > r["token"]:
            out.append(
                {
                    "kind": r["kind"],
                    "identity": r.get("identity"),
                    "token": r["token"],
                    "newer_token": newer,
                    "sent": r["sent"],
                    "acked": r["mono"],
                    "overlap": any(a <= r["sent"] <= b for a, b in overlap),
                }
            )
    return out


def checkpoint_regressions(
    records: Sequence[dict[str, Any]], samples: Sequence[CheckpointSample]
) -> list[dict[str, Any]]:
    """Backward moves of the saved position, seen by the sampler or implied by the audit."""
    out: list[dict[str, Any]] = []
    for (_, tok0, ct0), (t1, tok1, ct1) in itertools.pairwise(samples):
        if list(ct1) < list(ct0) or tok1 < tok0:
            out.append({"seen": "sampler", "at": t1, "from": [tok0, ct0], "to": [tok1, ct1]})
    saves = sorted(
        (r for r in records if r.get("kind") == "checkpoint" and r.get("ct")),
        key=lambda r: r["mono"],
    )
    times = [r["mono"] for r in saves]
    prefix: list[list[int]] = []
    best: list[int] = [-1, -1]
    for r in saves:
        best = max(best, list(r["ct"]))
        prefix.append(best)
    for r in saves:
        i = bisect.bisect_left(times, r["sent"])
        if i and list(r["ct"]) < prefix[i - 1]:
            out.append(
                {
                    "seen": "audit",
                    "at": r["mono"],
                    "from": prefix[i - 1],
                    "to": r["ct"],
                    "token": r["token"],
                    "identity": r.get("identity"),
                }
            )
    return out


def takeover_gaps(
    faults: Sequence[FaultRecord], records: Sequence[dict[str, Any]], end: float
) -> list[dict[str, Any]]:
    """One entry per fault: whether a newer token was elected before the next fault, and the gap."""
    elected = sorted(
        (r["mono"], r["token"], r.get("identity")) for r in records if r.get("kind") == "elected"
    )
    # What the old tenure last did: its acknowledged writes, and for a planned handover its
    # release (a crashed, paused or cut leader's own "lost" comes too late to count).
    acts: dict[int, list[float]] = {}
    released: dict[int, list[float]] = {}
    for r in records:
        if r.get("token") is not None and r.get("kind") in (*WRITES, "lost"):
            into = released if r["kind"] == "lost" else acts
            into.setdefault(r["token"], []).append(r["mono"])
    out = []
    for i, f in enumerate(faults):
        until = faults[i + 1].at if i + 1 < len(faults) else end
        entry: dict[str, Any] = {"index": f.index, "kind": f.kind, "takeover": False, "gap": None}
        planned = f.kind in PLANNED
        if f.token is not None:
            nxt = next(
                (e for e in elected if e[0] >= f.at and e[1] > f.token and e[0] < until), None
            )
            if nxt is not None:
                done = acts.get(f.token, []) + (released.get(f.token, []) if planned else [])
                last = max((m for m in done if m <= nxt[0]), default=f.at)
                start = max(f.at, last)
                entry.update(
                    takeover=True,
                    start=start,
                    end=nxt[0],
                    gap=nxt[0] - start,
                    new_token=nxt[1],
                    new_leader=nxt[2],
                )
        out.append(entry)
    return out


def planned_expired(
    faults: Sequence[FaultRecord], records: Sequence[dict[str, Any]]
) -> list[dict[str, Any]]:
    """The planned handovers (``term``, ``rotate``) whose tenure did not give its lease back."""
    released = {r["token"] for r in records if r.get("kind") == "released" and r.get("ok")}
    return [
        {"index": f.index, "kind": f.kind, "token": f.token, "victim": f.victim}
        for f in faults
        if f.kind in PLANNED and f.token is not None and f.token not in released
    ]


def write_lag(
    writes: Sequence[tuple[float, tuple[int, int] | None]], records: Sequence[dict[str, Any]]
) -> list[float]:
    """Seconds from each write to the first acknowledged batch that covers its cluster time."""
    batches = sorted(
        (tuple(r["ct"]), r["mono"]) for r in records if r.get("kind") == "batch" and r.get("ct")
    )
    cts = [b[0] for b in batches]
    suffix_min: list[float] = [0.0] * len(batches)
    best = math.inf
    for i in range(len(batches) - 1, -1, -1):
        best = min(best, batches[i][1])
        suffix_min[i] = best
    lags = []
    for at, ct in writes:
        if ct is None:
            continue
        i = bisect.bisect_left(cts, tuple(ct))
        if i < len(batches):
            lags.append(max(0.0, suffix_min[i] - at))
    return lags


@dataclass
class Verdict:
    missing: list[str] = field(default_factory=list)
    stale: list[str] = field(default_factory=list)
    resurrected: list[str] = field(default_factory=list)
    extra: list[str] = field(default_factory=list)
    regressions: list[dict[str, Any]] = field(default_factory=list)
    violations: list[dict[str, Any]] = field(default_factory=list)
    #: writes of an old tenure inside the documented overlap after a lease-store wipe
    overlap_writes: int = 0
    stalls: list[str] = field(default_factory=list)
    #: planned handovers whose lease was left to expire instead of released
    expired: list[dict[str, Any]] = field(default_factory=list)
    gaps: list[dict[str, Any]] = field(default_factory=list)
    lags: list[float] = field(default_factory=list)
    #: per fault: how long until the leases were balanced again
    balance: list[FaultBalance] = field(default_factory=list)
    #: per fault: how long until every index equalled its collection again
    equal: list[FaultEqual] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (
            self.missing
            or self.stale
            or self.resurrected
            or self.extra
            or self.regressions
            or self.violations
            or self.stalls
            or self.expired
            or any(not b.ok for b in self.balance)
            or any(not e.ok for e in self.equal)
            or self.errors
        )

    def failures(self) -> list[str]:
        out = []
        for name in ("missing", "stale", "resurrected", "extra"):
            ids = getattr(self, name)
            if ids:
                out.append(f"{len(ids)} {name} documents (first: {', '.join(ids[:5])})")
        if self.regressions:
            out.append(f"checkpoint moved backwards {len(self.regressions)} times")
        if self.violations:
            v = self.violations[0]
            out.append(
                f"{len(self.violations)} writes accepted from an older fencing token after a newer "
                f"one was elected (first: {v['kind']} of token {v['token']} by {v['identity']} "
                f"after token {v['newer_token']})"
            )
        out += [f"no leader recovered: {s}" for s in self.stalls]
        if self.expired:
            e = self.expired[0]
            out.append(
                f"{len(self.expired)} planned handovers left the lease to expire instead of "
                f"releasing it (first: fault {e['index']} {e['kind']} on {e['victim']}, "
                f"token {e['token']})"
            )
        out += balance_failures(self.balance)
        out += equal_failures(self.equal)
        out += self.errors
        return out

    def gaps_by_kind(self, kinds: Sequence[str]) -> dict[str, dict[str, Any]]:
        out = {}
        for kind in kinds:
            entries = [g for g in self.gaps if g["kind"] == kind]
            values = [g["gap"] for g in entries if g["takeover"]]
            out[kind] = {"count": len(entries), "takeovers": len(values), **summary(values)}
        return out

    def equal_summary(self, kinds: Sequence[str]) -> dict[str, Any]:
        """``{faults, unequal, p50, p99, max, by_kind: {kind: {count, unequal, p50, p99, max}},
        by_fault: [...]}``: seconds from each fault's end to every index equal to its
        collection (``null``: not within the bound; see :mod:`.converge`)."""

        def of(entries: Sequence[FaultEqual]) -> dict[str, Any]:
            times = [e.seconds for e in entries if e.seconds is not None]
            return {
                "count": len(entries),
                "unequal": sum(not e.ok for e in entries),
                **summary(times),
            }

        return {
            **of(self.equal),
            "by_kind": {k: of([e for e in self.equal if e.kind == k]) for k in kinds},
            "by_fault": [e.as_dict() for e in self.equal],
        }

    def balance_summary(self, bound: float) -> dict[str, Any]:
        """``{bound, faults, unbalanced, p50, p99, max, by_fault: [...]}``: seconds from each
        fault's end to balanced leases (``null`` for a fault never balanced in time)."""
        times = [b.seconds for b in self.balance if b.seconds is not None]
        return {
            "bound": bound,
            "faults": len(self.balance),
            "unbalanced": sum(not b.ok for b in self.balance),
            **summary(times),
            "by_fault": [b.as_dict() for b in self.balance],
        }


def split_extra(
    missing: list[str], stale: list[str], extra: list[str], deleted: Iterable[Any]
) -> tuple[list[str], list[str], list[str], list[str]]:
    """Separate resurrected ids (deleted by the writer, mapped to index ids the listener's
    way) from other extra ids."""
    dead = {doc_id(i) for i in deleted}
    resurrected = [x for x in extra if x in dead]
    others = [x for x in extra if x not in dead]
    return missing, stale, resurrected, others
