"""Streaming through a running replica: a spawned ``singleton run`` works off a backlog.

For each document size (about 100 bytes and about 2 KB), on SecantusDB and osmem-server started
here: a replica syncs an empty collection and is stopped (SIGTERM: drain, checkpoint, release);
``N`` documents are inserted; the replica is started again and streams the backlog. Measured in
the same run on the same documents:

* ``synced``: events/s from the first indexed document of the backlog to the last (``_count``
  on the index, polled);
* ``stream_raw``: pymongo alone reading the same change stream (``updateLookup``);
* ``bulk_raw``: pre-serialized bulk requests loading the same documents (best of 1 and 2
  connections);
* ``cpu_us_per_event``: the replica's own CPU time (``/proc/<pid>/stat``, user + system) over
  the streaming phase, divided by ``N``.
* ``stream_raw_cpu_us_per_event``: this process's CPU time while pymongo alone reads the stream
  (``stream_raw``), divided by ``N``: what reading and decoding cost by themselves on the same
  server, beside the replica's figure (which reads fewer fields, then mirrors each event).

``ratio = synced / min(stream_raw, bulk_raw)`` (goal >= 0.9); ``cpu_ratio``: the replica's CPU
per event over pymongo's (``stream_raw_cpu_us_per_event``), goal <= 1.5 (issue #26).
``BENCH_STREAM_N`` sets ``N`` for small documents (default 40,000; a quarter for 2 KB);
``BENCH_STREAM_OPTIONS`` adds listener options (``;``-separated TOML lines).

    python -m bench stream
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pymongo

from bench._support import cpu_seconds, embedded_urls, es_count
from bench.sync import _bulk_raw, _read_stream
from listeners.elasticsearch.transport import connect
from singleton.drivers.mongo import cluster_time
from singleton.service.dev.cluster import ReplicaProcess, child_environment, singleton_command
from singleton.service.dev.embedded import wait_until

SMALL = int(os.environ.get("BENCH_STREAM_N", "40000"))
#: Extra TOML lines for the listener (to compare settings, e.g. ``pipelined = false``).
OPTIONS = os.environ.get("BENCH_STREAM_OPTIONS", "").replace(";", "\n")
INSERT_CHUNK = 1000


def _doc(i: int, size: int) -> dict[str, Any]:
    doc: dict[str, Any] = {"_id": i, "n": i, "name": f"item {i}", "price": i * 0.25}
    doc["tags"] = ["a", f"t{i % 50}"]
    if size > 200:
        doc["nested"] = {"x": i % 7, "words": [f"w{i % 13}-{k}" for k in range(20)]}
        doc["text"] = "lorem ipsum " * ((size - 300) // 12)
    return doc


def _config(root: Path, redis: str, mongo: str, es: str, coll: str) -> Path:
    path = root / f"{coll}.toml"
    path.write_text(
        f"""backend = "redis"
redis_url = "{redis}"
mongo_url = "{mongo}"
es_url = "{es}"
namespace = "bench"
log_level = "WARNING"

[lease]
ttl = 6.0
renew_interval = 1.0
renew_deadline = 4.0
retry_interval = 0.5

[[listeners]]
use = "elasticsearch"
name = "stream-{coll}"
database = "bench"
collection = "{coll}"
index = "{coll}"
{OPTIONS}
"""
    )
    return path


def _one(servers: dict[str, str], root: Path, size: int, n: int) -> dict[str, Any]:
    coll_name = f"s{size}"
    client: pymongo.MongoClient[dict[str, Any]] = pymongo.MongoClient(servers["mongo"])
    coll = client["bench"][coll_name]
    es = connect(servers["es"], maxsize=4)
    config = _config(root, servers["redis"], servers["mongo"], servers["es"], coll_name)
    argv = singleton_command("run", "--config", str(config), "--identity", "bench")
    replica = ReplicaProcess("bench", argv, root / f"{coll_name}.log", child_environment())
    # 1. The replica syncs the (nearly) empty collection, then hands over cleanly.
    coll.insert_one({"_id": -1, "warm": True})
    replica.start()
    wait_until(lambda: es_count(es, coll_name) == 1, 60, what="first sync")
    replica.signal(signal.SIGTERM)
    if replica.wait(30) is None:
        raise RuntimeError("the replica did not exit on SIGTERM")
    # 2. The backlog.
    docs = [_doc(i, size) for i in range(n)]
    start = cluster_time(client)
    for lo in range(0, n, INSERT_CHUNK):
        coll.insert_many(docs[lo : lo + INSERT_CHUNK], ordered=False)
    doc_bytes = len(json.dumps(docs[n // 2]))
    # 3. The replica streams it; poll the index and sample its CPU time.
    replica.start()
    pid = replica.pid
    assert pid is not None
    stop = threading.Event()
    t_first = cpu_first = 0.0
    while es_count(es, coll_name) <= 1:
        if not replica.alive:
            raise RuntimeError(f"replica exited; see {replica.log_path}")
        stop.wait(0.002)
    t_first, cpu_first = time.perf_counter(), cpu_seconds(pid)
    deadline = time.monotonic() + 600
    while es_count(es, coll_name) < n + 1:
        if time.monotonic() > deadline or not replica.alive:
            raise RuntimeError(f"backlog not indexed; see {replica.log_path}")
        stop.wait(0.005)
    t_last, cpu_last = time.perf_counter(), cpu_seconds(pid)
    replica.stop()
    # 4. The ceilings, on the same documents.
    raw_cpu = time.process_time()
    stream_s = _read_stream(coll, start, n)
    raw_cpu = time.process_time() - raw_cpu
    bulk_s = min(_bulk_raw(es, f"raw{size}-{p}", docs, p) for p in (1, 2))
    es.close()
    client.close()
    rates = {"synced": n / (t_last - t_first), "stream_raw": n / stream_s, "bulk_raw": n / bulk_s}
    return {
        "events": n,
        "doc_json_bytes": doc_bytes,
        "rates_per_s": {k: round(v, 1) for k, v in rates.items()},
        "ratio": round(rates["synced"] / min(rates["stream_raw"], rates["bulk_raw"]), 3),
        "cpu_us_per_event": round((cpu_last - cpu_first) / n * 1e6, 1),
        "stream_raw_cpu_us_per_event": round(raw_cpu / n * 1e6, 1),
        # the replica's CPU per event over pymongo's own read of the same stream (goal <= 1.5)
        "cpu_ratio": round((cpu_last - cpu_first) / raw_cpu, 2) if raw_cpu > 0 else None,
    }


def main() -> dict[str, Any]:
    with embedded_urls("bench-stream-") as (root, urls):
        return {
            "small": _one(urls, root, 100, SMALL),
            "large": _one(urls, root, 2000, max(1, SMALL // 4)),
            "goal": {"ratio": 0.9, "cpu_ratio": 1.5},
        }


if __name__ == "__main__":
    print(json.dumps(main(), indent=2))
