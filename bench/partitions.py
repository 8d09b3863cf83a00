"""Partitions: events/s of one ``ElasticsearchSync`` split in K = 1, 2, 4 partitions, on one and
on three ``singleton run`` replicas, on embedded Redis, SecantusDB and osmem-server.

For each (K, replicas): the replicas start (``balance = true``), every partition's lease is held
and spread (max - min <= 1 over the replicas), one warm-up document per partition is indexed
(every stream is open); then ``N`` documents are inserted as fast as the driver can and the index
is polled until it holds them all. Measured:

* ``events_per_s``: ``N`` / (first insert to the last document indexed);
* ``insert_per_s``: the inserts alone (the ceiling of this method on this machine);
* ``cpu_us_per_event``: the replicas' CPU time (``/proc/<pid>/stat``, user + system, summed
  over the replicas) over the same phase, divided by ``N``; ``server_cpu_us_per_event`` the
  same for the embedded Redis, SecantusDB and osmem-server.

Each layout runs ``BENCH_PARTITIONS_ROUNDS`` times (default 1; more are interleaved); the
medians are reported beside every pass's figure.

Every partition reads the whole stream and keeps its own share (client-side filter), so the
server's change-stream work grows with K while the sink work is split K ways. On one machine the
server, the sink and the replicas share two cores: read the figures as costs, not as what K
partitions give on a real cluster. ``BENCH_PARTITIONS_N`` sets ``N`` (default 10,000).

    python -m bench partitions
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pymongo

from bench._support import cpu_seconds, es_count, start_servers
from listeners.elasticsearch.transport import connect
from listeners.stream.partition import layout_names, partition_of
from singleton.lease.redis import RedisLeaseBackend
from singleton.service.dev.cluster import ReplicaProcess, child_environment, singleton_command
from singleton.service.dev.embedded import wait_until

N = int(os.environ.get("BENCH_PARTITIONS_N", "10000"))
#: ``K:R`` pairs, comma-separated (default: K = 1, 2, 4 on 1 and on 3 replicas).
LAYOUTS = [
    (int(k), int(r))
    for k, _, r in (
        pair.partition(":")
        for pair in os.environ.get("BENCH_PARTITIONS_LAYOUTS", "1:1,2:1,4:1,1:3,2:3,4:3").split(",")
    )
]
LOG_LEVEL = os.environ.get("BENCH_PARTITIONS_LOG_LEVEL", "WARNING")
#: Passes over every layout (interleaved, so a slow moment of the machine hits them alike).
ROUNDS = int(os.environ.get("BENCH_PARTITIONS_ROUNDS", "1"))
INSERT_CHUNK = 1000


def _config(root: Path, urls: dict[str, str], tag: str, k: int) -> Path:
    path = root / f"{tag}.toml"
    path.write_text(
        f"""backend = "redis"
redis_url = "{urls["redis"]}"
mongo_url = "{urls["mongo"]}"
es_url = "{urls["es"]}"
namespace = "bench-{tag}"
log_level = "{LOG_LEVEL}"
balance = true

[lease]
ttl = 3.0
renew_interval = 0.5
renew_deadline = 2.0
retry_interval = 0.25

[[listeners]]
use = "elasticsearch"
name = "{tag}"
database = "bench"
collection = "{tag}"
index = "{tag}"
partitions = {k}
"""
    )
    return path


def _spread(backend: RedisLeaseBackend, names: list[str], replicas: list[str]) -> bool:
    """Every lease held, and max - min <= 1 leases over the replicas."""
    holders = [backend.inspect(n) for n in names]
    if any(h is None for h in holders):
        return False
    counts = [sum(1 for h in holders if h is not None and h.identity == r) for r in replicas]
    return max(counts) - min(counts) <= 1


def _warm_ids(k: int) -> list[str]:
    """One document id per partition (the first ``warm-<i>`` that falls in it)."""
    found: dict[int, str] = {}
    i = 0
    while len(found) < k:
        found.setdefault(partition_of(f"warm-{i}", k), f"warm-{i}")
        i += 1
    return list(found.values())


def _one(
    urls: dict[str, str], servers: dict[str, int], root: Path, k: int, replicas: int, n: int
) -> dict[str, Any]:
    tag = f"p{k}r{replicas}n{n}"
    config = _config(root, urls, tag, k)
    client: pymongo.MongoClient[dict[str, Any]] = pymongo.MongoClient(urls["mongo"])
    coll = client["bench"][tag]
    es = connect(urls["es"], maxsize=2)
    backend = RedisLeaseBackend(urls["redis"], namespace=f"bench-{tag}")
    env = child_environment()
    identities = [f"{tag}-r{i}" for i in range(replicas)]
    procs = [
        ReplicaProcess(
            ident,
            singleton_command("run", "--config", str(config), "--identity", ident),
            root / f"{ident}.log",
            env,
        )
        for ident in identities
    ]
    try:
        for p in procs:
            p.start()
        wait_until(
            lambda: _spread(backend, layout_names(tag, k), identities),
            60,
            what=f"{k} partition(s) spread over {replicas} replica(s)",
        )
        warm = _warm_ids(k)
        coll.insert_many([{"_id": w, "warm": True} for w in warm])
        wait_until(lambda: es_count(es, tag) >= len(warm), 60, what="every partition streaming")
        pids = [p.pid for p in procs if p.pid is not None]
        cpu0 = sum(cpu_seconds(pid) for pid in pids)
        server0 = {name: cpu_seconds(pid) for name, pid in servers.items()}
        t0 = time.perf_counter()
        for lo in range(0, N, INSERT_CHUNK):
            chunk = range(lo, min(N, lo + INSERT_CHUNK))
            coll.insert_many([{"_id": i, "n": i, "name": f"item {i}"} for i in chunk])
        t_inserted = time.perf_counter()
        wait_until(
            lambda: es_count(es, tag) >= N + len(warm), 120, interval=0.01, what="all indexed"
        )
        t1 = time.perf_counter()
        cpu1 = sum(cpu_seconds(pid) for pid in pids)
        server1 = {name: cpu_seconds(pid) for name, pid in servers.items()}
        if not all(p.alive for p in procs):
            raise RuntimeError(f"a replica exited; see {root}")
        return {
            "partitions": k,
            "replicas": replicas,
            "events": N,
            "events_per_s": round(N / (t1 - t0), 1),
            "insert_per_s": round(N / (t_inserted - t0), 1),
            "cpu_us_per_event": round((cpu1 - cpu0) / N * 1e6, 1),
            "server_cpu_us_per_event": {
                name: round((server1[name] - server0[name]) / N * 1e6, 1) for name in servers
            },
        }
    finally:
        stoppers = [threading.Thread(target=p.stop) for p in procs]
        for t in stoppers:
            t.start()
        for t in stoppers:
            t.join()
        backend.close()
        es.close()
        client.close()


def main() -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="bench-partitions-"))
    servers = start_servers(root)
    try:
        urls = {"redis": servers[0].url, "mongo": servers[1].url, "es": servers[2].url}
        pids = {
            name: s.proc.pid
            for name, s in zip(("redis", "mongo", "es"), servers, strict=True)
            if s.proc is not None
        }
        passes = [[_one(urls, pids, root, k, r, n) for k, r in LAYOUTS] for n in range(ROUNDS)]
        runs = []
        for i, (k, r) in enumerate(LAYOUTS):
            rates = [p[i]["events_per_s"] for p in passes]
            cpus = [p[i]["cpu_us_per_event"] for p in passes]
            runs.append(
                {
                    "partitions": k,
                    "replicas": r,
                    "events": N,
                    "events_per_s": statistics.median(rates),
                    "events_per_s_each": rates,
                    "insert_per_s_each": [p[i]["insert_per_s"] for p in passes],
                    "cpu_us_per_event": statistics.median(cpus),
                    "cpu_us_per_event_each": cpus,
                    "server_cpu_us_per_event_each": [
                        p[i]["server_cpu_us_per_event"] for p in passes
                    ],
                }
            )
        return {"runs": runs, "rounds": ROUNDS, "cpu_cores": os.cpu_count(), "logs": str(root)}
    finally:
        for s in reversed(servers):
            s.stop()


if __name__ == "__main__":
    print(json.dumps(main(), indent=2))
