"""AsyncListenerRunner on real servers (SecantusDB streams and stores checkpoints, redis-server
holds the lease): an ``async def handle_batch`` on the application's loop receives every event,
checkpoints, and a successor resumes exactly where a stopped leader handed over; a batch still
running when its tenure ends is cancelled on the loop and replayed by the successor."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Sequence
from typing import Any

import pymongo

from listeners.aio import AsyncListenerRunner
from listeners.base import ChangeEvent, ChangeStreamListener, ListenerContext
from listeners.deadletters import DeadLetterStore
from singleton.election.elector import Elector
from singleton.lease.redis import RedisLeaseBackend
from tests.integration.aio.support import run
from tests.integration.listener_support import RecordingStore, key, now, reference


class AsyncRecorder(ChangeStreamListener):
    """Records every event it handles, on the loop, with the token that handled it."""

    batch_size = 20
    max_batch_wait = 0.05

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.handled: list[tuple[str, int]] = []
        self.threads: set[int] = set()
        self.changed = asyncio.Event()
        self.stall: asyncio.Event | None = None  # set: batches wait for it
        self.cancelled = 0

    async def handle_batch(  # type: ignore[override]
        self, events: Sequence[ChangeEvent], ctx: ListenerContext
    ) -> int | None:
        ctx.check()
        self.threads.add(threading.get_ident())
        if self.stall is not None:
            try:
                await self.stall.wait()
            except asyncio.CancelledError:
                self.cancelled += 1
                raise
        await asyncio.sleep(0)  # a real sink awaits its I/O here
        self.handled.extend((key(e), ctx.token) for e in events)
        self.changed.set()
        return None

    def keys(self) -> list[str]:
        return [k for k, _ in self.handled]


async def until(listener: AsyncRecorder, done: Callable[[], bool], timeout: float = 20) -> None:
    async def wait() -> None:
        while not done():
            listener.changed.clear()
            await listener.changed.wait()

    await asyncio.wait_for(wait(), timeout)


async def streaming(runner: AsyncListenerRunner, timeout: float = 20) -> None:
    """Until the runner's tenure streams (its state lives on the runner's threads: polled)."""
    for _ in range(int(timeout / 0.02)):
        if runner.is_leader and runner.status().state == "streaming":
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"not streaming within {timeout}s: {runner.status()}")


class World:
    def __init__(self, mongo_url: str, redis_url: str, unique: str) -> None:
        self.mongo_url, self.redis_url, self.db = mongo_url, redis_url, f"t{unique}"
        self.client: pymongo.MongoClient[dict[str, Any]] = pymongo.MongoClient(
            mongo_url, tz_aware=True
        )
        self.store = RecordingStore(self.client, database=self.db)
        self.made: list[Any] = []

    def runner(self, identity: str, listener: AsyncRecorder) -> AsyncListenerRunner:
        backend = RedisLeaseBackend(self.redis_url, namespace=self.db)
        self.made.append(backend)
        elector = Elector(
            backend,
            listener.lease_name,
            identity=identity,
            ttl=1.0,
            retry_interval=0.1,
            release_timeout=0.55,
        )
        return AsyncListenerRunner(
            listener,
            elector,
            self.client,
            checkpoints=self.store,
            dead_letters=DeadLetterStore(self.client, database=self.db),
            max_await_time=0.1,
            standby_interval=None,
            idle_checkpoint_interval=0.3,
        )

    def listener(self) -> AsyncRecorder:
        return AsyncRecorder(database=self.db, collection="orders")

    async def insert(self, prefix: str, n: int) -> None:
        docs = [{"_id": f"{prefix}{i}", "n": i} for i in range(n)]
        await asyncio.to_thread(self.client[self.db]["orders"].insert_many, docs)

    def close(self) -> None:
        for b in self.made:
            b.close()
        self.client.close()


def test_an_async_listener_gets_every_event_and_its_successor_resumes_where_it_stopped(
    mongo_url: str, redis_url: str, unique: str
) -> None:
    world = World(mongo_url, redis_url, unique)
    since = now(world.client)
    a_listener, b_listener = world.listener(), world.listener()

    async def scenario() -> int:
        loop_thread = threading.get_ident()
        a = await world.runner("a", a_listener).start()
        await streaming(a)
        await world.insert("x", 45)
        await until(a_listener, lambda: len(a_listener.handled) >= 45)
        await a.stop()  # drains, checkpoints what was handled, releases
        await world.insert("y", 25)
        b = await world.runner("b", b_listener).start()
        await streaming(b)
        await until(b_listener, lambda: len(b_listener.handled) >= 25)
        await b.stop()
        assert a_listener.threads == {loop_thread} == b_listener.threads
        return loop_thread

    try:
        run(scenario())
        expected = reference(world.client[world.db]["orders"], since, until_count=70)
        assert a_listener.keys() + b_listener.keys() == expected  # all, in order, once each
        assert len(a_listener.keys()) == 45
        a_tokens = {t for _, t in a_listener.handled}
        b_tokens = {t for _, t in b_listener.handled}
        assert len(a_tokens) == 1 and len(b_tokens) == 1 and min(b_tokens) > max(a_tokens)
        assert world.store.accepted, "no checkpoint was saved"
        assert {c.fencing_token for c in world.store.accepted} >= a_tokens | b_tokens
    finally:
        world.close()


def test_a_batch_running_when_its_tenure_ends_is_cancelled_and_replayed_by_the_successor(
    mongo_url: str, redis_url: str, unique: str
) -> None:
    world = World(mongo_url, redis_url, unique)
    since = now(world.client)
    a_listener, b_listener = world.listener(), world.listener()

    async def scenario() -> None:
        a_listener.stall = asyncio.Event()  # A's sink never answers
        a = await world.runner("a", a_listener).start()
        await streaming(a)
        await world.insert("x", 10)
        while a_listener.threads == set():  # A's first batch is in hand (polled: it stalls)
            await asyncio.sleep(0.01)
        await a.stop()  # the drain waits for it at most drain_timeout, then A lets go
        assert a_listener.cancelled == 1 and a_listener.handled == []
        b = await world.runner("b", b_listener).start()
        await until(b_listener, lambda: len(b_listener.handled) >= 10)
        await b.stop()

    try:
        run(scenario())
        expected = reference(world.client[world.db]["orders"], since, until_count=10)
        assert b_listener.keys() == expected
    finally:
        world.close()
