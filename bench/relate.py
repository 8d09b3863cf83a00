"""Related documents (``relate``): a customer update fanning out to N orders, and what relate
costs on plain order writes, in one run on osmem-server (a SecantusDB per case).

* ``fanout``: for each N of ``BENCH_RELATE_FANOUT`` (default ``1000,10000``; the issue's
  100,000 takes minutes here), N orders of one customer are copied, the customer is updated, and
  the seconds until every order's index document carries the new name are timed; with the
  growth of this process's resident memory over that time (sampled every 50 ms: the rebuild runs
  in this process, the servers in others).
* ``order_writes``: a backlog of ``BENCH_RELATE_N`` order inserts streamed by the same listener
  with and without its two relations (customer, lines): events/s and this process's CPU per
  event.
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any

import pymongo

from bench._support import rss_mb
from listeners import Checkpoint, ListenerRunner, MongoCheckpointStore
from listeners.elasticsearch import ElasticsearchSync
from listeners.elasticsearch.transport import connect
from singleton import Elector
from singleton.service.dev.embedded import ElasticServer, MongoServer
from singleton.testing import MemoryLeaseBackend

FANOUT = [int(n) for n in os.environ.get("BENCH_RELATE_FANOUT", "1000,10000").split(",")]
N = int(os.environ.get("BENCH_RELATE_N", "10000"))
RELATE = [
    {"from": "customers", "local": "customer_id", "as": "customer", "fields": ["name"]},
    {"from": "lines", "foreign": "order_id", "as": "lines", "many": True, "fields": ["sku"]},
]


def _listener(db: str, es: str, related: bool) -> ElasticsearchSync:
    orders: dict[str, Any] = {"relate": RELATE} if related else {}
    return ElasticsearchSync(
        name=db, database=db, collections={"orders": orders}, index=f"{db}-{{collection}}",
        es=es, ttl=30.0,
    )  # fmt: skip


def _runner(listener: ElasticsearchSync, client: Any, store: Any) -> ListenerRunner:
    elector = Elector(MemoryLeaseBackend(), listener.lease_name, ttl=30.0)
    return ListenerRunner(
        listener, elector, client, checkpoints=store, standby_interval=None, max_await_time=0.2
    )


def _wait(what: str, done: Any, timeout: float = 1800) -> None:
    deadline = time.perf_counter() + timeout
    while not done():
        if time.perf_counter() > deadline:
            raise RuntimeError(f"{what}: not done in {timeout} s")
        time.sleep(0.05)  # (a benchmark's poll; tests wait on events)


def _fanout(n: int, es_url: str) -> dict[str, Any]:
    with MongoServer() as mongo:
        client: pymongo.MongoClient[dict[str, Any]] = pymongo.MongoClient(mongo.url)
        db = f"fan{n}"
        client[db].customers.insert_one({"_id": "c1", "name": "before"})
        for start in range(0, n, 5000):
            docs = [{"_id": i, "customer_id": "c1"} for i in range(start, min(n, start + 5000))]
            client[db].orders.insert_many(docs)
        listener = _listener(db, es_url, related=True)
        runner = _runner(listener, client, MongoCheckpointStore(client, database=f"{db}_meta"))
        es = connect(es_url)
        query = json.dumps({"query": {"term": {"customer.name": "after"}}}).encode()

        def renamed() -> int:
            es.request("POST", f"/{db}-orders/_refresh")
            status, body = es.request("POST", f"/{db}-orders/_count", query)
            return int(body["count"]) if status == 200 and isinstance(body, dict) else 0

        runner.start()
        try:
            _wait("copy", lambda: runner.status()["state"] == "streaming")
            base, peak = rss_mb(os.getpid()), [0.0]
            sampling = threading.Event()

            def sample() -> None:
                while not sampling.wait(0.05):
                    peak[0] = max(peak[0], rss_mb(os.getpid()))

            sampler = threading.Thread(target=sample, daemon=True)
            sampler.start()
            t0 = time.perf_counter()
            client[db].customers.update_one({"_id": "c1"}, {"$set": {"name": "after"}})
            _wait("fan-out", lambda: renamed() >= n)
            seconds = time.perf_counter() - t0
            sampling.set()
            sampler.join()
        finally:
            runner.stop()
            listener.close()
            es.close()
            client.close()
    return {"orders": n, "seconds": round(seconds, 2), "rss_growth_mb": round(peak[0] - base, 1)}


def _order_writes(related: bool, es_url: str) -> dict[str, Any]:
    with MongoServer() as mongo:
        client: pymongo.MongoClient[dict[str, Any]] = pymongo.MongoClient(mongo.url)
        db = f"writes{int(related)}"
        client[db].customers.insert_many([{"_id": f"c{i}", "name": f"n{i}"} for i in range(100)])
        store = MongoCheckpointStore(client, database=f"{db}_meta")
        since = client.admin.command("ping")["operationTime"]
        for start in range(0, N, 1000):
            client[db].orders.insert_many(
                [
                    {"_id": i, "customer_id": f"c{i % 100}", "n": i}
                    for i in range(start, start + 1000)
                ]
            )
        listener = _listener(db, es_url, related)
        store.save(Checkpoint(listener.lease_name, None, since, 0, "bench"))
        runner = _runner(listener, client, store)
        es = connect(es_url)

        def indexed() -> bool:
            status, body = es.request("GET", f"/{db}-orders/_count")
            return status == 200 and isinstance(body, dict) and int(body["count"]) >= N

        cpu0, t0 = time.process_time(), time.perf_counter()
        runner.start()
        try:
            _wait("backlog", indexed)
            seconds, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        finally:
            runner.stop()
            listener.close()
            es.close()
            client.close()
    return {
        "events": N,
        "events_per_s": round(N / seconds, 1),
        "cpu_us_per_event": round(cpu / N * 1e6, 1),
    }


def main() -> dict[str, Any]:
    with ElasticServer() as es:
        fanout = [_fanout(n, es.url) for n in FANOUT]
        plain = _order_writes(False, es.url)
        related = _order_writes(True, es.url)
    return {
        "bench": "relate",
        "fanout": fanout,
        "order_writes": {"without_relate": plain, "with_relate": related},
        "relate_cpu_ratio": round(related["cpu_us_per_event"] / plain["cpu_us_per_event"], 2),
    }


if __name__ == "__main__":
    print(json.dumps(main(), indent=2))
