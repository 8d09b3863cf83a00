"""Crash takeover through the service: three ``singleton run`` replicas mirroring ``bench.orders``
into Elasticsearch (embedded Redis, SecantusDB, osmem-server) under a steady insert load, the
leader SIGKILLed each round.

* ``first_indexed``: SIGKILL -> the first document inserted after the kill is in the index
  (``GET`` polled every 2 ms): what a user sees. Goal: ttl + 0.3 s (p99).
* ``elected``: SIGKILL -> another tenure holds the lease (the store polled every 2 ms). The
  lease runs out ttl after the leader's last renewal, at most ttl after the kill; the followers
  contend again at that moment. Goal: ttl + 0.1 s (p99).
* ``elected_to_first_indexed``: the successor's start of work (checkpoint read, stream opened,
  first bulk acknowledged).

The replicas keep the service's default timings but the ttl (``BENCH_TAKEOVER_TTL``, default
4 s): ``retry_interval`` is 2 s, so a follower that waited it out would show up to ttl + 2 s.

    python -m bench takeover                      # BENCH_TAKEOVER_ROUNDS=8 rounds
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from functools import partial
from typing import Any

from bench._support import paced_writer, pct, running_replicas
from listeners.elasticsearch.ids import doc_id
from listeners.elasticsearch.transport import connect
from singleton.service.dev.embedded import wait_until

LEASE = "bench-takeover"
ROUNDS = int(os.environ.get("BENCH_TAKEOVER_ROUNDS", "8"))
TTL = float(os.environ.get("BENCH_TAKEOVER_TTL", "4.0"))
RATE, STEP = 500.0, 10  # inserts per second, in batches of STEP: a batch every 20 ms


def _summary(values: list[float], goal: float) -> dict[str, Any]:
    return {
        "p50_s": round(pct(values, 0.5), 3),
        "p99_s": round(pct(values, 0.99), 3),
        "max_s": round(max(values), 3),
        "samples_s": [round(v, 3) for v in values],
        "goal_p99_s": goal,
        "ok": pct(values, 0.99) <= goal,
    }


def main() -> dict[str, Any]:
    replicas = running_replicas("bench-takeover-", LEASE, lease=f"ttl = {TTL}")
    with replicas as (procs, backend, client, stop, urls):
        es = connect(urls["es"], maxsize=2)
        written = [0]
        writer = threading.Thread(
            target=paced_writer,
            args=(client["bench"]["orders"], RATE, STEP, stop, written),
            daemon=True,
        )

        def holder() -> tuple[str, int] | None:
            state = backend.inspect(LEASE)
            return None if state is None else (state.identity, state.token)

        def indexed(n: int) -> bool:
            status, _ = es.request("GET", f"/{LEASE}/_doc/{doc_id(n)}")
            return status == 200

        wait_until(lambda: holder() is not None, 60, what="a leader")
        writer.start()
        wait_until(lambda: written[0] > 0 and indexed(written[0] - 1), 60, what="streaming")
        firsts: list[float] = []
        elections: list[float] = []
        starts: list[float] = []
        try:
            for _ in range(ROUNDS):
                wait_until(lambda: holder() is not None, 60, what="a leader")
                held = holder()
                assert held is not None
                old, token = held
                mark = written[0] + STEP  # its batch starts after the kill
                killed = time.monotonic()
                procs[old].signal(signal.SIGKILL)

                def moved(token: int = token) -> bool:
                    now = holder()
                    return now is not None and now[1] != token

                wait_until(moved, 60, interval=0.002, what="a successor")
                elections.append(time.monotonic() - killed)
                wait_until(partial(indexed, mark), 60, interval=0.002, what="a new event indexed")
                firsts.append(time.monotonic() - killed)
                starts.append(firsts[-1] - elections[-1])
                procs[old].wait(20)
                procs[old].start()  # a follower again
                stop.wait(TTL)  # the successor renews; the restarted replica settles
        finally:
            stop.set()
            writer.join(5)
            es.close()
        return {
            "ttl_s": TTL,
            "retry_interval_s": 2.0,
            "rounds": len(firsts),
            "write_rate_per_s": RATE,
            "elected": _summary(elections, TTL + 0.1),
            "first_indexed": _summary(firsts, TTL + 0.3),
            "elected_to_first_indexed": _summary(starts, 0.2),
        }


if __name__ == "__main__":
    print(json.dumps(main(), indent=2))
