"""Reading and judging the record of the scheduled-job tests.

Their replicas run the drill's job, :func:`singleton.service.drill.jobs.record` (re-exported here
with its ``RECORD_ENV``, so a job table may name ``tests.integration.job_support:record``): each
call appends ``fire_ms|token|identity`` to the file named by ``$RECORD_ENV``, after
``ctx.check()``.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from singleton.service.drill.jobs import RECORD_ENV, record

__all__ = ["RECORD_ENV", "Run", "exactly_once_violations", "read_runs", "record"]


@dataclass(frozen=True)
class Run:
    fire_ms: int
    token: int
    identity: str


def read_runs(path: Path) -> list[Run]:
    if not path.exists():
        return []
    runs = []
    for line in path.read_text().splitlines():
        fire, token, identity = line.split("|")
        runs.append(Run(int(fire), int(token), identity))
    return runs


def exactly_once_violations(
    runs: list[Run], every_ms: int, excused: Callable[[int], bool] = lambda fire_ms: False
) -> list[str]:
    """Every fire time from the first to the last recorded present exactly once (except those
    ``excused``: claimed by a tenure that died before its call, at most once by design); tokens
    never decrease in fire-time order; one identity per token. One sentence per violation."""
    problems: list[str] = []
    if not runs:
        return ["nothing recorded"]
    fires = sorted(r.fire_ms for r in runs)
    seen: dict[int, int] = {}
    for f in fires:
        seen[f] = seen.get(f, 0) + 1
    twice = sorted(f for f, n in seen.items() if n > 1)
    if twice:
        problems.append(f"{len(twice)} fire times ran more than once: {twice[:5]}")
    expected = set(range(fires[0], fires[-1] + 1, every_ms))
    missing = sorted(f for f in expected - set(seen) if not excused(f))
    if missing:
        problems.append(f"{len(missing)} fire times never ran: {missing[:5]}")
    off_grid = sorted(set(seen) - expected)
    if off_grid:
        problems.append(f"{len(off_grid)} fire times off the schedule: {off_grid[:5]}")
    ordered = sorted(runs, key=lambda r: (r.fire_ms, r.token))
    back = [
        (a.fire_ms, a.token, b.fire_ms, b.token)
        for a, b in itertools.pairwise(ordered)
        if b.token < a.token
    ]
    if back:
        problems.append(f"tokens decreased in fire-time order: {back[:3]}")
    identities: dict[int, set[str]] = {}
    for r in runs:
        identities.setdefault(r.token, set()).add(r.identity)
    shared = {t: ids for t, ids in identities.items() if len(ids) > 1}
    if shared:
        problems.append(f"tokens used by more than one identity: {shared}")
    return problems
