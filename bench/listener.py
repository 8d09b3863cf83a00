"""Listener throughput: events/s delivered to a no-op ``handle_batch`` by ListenerRunner, divided
by the rate of reading the same change stream with plain pymongo ``try_next()`` in the same run.

Both read the same ``N`` events from the same start time on one SecantusDB started here; the
runner's figure includes its fenced checkpoint writes. ``python -m bench.listener`` prints JSON.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Sequence
from typing import Any

import pymongo

from listeners import ChangeStreamListener, ListenerContext, ListenerRunner, MongoCheckpointStore
from listeners.base import ChangeEvent
from singleton import Elector
from singleton.service.dev.embedded import MongoServer
from singleton.testing import MemoryLeaseBackend

EVENTS = 20_000
BATCH = 500


class _NoOp(ChangeStreamListener):
    database = "bench"
    collection = "events"
    full_document = None
    batch_size = BATCH

    def __init__(self, total: int) -> None:
        super().__init__()
        self.total = total
        self.seen = 0
        self.started = 0.0
        self.finished = 0.0
        self.done = threading.Event()

    def on_start(self, ctx: ListenerContext) -> None:
        self.started = time.perf_counter()

    def handle_batch(self, events: Sequence[ChangeEvent], ctx: ListenerContext) -> None:
        self.seen += len(events)
        if self.seen >= self.total and not self.done.is_set():
            self.finished = time.perf_counter()
            self.done.set()


def _raw_rate(coll: Any, since: Any, total: int) -> float:
    started = time.perf_counter()
    n = 0
    with coll.watch(
        start_at_operation_time=since, max_await_time_ms=500, batch_size=BATCH
    ) as stream:
        while n < total:
            if stream.try_next() is not None:
                n += 1
    return total / (time.perf_counter() - started)


def _runner_rate(url: str, since: Any, total: int) -> tuple[float, dict[str, Any]]:
    client: pymongo.MongoClient[dict[str, Any]] = pymongo.MongoClient(url, tz_aware=True)
    store = MongoCheckpointStore(client, database="bench_meta")
    listener = _NoOp(total)
    # Start where the raw reader started: a checkpoint holding only the cluster time.
    elector = Elector(MemoryLeaseBackend(), listener.lease_name, ttl=10.0)
    runner = ListenerRunner(
        listener, elector, client, checkpoints=store, standby_interval=None, max_await_time=0.5
    )
    from listeners import Checkpoint

    store.save(Checkpoint(listener.lease_name, None, since, 0, "bench"))
    runner.start()
    try:
        if not listener.done.wait(300):
            raise RuntimeError(f"runner delivered {listener.seen} of {total} events in 300 s")
    finally:
        runner.stop()
        client.close()
    return total / (listener.finished - listener.started), runner.status()


def main() -> dict[str, Any]:
    with MongoServer() as server:
        client: pymongo.MongoClient[dict[str, Any]] = pymongo.MongoClient(server.url)
        coll = client["bench"]["events"]
        since = client.admin.command("ping")["operationTime"]
        for start in range(0, EVENTS, 1000):
            coll.insert_many([{"_id": i, "v": "x" * 64} for i in range(start, start + 1000)])
        raw = _raw_rate(coll, since, EVENTS)
        runner, status = _runner_rate(server.url, since, EVENTS)
        raw_again = _raw_rate(coll, since, EVENTS)  # guards against warm-up bias
        client.close()
    raw_best = max(raw, raw_again)
    return {
        "bench": "listener",
        "events": EVENTS,
        "batch_size": BATCH,
        "raw_events_per_s": round(raw_best, 1),
        "runner_events_per_s": round(runner, 1),
        "ratio": round(runner / raw_best, 3),
        "goal": 0.9,
        "batches": status["batches"],
        "events_handled": status["events_handled"],
    }


if __name__ == "__main__":
    print(json.dumps(main(), indent=2))
