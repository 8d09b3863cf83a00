"""How long each fault leaves an index unequal to its collection.

Once every listener streams again after a fault, the drill holds its writer between two
writes (:class:`~singleton.service.dev.cluster.WriteGate`) and compares every index with its
collection, document by document, until they are equal or the bound has passed. The seconds
from the fault's end to the first equal compare are that fault's *equal* time: what an
operator waits, after the fault, for a search that answers exactly. An index still unequal at
the bound is a stall of the verdict, named with the first ids of each mismatch.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from listeners.elasticsearch.verify import Diff
from singleton.service.dev.cluster import WriteGate

#: seconds between two compares while an index is not yet equal
COMPARE_PAUSE = 0.1


@dataclass(frozen=True)
class FaultEqual:
    """One fault's equal time (``None``: not equal within ``bound``) and the last compare."""

    index: int
    kind: str
    seconds: float | None
    bound: float
    compares: int
    last: str

    @property
    def ok(self) -> bool:
        return self.seconds is not None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def converge(
    diffs: Callable[[], Sequence[Diff]],
    gate: WriteGate,
    since: float,
    bound: float,
    stop: threading.Event,
) -> tuple[float | None, int, str]:
    """Hold the writer and compare until every diff is empty or ``bound`` seconds have passed
    since ``since`` (monotonic): ``(seconds since since or None, compares, last diff)``."""
    deadline = since + bound
    compares = 0
    with gate.paused():
        while True:
            found = diffs()
            compares += 1
            now = time.monotonic()
            if all(d.ok for d in found):
                return now - since, compares, "; ".join(map(str, found))
            if now >= deadline or stop.is_set():
                return None, compares, "; ".join(str(d) for d in found if not d.ok)
            stop.wait(min(COMPARE_PAUSE, max(0.0, deadline - now)))


def equal_failures(entries: Sequence[FaultEqual]) -> list[str]:
    """One sentence per fault after which an index did not become equal to its collection."""
    return [
        f"index not equal to its collection {e.bound:.0f}s after fault {e.index} ({e.kind}): "
        f"{e.last}"
        for e in entries
        if not e.ok
    ]
