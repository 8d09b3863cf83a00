"""A Redis Sentinel deployment of real processes on loopback free ports: one primary, one
replica (``--replicaof``) and three Sentinels (``redis-server <file> --sentinel``), with short
timings (down after 1 s, failover timeout 3 s) so that a failover takes a few seconds.

:class:`SentinelGroup` starts them in order and returns only once every Sentinel knows the
replica and the two other Sentinels (before that a failover could not be agreed on), and stops
them all on exit. :meth:`SentinelGroup.watch_switch` subscribes to ``+switch-master`` *before*
a fault is injected, so the promotion is waited on as an event, not polled.

``SentinelGroup(master_password=..., sentinel_password=...)`` makes the data nodes and the
Sentinels require passwords of their own (``requirepass``; the Sentinels authenticate to the data
nodes with ``auth-pass`` and to each other with ``sentinel-pass``), as a hardened deployment does.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import quote

import redis

from singleton.errors import BackendUnavailableError
from singleton.service.dev.embedded import EmbeddedServer, RedisServer, wait_until
from singleton.service.dev.ports import listens

SERVICE = "singleton-test"
DOWN_AFTER_MS = 1000
FAILOVER_TIMEOUT_MS = 3000


def _pong(host: str, port: int) -> bool:
    with socket.create_connection((host, port), timeout=0.5) as s:
        s.sendall(b"*1\r\n$4\r\nPING\r\n")
        # A server that requires a password answers -NOAUTH: it is up all the same.
        return s.recv(16).startswith((b"+PONG", b"-NOAUTH"))


class PrimaryRedis(RedisServer):
    """``redis-server``, requiring ``password`` when one is given."""

    def __init__(self, password: str | None = None, **kw: Any) -> None:
        super().__init__(**kw)
        self.password = password

    def command(self) -> Sequence[str]:
        auth = ["--requirepass", self.password, "--masterauth", self.password]
        return [*super().command(), *(auth if self.password else [])]

    def ready(self) -> bool:
        return _pong(self.host, self.port)


class ReplicaRedis(PrimaryRedis):
    """``redis-server --replicaof`` the primary (no persistence, like the primary)."""

    kind = "redis-replica"

    def __init__(self, primary: PrimaryRedis, **kw: Any) -> None:
        super().__init__(primary.password, **kw)
        self.primary = primary

    def command(self) -> Sequence[str]:
        assert not self.fake, "redis-server must be on PATH (make sysdeps)"
        return [*super().command(), "--replicaof", self.primary.host, str(self.primary.port)]


class SentinelServer(EmbeddedServer):
    """``redis-server <file> --sentinel`` monitoring ``primary`` as :data:`SERVICE`, quorum 2.
    Sentinel rewrites its file, so each one gets its own in its own temporary directory."""

    kind = "sentinel"

    def __init__(self, primary: PrimaryRedis, password: str | None = None, **kw: Any) -> None:
        super().__init__(**kw)
        self.primary = primary
        self.password = password
        self.binary = shutil.which("redis-server")

    def command(self) -> Sequence[str]:
        assert self.binary, "redis-server must be on PATH (make sysdeps)"
        conf = Path(self._tmp) / "sentinel.conf"
        conf.write_text(
            f"port {self.port}\n"
            f"bind {self.host}\n"
            f"dir {self._tmp}\n"
            f"sentinel monitor {SERVICE} {self.primary.host} {self.primary.port} 2\n"
            f"sentinel down-after-milliseconds {SERVICE} {DOWN_AFTER_MS}\n"
            f"sentinel failover-timeout {SERVICE} {FAILOVER_TIMEOUT_MS}\n"
            f"sentinel parallel-syncs {SERVICE} 1\n"
        )
        with conf.open("a") as f:
            if self.primary.password:
                f.write(f"sentinel auth-pass {SERVICE} {self.primary.password}\n")
            if self.password:
                f.write(f"requirepass {self.password}\nsentinel sentinel-pass {self.password}\n")
        return [self.binary, str(conf), "--sentinel"]

    def ready(self) -> bool:
        return _pong(self.host, self.port)


class SentinelGroup:
    """Primary, replica and three Sentinels; a context manager."""

    def __init__(
        self,
        sentinels: int = 3,
        *,
        master_password: str | None = None,
        sentinel_password: str | None = None,
    ) -> None:
        self.primary = PrimaryRedis(master_password)
        self.replica = ReplicaRedis(self.primary)
        self.sentinels = [SentinelServer(self.primary, sentinel_password) for _ in range(sentinels)]
        self._clients: list[redis.Redis] = []

    @property
    def url(self) -> str:
        """The group's ``redis+sentinel://`` URL, with both passwords when they are required."""
        hosts = ",".join(f"{s.host}:{s.port}" for s in self.sentinels)
        auth = f":{quote(self.primary.password, safe='')}@" if self.primary.password else ""
        query = ""
        if self.sentinels[0].password:
            query = f"?sentinel_password={quote(self.sentinels[0].password, safe='')}"
        return f"redis+sentinel://{auth}{hosts}/{SERVICE}{query}"

    def _client(self, server: EmbeddedServer) -> redis.Redis:
        client = redis.Redis(
            server.host,
            server.port,
            password=getattr(server, "password", None),
            socket_timeout=2,
            decode_responses=True,
        )
        self._clients.append(client)
        return client

    def start(self, timeout: float = 30.0) -> SentinelGroup:
        self.primary.start()
        self.replica.start()
        replica = self._client(self.replica)
        wait_until(
            lambda: replica.info("replication").get("master_link_status") == "up",
            timeout,
            what="the replica in sync with the primary",
        )
        for sentinel in self.sentinels:
            sentinel.start()
        others = len(self.sentinels) - 1
        for sentinel in self.sentinels:
            client = self._client(sentinel)

            def knows_all(client: redis.Redis = client) -> bool:
                state: Any = client.sentinel_master(SERVICE)
                return int(state["num-slaves"]) >= 1 and int(state["num-other-sentinels"]) >= others

            try:
                wait_until(knows_all, timeout, what=f"sentinel {sentinel.port} sees the others")
            except BackendUnavailableError as exc:
                raise BackendUnavailableError(f"{exc}; {self._describe(client)}") from None
        return self

    def _describe(self, client: redis.Redis) -> str:
        """What a Sentinel that did not settle saw, and whether each server is ours and up."""
        try:
            state: Any = client.sentinel_master(SERVICE)
            seen = {k: state.get(k) for k in ("num-slaves", "num-other-sentinels", "flags")}
        except redis.RedisError as exc:
            seen = {"error": str(exc)}
        servers = [self.primary, self.replica, *self.sentinels]
        up = {
            f"{s.kind}:{s.port}": s.proc is not None
            and s.proc.poll() is None
            and listens(s.proc.pid, s.port)
            for s in servers
        }
        return f"it saw {seen}; our process listening: {up}"

    def master_port(self) -> int:
        """The master's port as the first Sentinel reports it."""
        address: Any = self._client(self.sentinels[0]).sentinel_get_master_addr_by_name(SERVICE)
        _, port = address
        return int(port)

    def master_client(self) -> redis.Redis:
        """A plain client on whichever server is the master now."""
        port = self.master_port()
        server = self.primary if port == self.primary.port else self.replica
        return self._client(server)

    @contextlib.contextmanager
    def watch_switch(self) -> Iterator[SwitchWatch]:
        """Subscribed to ``+switch-master`` on every Sentinel for the duration of the block."""
        watch = SwitchWatch([self._client(s) for s in self.sentinels])
        try:
            yield watch
        finally:
            watch.close()

    def stop(self) -> None:
        for client in self._clients:
            with contextlib.suppress(Exception):
                client.close()
        for server in [*self.sentinels, self.replica, self.primary]:
            server.cleanup()

    def __enter__(self) -> SentinelGroup:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


class SwitchWatch:
    """``+switch-master`` messages from the Sentinels, read by :meth:`wait`."""

    def __init__(self, clients: list[redis.Redis]) -> None:
        self._pubsubs = []
        for client in clients:
            pubsub = client.pubsub(ignore_subscribe_messages=True)  # type: ignore[no-untyped-call]
            pubsub.subscribe("+switch-master")
            self._pubsubs.append(pubsub)

    def wait(self, timeout: float) -> tuple[float, int]:
        """(monotonic time it was heard, the new master's port) of the first switch any
        Sentinel announces; ``AssertionError`` if none does within ``timeout``."""
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            for pubsub in self._pubsubs:
                # Blocks on the socket up to the timeout: a wait on the event itself.
                message = pubsub.get_message(timeout=min(left, 0.2) / len(self._pubsubs))
                if message and message.get("type") == "message":
                    # "<name> <old ip> <old port> <new ip> <new port>"
                    fields = str(message["data"]).split()
                    return time.monotonic(), int(fields[4])
        raise AssertionError(f"no +switch-master within {timeout} s")

    def close(self) -> None:
        for pubsub in self._pubsubs:
            with contextlib.suppress(Exception):
                pubsub.close()
