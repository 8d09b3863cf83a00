"""``singleton demo``: the main job on embedded servers, with forced failovers and a verdict.

It starts Redis (the real ``redis-server`` when on PATH, else fakeredis's TCP server),
SecantusDB and osmem-server, seeds a collection, runs N ``singleton run`` replicas that mirror it
into Elasticsearch with :class:`~listeners.elasticsearch.ElasticsearchSync`, keeps a writer going,
and breaks the leader three ways (SIGKILL, SIGTERM, a voluntary rotation via SIGUSR1). It prints
who leads with which fencing token and the counts on both sides, and ends with a verdict: exit 0
only if the index equals the collection, every id and every field.
"""

from __future__ import annotations

import contextlib
import signal
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from loguru import logger

from singleton.drivers.mongo import client as mongo_client
from singleton.errors import SingletonError
from singleton.service.config import load_config
from singleton.service.dev.cluster import (
    ReplicaProcess,
    Writer,
    child_environment,
    es_listener_toml,
    singleton_command,
)
from singleton.service.dev.embedded import ElasticServer, MongoServer, RedisServer, wait_until
from singleton.service.drill.jobs import JOB, check_job, job_toml
from singleton.service.drill.jobs import RECORD_ENV as JOB_RECORD_ENV
from singleton.service.logs import setup_logging
from singleton.service.registry import make_backend

DATABASE, COLLECTION, INDEX, LEASE = "demo", "orders", "demo-orders", "orders-to-es"


def _write_config(
    path: Path, redis_url: str, mongo_url: str, es_url: str, backend: str, duration: float
) -> None:
    path.write_text(
        f"""backend = "{backend}"
redis_url = "{redis_url}"
mongo_url = "{mongo_url}"
es_url = "{es_url}"
namespace = "singleton-demo"

[lease]
ttl = 3.0
renew_interval = 0.6
renew_deadline = 2.0
retry_interval = 0.5
max_tenure = {max(10.0, duration):.1f}
cooldown = 1.0

{es_listener_toml(LEASE, DATABASE, COLLECTION, INDEX)}
{job_toml()}"""
    )


def run_demo(
    duration: float = 45.0,
    replicas: int = 3,
    backend: str = "redis",
    workdir: str | None = None,
    live: bool = True,
    out: Callable[[str], None] | None = None,
) -> int:
    """Run the demo; return 0 if the index equals the collection at the end."""
    import pymongo

    from listeners.elasticsearch.verify import compare

    if duration < 15:
        raise SingletonError(f"--duration must be at least 15 seconds, got {duration!r}")
    if replicas < 2:
        raise SingletonError(f"--replicas must be at least 2, got {replicas!r}")
    say = out or (lambda line: print(line, flush=True))  # noqa: T201
    setup_logging("text", "WARNING")
    root = Path(workdir or tempfile.mkdtemp(prefix="singleton-demo-"))
    root.mkdir(parents=True, exist_ok=True)
    say(f"singleton demo: {replicas} replicas, {backend} leases, {duration:.0f}s; logs in {root}")
    servers = [
        RedisServer(log_dir=str(root)),
        MongoServer(log_dir=str(root)),
        ElasticServer(log_dir=str(root)),
    ]
    procs: list[ReplicaProcess] = []
    writer: Writer | None = None
    client: pymongo.MongoClient[dict[str, Any]] | None = None
    previous_int = signal.getsignal(signal.SIGINT)
    interrupted = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: interrupted.set())
    try:
        for server in servers:
            server.start()
        redis_srv, mongo_srv, es_srv = servers
        note = " (fakeredis: redis-server not on PATH)" if redis_srv.fake else ""  # type: ignore[attr-defined]
        say(
            f"  redis {redis_srv.url}{note}\n  mongo {mongo_srv.url} (SecantusDB)\n"
            f"  elasticsearch {es_srv.url} (osmem-server)"
        )
        config_path = root / "singleton.toml"
        _write_config(config_path, redis_srv.url, mongo_srv.url, es_srv.url, backend, duration)
        config = load_config(config_path)
        client, _ = mongo_client(mongo_srv.url, timeout=5.0, socket_timeout=30.0)
        coll = client[DATABASE][COLLECTION]
        coll.insert_many(
            [{"_id": i, "sku": f"seed-{i}", "qty": i % 7, "v": 0} for i in range(1, 201)]
        )
        env = child_environment()
        job_record = root / "job-runs.txt"  # the scheduled job, once a second, on one replica
        env[JOB_RECORD_ENV] = str(job_record)
        for i in range(1, replicas + 1):
            identity = f"replica-{i}"
            argv = singleton_command("run", "--config", str(config_path), "--identity", identity)
            procs.append(ReplicaProcess(identity, argv, root / f"{identity}.log", env))
        for p in procs:
            p.start()
        by_id = {p.identity: p for p in procs}
        lease_backend = make_backend(config)

        def leader() -> tuple[str | None, int | None, float]:
            try:
                state = lease_backend.inspect(LEASE)
            except SingletonError:
                return None, None, 0.0
            if state is None:
                return None, None, 0.0
            return state.identity, state.token, state.ttl_remaining

        writer = Writer(coll, rate=40.0)
        writer_thread = threading.Thread(target=writer.run, name="demo-writer", daemon=True)
        writer_thread.start()
        faults = [(0.25, "kill"), (0.45, "term"), (0.65, "rotate")]
        t0 = time.monotonic()
        end_writes = t0 + duration * 0.85
        tick = threading.Event()
        last_print = 0.0
        killed_token: int | None = None  # a crashed leader's lease is left to run out
        while time.monotonic() < end_writes and not interrupted.is_set():
            elapsed = time.monotonic() - t0
            ident, token, left = leader()
            if faults and elapsed >= faults[0][0] * duration and ident in by_id:
                _, kind = faults.pop(0)
                victim = by_id[ident]
                say(f"  [{elapsed:5.1f}s] fault: {kind} the leader {ident} (token {token})")
                if kind == "kill":
                    victim.signal(signal.SIGKILL)
                    victim.wait(5)
                    killed_token = token
                    victim.start()
                    at = time.monotonic() - t0
                    say(
                        f"  [{at:5.1f}s] {ident} restarted (a new process: it starts as a follower)"
                    )
                elif kind == "term":
                    victim.signal(signal.SIGTERM)
                    code = victim.wait(15)
                    at = time.monotonic() - t0
                    say(f"  [{at:5.1f}s] {ident} exited with {code} after handing over")
                    victim.start()
                    say(f"  [{time.monotonic() - t0:5.1f}s] {ident} restarted")
                else:
                    victim.signal(signal.SIGUSR1)
            elapsed = time.monotonic() - t0  # after a fault's own lines, never before them
            if live and elapsed - last_print >= 1.0:
                last_print = elapsed
                counts = f"mongo={coll.estimated_document_count():<5} es={_es_count(es_srv.url):<5}"
                note = ""
                if token is not None and token == killed_token:
                    note = (
                        f" (killed; its lease runs out in {left:.1f}s, then a follower takes over)"
                    )
                say(
                    f"  [{elapsed:5.1f}s] leader={ident or '-':<10} token={token or '-':<13} "
                    f"{counts} writes={writer.ops}{note}"
                )
            tick.wait(0.2)
        writer.stop_event.set()
        writer_thread.join(5)
        if interrupted.is_set():
            say("interrupted: stopping everything")
            return 130
        say(f"  writer stopped after {writer.ops} operations; waiting for the index to catch up")
        diff: Any = None

        def caught_up() -> bool:
            nonlocal diff
            diff = compare(coll, es_srv.url, INDEX)
            return bool(diff.ok)

        with contextlib.suppress(SingletonError):
            wait_until(caught_up, timeout=45.0, interval=0.5, what="index equal to collection")
        job = check_job(job_record, ["kill", "term", "rotate"])
        say(
            f"  scheduled job {JOB}: {job.runs} runs, {len(job.twice)} fire times twice, "
            f"{len(job.missing)} missing"
        )
        ok = diff is not None and diff.ok and not job.failures()
        verdict = "PASS" if ok else "FAIL"
        say(f"verdict: {verdict}: {diff}" + "".join(f"; {f}" for f in job.failures()))
        lease_backend.close()
        return 0 if ok else 1
    finally:
        if writer is not None:
            writer.stop_event.set()
        for p in procs:
            p.stop()
        if client is not None:
            client.close()
        for server in reversed(servers):
            server.cleanup()
        signal.signal(signal.SIGINT, previous_int)


def _es_count(url: str) -> int:
    import json
    import urllib.request

    try:
        req = urllib.request.Request(
            f"{url}/{INDEX}/_count", headers={"Accept": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=2) as resp:
            return int(json.loads(resp.read())["count"])
    except Exception:  # not created yet, or busy: the count is only informative
        logger.debug("count failed")
        return 0
