"""MongoLeaseBackend against a SecantusDB started here. ``python -m bench.mongo_lease``.

* acquire (same holder, existing document) and renew latency, p50/p99;
* eight contender threads, each with its own client, grabbing and releasing one lease for a few
  seconds: grants per second and double grants (two holders acting at once), side by side with a
  find-then-update baseline written here, the pattern the atomic operation replaces;
* planned handover: ``Elector.rotate()`` on the leader -> successor's ``on_elected``, woken by the
  change stream (retry_interval is 1 s, so a poll would show ~1 s);
* crash takeover: a holder stops renewing -> a follower ``Elector`` with the default
  ``retry_interval`` (2 s) gets the lease: it contends again at the expiry the store reported.
  Goal: ttl + 100 ms.
"""

from __future__ import annotations

import json
import statistics
import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any

import pymongo
from loguru import logger

from singleton.election.elector import Elector
from singleton.lease.mongo import MongoLeaseBackend
from singleton.service.dev.embedded import MongoServer

Doc = dict[str, Any]
CONTENDERS = 8
CONTEND_SECONDS = 3.0


def _pct(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return {"p50_ms": round(statistics.median(ordered) * 1000, 2), "p99_ms": round(p99 * 1000, 2)}


def _timed(fn: Callable[[], object], n: int) -> list[float]:
    out = []
    for _ in range(n):
        start = time.perf_counter()
        fn()
        out.append(time.perf_counter() - start)
    return out


class _Referee:
    """Counts holders acting at once (a holder stops acting *before* it releases, so a count
    above one can only come from a double grant) and fencing tokens handed out twice."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.acting = 0
        self.grants = 0
        self.double = 0
        self.tokens: set[int] = set()
        self.duplicate_tokens = 0

    def granted(self, token: int) -> None:
        with self.lock:
            self.acting += 1
            self.grants += 1
            if self.acting > 1:
                self.double += 1
            if token in self.tokens:
                self.duplicate_tokens += 1
            self.tokens.add(token)

    def stopped(self) -> None:
        with self.lock:
            self.acting -= 1


def _atomic(url: str, db: str, i: int, ref: _Referee, end: float) -> None:
    with MongoLeaseBackend(url, database=db) as backend:
        n = 0
        while time.monotonic() < end:
            n += 1
            lease = backend.try_acquire("race", f"c{i}/{n}", 5.0)
            if lease is not None:
                ref.granted(lease.token)
                backend.renew(lease)  # one round trip of "work" while holding
                ref.stopped()
                backend.release(lease)


def _find_then_update(url: str, db: str, i: int, ref: _Referee, end: float) -> None:
    client: pymongo.MongoClient[Doc] = pymongo.MongoClient(url)
    coll = client[db]["naive"]
    n = 0
    while time.monotonic() < end:
        n += 1
        now = datetime.now(timezone.utc).replace(tzinfo=None)
        doc = coll.find_one({"_id": "race"})  # read ...
        if doc is None or doc.get("holder") is None or doc["expiresAt"] <= now:
            token = (doc or {}).get("token", 0) + 1
            coll.update_one(  # ... then write: another contender may have read the same state
                {"_id": "race"},
                {
                    "$set": {
                        "holder": f"c{i}/{n}",
                        "token": token,
                        "expiresAt": now + timedelta(0, 5),
                    }
                },
                upsert=True,
            )
            ref.granted(token)
            coll.find_one({"_id": "race"})  # one round trip of "work" while holding
            ref.stopped()
            coll.update_one({"_id": "race"}, {"$set": {"holder": None}})
    client.close()


def _contention(worker: Callable[[str, str, int, _Referee, float], None], url: str) -> Doc:
    ref = _Referee()
    end = time.monotonic() + CONTEND_SECONDS
    db = f"bench_{worker.__name__.strip('_')}"
    threads = [
        threading.Thread(target=worker, args=(url, db, i, ref, end)) for i in range(CONTENDERS)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {
        "acquisitions_per_s": round(ref.grants / CONTEND_SECONDS, 1),
        "grants": ref.grants,
        "double_grants": ref.double,
        "duplicate_tokens": ref.duplicate_tokens,
    }


def _handover(url: str, rounds: int = 10) -> list[float]:
    backends = [MongoLeaseBackend(url, database="bench_handover") for _ in range(2)]
    elected = [threading.Event(), threading.Event()]
    anyone = threading.Event()

    def on_elected(i: int) -> Callable[[Any], None]:
        def fire(_ld: Any) -> None:
            elected[i].set()
            anyone.set()

        return fire

    electors = [
        Elector(
            b,
            "handover",
            identity=f"e{i}",
            ttl=3,
            retry_interval=1.0,
            cooldown=0.2,
            on_elected=on_elected(i),
        )
        for i, b in enumerate(backends)
    ]
    for e in electors:
        e.start()
    samples = []
    try:
        for _ in range(rounds + 1):
            anyone.wait(10)
            leader = 0 if electors[0].is_leader else 1
            successor = 1 - leader
            elected[successor].clear()
            # Let the last leader's cooldown (0.2 s) pass: it is back in wait_for_release.
            elected[successor].wait(0.5)
            start = time.monotonic()
            electors[leader].rotate()
            if elected[successor].wait(10):
                samples.append(time.monotonic() - start)
    finally:
        for e in electors:
            e.stop()
        for b in backends:
            b.close()
    return samples[1:]  # the first round also pays the change stream's first open


def _takeover(url: str, rounds: int = 5, ttl: float = 1.0) -> list[float]:
    """A holder that never renews -> a follower ``Elector`` (the default ``retry_interval``,
    2 s) elected: it contends again at the expiry the store reported."""
    samples = []
    with (
        MongoLeaseBackend(url, database="bench_takeover") as crashed,
        MongoLeaseBackend(url, database="bench_takeover") as successor,
    ):
        for i in range(rounds):
            elected = threading.Event()
            start = time.monotonic()
            assert crashed.try_acquire("takeover", f"crashed/{i}", ttl) is not None
            follower = Elector(successor, "takeover", identity=f"next{i}", ttl=ttl)
            follower.subscribe(on_elected=lambda _ld, e=elected: e.set())
            follower.start()
            try:
                if not elected.wait(10):
                    raise TimeoutError("the follower did not take over")
                samples.append(time.monotonic() - start)
            finally:
                follower.stop(release=True)
    return samples


def main() -> dict[str, Any]:
    logger.disable("singleton")
    try:
        with MongoServer() as server:
            url = server.url
            with MongoLeaseBackend(url, database="bench_latency") as backend:
                lease = backend.try_acquire("lat", "a/1", 30)
                assert lease is not None
                acquire = _timed(lambda: backend.try_acquire("lat", "a/1", 30), 300)
                renew = _timed(lambda: backend.renew(lease), 300)
            atomic = _contention(_atomic, url)
            naive = _contention(_find_then_update, url)
            handover = _handover(url)
            takeover = _takeover(url)
    finally:
        logger.enable("singleton")
    return {
        "server": "SecantusDB (embedded, single node)",
        "acquire_existing": _pct(acquire),
        "renew": _pct(renew),
        "contenders": CONTENDERS,
        "contention_seconds": CONTEND_SECONDS,
        "atomic_find_one_and_update": atomic,
        "find_then_update_baseline": naive,
        "planned_handover": {**_pct(handover), "runs": len(handover), "retry_interval_s": 1.0},
        "crash_takeover": {
            **_pct(takeover),
            "runs": len(takeover),
            "ttl_s": 1.0,
            "retry_s": 2.0,
            "goal_ms": 1100,
        },
    }


if __name__ == "__main__":
    print(json.dumps(main(), indent=2))
