"""One place that turns a Redis URL into a client: the lease backend, the Redis checkpoint store
and the service's start-up checks all build theirs here, so they accept the same URLs.

* ``redis://``, ``rediss://`` (TLS), ``unix://``: redis-py's own ``Redis.from_url``.
* ``redis+sentinel://[[user]:password@]host:port[,host:port...]/<service_name>[/db][?query]``:
  the master of ``service_name`` as the listed Sentinels report it (``Sentinel.master_for``). The
  userinfo is the master's; the Sentinels' own credentials, when they require some, are the
  query's ``sentinel_username`` / ``sentinel_password`` (without them the Sentinels are asked
  without credentials). A port left out is 26379.
* ``rediss+sentinel://...``: the same over TLS, to the Sentinels and to the master alike (a TLS
  deployment serves both on its TLS ports), with redis-py's ``rediss://`` options in the query:
  ``ssl_ca_certs``, ``ssl_certfile``, ``ssl_keyfile``, ``ssl_cert_reqs``
  (``none|optional|required``) and ``ssl_check_hostname`` (``true|false``).

Failure model: a Sentinel-managed client asks the Sentinels for the master's address on every
new connection, and drops a connection that answers ``READONLY`` (a demoted master), so after a
failover the next call reaches the promoted replica. Calls in flight during the failover fail
(no Sentinel reachable, or no master yet, is ``MasterNotFoundError``, a connection error): the
callers translate that into ``BackendUnavailableError`` and retry on their own schedule. A
failover may lose the writes the replica had not received (replication is asynchronous).
"""

from __future__ import annotations

import contextlib
import difflib
import functools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, unquote_plus

import redis
import redis.exceptions as rex
from redis.backoff import NoBackoff
from redis.connection import SSLConnection
from redis.retry import Retry
from redis.sentinel import MasterNotFoundError, Sentinel, SentinelConnectionPool

from singleton.errors import ConfigurationError
from singleton.redact import (
    PERCENT_ENCODE,
    cut_short,
    is_secret_parameter,
    redact,
    redact_refused,
    refuse_control_characters,
    userinfo_cut_short,
)

SENTINEL_SCHEME = "redis+sentinel://"
SENTINEL_TLS_SCHEME = "rediss+sentinel://"
SCHEMES = ("redis://", "rediss://", "unix://", SENTINEL_SCHEME, SENTINEL_TLS_SCHEME)
SENTINEL_PORT = 26379
#: The query parameters of a Sentinel URL: the Sentinels' credentials, then the TLS options
#: (``rediss+sentinel://`` only).
_SENTINEL_AUTH = ("sentinel_username", "sentinel_password")
_TLS_OPTIONS = (
    "ssl_ca_certs",
    "ssl_certfile",
    "ssl_keyfile",
    "ssl_cert_reqs",
    "ssl_check_hostname",
)
_CERT_REQS = ("none", "optional", "required")
_BOOLS = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}


@dataclass(frozen=True)
class SentinelURL:
    """The parts of a ``redis+sentinel://`` URL."""

    sentinels: list[tuple[str, int]]
    service_name: str
    db: int
    username: str | None = field(default=None, repr=False)
    password: str | None = field(default=None, repr=False)
    sentinel_username: str | None = field(default=None, repr=False)
    sentinel_password: str | None = field(default=None, repr=False)
    #: TLS to the Sentinels and the master (``rediss+sentinel://``), with its redis-py options.
    ssl: bool = False
    ssl_options: dict[str, Any] = field(default_factory=dict)

    def sentinel_kwargs(self) -> dict[str, Any]:
        """Connection keywords for the Sentinels: their credentials, TLS."""
        auth = {"username": self.sentinel_username, "password": self.sentinel_password}
        return {**{k: v for k, v in auth.items() if v is not None}, **self._tls()}

    def master_kwargs(self) -> dict[str, Any]:
        """Connection keywords for the master: its db, credentials, TLS."""
        auth = {"db": self.db, "username": self.username, "password": self.password}
        return {**auth, **self._tls()}

    def _tls(self) -> dict[str, Any]:
        return {"ssl": True, **self.ssl_options} if self.ssl else {}


def is_sentinel_url(url: str) -> bool:
    return url.startswith((SENTINEL_SCHEME, SENTINEL_TLS_SCHEME))


def parse_sentinel_url(url: str) -> SentinelURL:
    """``redis+sentinel://[[user]:password@]host:port[,host:port...]/service[/db][?query]`` (or
    ``rediss+sentinel://``), or :class:`ConfigurationError` naming the (redacted) URL and what
    is wrong with it."""

    def bad(why: str) -> ConfigurationError:
        return ConfigurationError(f"invalid Redis Sentinel URL {redact_refused(url)}: {why}")

    if not is_sentinel_url(url):
        raise bad(f"must start with {SENTINEL_SCHEME} or {SENTINEL_TLS_SCHEME}")
    if userinfo_cut_short(url):  # else a piece of the password would be read as a host
        raise ConfigurationError(f"invalid Redis Sentinel URL: {cut_short(url)}")
    tls = url.startswith(SENTINEL_TLS_SCHEME)
    rest = url[len(SENTINEL_TLS_SCHEME if tls else SENTINEL_SCHEME) :]
    if "#" in rest:
        raise bad("takes no fragment")
    rest, _, query = rest.partition("?")
    options = _query(query, tls, bad)
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
    return SentinelURL(
        sentinels,
        unquote(parts[0]),
        db,
        username,
        password,
        sentinel_username=options.pop("sentinel_username", None) or None,
        sentinel_password=options.pop("sentinel_password", None) or None,
        ssl=tls,
        ssl_options=options,
    )


def _query(query: str, tls: bool, bad: Any) -> dict[str, Any]:
    """The known parameters of a Sentinel URL's query, their values read (see the module
    docstring); an unknown, repeated or ill-valued one is an error naming it (not its value,
    which may be a secret)."""
    out: dict[str, Any] = {}
    known = (*_SENTINEL_AUTH, *_TLS_OPTIONS)
    for key, value in _parameters(query, known, bad):
        if key in out:
            raise bad(f"parameter {key!r} given twice")
        if key in _TLS_OPTIONS and not tls:
            raise bad(f"{key} needs TLS: use {SENTINEL_TLS_SCHEME}")
        if key == "ssl_cert_reqs" and value.lower() not in _CERT_REQS:
            raise bad(f"ssl_cert_reqs must be one of {', '.join(_CERT_REQS)}, got {value!r}")
        if key == "ssl_check_hostname":
            if value.lower() not in _BOOLS:
                raise bad(f"ssl_check_hostname must be true or false, got {value!r}")
            out[key] = _BOOLS[value.lower()]
            continue
        out[key] = value.lower() if key == "ssl_cert_reqs" else value
    return out


def _parameters(query: str, known: Sequence[str], bad: Any) -> Iterator[tuple[str, str]]:
    """``(name, value)`` of each ``name=value`` of a URL's ``query``, every name among
    ``known`` (else an error naming it, with a near miss). A piece without ``=``, or an unknown
    name right after a secret's value, is not named: it is likely the rest of a password
    holding a raw ``&``."""
    after_secret = False
    for piece in query.split("&") if query else []:
        raw_key, eq, raw_value = piece.partition("=")
        key = unquote_plus(raw_key)
        if not eq or (after_secret and key not in known):
            raise bad(
                "a piece of the query is no known `name=value` parameter (not shown: after a"
                " password it is likely the rest of it, cut at a raw `&`): " + PERCENT_ENCODE
            )
        if key not in known:
            raise bad(f"unknown parameter {key!r}{_near(key, known)} (known: {', '.join(known)})")
        after_secret = is_secret_parameter(key)
        yield key, unquote_plus(raw_value)


@functools.cache
def _redis_py_parameters() -> tuple[str, ...]:
    """What redis-py takes in a ``redis://``, ``rediss://`` or ``unix://`` URL's query: its URL
    options and its connections' keywords (it passes the rest to them, which then fail at the
    first connection, naming the parameter)."""
    import inspect

    from redis import connection

    names = set(connection.URL_QUERY_ARGUMENT_PARSERS)
    for cls in (
        connection.AbstractConnection,
        connection.Connection,
        connection.SSLConnection,
        connection.UnixDomainSocketConnection,
    ):
        names |= set(inspect.signature(cls.__init__).parameters)
    return tuple(sorted(names - {"self", "args", "kwargs"}))


def _near(key: str, known: Sequence[str]) -> str:
    near = difflib.get_close_matches(key, known, n=1)
    return f" (did you mean {near[0]!r}?)" if near else ""


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


def checked_url(url: str) -> SentinelURL | None:
    """Check ``url``'s form without connecting (the thread and the asyncio clients accept the
    same URLs): a Sentinel URL's parts, ``None`` for a ``redis://``, ``rediss://`` or
    ``unix://`` one, or :class:`ConfigurationError` naming what is wrong (redacted)."""
    if isinstance(url, str):
        refuse_control_characters("the Redis URL", url)
    if not isinstance(url, str) or not url.startswith(SCHEMES):
        shown = redact_refused(url) if isinstance(url, str) else redact(str(url))
        raise ConfigurationError(f"not a Redis URL ({', '.join(SCHEMES)}): {shown}")
    if userinfo_cut_short(url):  # else a piece of the password would be read as a host or port
        raise ConfigurationError(f"invalid Redis URL: {cut_short(url)}")
    if is_sentinel_url(url):
        return parse_sentinel_url(url)
    query = url.partition("?")[2]  # (a `?` in the password was refused as cut short above)
    for _ in _parameters(query, _redis_py_parameters(), _bad_url(url)):
        pass
    return None


def client_from_url(url: str, **options: Any) -> redis.Redis:
    """A client for ``url`` (see the module docstring); ``options`` are redis-py connection
    keywords (``socket_timeout``, ``retry``...) for the data connections. The ``socket_*`` ones
    also bound each call to a Sentinel, which is never retried: the next one is asked. Connects
    to nothing yet. The caller owns the client: its ``close()`` also closes the Sentinel
    connections."""
    parts = checked_url(url)
    if parts is not None:
        sentinel_kwargs = {k: v for k, v in options.items() if k.startswith("socket_")}
        sentinel_kwargs.update(parts.sentinel_kwargs())
        # A silent Sentinel is skipped for the next one at once: redis-py's default retries
        # (with backoff) per Sentinel would multiply into a lookup of many seconds.
        sentinel_kwargs["retry"] = Retry(NoBackoff(), 0)
        sentinel = _Sentinels(  # type: ignore[no-untyped-call, unused-ignore]
            parts.sentinels, sentinel_kwargs=sentinel_kwargs
        )
        client: redis.Redis = sentinel.master_for(  # type: ignore[no-untyped-call, unused-ignore]
            parts.service_name,
            redis_class=SentinelMasterRedis,
            **{**parts.master_kwargs(), **options},
        )
        return client
    try:
        return redis.Redis.from_url(url, **options)
    except (ValueError, TypeError, rex.RedisError) as exc:
        why = redact(str(exc))
        raise ConfigurationError(f"invalid Redis URL {redact_refused(url)}: {why}") from None


def _bad_url(url: str) -> Any:
    def bad(why: str) -> ConfigurationError:
        return ConfigurationError(f"invalid Redis URL {redact_refused(url)}: {why}")

    return bad


class _Sentinels(Sentinel):
    """redis-py's ``Sentinel``, with a lookup that says why it failed: when every Sentinel
    refused our credentials it is an ``AuthenticationError`` (a misconfiguration the callers
    report as refused, not "no master"), and each Sentinel is named by its address only."""

    def discover_master(self, service_name: str) -> tuple[str, int]:
        errors: list[str] = []
        refused = 0
        for i, sentinel in enumerate(self.sentinels):
            kw = sentinel.connection_pool.connection_kwargs
            where = f"{kw.get('host')}:{kw.get('port')}"
            try:
                masters: Any = sentinel.sentinel_masters()
                state = masters.get(service_name)
            except (rex.ConnectionError, rex.TimeoutError) as exc:
                refused += isinstance(exc, rex.AuthenticationError)
                errors.append(f"{where}: {type(exc).__name__}: {exc}")
                continue
            if state and self.check_master_state(state, service_name):  # type: ignore[no-untyped-call, unused-ignore]
                self.sentinels[0], self.sentinels[i] = sentinel, self.sentinels[0]
                return state["ip"], state["port"]
            errors.append(f"{where}: knows no master for it")
        why = "; ".join(errors)
        if refused and refused == len(self.sentinels):
            raise rex.AuthenticationError(
                "every Sentinel refused the credentials (the URL's sentinel_username / "
                f"sentinel_password): {why}"
            )
        raise MasterNotFoundError(f"No master found for {service_name!r}: {why}")


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
        tls = issubclass(pool.connection_class, SSLConnection)
        return f"{SENTINEL_TLS_SCHEME if tls else SENTINEL_SCHEME}{hosts}/{pool.service_name}/{db}"
    kw = pool.connection_kwargs
    if "path" in kw:
        return f"unix://{kw['path']}"
    return f"redis://{kw.get('host', 'localhost')}:{kw.get('port', 6379)}/{kw.get('db', 0)}"
