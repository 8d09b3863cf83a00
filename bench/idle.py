"""An idle stream: how soon a lone event is indexed, and what a leader costs while nothing happens.

One spawned ``singleton run`` replica mirrors a collection into Elasticsearch (embedded Redis,
SecantusDB and osmem-server), once per ``max_batch_wait`` setting:

* ``idle_cpu_percent``: the replica's CPU time (``/proc/<pid>/stat``) over ``IDLE_S`` seconds in
  which nothing is written, as a percentage of one core;
* ``lone_event_ms``: ``EVENTS`` single inserts, ``GAP_S`` apart: insert -> the index counts the
  document (``_count``, polled every 2 ms), p50 / max.

A partial batch is handed over ``max_batch_wait`` after its first event at the latest, or as soon
as a ``getMore`` comes back empty (after at most 0.1 s); so a lone event waits about
``min(max_batch_wait, 0.1 s)``.

    python -m bench idle
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pymongo

from bench._support import cpu_seconds, embedded_urls, es_count, pct
from bench.stream import _config
from listeners.elasticsearch.transport import connect
from singleton.service.dev.cluster import ReplicaProcess, child_environment, singleton_command
from singleton.service.dev.embedded import wait_until

IDLE_S = float(os.environ.get("BENCH_IDLE_SECONDS", "20"))
EVENTS = 10
GAP_S = 0.37  # not a multiple of the getMore wait, so events land anywhere in it
#: Listener options to compare (TOML lines added to the listener's table).
SETTINGS = ["", "max_batch_wait = 0.02"]


def _one(urls: dict[str, str], root: Path, coll_name: str, options: str) -> dict[str, Any]:
    client: pymongo.MongoClient[dict[str, Any]] = pymongo.MongoClient(urls["mongo"])
    coll = client["bench"][coll_name]
    es = connect(urls["es"], maxsize=2)
    config = _config(root, urls["redis"], urls["mongo"], urls["es"], coll_name)
    if options:
        config.write_text(config.read_text() + options + "\n")
    argv = singleton_command("run", "--config", str(config), "--identity", "bench")
    replica = ReplicaProcess("bench", argv, root / f"{coll_name}.log", child_environment())
    try:
        coll.insert_one({"_id": -1})
        replica.start()
        wait_until(lambda: es_count(es, coll_name) == 1, 60, what="first sync")
        pid = replica.pid
        assert pid is not None
        time.sleep(2.0)  # start-up work (the first checkpoint and renewals) is not idle work
        cpu0, t0 = cpu_seconds(pid), time.monotonic()
        time.sleep(IDLE_S)  # the measured interval
        idle = (cpu_seconds(pid) - cpu0) / (time.monotonic() - t0) * 100
        lags: list[float] = []
        for i in range(EVENTS):
            started = time.perf_counter()
            coll.insert_one({"_id": i})
            wait_until(
                lambda: es_count(es, coll_name) >= i + 2,  # noqa: B023 (called before i moves)
                30,
                interval=0.002,
                what=f"event {i} indexed (see {replica.log_path})",
            )
            lags.append((time.perf_counter() - started) * 1000)
            time.sleep(GAP_S)
    finally:
        replica.stop()
        es.close()
        client.close()
    return {
        "listener_options": options or "(defaults)",
        "idle_cpu_percent": round(idle, 2),
        "lone_event_ms": {"p50": round(pct(lags, 0.5), 1), "max": round(max(lags), 1)},
    }


def main() -> dict[str, Any]:
    with embedded_urls("bench-idle-") as (root, urls):
        return {
            "runs": [_one(urls, root, f"idle{i}", opts) for i, opts in enumerate(SETTINGS)],
            "idle_seconds": IDLE_S,
        }


if __name__ == "__main__":
    import json

    print(json.dumps(main(), indent=2))
