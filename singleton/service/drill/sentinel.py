"""The drill's Redis Sentinel deployment (``singleton drill --sentinel``) and its failover.

Real processes on loopback free ports: two data nodes (``redis-server``, one started with
``--replicaof`` the other) and three Sentinels (``redis-server <file> --sentinel``, quorum 2)
with short timings (down after 3 s, failover timeout 3 s), so that a failover takes seconds.
The replicas reach it through ``redis+sentinel://`` and follow the master the Sentinels name.

Failure model of :meth:`SentinelTopology.failover`: the master is SIGKILLed (a crash: writes the
replica had not received yet are lost, replication being asynchronous), the Sentinels agree on
it and promote the replica, and the killed server comes back as a replica of the new master, so
the next failover can go the other way. The promotion is waited on as the Sentinels' own
``+switch-master`` announcement (subscribed before the kill), the recovery as a condition with a
deadline. The data nodes keep nothing on disk: lease tokens are at least Redis's clock in ms
(see ``singleton.lease.redis``), so they still grow after a failover loses the counter.
(``tests/integration/sentinel_support.py`` is the test suite's own copy; the drill must not
import tests.)
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import redis

from singleton.errors import BackendUnavailableError, ConfigurationError
from singleton.service.dev.embedded import EmbeddedServer, RedisServer, wait_until

SERVICE = "singleton-drill"
#: 1 s made a loaded machine fail over spuriously: a Sentinel that had just switched to the new
#: master did not hear its first PONG within 1 s and, with the other Sentinels' "down" answers
#: about the old master still fresh, failed the healthy new master over at once
DOWN_AFTER_MS = 3000
FAILOVER_TIMEOUT_MS = 3000
#: how long the Sentinels may take to promote the replica (an election can fail once and be
#: retried after twice the failover timeout)
PROMOTION_TIMEOUT = 30.0


class DataNode(RedisServer):
    """``redis-server`` without persistence; a replica of :attr:`replicaof` when that is set."""

    kind = "redis-data"

    def __init__(self, log_dir: str) -> None:
        super().__init__(log_dir=log_dir)
        self.replicaof: tuple[str, int] | None = None

    def command(self) -> Sequence[str]:
        if self.fake:
            raise ConfigurationError("--sentinel needs redis-server on PATH (make sysdeps)")
        extra = ["--replicaof", self.replicaof[0], str(self.replicaof[1])] if self.replicaof else []
        # a restarted node syncs at once, not after the default 5 s wait for more replicas
        return [*super().command(), "--repl-diskless-sync-delay", "0", *extra]


class SentinelServer(EmbeddedServer):
    """``redis-server <file> --sentinel`` monitoring ``master`` as :data:`SERVICE`, quorum 2.
    Sentinel rewrites its file, so each one has its own, in its own temporary directory."""

    kind = "sentinel"

    def __init__(self, master: DataNode, log_dir: str) -> None:
        super().__init__(log_dir=log_dir)
        self.master = master

    def command(self) -> Sequence[str]:
        assert self.master.binary is not None
        conf = Path(self._tmp) / "sentinel.conf"
        conf.write_text(
            f"port {self.port}\nbind {self.host}\ndir {self._tmp}\n"
            f"sentinel monitor {SERVICE} {self.master.host} {self.master.port} 2\n"
            f"sentinel down-after-milliseconds {SERVICE} {DOWN_AFTER_MS}\n"
            f"sentinel failover-timeout {SERVICE} {FAILOVER_TIMEOUT_MS}\n"
            f"sentinel parallel-syncs {SERVICE} 1\n"
        )
        return [self.master.binary, str(conf), "--sentinel"]


class SentinelTopology:
    """Two data nodes and three Sentinels; :meth:`failover` swaps the roles of the nodes."""

    def __init__(self, log_dir: str, sentinels: int = 3) -> None:
        self.nodes = (DataNode(log_dir), DataNode(log_dir))
        self.sentinels = [SentinelServer(self.nodes[0], log_dir) for _ in range(sentinels)]
        self._clients: list[redis.Redis] = []

    @property
    def url(self) -> str:
        hosts = ",".join(f"{s.host}:{s.port}" for s in self.sentinels)
        return f"redis+sentinel://{hosts}/{SERVICE}/0"

    def start(self, timeout: float = 30.0) -> None:
        first, second = self.nodes
        first.start(timeout)  # (its port is final once it runs: see EmbeddedServer.start)
        second.replicaof = (first.host, first.port)
        second.start(timeout)
        for sentinel in self.sentinels:
            sentinel.start(timeout)
            self._clients.append(_client(sentinel))
        self.settle(timeout)

    def settle(self, timeout: float) -> DataNode:
        """Wait until every Sentinel names the same master, sees the other Sentinels and the
        other node as a healthy replica, and that node is in sync with it (only then can a
        failover be agreed on and find a replica to promote); return that master. Whichever
        node it is: should the Sentinels fail over once more on their own, that is their call."""
        views = self._clients
        probes = {node.port: _client(node) for node in self.nodes}
        agreed: list[DataNode] = []

        def healthy(view: redis.Redis, master: DataNode, replica: DataNode) -> bool:
            state: Any = view.sentinel_master(SERVICE)
            if state["flags"] != "master" or int(state["port"]) != master.port:
                return False
            if int(state["num-other-sentinels"]) < len(views) - 1:
                return False
            known: Any = view.sentinel_slaves(SERVICE)
            return any(int(r["port"]) == replica.port and r["flags"] == "slave" for r in known)

        def settled() -> bool:
            master = self.master()
            replica = self.nodes[1] if master is self.nodes[0] else self.nodes[0]
            link = probes[replica.port].info("replication")
            if link.get("master_port") != master.port or link.get("master_link_status") != "up":
                return False
            if not all(healthy(view, master, replica) for view in views):
                return False
            agreed[:] = [master]
            return True

        try:
            wait_until(settled, timeout, interval=0.05, what="the Sentinels agreeing on a master")
        finally:
            for probe in probes.values():
                probe.close()
        return agreed[0]

    def master(self) -> DataNode:
        """The data node the first Sentinel names as the master."""
        address: Any = self._clients[0].sentinel_get_master_addr_by_name(SERVICE)
        port = int(address[1])
        return next(node for node in self.nodes if node.port == port)

    def failover(self, timeout: float = PROMOTION_TIMEOUT) -> tuple[DataNode, DataNode, float]:
        """SIGKILL the master, wait for the promotion, bring the killed node back as a replica
        of the new master and wait until the Sentinels could fail over again: (the killed node,
        the master then, when the promotion was announced on the monotonic clock)."""
        old = self.master()
        pubsubs = []
        try:
            for view in self._clients:
                pubsub = view.pubsub(ignore_subscribe_messages=True)  # type: ignore[no-untyped-call, unused-ignore]
                pubsub.subscribe("+switch-master")
                pubsubs.append(pubsub)
            old.kill()
            old.stop()  # closes its log; the restart appends to it
            promoted_at, port = _switch(pubsubs, timeout)
        finally:
            for pubsub in pubsubs:
                with contextlib.suppress(Exception):
                    pubsub.close()
        new = next(node for node in self.nodes if node.port == port)
        if new is old:
            raise BackendUnavailableError(f"Sentinel switched to the killed master {port}")
        old.replicaof = (new.host, new.port)
        old.start(timeout)
        return old, self.settle(timeout), promoted_at

    def stop(self) -> None:
        for client in self._clients:
            with contextlib.suppress(Exception):
                client.close()
        self._clients.clear()
        for server in [*self.sentinels, *self.nodes]:
            server.cleanup()

    def describe(self) -> str:
        return (
            f"  redis: Sentinel {SERVICE}, data nodes {self.nodes[0].port} (master at start) and "
            f"{self.nodes[1].port}, {len(self.sentinels)} Sentinels, nothing on disk"
        )


def _client(server: EmbeddedServer) -> redis.Redis:
    return redis.Redis(server.host, server.port, socket_timeout=2, decode_responses=True)


def _switch(pubsubs: Sequence[Any], timeout: float) -> tuple[float, int]:
    """(when it was heard, the new master's port) of the first ``+switch-master`` any
    Sentinel announces; :class:`BackendUnavailableError` if none does within ``timeout``."""
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        for pubsub in pubsubs:
            # blocks on the socket up to its share of the timeout: a wait on the event itself
            message = pubsub.get_message(timeout=min(left, 0.2) / len(pubsubs))
            if message and message.get("type") == "message":
                # "<name> <old ip> <old port> <new ip> <new port>"
                return time.monotonic(), int(str(message["data"]).split()[4])
    raise BackendUnavailableError(f"the Sentinels promoted no replica within {timeout} s")
