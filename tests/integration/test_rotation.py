"""Five electors in separate threads share one lease with max_tenure: leadership rotates, the
windows never overlap, and tokens grow in time order. Runs against every backend."""

from __future__ import annotations

import itertools
import threading
import time
from typing import Any

import pytest

from singleton import Elector, Leadership
from singleton.service.embedded import wait_until


@pytest.mark.parametrize("kind", ["memory", "fakeredis", "redis", "mongo"])
def test_five_electors_rotate_without_overlap(kind: str, backend_factory: Any) -> None:
    lock = threading.Lock()
    windows: dict[tuple[str, int], list[float]] = {}

    def elected(ld: Leadership) -> None:
        with lock:
            windows[(ld.identity, ld.token)] = [time.monotonic(), float("inf")]

    def lost(ld: Leadership, reason: str) -> None:
        with lock:
            windows[(ld.identity, ld.token)][1] = time.monotonic()

    electors = [
        Elector(
            backend_factory(kind),
            "rotating",
            identity=f"e{i}",
            ttl=1.0,
            retry_interval=0.2,
            max_tenure=1.5,
            cooldown=0.3,
            on_elected=elected,
            on_lost=lost,
        )
        for i in range(5)
    ]
    for e in electors:
        e.start()
    try:
        # Run for 10 s of rotations; the wait is the test's duration, not a synchronisation.
        stop = threading.Event()
        stop.wait(10.0)
    finally:
        for e in electors:
            e.stop()
    wait_until(lambda: all(w[1] != float("inf") for w in windows.values()), 5, what="all ended")

    ordered = sorted(windows.items(), key=lambda kv: kv[1][0])
    assert len(ordered) >= 4, ordered
    for (prev_key, (_, prev_end)), (key, (start, _)) in itertools.pairwise(ordered):
        assert start >= prev_end, f"{key} elected at {start} while {prev_key} led until {prev_end}"
        assert key[1] > prev_key[1], f"token went from {prev_key[1]} to {key[1]}"
    identities = {ident for ident, _ in windows}
    assert len(identities) >= 3, identities
