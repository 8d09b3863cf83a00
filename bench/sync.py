"""ElasticsearchSync throughput and latency against SecantusDB and osmem-server (started here).

All rates are measured in one run on the same documents:

* ``stream_raw``: reading the change stream (``updateLookup``) with pymongo alone;
* ``bulk_raw``: bulk-loading the same documents into the same server from pre-serialized
  requests (the best of 1 and ``concurrency`` parallel connections);
* ``synced``: ElasticsearchSync reading the stream and writing the index;
* ``naive``: a listener that sends one index request per event (on a subset).

``ratio = synced / min(stream_raw, bulk_raw)`` (goal >= 0.8). Latency: writes at a steady rate,
a runner-like loop streams them, and a reader polls a realtime GET for each document.
"""

from __future__ import annotations

import json
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import quote

import pymongo
from bson.timestamp import Timestamp
from loguru import logger

from listeners.base import ListenerContext
from listeners.elasticsearch import ElasticsearchSync
from listeners.elasticsearch.documents import doc_id, source_of
from listeners.elasticsearch.transport import EsTransport, connect
from listeners.elasticsearch.versioning import EventVersioner
from singleton.clock import SYSTEM_CLOCK
from singleton.drivers.mongo import cluster_time
from singleton.election.leadership import Leadership
from singleton.service.dev.embedded import ElasticServer, MongoServer
from singleton.testing import MemoryLeaseBackend

DOCS = 6000
NAIVE_DOCS = 1000
BATCH = 1000
CONCURRENCY = 2
RATE = 500.0
LATENCY_WRITES = 2000


def _ctx(client: Any, name: str) -> ListenerContext:
    lease = MemoryLeaseBackend().try_acquire(name, "bench/1", ttl=3600)
    assert lease is not None
    ld = Leadership(lease, "bench", SYSTEM_CLOCK.monotonic() + 3600, SYSTEM_CLOCK)
    return ListenerContext(ld, client, logger, name)


def _doc(i: int) -> dict[str, Any]:
    return {
        "_id": i,
        "n": i,
        "name": f"item {i}",
        "tags": ["a", "b", f"t{i % 50}"],
        "price": i * 0.25,
        "nested": {"x": i % 7, "y": "z" * 40},
    }


def _read_stream(coll: Any, start: Timestamp, count: int, on_batch: Any = None) -> float:
    """Seconds to read ``count`` events from ``start`` (calling ``on_batch`` on each batch)."""
    t0 = time.perf_counter()
    got = 0
    with coll.watch(
        start_at_operation_time=start,
        full_document="updateLookup",
        batch_size=BATCH,
        max_await_time_ms=50,
    ) as stream:
        batch: list[Any] = []
        while got < count:
            event = stream.try_next()
            if event is not None:
                batch.append(event)
                got += 1
            if batch and (event is None or len(batch) >= BATCH or got >= count):
                if on_batch is not None:
                    on_batch(batch)
                batch = []
    return time.perf_counter() - t0


def _bulk_raw(es: EsTransport, index: str, docs: list[dict[str, Any]], par: int) -> float:
    bodies = []
    for lo in range(0, len(docs), BATCH):
        lines = []
        for d in docs[lo : lo + BATCH]:
            meta = {
                "index": {
                    "_index": index,
                    "_id": doc_id(d["_id"]),
                    "version": 1,
                    "version_type": "external",
                }
            }
            lines.append(json.dumps(meta).encode() + b"\n" + (source_of(d) or b"{}") + b"\n")
        bodies.append(b"".join(lines))
    t0 = time.perf_counter()

    def send(body: bytes) -> None:
        status, resp = es.request("POST", "/_bulk", body, ndjson=True)
        assert status == 200 and not resp["errors"], resp

    with ThreadPoolExecutor(par) as pool:
        list(pool.map(send, bodies))
    return time.perf_counter() - t0


def _latency(client: Any, es_url: str, db: str) -> dict[str, float]:
    coll = client[db]["lat"]
    listener = ElasticsearchSync(database=db, collection="lat", es=es_url, concurrency=1)
    ctx = _ctx(client, listener.lease_name)
    es = connect(es_url)
    start = cluster_time(client)
    stop = threading.Event()
    written: dict[int, float] = {}
    seen: dict[int, float] = {}
    stream_ready = threading.Event()

    def run_listener() -> None:  # the runner's loop: batch up to 20 ms, then handle
        with coll.watch(
            start_at_operation_time=start, full_document="updateLookup", max_await_time_ms=20
        ) as stream:
            stream_ready.set()
            while not stop.is_set():
                batch: list[Any] = []
                first = time.monotonic()
                while len(batch) < 500 and time.monotonic() - first < 0.02:
                    event = stream.try_next()
                    if event is None:
                        break
                    batch.append(event)
                if batch:
                    listener.handle_batch(batch, ctx)

    def read_back() -> None:
        path = f"/{listener.index_name}/_doc/"
        for i in range(LATENCY_WRITES):
            while i not in written:
                stop.wait(0.0005)
            while True:
                status, _ = es.request("GET", f"{path}{quote(doc_id(i), safe='')}?realtime=true")
                if status == 200:
                    seen[i] = time.perf_counter()
                    break
                stop.wait(0.0005)

    threads = [threading.Thread(target=run_listener), threading.Thread(target=read_back)]
    threads[0].start()
    stream_ready.wait(30)
    threads[1].start()
    achieved = _write_paced(coll, written)
    threads[1].join(120)
    stop.set()
    threads[0].join(30)
    listener.close()
    es.close()
    lat = sorted(seen[i] - written[i] for i in range(LATENCY_WRITES))
    return {
        "writes_per_s": round(achieved, 1),
        "p50_ms": round(statistics.median(lat) * 1000, 2),
        "p99_ms": round(lat[int(len(lat) * 0.99) - 1] * 1000, 2),
        "max_ms": round(lat[-1] * 1000, 2),
    }


def _write_paced(coll: Any, written: dict[int, float]) -> float:
    """Insert LATENCY_WRITES documents at RATE per second (noting when each was acknowledged);
    returns the rate achieved."""
    pace = threading.Event()
    t0 = time.perf_counter()
    for i in range(LATENCY_WRITES):
        delay = t0 + i / RATE - time.perf_counter()
        if delay > 0:
            pace.wait(delay)
        coll.insert_one({"_id": i, "n": i, "name": f"item {i}"})
        written[i] = time.perf_counter()
    return LATENCY_WRITES / (time.perf_counter() - t0)


def main() -> dict[str, Any]:
    logger.remove()
    with MongoServer() as mongo, ElasticServer() as elastic:
        client: pymongo.MongoClient[dict[str, Any]] = pymongo.MongoClient(mongo.url)
        es = connect(elastic.url, maxsize=CONCURRENCY + 2)
        coll = client.bench.docs
        docs = [_doc(i) for i in range(DOCS)]
        start = cluster_time(client)
        for lo in range(0, DOCS, 500):
            coll.insert_many(docs[lo : lo + 500])

        stream_s = _read_stream(coll, start, DOCS)
        bulk = {p: _bulk_raw(es, f"raw{p}", docs, p) for p in (1, CONCURRENCY)}
        bulk_best = min(bulk.values())

        listener = ElasticsearchSync(
            database="bench",
            collection="docs",
            es=elastic.url,
            concurrency=CONCURRENCY,
            bulk_actions=BATCH,
        )
        ctx = _ctx(client, listener.lease_name)
        synced_s = _read_stream(coll, start, DOCS, lambda b: listener.handle_batch(b, ctx))
        listener.close()

        versioner = EventVersioner()

        def naive(batch: list[Any]) -> None:
            for e in batch:
                v = versioner.version(e)
                path = f"/naive/_doc/{doc_id(e['documentKey']['_id'])}"
                status, _ = es.request(
                    "PUT", f"{path}?version={v}&version_type=external", source_of(e["fullDocument"])
                )
                assert status in (200, 201, 409), status

        naive_s = _read_stream(coll, start, NAIVE_DOCS, naive)
        rates = {
            "stream_raw": DOCS / stream_s,
            "bulk_raw": DOCS / bulk_best,
            "bulk_raw_sequential": DOCS / bulk[1],
            "synced": DOCS / synced_s,
            "naive": NAIVE_DOCS / naive_s,
        }
        ceiling = min(rates["stream_raw"], rates["bulk_raw"])
        latency = _latency(client, elastic.url, "benchlat")
        es.close()
        client.close()
    return {
        "documents": DOCS,
        "naive_documents": NAIVE_DOCS,
        "concurrency": CONCURRENCY,
        "rates_per_s": {k: round(v, 1) for k, v in rates.items()},
        "ratio": round(rates["synced"] / ceiling, 3),
        "naive_ratio": round(rates["naive"] / ceiling, 3),
        "latency_at_500_writes_per_s": latency,
    }


if __name__ == "__main__":
    print(json.dumps(main(), indent=2))
