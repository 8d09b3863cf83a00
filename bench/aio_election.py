"""AsyncElector against Elector, in one run, on a real ``redis-server`` and SecantusDB started here.

* planned handover: ``rotate()`` on the leader -> the successor's ``on_elected`` (20 runs per
  driver and store);
* crash takeover: the leader stops without releasing (``stop(release=False)``) -> the successor's
  ``on_elected`` (5 runs, ttl=1: the goal is ttl + 0.1 s);
* hogged loop (async only): the work blocks the loop past its renew deadline; the delay from the
  end of the blocking step to the work's ``CancelledError`` (10 runs, Redis).

The async candidates share one event loop; times are ``time.monotonic()`` read in the callbacks.
``python -m bench.aio_election`` (or ``python -m bench aio_election``).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable
from typing import Any

from loguru import logger

from bench.election import percentiles
from singleton.aio import AsyncElector, AsyncLeases, AsyncMongoLeaseBackend, AsyncRedisLeaseBackend
from singleton.election.elector import Elector
from singleton.election.leadership import Leadership
from singleton.lease.contract import LeaseBackend
from singleton.lease.mongo import MongoLeaseBackend
from singleton.lease.redis import RedisLeaseBackend
from singleton.service.dev.embedded import MongoServer, RedisServer

ROTATIONS = 20
CRASHES = 5
HOGS = 10
ROTATE: dict[str, Any] = {"ttl": 3.0, "retry_interval": 0.5, "cooldown": 0.2}
CRASH: dict[str, Any] = {"ttl": 1.0}


class Stamp:
    """When the last ``on_elected`` fired, and an event for it (thread-safe)."""

    def __init__(self) -> None:
        self.at = 0.0
        self.event = threading.Event()

    def __call__(self, _ld: Leadership) -> None:
        self.at = time.monotonic()
        self.event.set()


def thread_backend(kind: str, url: str, ns: str) -> LeaseBackend:
    if kind == "redis":
        return RedisLeaseBackend(url, namespace=ns)
    return MongoLeaseBackend(url, database=ns)


def async_backend(kind: str, url: str, ns: str) -> AsyncLeases:
    if kind == "redis":
        return AsyncRedisLeaseBackend(url, namespace=ns)
    return AsyncMongoLeaseBackend(url, database=ns)


def thread_runs(kind: str, url: str, ns: str, crash: bool) -> list[float]:
    samples: list[float] = []
    for i in range(CRASHES if crash else 1):
        stamps = [Stamp(), Stamp()]
        backends = [thread_backend(kind, url, f"{ns}{i}") for _ in stamps]
        timings = CRASH if crash else ROTATE
        electors = [
            Elector(b, "job", identity=f"t{j}", on_elected=s, **timings)
            for j, (b, s) in enumerate(zip(backends, stamps, strict=True))
        ]
        try:
            electors[0].start()
            stamps[0].event.wait(10)
            electors[1].start()
            leader = 0
            for _ in range(1 if crash else ROTATIONS):
                successor = 1 - leader
                stamps[successor].event.clear()
                threading.Event().wait(0.5)  # cooldowns over, the follower settled in its wait
                asked = time.monotonic()
                if crash:
                    electors[leader].stop(release=False, timeout=10)
                else:
                    electors[leader].rotate()
                if not stamps[successor].event.wait(10):
                    raise TimeoutError("successor not elected")
                samples.append(stamps[successor].at - asked)
                leader = successor
        finally:
            for e in electors:
                e.stop(timeout=10)
            for b in backends:
                b.close()
    return samples


async def async_runs(kind: str, url: str, ns: str, crash: bool) -> list[float]:
    samples: list[float] = []
    for i in range(CRASHES if crash else 1):
        stamps = [Stamp(), Stamp()]
        backends = [async_backend(kind, url, f"{ns}{i}") for _ in stamps]
        timings = CRASH if crash else ROTATE
        electors = [
            AsyncElector(b, "job", identity=f"a{j}", on_elected=s, **timings)
            for j, (b, s) in enumerate(zip(backends, stamps, strict=True))
        ]
        try:
            electors[0].start()
            await _until(stamps[0].event.is_set, 10)
            electors[1].start()
            leader = 0
            for _ in range(1 if crash else ROTATIONS):
                successor = 1 - leader
                stamps[successor].event.clear()
                await asyncio.sleep(0.5)
                asked = time.monotonic()
                if crash:
                    await electors[leader].stop(release=False)
                else:
                    electors[leader].rotate()
                await _until(stamps[successor].event.is_set, 10)
                samples.append(stamps[successor].at - asked)
                leader = successor
        finally:
            for e in electors:
                await e.stop()
            for b in backends:
                await b.aclose()
    return samples


async def _until(done: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not done():  # set by a callback on this very loop: a short poll is exact enough
        if time.monotonic() > deadline:
            raise TimeoutError("not elected in time")
        await asyncio.sleep(0.001)


async def hogged(url: str) -> dict[str, Any]:
    """The work hogs the loop past its deadline; how long after the hog ends is it cancelled,
    and does it ever take a step after the deadline?"""
    delays: list[float] = []
    steps_after_deadline = 0
    for i in range(HOGS):
        backend = AsyncRedisLeaseBackend(url, namespace=f"hog{i}")
        elector = AsyncElector(backend, "job", ttl=1.5, renew_interval=0.3, renew_deadline=0.9)
        seen: dict[str, float] = {}

        async def work(ld: Leadership, seen: dict[str, float] = seen) -> None:
            if seen:
                await asyncio.sleep(30)  # a later tenure: wait to be stopped
            while ld.valid():
                time.sleep(0.001)  # the application blocks the loop
            time.sleep(0.1)
            seen["hog_ended"] = time.monotonic()
            try:
                await asyncio.sleep(0)
            except asyncio.CancelledError:
                seen["cancelled"] = time.monotonic()
                raise
            seen["stepped"] = time.monotonic()

        runner = asyncio.ensure_future(elector.run(work))

        def ended(seen: dict[str, float] = seen) -> bool:
            return "cancelled" in seen or "stepped" in seen

        await _until(ended, 20)
        await elector.stop()
        await runner
        await backend.aclose()
        if "stepped" in seen:
            steps_after_deadline += 1
        else:
            delays.append(seen["cancelled"] - seen["hog_ended"])
    return {**percentiles(delays), "steps_after_deadline": steps_after_deadline}


def compare(kind: str, url: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for what, crash in (("planned_handover", False), ("crash_takeover", True)):
        threaded = percentiles(thread_runs(kind, url, f"bt{what}", crash))
        awaited = percentiles(asyncio.run(async_runs(kind, url, f"ba{what}", crash)))
        out[what] = {"thread": threaded, "async": awaited}
    return out


def main() -> dict[str, Any]:
    logger.remove()
    results: dict[str, Any] = {}
    with RedisServer() as redis_server:
        results["redis"] = compare("redis", redis_server.url)
        results["hogged_loop_cancel"] = asyncio.run(hogged(redis_server.url))
    with MongoServer() as mongo_server:
        results["mongo"] = compare("mongo", mongo_server.url)
    return results


if __name__ == "__main__":
    print(json.dumps(main(), indent=2))
