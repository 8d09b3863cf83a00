"""Fenced leases on Redis (>= 6) or fakeredis: one Lua script per operation.

Layout, under ``namespace`` (default ``singleton``):

* ``<ns>:lease:<name>``: a string ``"<token>:<holder>"`` with a PX expiry. The token comes first
  because it is all digits, so the first ``:`` splits it from any holder. Comparing the whole
  value compares holder *and* token in one step.
* ``<ns>:fence:<name>``: the fencing counter, never expiring, never deleted by a release. A new
  grant takes ``max(counter + 1, server time in ms)``: tokens are a hybrid logical clock, so
  they keep growing even after Redis lost the counter (a restart without persistence, a failover
  to a replica that had not seen the last writes), as long as Redis's clock does not step back
  and fewer than 1,000 grants a second are made of one name.
* ``<ns>:facts:<name>``: a hash, never expiring, never touched by the lease scripts: what
  :meth:`~singleton.lease.facts.Facts.remember` merged (one ``HSET``, atomic).
* ``<ns>:fires:<name>``: a list, latest first, of ``"<fire_ms>:<token>:<holder>"``: the fire
  times :meth:`~singleton.lease.fires.FireClaims.claim_fire` claimed, trimmed to ``keep``
  entries, never expiring (lost with the store's data, like the counter).
* ``<ns>:released``: a pub/sub channel; a release publishes the lease name on it (a user whose
  ACL refuses that PUBLISH still releases: only the notification is lost, said once).

Failure model: Redis expires keys by its own clock, so expiry needs no agreement between client
clocks. A lost or late reply is an unknown outcome and raises ``BackendUnavailableError``. Redis
replication is asynchronous: a failover (Sentinel, cluster) may lose a lease key, and the
fencing counter with it (see the Redis docs on distributed locks); so does a restart without
persistence. Tokens survive that (see the counter above), but a lost *lease key* means a second
holder may be granted the lease while the first still believes it leads: the renew deadline
bounds that window, and fenced checkpoints and sink writes make the older holder's writes
harmless.
The pub/sub subscription only shortens waits: if it is down, waiters fall back to their timeout.
Under Sentinel every new connection, the subscription's included, goes to the master the
Sentinels name, so after a failover both reach the promoted replica.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterator, Mapping
from typing import Any

import redis
import redis.exceptions as rex
from loguru import logger
from redis.backoff import NoBackoff
from redis.retry import Retry

from singleton.drivers.redis import client_from_url, describe_client
from singleton.errors import (
    BackendError,
    BackendUnavailableError,
    ConfigurationError,
    PermissionDeniedError,
)
from singleton.lease.facts import validate_facts
from singleton.lease.fires import FireClaim, validate_claim
from singleton.lease.leases import Lease, LeaseState, validate_lease_args
from singleton.lease.members import RedisMembership
from singleton.lease.notify import ReleaseFeed
from singleton.lease.server import ServerLeaseBackend
from singleton.redact import redact

# KEYS[1] lease key, KEYS[2] fencing counter key
# ARGV[1] holder, ARGV[2] ttl in ms, ARGV[3] the caller's highest token so far (TokenFloor)
# Returns {1, token} when granted (a new token if the lease was free, the kept token if ARGV[1]
# already held it, extended), else {0, token, holder, pttl_ms} of the live lease.
ACQUIRE = """
local current = redis.call('GET', KEYS[1])
if not current then
  -- max(counter + 1, now in ms, the caller's highest token + 1): still growing after the
  -- counter itself was lost, also within the millisecond of the last grant
  local now = redis.call('TIME')
  local token = math.max(
    tonumber(redis.call('GET', KEYS[2]) or '0') + 1,
    tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000),
    tonumber(ARGV[3] or '0') + 1)
  local text = string.format('%d', token)
  redis.call('SET', KEYS[2], text)
  redis.call('SET', KEYS[1], text .. ':' .. ARGV[1], 'NX', 'PX', ARGV[2])
  return {1, token}
end
local sep = string.find(current, ':', 1, true)
local token = tonumber(string.sub(current, 1, sep - 1))
local holder = string.sub(current, sep + 1)
if holder == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {1, token}
end
return {0, token, holder, redis.call('PTTL', KEYS[1])}
"""

# KEYS[1] lease key
# ARGV[1] expected value "<token>:<holder>", ARGV[2] ttl in milliseconds
# Returns 1 if the stored value matched and the expiry was reset, else 0 (changed nothing).
RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
"""

# KEYS[1] lease key
# ARGV[1] expected value "<token>:<holder>", ARGV[2] channel, ARGV[3] lease name
# Returns {1} if the stored value matched: the lease key is deleted (the fencing counter is
# kept) and the name is published on the channel; {2, error} if it matched and the key is
# deleted, but the PUBLISH was refused (an ACL without the channel or the command: the release
# stands, only its notification is lost); else {0} (changed nothing).
RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  local sent = redis.pcall('PUBLISH', ARGV[2], ARGV[3])
  if type(sent) == 'table' and sent.err then
    return {2, sent.err}
  end
  return {1}
end
return {0}
"""

# KEYS[1] lease key
# Returns false if the lease is free, else {token, holder, pttl_ms}.
INSPECT = """
local current = redis.call('GET', KEYS[1])
if not current then
  return false
end
local sep = string.find(current, ':', 1, true)
return {tonumber(string.sub(current, 1, sep - 1)), string.sub(current, sep + 1),
        redis.call('PTTL', KEYS[1])}
"""

# KEYS[1] lease key, KEYS[2] fires list
# ARGV[1] expected value "<token>:<holder>", ARGV[2] fire time in ms, ARGV[3] claims to keep,
# ARGV[4] how far (ms) the fire time may be ahead of the server's clock
# Returns 1 if the lease matched, ARGV[2] is later than the latest claim and at most ARGV[4]
# ahead of TIME: the claim is pushed as "<fire_ms>:<token>:<holder>" and the list trimmed to
# ARGV[3]; else 0 (changed nothing).
CLAIM_FIRE = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
if tonumber(ARGV[2]) > now_ms + tonumber(ARGV[4]) then
  return 0
end
local last = redis.call('LINDEX', KEYS[2], 0)
if last then
  local sep = string.find(last, ':', 1, true)
  if tonumber(string.sub(last, 1, sep - 1)) >= tonumber(ARGV[2]) then
    return 0
  end
end
redis.call('LPUSH', KEYS[2], ARGV[2] .. ':' .. ARGV[1])
redis.call('LTRIM', KEYS[2], 0, tonumber(ARGV[3]) - 1)
return 1
"""

DEFAULT_TIMEOUT = 2.0
#: How long the pub/sub thread blocks per read; bounds how late ``close()`` ends it.
POLL = 0.5
#: Silence on the subscription after which the thread pings it (and reconnects if still silent).
HEALTH_INTERVAL = 30.0

_PERMISSION = (rex.AuthenticationError, rex.AuthorizationError, rex.NoPermissionError)
_UNAVAILABLE = (rex.ConnectionError, rex.TimeoutError, rex.BusyLoadingError, rex.ReadOnlyError)
_PERMISSION_PREFIXES = ("NOAUTH", "WRONGPASS", "NOPERM")


@contextlib.contextmanager
def translate(what: str) -> Iterator[None]:
    """Turn every redis-py error raised inside the block into a :class:`SingletonError`:
    refused credentials or ACLs (``NOAUTH``, ``WRONGPASS``, ``NOPERM``) ->
    :class:`PermissionDeniedError`; unreachable, timed out, loading or read-only (a replica that
    has not been promoted yet) -> :class:`BackendUnavailableError`; anything else ->
    :class:`BackendError`. Used by the lease backend and the Redis checkpoint store alike."""
    try:
        yield
    except (rex.RedisError, OSError) as exc:
        detail = redact(str(exc))  # a connection error may quote the URL, password and all
        if isinstance(exc, _PERMISSION) or (
            isinstance(exc, rex.ResponseError) and detail.upper().startswith(_PERMISSION_PREFIXES)
        ):
            raise PermissionDeniedError(f"{what}: permission denied: {detail}") from exc
        detail = f"{type(exc).__name__}: {detail}"
        if isinstance(exc, (*_UNAVAILABLE, OSError)):
            raise BackendUnavailableError(f"{what}: {detail}") from exc
        raise BackendError(f"{what}: {detail}") from exc


def _ms(ttl: float) -> int:
    return max(1, math.ceil(round(ttl * 1000, 6)))


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


# -- the options, keys and answers, shared by the thread and the asyncio backends (no I/O) -----
def check_options(
    namespace: object, socket_timeout: object, socket_connect_timeout: object
) -> None:
    """Refuse a bad option of a Redis lease backend, naming it."""
    if not isinstance(namespace, str) or not namespace:
        raise ConfigurationError(f"namespace must be a non-empty string, got {namespace!r}")
    for label, value in (
        ("socket_timeout", socket_timeout),
        ("socket_connect_timeout", socket_connect_timeout),
    ):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise ConfigurationError(f"{label} must be a positive number, got {value!r}")


def lease_key(namespace: str, name: str) -> str:
    return f"{namespace}:lease:{name}"


def fence_key(namespace: str, name: str) -> str:
    return f"{namespace}:fence:{name}"


def lease_value(lease: Lease) -> str:
    """What the lease key holds for ``lease``: the scripts compare it whole."""
    return f"{lease.token}:{lease.holder}"


def seconds_of(pttl: Any) -> float:
    ms = int(pttl)
    return math.inf if ms < 0 else ms / 1000


class TokenFloor:
    """The highest token a backend has seen per lease: passed to :data:`ACQUIRE`, so that a
    token granted after the store lost its keys exceeds it even within the same millisecond
    (invariant 7: the clock alone would give an equal or, after several grants in one
    millisecond, a smaller one)."""

    def __init__(self) -> None:
        self._highest: dict[str, int] = {}

    def of(self, name: str) -> str:
        return str(self._highest.get(name, 0))

    def saw(self, name: str, token: int) -> None:
        if token > self._highest.get(name, 0):
            self._highest[name] = token


def contended(name: str, holder: str, ttl: float, reply: Any) -> Lease | LeaseState:
    """The :data:`ACQUIRE` script's ``reply``: the lease granted, or the live one's state."""
    if int(reply[0]) == 1:
        return Lease(name, holder, int(reply[1]), ttl)
    return LeaseState(name, _text(reply[2]), int(reply[1]), seconds_of(reply[3]))


def inspected(name: str, reply: Any) -> LeaseState | None:
    """The :data:`INSPECT` script's ``reply``."""
    if not reply:
        return None
    return LeaseState(name, _text(reply[1]), int(reply[0]), seconds_of(reply[2]))


def publish_refused_warning(url: str, channel: str, reply: Any) -> None:
    """Said once per backend when a :data:`RELEASE` answered ``{2, error}``."""
    logger.warning(
        "redis {} refused to PUBLISH on {} ({}): leases are released, but successors"
        " elsewhere learn it only at the lease's expiry or their retry_interval, not in"
        " milliseconds; grant the user the channel (ACL SETUSER <user> &{} +publish"
        " +subscribe)",
        url,
        channel,
        redact(_text(reply[1])),
        channel,
    )


class RedisLeaseBackend(ServerLeaseBackend):
    """Leases on Redis. Pass a ``redis.Redis`` client (never closed here) or a URL, including
    ``redis+sentinel://`` (:func:`~singleton.drivers.redis.client_from_url`; the client
    built from it has bounded socket timeouts, ``retries`` immediate retries of a failed call,
    and is closed by :meth:`close`)."""

    def __init__(
        self,
        client_or_url: redis.Redis | str,
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
            self._client: redis.Redis = client_from_url(
                client_or_url,
                socket_timeout=socket_timeout,
                socket_connect_timeout=socket_connect_timeout,
                socket_keepalive=True,
                # Only a stale pooled connection is worth an immediate retry; the Elector
                # owns every other retry (with backoff) and its renew deadline.
                retry=Retry(NoBackoff(), retries),
            )
        elif isinstance(client_or_url, redis.Redis):
            self._client = client_or_url
            self._url = describe_client(client_or_url)
        else:
            raise ConfigurationError(
                f"expected a redis.Redis client or a URL string, got {type(client_or_url)!r}"
            )
        self._channel = f"{namespace}:released"
        #: A release's PUBLISH was refused once (said at WARNING, then no more).
        self._publish_refused = False
        self._acquire = self._client.register_script(ACQUIRE)
        self._floor = TokenFloor()
        self._renew = self._client.register_script(RENEW)
        self._release = self._client.register_script(RELEASE)
        self._inspect = self._client.register_script(INSPECT)
        self._claim_fire = self._client.register_script(CLAIM_FIRE)
        self._releases = ReleaseFeed(
            f"singleton-redis-pubsub-{namespace}",
            f"release subscription {self._url} channel={self._channel}",
            self._subscription,
            (rex.RedisError, OSError, ValueError),
            open_timeout=DEFAULT_TIMEOUT,
        )

    # -- the contract -----------------------------------------------------------------------
    def contend(self, name: str, holder: str, ttl: float) -> Lease | LeaseState | None:
        validate_lease_args(name, holder, ttl)
        with self._translate("acquire", name):
            reply = self._acquire(
                keys=[self._key(name), self._fence(name)],
                args=[holder, _ms(ttl), self._floor.of(name)],
            )
        answer = contended(name, holder, ttl, reply)
        self._floor.saw(name, answer.token)
        return answer

    def renew(self, lease: Lease, ttl: float | None = None) -> Lease | None:
        ttl = lease.ttl if ttl is None else ttl
        validate_lease_args(lease.name, lease.holder, ttl)
        with self._translate("renew", lease.name):
            ok = self._renew(keys=[self._key(lease.name)], args=[self._value(lease), _ms(ttl)])
        return Lease(lease.name, lease.holder, lease.token, ttl) if int(ok) == 1 else None

    def release(self, lease: Lease) -> bool:
        validate_lease_args(lease.name, lease.holder)
        with self._translate("release", lease.name):
            reply = self._release(
                keys=[self._key(lease.name)],
                args=[self._value(lease), self._channel, lease.name],
            )
        if int(reply[0]) == 2 and not self._publish_refused:
            self._publish_refused = True  # said once: every later release would say the same
            publish_refused_warning(self._url, self._channel, reply)
        return int(reply[0]) != 0

    def inspect(self, name: str) -> LeaseState | None:
        validate_lease_args(name)
        with self._translate("inspect", name):
            reply = self._inspect(keys=[self._key(name)])
        return inspected(name, reply)

    def remember(self, name: str, facts: Mapping[str, str | int]) -> None:
        fields = validate_facts(name, facts)
        with self._translate("remember", name):
            self._client.hset(self._facts(name), mapping=fields)  # type: ignore[arg-type]

    def recall(self, name: str) -> dict[str, str]:
        validate_lease_args(name)
        with self._translate("recall", name):
            stored: dict[Any, Any] = self._client.hgetall(self._facts(name))
        return {_text(k): _text(v) for k, v in stored.items()}

    def claim_fire(
        self, lease: Lease, fire_ms: int, keep: int = 100, ahead_ms: int = 10_000
    ) -> bool:
        validate_claim(lease, fire_ms, keep, ahead_ms)
        with self._translate("claim_fire", lease.name):
            ok = self._claim_fire(
                keys=[self._key(lease.name), self._fires(lease.name)],
                args=[self._value(lease), fire_ms, keep, ahead_ms],
            )
        return int(ok) == 1

    def fires(self, name: str) -> list[FireClaim]:
        validate_lease_args(name)
        with self._translate("fires", name):
            stored: list[Any] = self._client.lrange(self._fires(name), 0, -1)
        out = []
        for entry in stored:
            fire, token, holder = _text(entry).split(":", 2)
            out.append(FireClaim(int(fire), int(token), holder))
        return out

    def membership(self) -> RedisMembership:
        return RedisMembership(self._client, self.namespace, self._translate)

    def describe(self) -> str:
        return f"redis {self._url} namespace={self.namespace}"

    def close(self) -> None:
        self._releases.close(POLL + DEFAULT_TIMEOUT)
        if self._owned:
            with contextlib.suppress(rex.RedisError, OSError):
                self._client.close()

    # -- pub/sub ---------------------------------------------------------------------------
    def _subscription(self) -> None:
        pubsub = self._client.pubsub(ignore_subscribe_messages=False)  # type: ignore[no-untyped-call, unused-ignore]
        try:
            self._pump(pubsub)
        finally:
            with contextlib.suppress(Exception):
                pubsub.close()

    def _pump(self, pubsub: Any) -> None:
        pubsub.subscribe(self._channel)
        heard = time.monotonic()
        pinged = False
        while not self._releases.closed.is_set():
            message = pubsub.get_message(timeout=POLL)
            now = time.monotonic()
            if message is None:
                silent = now - heard
                if silent > HEALTH_INTERVAL and not pinged:
                    pubsub.ping()
                    pinged = True
                elif silent > HEALTH_INTERVAL + DEFAULT_TIMEOUT and pinged:
                    raise rex.TimeoutError(f"no answer to PING on {self._channel} in {silent:.0f}s")
                continue
            heard, pinged = now, False
            kind = _text(message.get("type"))
            if kind == "subscribe":
                self._releases.opened()
            elif kind == "message":
                self._releases.notify(_text(message["data"]))

    # -- helpers ---------------------------------------------------------------------------
    def _translate(self, op: str, name: str) -> contextlib.AbstractContextManager[None]:
        return translate(f"redis {op} of lease {name!r} on {self._url}")

    def _key(self, name: str) -> str:
        return lease_key(self.namespace, name)

    def _fence(self, name: str) -> str:
        return fence_key(self.namespace, name)

    def _facts(self, name: str) -> str:
        return f"{self.namespace}:facts:{name}"

    def _fires(self, name: str) -> str:
        return f"{self.namespace}:fires:{name}"

    @staticmethod
    def _value(lease: Lease) -> str:
        return lease_value(lease)
