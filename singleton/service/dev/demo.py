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
from typing import TYPE_CHECKING, Any, NamedTuple

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
from singleton.service.dev.embedded import (
    ElasticServer,
    EmbeddedServer,
    MongoServer,
    RedisServer,
    wait_until,
)
from singleton.service.drill.jobs import JOB, check_job, job_toml
from singleton.service.drill.jobs import RECORD_ENV as JOB_RECORD_ENV
from singleton.service.logs import setup_logging
from singleton.service.registry import make_backend

if TYPE_CHECKING:
    import pymongo
    from pymongo.collection import Collection

    from singleton.lease.contract import LeaseBackend

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
    if duration < 15:
        raise SingletonError(f"--duration must be at least 15 seconds, got {duration!r}")
    if replicas < 2:
        raise SingletonError(f"--replicas must be at least 2, got {replicas!r}")
    say = out or (lambda line: print(line, flush=True))  # noqa: T201
    setup_logging("text", "WARNING")
    root = Path(workdir or tempfile.mkdtemp(prefix="singleton-demo-"))
    root.mkdir(parents=True, exist_ok=True)
    say(f"singleton demo: {replicas} replicas, {backend} leases, {duration:.0f}s; logs in {root}")
    demo = _Demo(root, duration, say)
    previous_int = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, lambda *_: demo.interrupted.set())
    try:
        return demo.run(replicas, backend, live)
    finally:
        demo.cleanup()
        signal.signal(signal.SIGINT, previous_int)


class _Holder(NamedTuple):
    """Who the lease store names as holder (all empty when none, or when it does not answer)."""

    identity: str | None
    token: int | None
    ttl_remaining: float


def _holder(lease_backend: LeaseBackend) -> _Holder:
    try:
        state = lease_backend.inspect(LEASE)
    except SingletonError:
        return _Holder(None, None, 0.0)
    if state is None:
        return _Holder(None, None, 0.0)
    return _Holder(state.identity, state.token, state.ttl_remaining)


class _Demo:
    """One demo run: the servers, replicas, client and writer it started (all stopped by
    :meth:`cleanup`, whatever happened), and the lines it says."""

    def __init__(self, root: Path, duration: float, say: Callable[[str], None]) -> None:
        self.root = root
        self.duration = duration
        self.say = say
        self.redis = RedisServer(log_dir=str(root))
        self.mongo = MongoServer(log_dir=str(root))
        self.es = ElasticServer(log_dir=str(root))
        self.servers: list[EmbeddedServer] = [self.redis, self.mongo, self.es]
        self.procs: list[ReplicaProcess] = []
        self.writer: Writer | None = None
        self.client: pymongo.MongoClient[dict[str, Any]] | None = None
        self.interrupted = threading.Event()

    def run(self, replicas: int, backend: str, live: bool) -> int:
        for server in self.servers:
            server.start()
        note = " (fakeredis: redis-server not on PATH)" if self.redis.fake else ""
        self.say(
            f"  redis {self.redis.url}{note}\n  mongo {self.mongo.url} (SecantusDB)\n"
            f"  elasticsearch {self.es.url} (osmem-server)"
        )
        config_path = self.root / "singleton.toml"
        _write_config(
            config_path, self.redis.url, self.mongo.url, self.es.url, backend, self.duration
        )
        config = load_config(config_path)
        self.client, _ = mongo_client(self.mongo.url, timeout=5.0, socket_timeout=30.0)
        coll = self.client[DATABASE][COLLECTION]
        coll.insert_many(
            [{"_id": i, "sku": f"seed-{i}", "qty": i % 7, "v": 0} for i in range(1, 201)]
        )
        job_record = self.root / "job-runs.txt"  # the scheduled job, once a second, on one replica
        self._start_replicas(config_path, replicas, job_record)
        lease_backend = make_backend(config)
        self.writer = writer = Writer(coll, rate=40.0)
        writer_thread = threading.Thread(target=writer.run, name="demo-writer", daemon=True)
        writer_thread.start()
        self._break_leaders(coll, writer, lease_backend, live)
        writer.stop_event.set()
        writer_thread.join(5)
        if self.interrupted.is_set():
            self.say("interrupted: stopping everything")
            return 130
        self.say(
            f"  writer stopped after {writer.ops} operations; waiting for the index to catch up"
        )
        ok = self._verdict(coll, job_record)
        lease_backend.close()
        return 0 if ok else 1

    def _start_replicas(self, config_path: Path, replicas: int, job_record: Path) -> None:
        env = child_environment()
        env[JOB_RECORD_ENV] = str(job_record)
        for i in range(1, replicas + 1):
            identity = f"replica-{i}"
            argv = singleton_command("run", "--config", str(config_path), "--identity", identity)
            self.procs.append(ReplicaProcess(identity, argv, self.root / f"{identity}.log", env))
        for p in self.procs:
            p.start()

    def _break_leaders(
        self,
        coll: Collection[dict[str, Any]],
        writer: Writer,
        lease_backend: LeaseBackend,
        live: bool,
    ) -> None:
        """While the writer writes: SIGKILL, SIGTERM and rotate the leader at a quarter, 45% and
        65% of the run, and (``live``) print who leads and the counts once a second."""
        by_id = {p.identity: p for p in self.procs}
        faults = [(0.25, "kill"), (0.45, "term"), (0.65, "rotate")]
        t0 = time.monotonic()
        end_writes = t0 + self.duration * 0.85
        tick = threading.Event()
        last_print = 0.0
        killed_token: int | None = None  # a crashed leader's lease is left to run out
        while time.monotonic() < end_writes and not self.interrupted.is_set():
            elapsed = time.monotonic() - t0
            now = _holder(lease_backend)
            if faults and elapsed >= faults[0][0] * self.duration and now.identity in by_id:
                _, kind = faults.pop(0)
                self.say(
                    f"  [{elapsed:5.1f}s] fault: {kind} the leader {now.identity} "
                    f"(token {now.token})"
                )
                self._fault(kind, by_id[now.identity], t0)
                if kind == "kill":
                    killed_token = now.token
            elapsed = time.monotonic() - t0  # after a fault's own lines, never before them
            if live and elapsed - last_print >= 1.0:
                last_print = elapsed
                self._progress(elapsed, now, killed_token, coll, writer)
            tick.wait(0.2)

    def _fault(self, kind: str, victim: ReplicaProcess, t0: float) -> None:
        ident = victim.identity
        if kind == "kill":
            victim.signal(signal.SIGKILL)
            victim.wait(5)
            victim.start()
            at = time.monotonic() - t0
            self.say(f"  [{at:5.1f}s] {ident} restarted (a new process: it starts as a follower)")
        elif kind == "term":
            victim.signal(signal.SIGTERM)
            code = victim.wait(15)
            at = time.monotonic() - t0
            self.say(f"  [{at:5.1f}s] {ident} exited with {code} after handing over")
            victim.start()
            self.say(f"  [{time.monotonic() - t0:5.1f}s] {ident} restarted")
        else:
            victim.signal(signal.SIGUSR1)

    def _progress(
        self,
        elapsed: float,
        now: _Holder,
        killed_token: int | None,
        coll: Collection[dict[str, Any]],
        writer: Writer,
    ) -> None:
        counts = f"mongo={coll.estimated_document_count():<5} es={_es_count(self.es.url):<5}"
        note = ""
        if now.token is not None and now.token == killed_token:
            note = (
                f" (killed; its lease runs out in {now.ttl_remaining:.1f}s, "
                "then a follower takes over)"
            )
        self.say(
            f"  [{elapsed:5.1f}s] leader={now.identity or '-':<10} token={now.token or '-':<13} "
            f"{counts} writes={writer.ops}{note}"
        )

    def _verdict(self, coll: Collection[dict[str, Any]], job_record: Path) -> bool:
        """Wait (45 s at most) for the index to equal the collection, check the scheduled job,
        and say the verdict."""
        from listeners.elasticsearch.verify import compare

        diff: Any = None

        def caught_up() -> bool:
            nonlocal diff
            diff = compare(coll, self.es.url, INDEX)
            return bool(diff.ok)

        with contextlib.suppress(SingletonError):
            wait_until(caught_up, timeout=45.0, interval=0.5, what="index equal to collection")
        job = check_job(job_record, ["kill", "term", "rotate"])
        self.say(
            f"  scheduled job {JOB}: {job.runs} runs, {len(job.twice)} fire times twice, "
            f"{len(job.missing)} missing"
        )
        ok = bool(diff is not None and diff.ok and not job.failures())
        verdict = "PASS" if ok else "FAIL"
        self.say(f"verdict: {verdict}: {diff}" + "".join(f"; {f}" for f in job.failures()))
        return ok

    def cleanup(self) -> None:
        if self.writer is not None:
            self.writer.stop_event.set()
        for p in self.procs:
            p.stop()
        if self.client is not None:
            self.client.close()
        for server in reversed(self.servers):
            server.cleanup()


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
