"""Latency histograms for metrics: observed on the hot path (one lock, a bisect), read at scrape
time as an immutable snapshot. Buckets follow Prometheus' defaults, widened down to 1 ms."""

from __future__ import annotations

import bisect
import threading
from dataclasses import dataclass

#: Upper bounds in seconds (a final +Inf bucket is implied).
BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


@dataclass(frozen=True)
class LatencySnapshot:
    """Counts per bucket (the last one is +Inf), their sum in seconds, and how many."""

    counts: tuple[int, ...] = (0,) * (len(BUCKETS) + 1)
    total: float = 0.0

    @property
    def count(self) -> int:
        return sum(self.counts)

    def cumulative(self) -> list[tuple[str, float]]:
        """Prometheus' ``le`` buckets: ``[("0.001", n), ..., ("+Inf", count)]``."""
        out: list[tuple[str, float]] = []
        running = 0
        for bound, n in zip((*map(str, BUCKETS), "+Inf"), self.counts, strict=True):
            running += n
            out.append((bound, float(running)))
        return out


class Latencies:
    """A thread-safe histogram of durations in seconds."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts = [0] * (len(BUCKETS) + 1)
        self._total = 0.0

    def observe(self, seconds: float) -> None:
        i = bisect.bisect_left(BUCKETS, seconds)
        with self._lock:
            self._counts[i] += 1
            self._total += seconds

    def snapshot(self) -> LatencySnapshot:
        with self._lock:
            return LatencySnapshot(tuple(self._counts), self._total)
