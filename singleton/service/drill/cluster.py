"""The drill's cluster: servers, one lease-store proxy and one audit file per replica, replicas.

Every replica reaches the lease store through its own :class:`~.proxy.TcpProxy` (so one replica can
be partitioned while the others keep going; with ``sentinel`` it reaches the Sentinels and the
master they name directly, see :mod:`.sentinel`), writes its audit trail to its own file
(:mod:`listeners.runtime.audit`), and, when ``clock-jump`` is drilled, runs under libfaketime with
its own offset file: its wall clock jumps, its monotonic clock does not
(``FAKETIME_DONT_FAKE_MONOTONIC=1``).

Redis runs with an fsync-always append-only file: the fencing counter lives in Redis, and a
restart without persistence would start tokens again at 1 (see ``singleton.lease.redis``).
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from listeners.stream.partition import layout_names
from singleton.drivers.mongo import client as mongo_client
from singleton.errors import ConfigurationError, SingletonError
from singleton.lease.contract import LeaseBackend, LeaseState
from singleton.lease.timings import LeaseTimings
from singleton.service.config import AUDIT_ENV, UNSAFE_ENV, Config, load_config
from singleton.service.dev.cluster import (
    ReplicaProcess,
    child_environment,
    es_listener_toml,
    singleton_command,
)
from singleton.service.dev.embedded import ElasticServer, EmbeddedServer, MongoServer, RedisServer
from singleton.service.drill import shaped
from singleton.service.drill.jobs import RECORD_ENV as JOB_RECORD_ENV
from singleton.service.drill.jobs import job_toml
from singleton.service.drill.proxy import TcpProxy, host_port, via_proxy
from singleton.service.drill.sentinel import SentinelTopology
from singleton.service.registry import make_backend

DATABASE, COLLECTION, INDEX, LEASE = "drill", "orders", "drill-orders", "drill-orders"
NAMESPACE = "singleton-drill"


#: SecantusDB's oplog cap in drills: its reads slow down as the oplog grows, so an unbounded one
#: makes a long drill measure the stand-in. 20,000 entries keep minutes of history at the drill's
#: rates, far more than the longest fault keeps a checkpoint behind.
DRILL_OPLOG_ENTRIES = 20_000

#: Short lease timings; the runner's 0.1 s stream poll must stay <= renew_deadline / 4.
DRILL_TIMINGS = LeaseTimings.of(
    ttl=2.5, renew_interval=0.5, renew_deadline=2.0, retry_interval=0.25, cooldown=1.0
)


class PersistentRedis(RedisServer):
    """``redis-server`` whose data (the fencing counter) survives a restart."""

    def command(self) -> Sequence[str]:
        cmd = list(super().command())
        if self.fake:
            raise ConfigurationError("the drill needs redis-server on PATH (make sysdeps)")
        i = cmd.index("--appendonly")
        cmd[i + 1] = "yes"
        return [*cmd, "--appendfsync", "always"]


def faketime_library() -> str | None:
    """libfaketimeMT from Debian's ``faketime`` package, if installed."""
    for pattern in (
        "/usr/lib/*/faketime/libfaketimeMT.so.1",
        "/usr/lib/faketime/libfaketimeMT.so.1",
    ):
        found = sorted(glob.glob(pattern))
        if found:
            return found[0]
    return None


#: ``sitecustomize`` for replicas under libfaketime. libfaketime 0.9.10 with
#: ``FAKETIME_DONT_FAKE_MONOTONIC=1`` fails ``clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME)``
#: with EINVAL, which is how Python's ``time.sleep`` sleeps: pymongo's monitor threads would die.
#: ``select()`` is unaffected, so ``time.sleep`` sleeps with it in those replicas.
FAKETIME_SHIM = """import select
import time


def _sleep(seconds):
    if seconds < 0:
        raise ValueError("sleep length must be non-negative")
    select.select([], [], [], seconds)


time.sleep = _sleep
"""


@dataclass
class ClusterSpec:
    """What the drill's cluster is made of (the drill's options extend it)."""

    backend: str = "redis"
    replicas: int = 3
    timings: LeaseTimings = DRILL_TIMINGS
    #: servers to use instead of embedded ones
    redis_url: str | None = None
    mongo_url: str | None = None
    es_url: str | None = None
    #: TESTS ONLY: replicas run with fencing off
    unsafe: bool = False
    #: replicas run under libfaketime, so that their wall clocks can jump
    clock_jumps: bool = False
    #: Redis leases behind Sentinel (:mod:`.sentinel`) instead of one embedded Redis
    sentinel: bool = False
    #: the embedded SecantusDB's oplog cap (``None``: its own default)
    oplog_max_entries: int | None = DRILL_OPLOG_ENTRIES
    #: ElasticsearchSync listeners, each mirroring the collection into its own index
    listeners: int = 1
    #: ``partitions`` of each listener
    partitions: int = 1
    #: one shaped listener (:mod:`.shaped`) instead of mirrors of one collection
    shaped: bool = False
    #: and its orders embed their customer and lines (``--related``)
    related: bool = False


@dataclass(frozen=True)
class DrillListener:
    """One of the drill's listeners: its name, its index, and its lease names (one per
    partition, ``<name>.<i>-of-<K>``; the name itself when not partitioned)."""

    name: str
    index: str
    leases: tuple[str, ...]


def drill_listeners(count: int, partitions: int) -> list[DrillListener]:
    """The drill's listeners: all read the one collection, each into its own index, so that
    every index must equal the collection exactly (the first keeps today's names)."""
    out = []
    for i in range(count):
        name = LEASE if i == 0 else f"{LEASE}-{i + 1}"
        index = INDEX if i == 0 else f"{INDEX}-{i + 1}"
        out.append(DrillListener(name, index, tuple(layout_names(name, partitions))))
    return out


class DrillCluster:
    """Starts (or connects to) the servers and N replicas; knows who leads."""

    def __init__(self, workdir: Path, spec: ClusterSpec) -> None:
        self.workdir = workdir
        self.backend_name = spec.backend
        self.n = spec.replicas
        self.timings = spec.timings
        self.unsafe = spec.unsafe
        self.clock_jumps = spec.clock_jumps
        self.oplog_max_entries = spec.oplog_max_entries
        self.listeners = drill_listeners(spec.listeners, spec.partitions)
        self.partitions = spec.partitions
        self.shaped = spec.shaped
        self.related = spec.related
        #: the lease faults aim at: whoever holds it is "the leader"
        self.lease = self.listeners[0].leases[0]
        self.redis: PersistentRedis | None = None
        self.use_sentinel = spec.sentinel
        self.sentinel: SentinelTopology | None = None
        self.servers: list[EmbeddedServer] = []
        self.urls = {"redis": spec.redis_url, "mongo": spec.mongo_url, "es": spec.es_url}
        self.proxies: dict[str, TcpProxy] = {}
        #: one Elasticsearch proxy per replica, so one replica's sink can refuse it
        self.es_proxies: dict[str, TcpProxy] = {}
        self.replicas: dict[str, ReplicaProcess] = {}
        self.audit_paths: dict[str, Path] = {}
        self.clock_files: dict[str, Path] = {}
        self.config: Config | None = None
        #: every replica's runs of the drill's scheduled job (see drill/jobs.py)
        self.job_record = workdir / "job-runs.txt"
        self._backend: LeaseBackend | None = None

    # -- start/stop ---------------------------------------------------------------------
    def start_servers(self) -> None:
        logs = str(self.workdir)
        made: dict[str, EmbeddedServer] = {}
        if self.use_sentinel:
            self.sentinel = SentinelTopology(logs)
            self.sentinel.start()
            self.urls["redis"] = self.sentinel.url
        elif self.urls["redis"] is None and self.backend_name == "redis":
            self.redis = PersistentRedis(log_dir=logs)
            made["redis"] = self.redis
        if self.urls["mongo"] is None:
            made["mongo"] = MongoServer(log_dir=logs, oplog_max_entries=self.oplog_max_entries)
        if self.urls["es"] is None:
            made["es"] = ElasticServer(log_dir=logs)
        for key, server in made.items():
            self.servers.append(server)
            server.start()
            self.urls[key] = server.url  # (known once it runs: see EmbeddedServer.start)

    @property
    def mongo_url(self) -> str:
        return str(self.urls["mongo"])

    @property
    def es_url(self) -> str:
        return str(self.urls["es"])

    def _write_config(self) -> Path:
        t = self.timings
        path = self.workdir / "singleton.toml"
        redis_url = self.urls["redis"] or "redis://127.0.0.1:6379/0"
        path.write_text(
            f"""backend = "{self.backend_name}"
redis_url = "{redis_url}"
mongo_url = "{self.mongo_url}"
es_url = "{self.es_url}"
namespace = "{NAMESPACE}"

[lease]
ttl = {t.ttl}
renew_interval = {t.renew_interval}
renew_deadline = {t.renew_deadline}
retry_interval = {t.retry_interval}
cooldown = {t.cooldown}

{self._listener_tables()}
{job_toml()}"""
        )
        self.config = load_config(path)
        return path

    def _listener_tables(self) -> str:
        extra: dict[str, Any] = {"partitions": self.partitions} if self.partitions > 1 else {}
        if self.shaped:
            (li,) = self.listeners
            return shaped.layout_toml(
                li.name, DATABASE, shaped.INDEX_TEMPLATE, self.related, sink_name="drill", **extra
            )
        return "\n".join(
            es_listener_toml(li.name, DATABASE, COLLECTION, li.index, sink_name="drill", **extra)
            for li in self.listeners
        )

    @property
    def listener_leases(self) -> list[str]:
        return [lease for li in self.listeners for lease in li.leases]

    def running(self) -> list[str]:
        """Identities of the replica processes running now."""
        return [identity for identity, p in self.replicas.items() if p.alive]

    def start_replicas(self) -> None:
        config_path = self._write_config()
        store_url = self.urls["redis"] if self.backend_name == "redis" else self.mongo_url
        assert store_url is not None
        host, port = host_port(store_url, 6379 if self.backend_name == "redis" else 27017)
        base_env = child_environment()
        if self.unsafe:
            base_env[UNSAFE_ENV] = "1"
        preload = faketime_library() if self.clock_jumps else None
        if self.clock_jumps and preload is None:
            raise ConfigurationError(
                "clock-jump needs libfaketime: apt-get install -y faketime (make sysdeps)"
            )
        shim = self.workdir / "faketime-shim"
        if preload is not None:
            shim.mkdir(exist_ok=True)
            (shim / "sitecustomize.py").write_text(FAKETIME_SHIM)
        for i in range(1, self.n + 1):
            identity = f"replica-{i}"
            argv = singleton_command("run", "--config", str(config_path), "--identity", identity)
            if self.sentinel is None:  # with Sentinel: the redis_url of the config, direct
                proxy = TcpProxy(host, port)
                self.proxies[identity] = proxy
                flag = "--redis-url" if self.backend_name == "redis" else "--mongo-url"
                argv += [flag, via_proxy(store_url, proxy.port)]
            es_proxy = TcpProxy(*host_port(self.es_url, 9200))
            self.es_proxies[identity] = es_proxy
            argv += ["--es-url", via_proxy(self.es_url, es_proxy.port)]
            env = dict(base_env)
            audit = self.workdir / f"audit-{identity}.jsonl"
            self.audit_paths[identity] = audit
            env[AUDIT_ENV] = str(audit)
            env[JOB_RECORD_ENV] = str(self.job_record)
            if preload is not None:
                clock = self.workdir / f"clock-{identity}.rc"
                clock.write_text("+0\n")
                self.clock_files[identity] = clock
                path = [str(shim), *filter(None, [env.get("PYTHONPATH")])]
                env.update(
                    PYTHONPATH=os.pathsep.join(path),
                    LD_PRELOAD=preload,
                    FAKETIME_TIMESTAMP_FILE=str(clock),
                    FAKETIME_DONT_FAKE_MONOTONIC="1",
                    FAKETIME_CACHE_DURATION="1",
                )
            self.replicas[identity] = ReplicaProcess(
                identity, argv, self.workdir / f"{identity}.log", env
            )
        for p in self.replicas.values():
            p.start()

    def stop(self) -> None:
        for p in self.replicas.values():
            p.stop()
        for proxy in [*self.proxies.values(), *self.es_proxies.values()]:
            proxy.close()
        if self._backend is not None:
            self._backend.close()
            self._backend = None
        for server in reversed(self.servers):
            server.resume()
            server.cleanup()
        if self.sentinel is not None:
            self.sentinel.stop()

    # -- faults on the stores -------------------------------------------------------------
    def wipe_leases(self) -> None:
        """The lease store loses its data: FLUSHALL on Redis, drop the leases collection."""
        assert self.config is not None
        if self.backend_name == "redis":
            from singleton.drivers.redis import client_from_url

            client = client_from_url(str(self.urls["redis"]))
            try:
                client.flushall()
            finally:
                client.close()
        else:
            with self._mongo() as mongo:
                mongo[NAMESPACE].drop_collection("leases")

    def delete_checkpoint(self) -> bool:
        """Delete the first listener's checkpoints, every partition's (an operator's mistake);
        True if there was one."""
        names = list(self.listeners[0].leases)
        with self._mongo() as mongo:
            found = mongo[NAMESPACE]["checkpoints"].delete_many({"_id": {"$in": names}})
            return bool(found.deleted_count)

    def lose_history(self) -> str:
        """With every replica stopped: turn the first listener's checkpoints into bare cluster
        times (as they stand right after a copy), then write past the oplog's cap in a scratch
        collection, so that the oplog no longer reaches back to them; what was done."""
        names = list(self.listeners[0].leases)
        with self._mongo() as mongo:
            checkpoints = mongo[NAMESPACE]["checkpoints"]
            bare = checkpoints.update_many(
                {"_id": {"$in": names}}, {"$set": {"resume_token": None, "start_after": False}}
            )
            times = [d["cluster_time"] for d in checkpoints.find({"_id": {"$in": names}})]
            cap = self.oplog_max_entries or 100_000
            scratch, oplog = mongo[DATABASE]["drill_oplog_filler"], mongo["local"]["oplog.rs"]
            written = 0
            while written < cap + 5_000:  # just past the saved times: the stand-in slows down
                first = oplog.find_one({}, sort=[("$natural", 1)])
                if first is not None and times and first["ts"] > max(times):
                    break
                scratch.insert_many([{"n": written + i} for i in range(1_000)])
                written += 1_000
            scratch.drop()
        return f"{bare.modified_count} checkpoint(s) made bare, {written} oplog entries written"

    @contextlib.contextmanager
    def _mongo(self) -> Iterator[Any]:
        client, _ = mongo_client(self.mongo_url, timeout=5.0)
        try:
            yield client
        finally:
            client.close()

    # -- observation ----------------------------------------------------------------------
    def lease_backend(self) -> LeaseBackend:
        """A lease backend of the drill's own, connected directly (not through a proxy)."""
        if self._backend is None:
            assert self.config is not None
            self._backend = make_backend(self.config)
        return self._backend

    def checkpoint_store(self, client: Any) -> Any:
        from listeners.checkpoints.stores import MongoCheckpointStore

        return MongoCheckpointStore(client, database=NAMESPACE)

    def lease_state(
        self, backend: LeaseBackend | None = None, name: str | None = None
    ) -> LeaseState | None:
        """``name``'s holder (default: the lease faults aim at); ``None`` if unheld or unknown."""
        try:
            return (backend or self.lease_backend()).inspect(name or self.lease)
        except SingletonError:
            return None

    def leader(self) -> tuple[ReplicaProcess | None, int | None]:
        state = self.lease_state()
        if state is None:
            return None, None
        return self.replicas.get(state.identity), state.token

    def describe(self) -> str:
        lines = [f"  {kind} {url}" for kind, url in self.urls.items() if url]
        if self.redis is not None:
            lines.append("  redis: embedded, append-only file fsynced on every write")
        if self.sentinel is not None:
            lines.append(self.sentinel.describe())
        return "\n".join(lines)


def have_faketime() -> bool:
    return faketime_library() is not None and shutil.which("faketime") is not None
