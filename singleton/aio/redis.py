"""Fenced leases on Redis for asyncio (``redis.asyncio``): the thread backend's Lua scripts, keys
and answer parsing (:mod:`singleton.lease.redis`), sent from coroutines.

Failure model: that of :mod:`singleton.lease.redis` (Redis expires keys by its own clock; a lost
or late reply is an unknown outcome and raises ``BackendUnavailableError``; the pub/sub
subscription only shortens waits). Every call is bounded by the socket timeouts and awaits, so
the event loop never blocks on the store.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import redis
import redis.asyncio as aioredis
import redis.exceptions as rex
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel
from redis.backoff import NoBackoff

from singleton.aio.leases import AsyncReleaseFeed, AsyncServerLeases
from singleton.drivers.redis import checked_url
from singleton.errors import ConfigurationError
from singleton.lease.leases import Lease, LeaseState, validate_lease_args
from singleton.lease.redis import (
    ACQUIRE,
    DEFAULT_TIMEOUT,
    HEALTH_INTERVAL,
    INSPECT,
    POLL,
    RELEASE,
    RENEW,
    TokenFloor,
    _ms,
    _text,
    check_options,
    contended,
    fence_key,
    inspected,
    lease_key,
    lease_value,
    publish_refused_warning,
    translate,
)
from singleton.redact import redact, redact_refused


def _driver_options() -> dict[str, Any]:
    """What redis-py sends in ``CLIENT SETINFO``, given rather than looked up: without it every
    new connection reads the package's metadata from disk (``importlib.metadata``), 1 to 25 ms
    of blocking on the loop each time (redis-py 5 to 8)."""
    try:
        from redis.driver_info import DriverInfo  # (redis-py >= 7.1; lib_version is deprecated)
    except ImportError:
        return {"lib_version": redis.__version__}
    return {"driver_info": DriverInfo(lib_version=redis.__version__)}


def async_client_from_url(url: str, **options: Any) -> aioredis.Redis:
    """An asyncio client for ``url``: the URLs :func:`singleton.drivers.redis.client_from_url`
    accepts (checked by the same code), ``redis+sentinel://`` included. Connects to nothing."""
    options = {**_driver_options(), **options}
    parts = checked_url(url)
    if parts is None:
        try:
            return aioredis.Redis.from_url(url, **options)
        except (ValueError, TypeError, rex.RedisError) as exc:
            why = redact(str(exc))
            raise ConfigurationError(f"invalid Redis URL {redact_refused(url)}: {why}") from None
    sentinel_kwargs = {k: v for k, v in options.items() if k.startswith("socket_")}
    sentinel_kwargs.update(_driver_options())
    sentinel_kwargs.update(parts.sentinel_kwargs())
    sentinel_kwargs["retry"] = Retry(NoBackoff(), 0)  # a silent Sentinel: ask the next one
    sentinel = Sentinel(parts.sentinels, sentinel_kwargs=sentinel_kwargs)  # type: ignore[no-untyped-call, unused-ignore]
    client: aioredis.Redis = sentinel.master_for(
        parts.service_name, **{**parts.master_kwargs(), **options}
    )
    return client


class AsyncRedisLeaseBackend(AsyncServerLeases):
    """Leases on Redis, awaited. Pass a ``redis.asyncio.Redis`` client (never closed here) or a
    URL (the client built from it has the thread backend's bounded timeouts and immediate
    retries, and is closed by :meth:`aclose`); the options are
    :class:`~singleton.lease.redis.RedisLeaseBackend`'s."""

    def __init__(
        self,
        client_or_url: aioredis.Redis | str,
        namespace: str = "singleton",
        *,
        socket_timeout: float = DEFAULT_TIMEOUT,
        socket_connect_timeout: float = DEFAULT_TIMEOUT,
        retries: int = 1,
    ) -> None:
        check_options(namespace, socket_timeout, socket_connect_timeout)
        self.namespace = namespace
        self._owned = isinstance(client_or_url, str)
        if isinstance(client_or_url, str):
            self._url = redact(client_or_url)
            self._client = async_client_from_url(
                client_or_url,
                socket_timeout=socket_timeout,
                socket_connect_timeout=socket_connect_timeout,
                socket_keepalive=True,
                retry=Retry(NoBackoff(), retries),
            )
        elif isinstance(client_or_url, aioredis.Redis):
            self._client = client_or_url
            kw = client_or_url.connection_pool.connection_kwargs
            self._url = f"redis://{kw.get('host', 'localhost')}:{kw.get('port', 6379)}"
        else:
            raise ConfigurationError(
                f"expected a redis.asyncio.Redis client or a URL string,"
                f" got {type(client_or_url)!r}"
            )
        self._channel = f"{namespace}:released"
        self._publish_refused = False
        self._acquire = self._client.register_script(ACQUIRE)
        self._floor = TokenFloor()
        self._renew = self._client.register_script(RENEW)
        self._release = self._client.register_script(RELEASE)
        self._inspect = self._client.register_script(INSPECT)
        self._releases = AsyncReleaseFeed(
            f"release subscription {self._url} channel={self._channel}",
            self._subscription,
            (rex.RedisError, OSError, ValueError),
            open_timeout=DEFAULT_TIMEOUT,
        )

    async def contend(self, name: str, holder: str, ttl: float) -> Lease | LeaseState | None:
        validate_lease_args(name, holder, ttl)
        with self._translate("acquire", name):
            reply = await self._acquire(
                keys=[lease_key(self.namespace, name), fence_key(self.namespace, name)],
                args=[holder, _ms(ttl), self._floor.of(name)],
            )
        answer = contended(name, holder, ttl, reply)
        self._floor.saw(name, answer.token)
        return answer

    async def renew(self, lease: Lease, ttl: float | None = None) -> Lease | None:
        ttl = lease.ttl if ttl is None else ttl
        validate_lease_args(lease.name, lease.holder, ttl)
        with self._translate("renew", lease.name):
            ok = await self._renew(
                keys=[lease_key(self.namespace, lease.name)], args=[lease_value(lease), _ms(ttl)]
            )
        return Lease(lease.name, lease.holder, lease.token, ttl) if int(ok) == 1 else None

    async def release(self, lease: Lease) -> bool:
        validate_lease_args(lease.name, lease.holder)
        with self._translate("release", lease.name):
            reply = await self._release(
                keys=[lease_key(self.namespace, lease.name)],
                args=[lease_value(lease), self._channel, lease.name],
            )
        if int(reply[0]) == 2 and not self._publish_refused:
            self._publish_refused = True
            publish_refused_warning(self._url, self._channel, reply)
        return int(reply[0]) != 0

    async def inspect(self, name: str) -> LeaseState | None:
        validate_lease_args(name)
        with self._translate("inspect", name):
            reply = await self._inspect(keys=[lease_key(self.namespace, name)])
        return inspected(name, reply)

    def describe(self) -> str:
        return f"redis {self._url} namespace={self.namespace}"

    async def aclose(self) -> None:
        await self._releases.close()
        if self._owned:
            with contextlib.suppress(rex.RedisError, OSError):
                await self._client.aclose()

    async def _subscription(self) -> None:
        pubsub = self._client.pubsub(ignore_subscribe_messages=False)
        try:
            await pubsub.subscribe(self._channel)
            loop = asyncio.get_running_loop()
            heard, pinged = loop.time(), False
            while not self._releases.closed:
                message: Any = await pubsub.get_message(timeout=POLL)
                now = loop.time()
                if message is None:  # a silent link may be dead: ping it, then give up on it
                    silent = now - heard
                    if silent > HEALTH_INTERVAL and not pinged:
                        await pubsub.ping()
                        pinged = True
                    elif silent > HEALTH_INTERVAL + DEFAULT_TIMEOUT and pinged:
                        raise rex.TimeoutError(f"no answer to PING on {self._channel}")
                    continue
                heard, pinged = now, False
                kind = _text(message.get("type"))
                if kind == "subscribe":
                    self._releases.opened()
                elif kind == "message":
                    self._releases.notify(_text(message["data"]))
        finally:
            with contextlib.suppress(Exception):
                await pubsub.aclose()  # type: ignore[no-untyped-call, unused-ignore]

    def _translate(self, op: str, name: str) -> contextlib.AbstractContextManager[None]:
        return translate(f"redis {op} of lease {name!r} on {self._url}")
