"""A shaped index's cost: events/s and CPU per event for one listener reading 1 vs 3 collections
(``collections``), against three listeners mirroring one collection each and a plain mirror of
one collection, in one run on one osmem-server (a SecantusDB per case: it scans its oplog to
open a stream).

Each case streams a backlog of ``BENCH_SHAPED_N`` small documents (split evenly over its
collections) written before it starts: its listeners begin at a checkpoint holding the cluster
time before the writes, so what is timed is streaming, not the initial copy. CPU is this
process's (``time.process_time``: the listeners' threads; the servers are other processes),
from the start until every document is counted in its index.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import pymongo

from listeners import Checkpoint, ListenerRunner, MongoCheckpointStore
from listeners.elasticsearch import ElasticsearchSync
from listeners.elasticsearch.transport import connect
from singleton import Elector
from singleton.service.dev.embedded import ElasticServer, MongoServer
from singleton.testing import MemoryLeaseBackend

N = int(os.environ.get("BENCH_SHAPED_N", "30000"))
CASES = ("mirror_one", "shaped_one", "shaped_three", "three_mirrors")


def _listeners(case: str, db: str, es: str) -> list[ElasticsearchSync]:
    common: dict[str, Any] = {"database": db, "es": es, "ttl": 10.0}
    if case == "mirror_one":
        return [ElasticsearchSync(collection="a", index=f"{db}-a", **common)]
    if case == "shaped_one":
        return [ElasticsearchSync(name=db, collections={"a": {}}, index=f"{db}-{{collection}}",
                                  **common)]  # fmt: skip
    if case == "shaped_three":
        tables: dict[str, Any] = {c: {} for c in "abc"}
        return [ElasticsearchSync(name=db, collections=tables, index=f"{db}-{{collection}}",
                                  **common)]  # fmt: skip
    return [ElasticsearchSync(collection=c, index=f"{db}-{c}", **common) for c in "abc"]


def _run_case(case: str, mongo_url: str, es_url: str) -> dict[str, Any]:
    client: pymongo.MongoClient[dict[str, Any]] = pymongo.MongoClient(mongo_url, tz_aware=True)
    db = f"bench_{case}"
    names = "a" if case in ("mirror_one", "shaped_one") else "abc"
    since = client.admin.command("ping")["operationTime"]
    per = N // len(names)
    for name in names:
        for start in range(0, per, 1000):
            docs = [{"_id": i, "name": f"n{i}", "qty": i % 7} for i in range(start, start + 1000)]
            client[db][name].insert_many(docs[: per - start])
    store = MongoCheckpointStore(client, database=f"{db}_meta")
    listeners = _listeners(case, db, es_url)
    runners = []
    for listener in listeners:
        store.save(Checkpoint(listener.lease_name, None, since, 0, "bench"))
        elector = Elector(MemoryLeaseBackend(), listener.lease_name, ttl=30.0)
        runners.append(
            ListenerRunner(
                listener,
                elector,
                client,
                checkpoints=store,
                standby_interval=None,
                max_await_time=0.5,
            )
        )
    es = connect(es_url)
    indexes = [f"{db}-{n}" for n in names]
    cpu0, t0 = time.process_time(), time.perf_counter()
    for runner in runners:
        runner.start()
    try:
        deadline = t0 + 600
        while _indexed(es, indexes) < per * len(names):
            if time.perf_counter() > deadline:
                raise RuntimeError(f"{case}: not every document indexed in 600 s")
            time.sleep(0.05)  # (a benchmark's poll; tests wait on events)
        seconds, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    finally:
        for runner in runners:
            runner.stop()
        for listener in listeners:
            listener.close()
        es.close()
        client.close()
    events = per * len(names)
    return {
        "events": events,
        "seconds": round(seconds, 2),
        "events_per_s": round(events / seconds, 1),
        "cpu_us_per_event": round(cpu / events * 1e6, 1),
    }


def _indexed(es: Any, indexes: list[str]) -> int:
    total = 0
    for index in indexes:
        status, body = es.request("GET", f"/{index}/_count")
        total += int(body["count"]) if status == 200 and isinstance(body, dict) else 0
    return total


def main() -> dict[str, Any]:
    results = {}
    with ElasticServer() as es:
        for case in CASES:  # (each on a SecantusDB of its own: it scans its oplog to open)
            with MongoServer() as mongo:
                results[case] = _run_case(case, mongo.url, es.url)
    base = results["mirror_one"]["cpu_us_per_event"]
    return {
        "bench": "shaped",
        "documents": N,
        **results,
        "cpu_vs_mirror": {c: round(results[c]["cpu_us_per_event"] / base, 2) for c in CASES},
    }


if __name__ == "__main__":
    print(json.dumps(main(), indent=2))
