"""RedisLeaseBackend beyond the contract: errors, credentials (an elector refused by a server
with ``--requirepass`` says so and backs off), client ownership, the release subscription across
a Redis restart, a black-holed leader, and a SIGSTOPped leader process."""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from singleton.election.elector import Elector
from singleton.election.leadership import Leadership
from singleton.errors import BackendUnavailableError, ConfigurationError, PermissionDeniedError
from singleton.lease.contract import LeaseBackend
from singleton.lease.leases import Lease
from singleton.lease.redis import RedisLeaseBackend
from singleton.service.dev.embedded import RedisServer, wait_until
from singleton.service.dev.ports import free_port
from tests.integration.leader_child import Child
from tests.integration.proxy import TcpProxy
from tests.unit.election.election_support import captured_logs, contend_times

SECRET = "s3cr3t-pa55"


def ops(backend: LeaseBackend) -> list[Any]:
    lease = Lease("job", "a/1", 1, 1.0)
    return [
        lambda: backend.try_acquire("job", "a/1", 1.0),
        lambda: backend.contend("job", "a/1", 1.0),
        lambda: backend.renew(lease),
        lambda: backend.release(lease),
        lambda: backend.inspect("job"),
    ]


def test_unreachable_redis_is_unavailable_quickly() -> None:
    backend = RedisLeaseBackend(f"redis://127.0.0.1:{free_port()}/0", socket_timeout=0.5)
    try:
        for op in ops(backend):
            started = time.monotonic()
            with pytest.raises(BackendUnavailableError) as info:
                op()
            assert isinstance(info.value.__cause__, redis.RedisError)
            assert time.monotonic() - started < 5, "a refused connection must not hang"
    finally:
        backend.close()


@pytest.mark.parametrize(
    "url",
    [
        f"http://user:{SECRET}@127.0.0.1:6379/0",
        f"redis://:{SECRET}@127.0.0.1:notaport/0",
        "localhost:6379",
    ],
)
def test_malformed_url_is_a_configuration_error(url: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        RedisLeaseBackend(url)
    assert SECRET not in str(info.value)
    assert "127.0.0.1" in str(info.value) or "localhost" in str(info.value)


@pytest.mark.parametrize(
    "url",
    [
        f"redis://:{SECRET}@127.0.0.1:{{port}}/0",
        f"redis://bob:{SECRET}@127.0.0.1:{{port}}/0",
        f"redis://{SECRET}@127.0.0.1:{{port}}/0",
        f"redis://127.0.0.1:{{port}}/0?password={SECRET}",
    ],
)
def test_password_never_shown(url: str) -> None:
    backend = RedisLeaseBackend(url.format(port=free_port()), socket_timeout=0.5)
    try:
        assert SECRET not in backend.describe()
        assert "***" in backend.describe()
        with pytest.raises(BackendUnavailableError) as info:
            backend.try_acquire("job", "a/1", 1.0)
        chain: BaseException | None = info.value
        while chain is not None:
            assert SECRET not in str(chain)
            chain = chain.__cause__
    finally:
        backend.close()


def test_wrong_password_is_permission_denied(redis_url: str, unique: str) -> None:
    url = redis_url.replace("redis://", f"redis://nobody-{unique}:{SECRET}@")
    backend = RedisLeaseBackend(url)
    try:
        with pytest.raises(PermissionDeniedError) as info:
            backend.try_acquire("job", "a/1", 1.0)
        assert SECRET not in str(info.value)
    finally:
        backend.close()


class PasswordRedis(RedisServer):
    """``redis-server --requirepass``; ready once it answers, if only with NOAUTH."""

    def command(self) -> list[str]:
        assert not self.fake, "redis-server must be on PATH (make sysdeps)"
        return [*super().command(), "--requirepass", SECRET]

    def ready(self) -> bool:
        with socket.create_connection((self.host, self.port), timeout=0.5) as s:
            s.sendall(b"*1\r\n$4\r\nPING\r\n")
            return s.recv(16).startswith(b"-NOAUTH")


@pytest.mark.parametrize("creds", ["default:wrong-pa55@", ""], ids=["wrong-password", "none"])
def test_refused_elector_never_leads_says_why_and_backs_off(creds: str, unique: str) -> None:
    with PasswordRedis() as server:
        url = f"redis://{creds}{server.host}:{server.port}/0"
        backend = RedisLeaseBackend(url, namespace=f"t{unique}")
        attempts = contend_times(backend)
        elector = Elector(backend, "job", ttl=3.0, retry_interval=0.1, jitter=0.0)
        try:
            with captured_logs("ERROR") as logs:
                elector.start()
                wait_until(lambda: len(attempts) >= 6, 30, what="six refused campaigns")
                assert elector.failing and elector.last_error is not None
                last_error = elector.last_error
        finally:
            elector.stop(timeout=10)
            backend.close()
    assert elector.stats.elections == 0 and elector.stats.fatal_errors >= 6
    assert last_error.startswith("PermissionDeniedError: ")
    assert "permission denied" in last_error and f":{server.port}" in last_error, last_error
    refusals = [msg for level, msg in logs if level == "ERROR" and "contend failed" in msg]
    assert len(refusals) >= 5, logs  # one ERROR line per retry
    where = f"{creds.replace('wrong-pa55', '***')}{server.host}:{server.port}"
    assert all(where in msg for msg in refusals), (where, refusals)
    assert not [msg for _, msg in logs if "wrong-pa55" in msg or SECRET in msg]
    gaps = [b - a for a, b in itertools.pairwise(attempts)]
    # Doubling from retry_interval (jitter 0): 0.1, 0.2, 0.4, 0.8, 1.6 s at least, never a spin.
    assert all(gap >= 0.1 * 2**i for i, gap in enumerate(gaps[:5])), gaps


class SpyRedis(redis.Redis):
    closes = 0

    def close(self) -> None:
        self.closes += 1
        super().close()


def clients_named(probe: redis.Redis, name: str) -> int:
    return sum(1 for c in probe.client_list() if c.get("name") == name)


def test_caller_client_is_not_closed(redis_url: str, unique: str) -> None:
    client = SpyRedis(connection_pool=redis.ConnectionPool.from_url(redis_url))
    backend = RedisLeaseBackend(client, namespace=f"t{unique}")
    assert backend.try_acquire("job", "a/1", 5.0) is not None
    assert backend.wait_for_release("job", 0.1) is False  # starts the subscription thread
    backend.close()
    assert client.closes == 0
    assert client.ping()
    assert not [t for t in threading.enumerate() if t.name.endswith(f"pubsub-t{unique}")]
    client.close()


def test_url_client_is_closed(redis_url: str, unique: str) -> None:
    name = f"owned-{unique}"
    probe = redis.Redis.from_url(redis_url)
    backend = RedisLeaseBackend(f"{redis_url}?client_name={name}", namespace=f"t{unique}")
    try:
        assert backend.try_acquire("job", "a/1", 5.0) is not None
        assert backend.wait_for_release("job", 0.1) is False
        assert clients_named(probe, name) >= 1
    finally:
        backend.close()
    wait_until(lambda: clients_named(probe, name) == 0, 10, what="owned connections closed")
    assert not [t for t in threading.enumerate() if t.name.endswith(f"pubsub-t{unique}")]
    probe.close()


def assert_release_observed(waiter: LeaseBackend, releaser: LeaseBackend, what: str) -> None:
    """Release (a fresh tenure each try) until a waiter on ``waiter`` is woken by one."""
    observed = threading.Event()
    done = threading.Event()

    def wait() -> None:
        while not done.is_set():
            if waiter.wait_for_release("job", 0.5):
                observed.set()
                return

    def release_observed() -> bool:
        try:
            lease = releaser.try_acquire("job", "a/1", 5.0)
        except BackendUnavailableError:
            return False  # the server is still coming back
        assert lease is not None and releaser.release(lease)
        return observed.wait(0.1)

    t = threading.Thread(target=wait, daemon=True)
    t.start()
    try:
        wait_until(release_observed, 30, interval=0.1, what=what)
    finally:
        done.set()
        t.join(10)


def test_release_subscription_survives_redis_restart(unique: str) -> None:
    with RedisServer() as server:
        waiter = RedisLeaseBackend(server.url, namespace=f"t{unique}")
        releaser = RedisLeaseBackend(server.url, namespace=f"t{unique}")
        try:
            assert_release_observed(waiter, releaser, "a release seen before the restart")
            server.restart()
            assert_release_observed(waiter, releaser, "a release seen after the restart")
        finally:
            waiter.close()
            releaser.close()


class Recorder:
    """Monotonic timestamps from an Elector's callbacks (and its backend's renewals)."""

    def __init__(self) -> None:
        self.elected = threading.Event()
        self.lost = threading.Event()
        self.elected_at = 0.0
        self.lost_at = 0.0
        self.token = 0
        self.reason = ""

    def on_elected(self, ld: Leadership) -> None:
        self.elected_at = time.monotonic()
        self.token = ld.token
        self.elected.set()

    def on_lost(self, ld: Leadership, reason: str) -> None:
        self.lost_at = time.monotonic()
        self.reason = reason
        self.lost.set()


class RenewLog(RedisLeaseBackend):
    """Records (sent, answered) monotonic times of every renewal the server confirmed."""

    renewals: list[tuple[float, float]]

    def renew(self, lease: Lease, ttl: float | None = None) -> Lease | None:
        sent = time.monotonic()
        renewed = super().renew(lease, ttl)
        if renewed is not None:
            self.renewals.append((sent, time.monotonic()))
        return renewed


TIMINGS: dict[str, Any] = {
    "ttl": 1.5,
    "renew_interval": 0.3,
    "renew_deadline": 1.0,
    "retry_interval": 0.2,
}


@pytest.fixture
def proxy(redis_server: RedisServer) -> Iterator[TcpProxy]:
    with TcpProxy(redis_server.host, redis_server.port) as p:
        yield p


def test_blackholed_leader_demotes_itself_before_successor(
    proxy: TcpProxy, redis_url: str, unique: str
) -> None:
    ns = f"t{unique}"
    far = RenewLog(f"redis://127.0.0.1:{proxy.port}/0", namespace=ns)
    far.renewals = []
    near = RedisLeaseBackend(redis_url, namespace=ns)
    first, second = Recorder(), Recorder()
    one = Elector(far, "job", identity="one", **TIMINGS, on_elected=first.on_elected,
                  on_lost=first.on_lost)  # fmt: skip
    two = Elector(near, "job", identity="two", **TIMINGS, on_elected=second.on_elected,
                  on_lost=second.on_lost)  # fmt: skip
    try:
        one.start()
        assert first.elected.wait(10)
        wait_until(lambda: len(far.renewals) >= 2, 10, what="two renewals through the proxy")
        two.start()
        proxy.blackhole()
        assert first.lost.wait(10), "a black-holed leader must demote itself"
        last_sent = max(sent for sent, _ in far.renewals)
        assert first.reason == "expired"
        assert first.lost_at - last_sent <= TIMINGS["renew_deadline"] + 0.3
        assert second.elected.wait(10), "the second elector never took over"
        assert first.lost_at < second.elected_at
        assert second.token > first.token
        assert one.leadership is None
    finally:
        proxy.close()  # unblocks the first elector's pending calls
        one.stop(release=False, timeout=10)
        two.stop(timeout=10)
        far.close()
        near.close()


def test_sigstopped_leader_is_invalid_when_it_wakes(
    redis_url: str, unique: str, tmp_path: Path
) -> None:
    ns = f"t{unique}"
    child = Child(redis_url, ns, tmp_path / "child.log")
    backend = RedisLeaseBackend(redis_url, namespace=ns)
    successor = Recorder()
    elector = Elector(backend, "job", identity="successor", ttl=1.0, retry_interval=0.2,
                      on_elected=successor.on_elected, on_lost=successor.on_lost)  # fmt: skip
    try:
        elected, _ = child.next("elected")
        assert elected["valid"] is True
        assert child.ask_valid()[0]["valid"] is True
        elector.start()
        os.kill(child.proc.pid, signal.SIGSTOP)
        frozen_until = time.monotonic() + 3 * 1.0
        assert successor.elected.wait(10), "no takeover while the leader was frozen"
        wait_until(
            lambda: time.monotonic() >= frozen_until and elector.is_leader,
            10,
            what="3 x ttl frozen with the successor leading",
        )
        os.kill(child.proc.pid, signal.SIGCONT)
        report, after = child.ask_valid()
        assert report["valid"] is False and report["token"] == elected["token"]
        assert all(line["valid"] is False for line in after), after
        assert successor.token > elected["token"]
        assert elector.is_leader
    finally:
        child.close()
        elector.stop(timeout=10)
        backend.close()


def test_tokens_keep_growing_after_redis_loses_its_data(unique: str) -> None:
    """A restart without persistence loses the fencing counter; tokens must not start over,
    or every fenced checkpoint would refuse the next leader (or, worse, accept a reused token)."""
    with RedisServer() as server:
        backend = RedisLeaseBackend(server.url, namespace=f"t{unique}")
        try:
            before = backend.try_acquire("job", "a/1", 30)
            assert before is not None
            server.restart()
            wait_until(lambda: _answers(backend), 10, what="redis back")
            after = backend.try_acquire("job", "b/1", 30)
            assert after is not None and after.token > before.token
        finally:
            backend.close()


def _answers(backend: RedisLeaseBackend) -> bool:
    backend.inspect("probe")
    return True


@pytest.mark.parametrize("driver", ["thread", "async"])
def test_a_token_after_losing_the_store_exceeds_one_granted_ahead_of_the_clock(
    redis_url: str, driver: str
) -> None:
    """Invariant 7 within one millisecond: grants faster than the clock push the counter ahead
    of it; the store then loses every key, and the next token must still be greater (the
    clock alone gives a smaller one: the backend passes its highest token as the floor)."""
    namespace = f"floor{os.getpid()}{driver}"
    raw = redis.Redis.from_url(redis_url)
    ahead = int(time.time() * 1000) + 60_000  # a minute of grants ahead of the clock
    raw.set(f"{namespace}:fence:job", ahead)
    try:
        if driver == "thread":
            backend = RedisLeaseBackend(redis_url, namespace=namespace)
            first = backend.try_acquire("job", "a/1", 5)
            assert first is not None and first.token == ahead + 1
            backend.release(first)
            raw.delete(*raw.keys(f"{namespace}:*"))  # the store loses everything
            second = backend.try_acquire("job", "b/1", 5)
            backend.close()
        else:
            from singleton.aio import AsyncRedisLeaseBackend

            async def grants() -> tuple[Any, Any]:
                backend = AsyncRedisLeaseBackend(redis_url, namespace=namespace)
                try:
                    first = await backend.try_acquire("job", "a/1", 5)
                    assert first is not None
                    await backend.release(first)
                    raw.delete(*raw.keys(f"{namespace}:*"))
                    return first, await backend.try_acquire("job", "b/1", 5)
                finally:
                    await backend.aclose()

            first, second = asyncio.run(grants())
        assert second is not None and second.token > first.token
    finally:
        keys = raw.keys(f"{namespace}:*")
        if keys:
            raw.delete(*keys)
        raw.close()
