"""Planned handovers under load: SIGTERM and rotation (SIGUSR1) with three ``singleton run``
replicas mirroring ~1,000 events/s into Elasticsearch (embedded Redis, SecantusDB, osmem-server).

* gap: signal sent to the leader -> a new tenure holds the lease (the lease store polled every
  2 ms), p50/p99/max per kind; goal p99 <= 100 ms;
* ``waited_for_expiry``: planned handovers whose leader did not give the lease back (no
  ``released: ... token=T ok=True`` line in its log), so the successor waited for the ttl; goal 0;
* ``checkpoint_not_saved``: handovers whose checkpoint write did not finish within the drain's
  budget (``handover checkpoint not saved`` in the logs: released anyway, the successor replays);
* ``store_write_ms``: the stand-in's own latency meanwhile - a probe updating one document of
  the same SecantusDB every 20 ms - so a slow handover can be told from a slow store.

    python -m bench.handover            # ROUNDS of each kind
    BENCH_HANDOVER_DRAIN=0.08 python -m bench.handover   # with a shorter drain_timeout
    BENCH_HANDOVER_CHECKPOINTS=redis python -m bench.handover   # checkpoints in Redis
"""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from bench._support import paced_writer, pct, running_replicas
from singleton.errors import SingletonError
from singleton.service.dev.cluster import ReplicaProcess
from singleton.service.dev.embedded import wait_until

LEASE = "bench-handover"
ROUNDS = int(os.environ.get("BENCH_HANDOVER_ROUNDS", "15"))
RATE = 1000.0  # inserts per second, in batches of 20
KINDS = {"sigterm": signal.SIGTERM, "rotate": signal.SIGUSR1}
#: ``drain_timeout`` of the replicas (``BENCH_HANDOVER_DRAIN``; default: the service's, 0.25 s).
DRAIN = os.environ.get("BENCH_HANDOVER_DRAIN")
#: ``checkpoint_store`` of the replicas (``BENCH_HANDOVER_CHECKPOINTS``; default ``mongo``, the
#: same SecantusDB as the stream, whose write stalls a handover's checkpoint then waits for).
CHECKPOINTS = os.environ.get("BENCH_HANDOVER_CHECKPOINTS", "mongo")


def _released(log: Path, token: int) -> bool:
    """Whether the replica whose log is ``log`` gave back the lease of tenure ``token``."""
    pattern = re.compile(rf"released: lease={re.escape(LEASE)} \S+ token={token} ok=True")
    return bool(pattern.search(log.read_text(errors="replace")))


def _hand_over(
    kind: str, procs: dict[str, ReplicaProcess], holder: Callable[[], tuple[str, int] | None]
) -> tuple[float, bool]:
    """Signal the leader (``kind``); return the seconds until another tenure holds the lease,
    and whether the old one was released rather than left to expire."""
    wait_until(lambda: holder() is not None, 30, what="a leader")
    held = holder()
    assert held is not None
    old, token = held
    victim = procs[old]
    sent = time.monotonic()
    victim.signal(KINDS[kind])

    def moved() -> bool:  # another tenure (maybe the same replica's)
        now = holder()
        return now is not None and now[1] != token

    wait_until(moved, 30, interval=0.002, what="successor")
    gap = time.monotonic() - sent
    if kind == "sigterm":
        victim.wait(20)
    released = True
    try:  # logged before the process exits, or right after the rotation
        wait_until(partial(_released, victim.log_path, token), 2.0, what="release")
    except SingletonError:
        released = False
    if kind == "sigterm":
        victim.start()
    return gap, released


def main() -> dict[str, Any]:
    drain = "" if DRAIN is None else f"drain_timeout = {float(DRAIN)}\n"
    settings = f'{drain}checkpoint_store = "{CHECKPOINTS}"'
    replicas = running_replicas("bench-handover-", LEASE, settings, lease="cooldown = 1.0")
    with replicas as (procs, backend, client, stop, _):
        written = [0]

        def writer() -> None:
            paced_writer(client["bench"]["orders"], RATE, 20, stop, written)

        probe_ms: list[float] = []

        def probe() -> None:
            coll = client["bench"]["probe"]
            while not stop.wait(0.02):
                t0 = time.perf_counter()
                coll.update_one({"_id": 1}, {"$inc": {"n": 1}}, upsert=True)
                probe_ms.append((time.perf_counter() - t0) * 1000)

        def holder() -> tuple[str, int] | None:
            state = backend.inspect(LEASE)
            return None if state is None else (state.identity, state.token)

        gaps: dict[str, list[float]] = {kind: [] for kind in KINDS}
        expired: dict[str, int] = {kind: 0 for kind in KINDS}
        wait_until(lambda: holder() is not None, 30, what="a leader")
        t = threading.Thread(target=writer, daemon=True)
        t.start()
        prober = threading.Thread(target=probe, daemon=True)
        prober.start()
        started = time.monotonic()
        stop.wait(5.0)  # steady state under load
        for round_ in range(ROUNDS * len(KINDS)):
            kind = list(KINDS)[round_ % len(KINDS)]
            gap, released = _hand_over(kind, procs, holder)
            gaps[kind].append(gap)
            if not released:
                expired[kind] += 1
            stop.wait(1.5)  # the restarted or rotated replica becomes a follower again
        rate = written[0] / (time.monotonic() - started)
        stop.set()
        t.join(5)
        prober.join(5)
        logs = [p.log_path.read_text(errors="replace") for p in procs.values()]
        return {
            "drain_timeout_s": 0.25 if DRAIN is None else float(DRAIN),
            "checkpoint_store": CHECKPOINTS,
            "write_rate_per_s": round(rate, 1),
            "checkpoint_not_saved": sum(g.count("handover checkpoint not saved") for g in logs),
            "store_write_ms": {
                "p50": round(pct(probe_ms, 0.5), 1),
                "p99": round(pct(probe_ms, 0.99), 1),
                "max": round(max(probe_ms), 1),
                "writes": len(probe_ms),
            },
            **{
                f"{kind}_handover_ms": {
                    "p50": round(pct(values, 0.5) * 1000, 1),
                    "p99": round(pct(values, 0.99) * 1000, 1),
                    "max": round(max(values) * 1000, 1),
                    "rounds": len(values),
                    "waited_for_expiry": expired[kind],
                    "goal_p99": 100,
                }
                for kind, values in gaps.items()
            },
            "waited_for_expiry_goal": 0,
        }


if __name__ == "__main__":
    print(json.dumps(main(), indent=2))
