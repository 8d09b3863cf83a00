"""Shared pieces of the asyncio tests: the async backends on the session's real servers, and the
thread backend on the very same keys."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

import pytest

from singleton.aio import AsyncLeases, AsyncMongoLeaseBackend, AsyncRedisLeaseBackend
from singleton.lease.contract import LeaseBackend
from singleton.lease.mongo import MongoLeaseBackend
from singleton.lease.redis import RedisLeaseBackend

KINDS = ("redis", "mongo")
T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T], timeout: float = 60.0) -> T:
    """Run one test's coroutine on a fresh loop, bounded."""

    async def bounded() -> T:
        return await asyncio.wait_for(coro, timeout)

    return asyncio.run(bounded())


def url_of(kind: str, request: pytest.FixtureRequest) -> str:
    return str(request.getfixturevalue("redis_url" if kind == "redis" else "mongo_url"))


def make_async(kind: str, url: str, unique: str, **options: Any) -> AsyncLeases:
    """An asyncio backend of ``kind`` on keys of its own (namespace / database ``t<unique>``)."""
    if kind == "redis":
        return AsyncRedisLeaseBackend(url, namespace=f"t{unique}", **options)
    return AsyncMongoLeaseBackend(url, database=f"t{unique}", **options)


def make_thread(kind: str, url: str, unique: str) -> LeaseBackend:
    """The thread backend on the same keys as :func:`make_async`'s."""
    if kind == "redis":
        return RedisLeaseBackend(url, namespace=f"t{unique}")
    return MongoLeaseBackend(url, database=f"t{unique}")


async def eventually(
    predicate: Callable[[], Awaitable[bool]], timeout: float, what: str, interval: float = 0.02
) -> None:
    """Poll another process's state (a store we can only ask) until ``predicate``, bounded."""
    deadline = time.monotonic() + timeout
    while not await predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout}s")
        await asyncio.sleep(interval)
