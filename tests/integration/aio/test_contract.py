"""The lease contract (singleton/lease/leases.py), awaited: both asyncio backends on real servers
(redis-server, SecantusDB), and each against its thread twin on the same keys, which proves that
they share the scripts and documents rather than copies of them."""

from __future__ import annotations

import asyncio
import time

import pytest

from singleton.aio import AsyncLeases, AsyncMongoLeaseBackend, AsyncRedisLeaseBackend
from singleton.errors import BackendUnavailableError, ConfigurationError
from singleton.lease.leases import Lease, LeaseState
from singleton.service.dev.ports import free_port
from tests.integration.aio.support import KINDS, make_async, make_thread, run, url_of

TTL = 5.0
SHORT = 0.3


@pytest.fixture(params=KINDS)
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def url(kind: str, request: pytest.FixtureRequest) -> str:
    return url_of(kind, request)


async def acquire(b: AsyncLeases, name: str, holder: str, ttl: float = TTL) -> Lease:
    lease = await b.try_acquire(name, holder, ttl)
    assert lease is not None, f"{holder} could not acquire free lease {name}"
    return lease


async def wipe(b: AsyncLeases) -> None:
    """The store forgets everything, fencing counters too (FLUSHALL / a dropped collection)."""
    if isinstance(b, AsyncRedisLeaseBackend):
        await b._client.flushall()
    else:
        assert isinstance(b, AsyncMongoLeaseBackend)
        await b._client[b.database].drop_collection(b.collection)


def test_mutual_exclusion_and_the_refusal_says_who_holds_it(
    kind: str, url: str, unique: str
) -> None:
    async def scenario() -> None:
        async with make_async(kind, url, unique) as b:
            lease = await acquire(b, "job", "a/1")
            assert await b.try_acquire("job", "b/1", TTL) is None
            state = await b.contend("job", "b/1", TTL)
            assert isinstance(state, LeaseState)
            assert (state.holder, state.token) == ("a/1", lease.token)
            assert 0 < state.ttl_remaining <= TTL
            again = await b.contend("job", "a/1", TTL)  # the holder's own: kept token
            assert isinstance(again, Lease) and again.token == lease.token
            seen = await b.inspect("job")
            assert seen is not None and seen.holder == "a/1"

    run(scenario())


def test_tokens_grow_across_release_expiry_and_losing_the_store(
    kind: str, url: str, unique: str
) -> None:
    async def scenario() -> None:
        async with make_async(kind, url, unique) as b:
            first = await acquire(b, "job", "a/1", SHORT)
            deadline = time.monotonic() + 10
            while await b.inspect("job") is not None:  # the server lets it expire
                assert time.monotonic() < deadline
                await asyncio.sleep(0.05)
            second = await acquire(b, "job", "b/1")
            assert second.token > first.token
            assert await b.release(second)
            third = await acquire(b, "job", "a/2")
            assert third.token > second.token
            await wipe(b)
            fourth = await acquire(b, "job", "c/1")
            assert fourth.token > third.token

    run(scenario())


def test_only_the_holder_with_its_token_renews_or_releases(
    kind: str, url: str, unique: str
) -> None:
    async def scenario() -> None:
        async with make_async(kind, url, unique) as b:
            lease = await acquire(b, "job", "a/1")
            stranger = Lease("job", "b/1", lease.token, TTL)
            stale = Lease("job", "a/1", lease.token - 1, TTL)
            for other in (stranger, stale):
                assert await b.renew(other) is None
                assert await b.release(other) is False
            renewed = await b.renew(lease, TTL)
            assert renewed is not None and renewed.token == lease.token
            assert await b.release(lease)
            assert await b.renew(lease) is None
            assert await b.release(lease) is False

    run(scenario())


def test_a_release_wakes_a_waiter_on_another_backend_and_moves_the_mark(
    kind: str, url: str, unique: str
) -> None:
    async def scenario() -> None:
        async with make_async(kind, url, unique) as holder, make_async(kind, url, unique) as w:
            lease = await acquire(holder, "job", "a/1")
            assert await w.wait_for_release("job", SHORT) is False  # opens the feed; times out
            mark = w.release_mark("job")
            waiting = asyncio.ensure_future(w.wait_for_release("job", 10))
            await asyncio.sleep(0.05)  # let the waiter register; the release must still wake it
            start = time.monotonic()
            assert await holder.release(lease)
            assert await waiting is True
            assert time.monotonic() - start < 1.0
            assert w.release_mark("job") > mark
            # A release seen after the mark ends a later wait at once; an unmoved one waits.
            assert await w.wait_for_release("job", 10, since=mark) is True
            assert await w.wait_for_release("job", SHORT, since=w.release_mark("job")) is False
            wake = asyncio.Event()
            wake.set()
            assert await w.wait_for_release("job", 10, wake=wake) is False

    run(scenario())


def test_the_async_and_thread_backends_share_the_same_leases(
    kind: str, url: str, unique: str
) -> None:
    thread = make_thread(kind, url, unique)

    async def scenario() -> None:
        async with make_async(kind, url, unique) as b:
            lease = await acquire(b, "job", "async/1")
            assert thread.try_acquire("job", "thread/1", TTL) is None
            state = thread.inspect("job")
            assert state is not None and (state.holder, state.token) == ("async/1", lease.token)
            assert thread.renew(lease) is not None  # same value, same key, same document
            assert await b.release(lease)
            other = thread.try_acquire("job", "thread/1", TTL)
            assert other is not None and other.token > lease.token
            assert await b.renew(other) is not None

    try:
        run(scenario())
    finally:
        thread.close()


def test_bad_arguments_and_urls_are_refused_before_any_io(kind: str, unique: str) -> None:
    port = free_port()
    dead = (
        f"redis://user:hunter2@127.0.0.1:{port}/0"
        if kind == "redis"
        else f"mongodb://user:hunter2@127.0.0.1:{port}/"
    )

    async def scenario() -> None:
        async with make_async(kind, dead, unique) as b:
            with pytest.raises(ConfigurationError, match="ttl"):
                await b.contend("job", "a/1", 0)
            with pytest.raises(ConfigurationError, match="lease name"):
                await b.inspect("")
        with pytest.raises(ConfigurationError) as caught:
            make_async(kind, dead.replace("hunter2", "hun\nter2"), unique)
        assert "hunter2" not in str(caught.value) and "hun" not in str(caught.value)
        option = {"socket_timeout": 0} if kind == "redis" else {"timeout": 0}
        with pytest.raises(ConfigurationError, match="timeout must be a positive number"):
            make_async(kind, dead, unique, **option)

    run(scenario())


def test_an_unreachable_store_is_an_unknown_outcome_never_a_guess(kind: str, unique: str) -> None:
    port = free_port()
    fast = {"socket_timeout": 0.3, "socket_connect_timeout": 0.3} if kind == "redis" else {}
    options = fast if kind == "redis" else {"timeout": 0.5}
    url = (
        f"redis://:hunter2@127.0.0.1:{port}/0"
        if kind == "redis"
        else f"mongodb://u:hunter2@127.0.0.1:{port}/?serverSelectionTimeoutMS=300"
    )

    async def scenario() -> None:
        async with make_async(kind, url, unique, **options) as b:
            for call in (b.contend("job", "a/1", TTL), b.renew(Lease("job", "a/1", 1, TTL))):
                with pytest.raises(BackendUnavailableError) as caught:
                    await call
                assert "hunter2" not in str(caught.value)

    run(scenario())


def test_a_client_passed_in_is_not_closed(kind: str, url: str, unique: str) -> None:
    async def scenario() -> None:
        if kind == "redis":
            import redis.asyncio as aioredis

            rc = aioredis.Redis.from_url(url)
            async with AsyncRedisLeaseBackend(rc, namespace=f"t{unique}") as b:
                await acquire(b, "job", "a/1")
            assert await rc.ping()
            await rc.aclose()
        else:
            from pymongo import AsyncMongoClient

            mc: AsyncMongoClient[dict[str, object]] = AsyncMongoClient(url)
            async with AsyncMongoLeaseBackend(mc, database=f"t{unique}") as b:
                await acquire(b, "job", "a/1")
            assert (await mc.admin.command("ping"))["ok"] == 1
            await mc.close()

    run(scenario())
