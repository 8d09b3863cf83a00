"""What several benchmarks share: percentiles, a process's CPU time and memory, an index's
document count, three ``singleton run`` replicas on one config (and a whole cluster of them on
embedded servers, torn down on exit), and a paced writer."""

from __future__ import annotations

import contextlib
import os
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pymongo

from listeners.elasticsearch.transport import Transport as EsTransport
from singleton.lease.redis import RedisLeaseBackend
from singleton.service.dev.cluster import ReplicaProcess, child_environment, singleton_command
from singleton.service.dev.embedded import ElasticServer, MongoServer, RedisServer


def pct(values: list[float], q: float) -> float:
    """The ``q`` quantile of ``values`` (nearest rank)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (``/proc/<pid>/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mb(pid: int) -> float:
    """Resident memory of process ``pid`` in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def es_count(es: EsTransport, index: str) -> int:
    """Documents in ``index`` now (0 if it cannot be read)."""
    status, body = es.request("GET", f"/{index}/_count")
    return int(body["count"]) if status == 200 and isinstance(body, dict) else 0


def start_servers(root: Path) -> list[Any]:
    """Embedded Redis, SecantusDB and osmem-server, started, in that order, logging into
    ``root``."""
    servers: list[Any] = [RedisServer(log_dir=str(root)), MongoServer(log_dir=str(root))]
    servers.append(ElasticServer(log_dir=str(root)))
    for s in servers:
        s.start()
    return servers


@contextlib.contextmanager
def embedded_urls(prefix: str) -> Iterator[tuple[Path, dict[str, str]]]:
    """A fresh work directory (``prefix`` names it) and the URLs of embedded Redis, SecantusDB
    and osmem-server started in it (keys ``redis``, ``mongo``, ``es``); stopped on exit."""
    root = Path(tempfile.mkdtemp(prefix=prefix))
    servers = start_servers(root)
    try:
        yield root, {"redis": servers[0].url, "mongo": servers[1].url, "es": servers[2].url}
    finally:
        for s in servers:
            s.stop()


def three_replicas(config: Path, root: Path) -> dict[str, ReplicaProcess]:
    """Replicas ``r0``..``r2`` of ``singleton run --config config``, logging into ``root``."""
    env = child_environment()
    return {
        f"r{i}": ReplicaProcess(
            f"r{i}",
            singleton_command("run", "--config", str(config), "--identity", f"r{i}"),
            root / f"r{i}.log",
            env,
        )
        for i in range(3)
    }


class Replicas(NamedTuple):
    """Three running replicas, their lease store (namespace ``bench``), a client on their
    SecantusDB, the event that stops a benchmark's load threads, and the servers' URLs (keys
    ``redis``, ``mongo``, ``es``)."""

    procs: dict[str, ReplicaProcess]
    backend: RedisLeaseBackend
    client: pymongo.MongoClient[dict[str, Any]]
    stop: threading.Event
    urls: dict[str, str]


#: The ``[lease]`` timings of the benchmarks' replicas unless one gives its own.
BENCH_TIMINGS = """ttl = 4.0
renew_interval = 1.0
renew_deadline = 2.5
retry_interval = 1.0"""


def replica_config(
    root: Path, urls: dict[str, str], listener: str, settings: str = "", lease: str = ""
) -> Path:
    """``root/singleton.toml``: Redis leases (namespace ``bench``, :data:`BENCH_TIMINGS` unless
    ``lease`` gives a ``ttl``: then ``lease`` alone) and one ``elasticsearch`` listener
    ``listener`` mirroring ``bench.orders`` into the index of that name, on the servers ``urls``
    names (``redis``, ``mongo``, ``es``); ``settings`` and ``lease`` are more TOML lines for the
    top and the ``[lease]`` table."""
    timings = "" if "ttl =" in lease else BENCH_TIMINGS
    config = root / "singleton.toml"
    config.write_text(
        f"""backend = "redis"
redis_url = "{urls["redis"]}"
mongo_url = "{urls["mongo"]}"
es_url = "{urls["es"]}"
namespace = "bench"
log_level = "INFO"
{settings}

[lease]
{timings}
{lease}

[[listeners]]
use = "elasticsearch"
name = "{listener}"
database = "bench"
collection = "orders"
index = "{listener}"
"""
    )
    return config


@contextlib.contextmanager
def running_replicas(
    prefix: str, listener: str, settings: str = "", lease: str = ""
) -> Iterator[Replicas]:
    """Embedded servers in a fresh work directory (``prefix`` names it) and three replicas of
    :func:`replica_config` (``listener``, ``settings``, ``lease``) on them, started. On exit
    ``stop`` is set, the replicas stop, the store and the client close, and the servers are
    cleaned up."""
    root = Path(tempfile.mkdtemp(prefix=prefix))
    servers = start_servers(root)
    redis_srv, mongo_srv, es_srv = servers
    urls = {"redis": redis_srv.url, "mongo": mongo_srv.url, "es": es_srv.url}
    config = replica_config(root, urls, listener, settings, lease)
    procs = three_replicas(config, root)
    backend = RedisLeaseBackend(redis_srv.url, namespace="bench")
    client: pymongo.MongoClient[dict[str, Any]] = pymongo.MongoClient(mongo_srv.url)
    stop = threading.Event()
    try:
        for p in procs.values():
            p.start()
        yield Replicas(procs, backend, client, stop, urls)
    finally:
        stop.set()
        for p in procs.values():
            p.stop()
        backend.close()
        client.close()
        for s in reversed(servers):
            s.cleanup()


def paced_writer(
    coll: Any, rate: float, step: int, stop: threading.Event, written: list[int]
) -> None:
    """Insert ``{_id: n, n: n}`` documents ``step`` at a time at ``rate`` a second until
    ``stop``; ``written[0]`` counts them."""
    next_at = time.monotonic()
    while not stop.is_set():
        base = written[0]
        coll.insert_many([{"_id": base + i, "n": base + i} for i in range(step)])
        written[0] += step
        next_at += step / rate
        stop.wait(max(0.0, next_at - time.monotonic()))
