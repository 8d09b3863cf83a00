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
import pytest

from listeners.aio import AsyncListenerRunner
from listeners.base import ChangeEvent, ChangeStreamListener, ListenerContext
from listeners.deadletters import DeadLetterStore
from singleton.election.elector import Elector
from singleton.errors import ConfigurationError
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


class AsyncHooks(AsyncRecorder):
    """Every hook an ``async def``; each records, on the loop, that it ran and on which thread.
    A document ``_id`` "poison" is refused: it must become a dead letter, alone."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.ran: list[str] = []
        self.ids: list[str] = []
        self.in_flight = False  # set: batches stay unacknowledged until flush()
        self.unacknowledged = 0

    def _ran(self, hook: str) -> None:
        self.threads.add(threading.get_ident())
        self.ran.append(hook)
        self.changed.set()

    async def handle_batch(  # type: ignore[override]
        self, events: Sequence[ChangeEvent], ctx: ListenerContext
    ) -> int | None:
        await asyncio.sleep(0)
        if any(e["documentKey"]["_id"] == "poison" for e in events):
            raise ValueError("this sink refuses the poison document")
        await super().handle_batch(events, ctx)
        self.ids.extend(e["documentKey"]["_id"] for e in events)
        if not self.in_flight:
            return None
        self.unacknowledged += len(events)
        return 0  # acknowledged by flush()

    async def flush(self, deadline: float | None, ctx: ListenerContext) -> int | None:  # type: ignore[override]
        await asyncio.sleep(0)
        self._ran("flush")
        done, self.unacknowledged = self.unacknowledged, 0
        return done

    async def on_start(self, ctx: ListenerContext) -> None:  # type: ignore[override]
        await asyncio.sleep(0)
        self._ran("on_start")

    async def initial_sync(self, ctx: ListenerContext) -> None:  # type: ignore[override]
        await asyncio.sleep(0)
        ctx.check()
        self._ran("initial_sync")

    async def on_idle(self, ctx: ListenerContext) -> None:  # type: ignore[override]
        await asyncio.sleep(0)
        if "on_idle" not in self.ran:
            self._ran("on_idle")

    async def on_stop(self, ctx: ListenerContext, reason: Any) -> None:  # type: ignore[override]
        await asyncio.sleep(0)
        self._ran(f"on_stop:{reason.value if hasattr(reason, 'value') else reason}")


def test_every_hook_may_be_a_coroutine_and_a_poison_event_is_a_dead_letter(
    mongo_url: str, redis_url: str, unique: str
) -> None:
    """on_start, initial_sync, on_idle, flush, on_stop as ``async def``: each is awaited on the
    application's loop (not merely called: the record is made after an ``await``); an event
    that ``handle_batch`` refuses alone is dead-lettered and the others are delivered."""
    world = World(mongo_url, redis_url, unique)
    listener = AsyncHooks(database=world.db, collection="orders")

    async def scenario() -> int:
        loop_thread = threading.get_ident()
        a = await world.runner("a", listener).start()
        await until(listener, lambda: "on_idle" in listener.ran)
        docs = [{"_id": f"d{i}"} for i in range(5)] + [{"_id": "poison"}]
        docs += [{"_id": f"e{i}"} for i in range(5)]
        await asyncio.to_thread(world.client[world.db]["orders"].insert_many, docs)
        await until(listener, lambda: len(listener.handled) >= 10)
        await a.stop()
        return loop_thread

    try:
        loop_thread = run(scenario())
        assert listener.threads == {loop_thread}
        assert listener.ran[:2] == ["on_start", "initial_sync"], listener.ran
        assert "on_idle" in listener.ran, listener.ran
        assert listener.ran[-1].startswith("on_stop:"), listener.ran
        assert sorted(listener.ids) == sorted(
            [f"d{i}" for i in range(5)] + [f"e{i}" for i in range(5)]
        )
        letters = DeadLetterStore(world.client, database=world.db).letters(listener.lease_name)
        assert [letter["event"]["documentKey"]["_id"] for letter in letters] == ["poison"], letters
    finally:
        world.close()


def test_a_method_the_runner_reads_for_a_value_may_not_be_a_coroutine(
    mongo_url: str, redis_url: str, unique: str
) -> None:
    class Wrong(AsyncRecorder):
        async def sink_identity(self) -> str:  # type: ignore[override]
            return "nowhere"

    world = World(mongo_url, redis_url, unique)
    try:
        with pytest.raises(ConfigurationError, match=r"Wrong\.sink_identity is async def"):
            world.runner("a", Wrong(database=world.db, collection="orders"))
    finally:
        world.close()


def test_an_async_flush_acknowledges_what_handle_batch_left_in_flight(
    mongo_url: str, redis_url: str, unique: str
) -> None:
    """handle_batch answers 0 (all in flight); the runner awaits the ``async def flush`` before
    it checkpoints, and the successor resumes after the last flushed event: nothing twice."""
    world = World(mongo_url, redis_url, unique)
    since = now(world.client)
    a_listener = AsyncHooks(database=world.db, collection="orders")
    b_listener = AsyncHooks(database=world.db, collection="orders")
    a_listener.in_flight = True

    async def scenario() -> None:
        a = await world.runner("a", a_listener).start()
        await streaming(a)
        await world.insert("x", 30)
        await until(a_listener, lambda: len(a_listener.handled) >= 30)
        await until(a_listener, lambda: a_listener.unacknowledged == 0)
        await a.stop()
        await world.insert("y", 5)
        b = await world.runner("b", b_listener).start()
        await until(b_listener, lambda: len(b_listener.handled) >= 5)
        await b.stop()

    try:
        run(scenario())
        assert "flush" in a_listener.ran, a_listener.ran
        expected = reference(world.client[world.db]["orders"], since, until_count=35)
        assert a_listener.keys() + b_listener.keys() == expected
    finally:
        world.close()
