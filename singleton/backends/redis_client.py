"""One place that turns a Redis URL into a client: the lease backend, the Redis checkpoint store
and the service's start-up checks all build theirs here, so they accept the same URLs.

* ``redis://``, ``rediss://`` (TLS), ``unix://``: redis-py's own ``Redis.from_url``.
* ``redis+sentinel://[[user]:password@]host:port[,host:port...]/<service_name>[/db]``: the
  master of ``service_name`` as the listed Sentinels report it (``Sentinel.master_for``). The
  password is the master's (Sentinels are asked without credentials); a port left out is 26379.

Failure model: a Sentinel-managed client asks the Sentinels for the master's address on every
new connection, and drops a connection that answers ``READONLY`` (a demoted master), so after a
failover the next call reaches the promoted replica. Calls in flight during the failover fail
(no Sentinel reachable, or no master yet, is ``MasterNotFoundError``, a connection error): the
callers translate that into ``BackendUnavailableError`` and retry on their own schedule. A
failover may lose the writes the replica had not received (replication is asynchronous).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

import redis
import redis.exceptions as rex
from redis.backoff import NoBackoff
from redis.retry import Retry
from redis.sentinel import Sentinel, SentinelConnectionPool

from singleton.errors import ConfigurationError
from singleton.redact import redact

SCHEMES = ("redis://", "rediss://", "unix://", "redis+sentinel://")
SENTINEL_SCHEME = "redis+sentinel://"
SENTINEL_PORT = 26379


@dataclass(frozen=True)
class SentinelURL:
    """The parts of a ``redis+sentinel://`` URL."""

    sentinels: list[tuple[str, int]]
    service_name: str
    db: int
    username: str | None = field(default=None, repr=False)
    password: str | None = field(default=None, repr=False)


def is_sentinel_url(url: str) -> bool:
    return url.startswith(SENTINEL_SCHEME)


def parse_sentinel_url(url: str) -> SentinelURL:
    """``redis+sentinel://[[user]:password@]host:port[,host:port...]/service[/db]``, or
    :class:`ConfigurationError` naming the (redacted) URL and what is wrong with it."""

    def bad(why: str) -> ConfigurationError:
        return ConfigurationError(f"invalid Redis Sentinel URL {redact(url)}: {why}")

    if not is_sentinel_url(url):
        raise bad(f"must start with {SENTINEL_SCHEME}")
    rest = url[len(SENTINEL_SCHEME) :]
    if "?" in rest or "#" in rest:
        raise bad("takes no query or fragment")
    netloc, slash, path = rest.partition("/")
    userinfo, at, hosts = netloc.rpartition("@")
    username = password = None
    if at:
        user, colon, secret = userinfo.partition(":")
        if colon:
            username, password = unquote(user) or None, unquote(secret) or None
        else:  # a bare userinfo is a user name, as redis-py reads redis://name@host
            username = unquote(user) or None
    sentinels = [_host_port(part, bad) for part in hosts.split(",")]
    parts = path.split("/") if slash else []
    if not parts or not parts[0]:
        raise bad("the master's service name is missing (.../<service_name>[/db])")
    if len(parts) > 2:
        raise bad("expected /<service_name>[/db] after the hosts")
    db = 0
    if len(parts) == 2 and parts[1] != "":
        if not parts[1].isdigit():
            raise bad(f"db must be a non-negative integer, got {parts[1]!r}")
        db = int(parts[1])
    return SentinelURL(sentinels, unquote(parts[0]), db, username, password)


def _host_port(part: str, bad: Any) -> tuple[str, int]:
    if part.startswith("["):  # [IPv6]:port
        host, bracket, port = part[1:].partition("]")
        if not bracket or (port and not port.startswith(":")):
            raise bad(f"bad Sentinel address {part!r}")
        port = port[1:]
    else:
        host, _, port = part.partition(":")
    if not host:
        raise bad(f"a Sentinel address has no host: {part!r}")
    if not port:
        return host, SENTINEL_PORT
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise bad(f"bad Sentinel port in {part!r}")
    return host, int(port)


def check_url(url: str) -> None:
    """Raise :class:`ConfigurationError` if ``url`` is no Redis URL this module can connect to;
    connects to nothing."""
    client_from_url(url).close()


def client_from_url(url: str, **options: Any) -> redis.Redis:
    """A client for ``url`` (see the module docstring); ``options`` are redis-py connection
    keywords (``socket_timeout``, ``retry``...) for the data connections. The ``socket_*`` ones
    also bound each call to a Sentinel, which is never retried: the next one is asked. Connects
    to nothing yet. The caller owns the client: its ``close()`` also closes the Sentinel
    connections."""
    if not isinstance(url, str) or not url.startswith(SCHEMES):
        raise ConfigurationError(f"not a Redis URL ({', '.join(SCHEMES)}): {redact(str(url))}")
    if is_sentinel_url(url):
        parts = parse_sentinel_url(url)
        sentinel_kwargs = {k: v for k, v in options.items() if k.startswith("socket_")}
        # A silent Sentinel is skipped for the next one at once: redis-py's default retries
        # (with backoff) per Sentinel would multiply into a lookup of many seconds.
        sentinel_kwargs["retry"] = Retry(NoBackoff(), 0)
        sentinel = Sentinel(  # type: ignore[no-untyped-call]
            parts.sentinels, sentinel_kwargs=sentinel_kwargs
        )
        client: redis.Redis = sentinel.master_for(  # type: ignore[no-untyped-call]
            parts.service_name,
            redis_class=SentinelMasterRedis,
            db=parts.db,
            username=parts.username,
            password=parts.password,
            **options,
        )
        return client
    try:
        return redis.Redis.from_url(url, **options)
    except (ValueError, TypeError, rex.RedisError) as exc:
        raise ConfigurationError(f"invalid Redis URL {redact(url)}: {redact(str(exc))}") from None


class SentinelMasterRedis(redis.Redis):
    """The master of a Sentinel service; ``close()`` also closes the Sentinel clients."""

    def close(self) -> None:
        try:
            super().close()
        finally:
            pool = self.connection_pool
            if isinstance(pool, SentinelConnectionPool):
                for sentinel in pool.sentinel_manager.sentinels:  # Sentinel.close() is redis 6+
                    with contextlib.suppress(rex.RedisError, OSError):
                        sentinel.close()


def describe_client(client: redis.Redis) -> str:
    """Where a caller's client points, as a URL without credentials."""
    pool = client.connection_pool
    if isinstance(pool, SentinelConnectionPool):
        hosts = ",".join(
            "{host}:{port}".format_map(s.connection_pool.connection_kwargs)
            for s in pool.sentinel_manager.sentinels
        )
        db = pool.connection_kwargs.get("db", 0)
        return f"{SENTINEL_SCHEME}{hosts}/{pool.service_name}/{db}"
    kw = pool.connection_kwargs
    if "path" in kw:
        return f"unix://{kw['path']}"
    return f"redis://{kw.get('host', 'localhost')}:{kw.get('port', 6379)}/{kw.get('db', 0)}"
