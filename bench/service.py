"""Replica memory and SIGTERM handover, on embedded Redis, SecantusDB and osmem-server.

* RSS of the leader (mirroring ~1,000 events/s into Elasticsearch) and of a follower.
* SIGTERM handover: signal sent to the leader -> another replica holds the lease (polled every
  2 ms through the lease store), over several rounds; goal p99 < 100 ms.

    python -m bench.service
"""

from __future__ import annotations

import json
import signal
import threading
import time
from typing import Any

from bench._support import paced_writer, pct, rss_mb, running_replicas
from singleton.service.dev.embedded import wait_until

LEASE = "bench-orders"
ROUNDS = 10


def main() -> dict[str, Any]:
    with running_replicas("bench-service-", LEASE) as (procs, backend, client, stop, _):
        written = [0]

        def writer() -> None:  # ~1,000 inserts/s in batches of 50
            paced_writer(client["bench"]["orders"], 1000.0, 50, stop, written)

        def leader() -> str | None:
            state = backend.inspect(LEASE)
            return None if state is None else state.identity

        wait_until(lambda: leader() is not None, 30, what="a leader")
        t = threading.Thread(target=writer, daemon=True)
        t.start()
        started = time.monotonic()
        threading.Event().wait(10.0)  # steady state under load before reading RSS
        rate = written[0] / (time.monotonic() - started)
        lead = leader()
        assert lead is not None
        leader_rss = rss_mb(procs[lead].proc.pid)  # type: ignore[union-attr]
        follower_rss = max(
            rss_mb(p.proc.pid) for name, p in procs.items() if name != lead and p.proc
        )
        handovers: list[float] = []
        for _ in range(ROUNDS):
            old = leader()
            assert old is not None
            victim = procs[old]
            sent = time.monotonic()
            victim.signal(signal.SIGTERM)

            def moved(previous: str = old) -> bool:
                return leader() not in (None, previous)

            wait_until(moved, 20, interval=0.002, what="successor")
            handovers.append(time.monotonic() - sent)
            victim.wait(20)
            victim.start()
            threading.Event().wait(1.0)  # let the restarted replica become a follower again
        stop.set()
        t.join(5)
        return {
            "write_rate_per_s": round(rate, 1),
            "leader_rss_mb": round(leader_rss, 1),
            "follower_rss_mb": round(follower_rss, 1),
            "follower_rss_goal_mb": 100,
            "sigterm_handover_ms": {
                "p50": round(pct(handovers, 0.5) * 1000, 1),
                "p99": round(pct(handovers, 0.99) * 1000, 1),
                "max": round(max(handovers) * 1000, 1),
                "rounds": len(handovers),
                "goal_p99": 100,
            },
        }


if __name__ == "__main__":
    print(json.dumps(main(), indent=2))
