"""The drill's scheduled job: every replica hosts one, recording each run; the verdict checks it.

The job fires every second and appends ``fire_ms|token|identity`` to the file named by
``$DRILL_JOB_FILE`` (one ``O_APPEND`` write per line: atomic across the replicas). The verdict
then requires, whatever the faults:

* no fire time ran twice;
* tokens never decrease in fire-time order, and each token belongs to one replica;
* the job ran (in every drill);
* every fire time between the first and the last recorded ran, unless a fault could lose the
  claims or move a leader's wall clock (``lease-wipe``, ``redis-restart``,
  ``sentinel-failover``, ``clock-jump``), stops every replica for longer than the job's
  ``misfire_grace`` (``history-loss``: no replica runs while the oplog is flooded), or holds
  the store past the renew deadline right after a claim (``redis-pause``: the leader, no longer
  sure of its lease, does not make the call, and the claim stays): those skip fire times by
  design (never double them), so there it is only counted.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from singleton.jobs.context import JobContext, epoch_ms

JOB = "drill-tick"
EVERY_MS = 1000
RECORD_ENV = "DRILL_JOB_FILE"
#: Faults after which missing fire times are expected (skipped, never doubled).
SKIPPING_KINDS = frozenset(
    {
        "lease-wipe",
        "redis-restart",
        "redis-pause",
        "sentinel-failover",
        "clock-jump",
        "history-loss",
    }
)


def record(ctx: JobContext) -> None:
    """The drill's job: one line per run."""
    ctx.check()
    line = f"{epoch_ms(ctx.fire_time)}|{ctx.token}|{ctx.leadership.identity}\n"
    fd = os.open(os.environ[RECORD_ENV], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def job_toml() -> str:
    return f"""
[[jobs]]
use = "{__name__}:record"
name = "{JOB}"
every = {EVERY_MS / 1000}
misfire_grace = 30.0
"""


@dataclass
class JobCheck:
    runs: int = 0
    twice: list[int] = field(default_factory=list)
    missing: list[int] = field(default_factory=list)
    regressions: list[tuple[int, int, int, int]] = field(default_factory=list)
    shared_tokens: dict[int, list[str]] = field(default_factory=dict)
    #: whether missing fire times fail the verdict (no fault that skips them by design)
    strict: bool = True

    def failures(self) -> list[str]:
        out = []
        if self.runs == 0:
            out.append(f"the scheduled job {JOB} never ran")
        if self.twice:
            out.append(f"{len(self.twice)} job fire times ran twice (first: {self.twice[:3]})")
        if self.regressions:
            out.append(f"job tokens decreased in fire-time order {len(self.regressions)} times")
        if self.shared_tokens:
            out.append(f"job tokens used by more than one replica: {self.shared_tokens}")
        if self.strict and self.missing:
            out.append(f"{len(self.missing)} job fire times never ran (first: {self.missing[:3]})")
        return out

    def as_dict(self) -> dict[str, Any]:
        return {
            "runs": self.runs,
            "twice": len(self.twice),
            "missing": len(self.missing),
            "token_regressions": len(self.regressions),
            "shared_tokens": len(self.shared_tokens),
            "missing_fails": self.strict,
        }


def check_job(path: Path, fault_kinds: Iterable[str]) -> JobCheck:
    """The verdict on the job's record (see the module docstring)."""
    runs: list[tuple[int, int, str]] = []
    if path.exists():
        for line in path.read_text().splitlines():
            fire_text, token_text, who = line.split("|")
            runs.append((int(fire_text), int(token_text), who))
    check = JobCheck(runs=len(runs), strict=not SKIPPING_KINDS & set(fault_kinds))
    if not runs:
        return check
    fires = sorted(run[0] for run in runs)
    check.twice = sorted({a for a, b in itertools.pairwise(fires) if a == b})
    seen = set(fires)
    check.missing = [f for f in range(fires[0], fires[-1] + 1, EVERY_MS) if f not in seen]
    ordered = sorted(runs)
    check.regressions = [
        (a[0], a[1], b[0], b[1]) for a, b in itertools.pairwise(ordered) if b[1] < a[1]
    ]
    owners: dict[int, set[str]] = {}
    for _fire, token, identity in runs:
        owners.setdefault(token, set()).add(identity)
    check.shared_tokens = {t: sorted(ids) for t, ids in owners.items() if len(ids) > 1}
    return check
