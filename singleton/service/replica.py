"""One replica of the service: listeners and scheduled jobs, each under its own Elector and lease.

Failure model: the replica may be SIGKILLed at any instant (safe by design: leases expire, fenced
checkpoints refuse stale writers), or asked to stop with SIGTERM/SIGINT, in which case every
leader drains, checkpoints and releases within ``shutdown_timeout`` so that a rolling deploy
hands over in milliseconds instead of a lease TTL.
"""

from __future__ import annotations

import faulthandler
import gc
import signal
import sys
import threading
import time
from dataclasses import dataclass
from types import FrameType
from typing import Any

from loguru import logger

from listeners.base import ChangeStreamListener
from listeners.checkpoints.stores import CheckpointStore, check_deployment
from listeners.deadletters import DeadLetterStore
from listeners.runtime.audit import AuditLog
from listeners.runtime.runner import ListenerRunner
from listeners.stream.partition_seed import seed_partitions
from singleton.balance.balancer import Balancer
from singleton.drivers import mongo
from singleton.election.elector import Elector, default_identity
from singleton.errors import BackendUnavailableError, ConfigurationError
from singleton.lease.contract import LeaseBackend
from singleton.service.assembly import (
    build_scheduler,
    placed_listeners,
    warn_evicting_policy,
    warn_without_persistence,
)
from singleton.service.config import Config, TestSwitches
from singleton.service.registry import (
    make_backend,
    make_checkpoint_store,
)

#: How often the main thread wakes to run pending signal handlers (see :meth:`Replica.wait`).
SIGNAL_POLL = 0.5
#: The replica's young-generation GC threshold (CPython's default is 700): a stream allocates
#: thousands of short-lived dicts per batch, nearly all freed by reference counting, and the
#: default threshold runs a collection every few hundred events for nothing.
GC_THRESHOLD = 20_000

#: A stop still running after this many seconds dumps every thread's stack to stderr once (a
#: planned handover takes milliseconds; a stuck one must say where it is stuck).
STOP_DUMP_AFTER = 3.0


@dataclass
class Hosted:
    """One listener with its elector and runner."""

    name: str
    elector: Elector
    runner: ListenerRunner
    listener: ChangeStreamListener


class Replica:
    """Hosts every configured listener; ``start()``, then ``stop()`` (or ``run()`` for both
    with signal handling)."""

    def __init__(
        self,
        config: Config,
        *,
        backend: LeaseBackend | None = None,
        switches: TestSwitches | None = None,
    ) -> None:
        if not config.listeners and not config.jobs:
            raise ConfigurationError(
                "no listeners or jobs configured: pass --config singleton.toml (or "
                "$SINGLETON_CONFIG) with a [[listeners]] or [[jobs]] table, or --listener USE"
            )
        self.config = config
        self.identity = config.identity or default_identity()
        self._own_backend = backend is None
        self.backend = backend or make_backend(config)
        self._stop = threading.Event()
        #: When :meth:`stop` must be over (monotonic; set when it starts).
        self.stop_deadline: float | None = None
        self.started_at: float | None = None
        self.hosted: list[Hosted] = []
        self.switches = switches or TestSwitches()
        self.mongo: Any = None
        self.checkpoints: CheckpointStore | None = None
        self._audit: AuditLog | None = None
        self._placed = placed_listeners(config)
        self._listeners = [listener for listener, _ in self._placed]
        self._check_names()
        #: Spreads this replica's leases over the live replicas (``balance = true``).
        self.balancer = self._balancer() if config.balance else None
        #: Scheduled jobs (``[[jobs]]``), each under its own lease; ``None`` without any.
        self.jobs = (
            build_scheduler(config, self.backend, self.identity, self.balancer)
            if config.jobs
            else None
        )

    def _balancer(self) -> Balancer:
        prefer: dict[str, tuple[str, ...]] = {}
        min_tenure: dict[str, float] = {}
        for listener, lc in self._placed:
            prefer[listener.lease_name] = lc.prefer
            min_tenure[listener.lease_name] = lc.min_tenure
        for job in self.config.jobs:
            prefer[job.name], min_tenure[job.name] = job.prefer, job.min_tenure
        return Balancer(
            self.backend,
            self.identity,
            self.config.lease.timings(),
            prefer={k: v for k, v in prefer.items() if v},
            min_tenure={k: v for k, v in min_tenure.items() if v},
            busy=self._syncing,
        )

    def _syncing(self, lease: str) -> bool:
        """Whether this replica's runner of ``lease`` is in an initial sync or a resync (the
        balancer does not move it then: its successor would only redo part of it)."""
        return any(h.name == lease and h.runner.status().state == "syncing" for h in self.hosted)

    def _check_names(self) -> None:
        taken = {listener.lease_name for listener in self._listeners}
        clash = sorted(taken & {job.name for job in self.config.jobs})
        if clash:
            raise ConfigurationError(
                f"job names must differ from listener lease names, repeated: {', '.join(clash)}"
            )

    def start(self) -> Replica:
        checkpoints = self._listeners and self.config.checkpoint_store == "redis"
        if checkpoints or (self._own_backend and self.config.backend == "redis"):
            warn_evicting_policy(self.config.redis_url)
        if self._listeners:
            self._host_listeners()
        if self.balancer is not None:
            for h in self.hosted:
                self.balancer.add(h.elector)
            if self.jobs is not None:
                for name in self.jobs.names:
                    self.balancer.add(self.jobs.elector(name))
            self.balancer.start()
        if self.jobs is not None:
            self.jobs.start()
        for h in self.hosted:
            h.runner.start()
            h.elector.start()
        self.started_at = time.monotonic()
        logger.info(
            "replica {} started: backend={} listeners={} jobs={}",
            self.identity,
            self.backend.describe(),
            [h.name for h in self.hosted],
            [] if self.jobs is None else self.jobs.names,
        )
        return self

    def _host_listeners(self) -> None:
        unsafe = self.switches.unsafe_disable_fencing
        self.mongo, _ = mongo.client(
            self.config.mongo_url, mongo.Timeouts.lease_bound(self.config.lease.ttl)
        )
        self.checkpoints = make_checkpoint_store(
            self.config, self.mongo, unsafe_disable_fencing=unsafe
        )
        self._check_deployments(self.checkpoints)
        self._seed_partitions(self.checkpoints)
        if self.config.checkpoint_store == "redis":
            warn_without_persistence(self.config.redis_url)
        if self.switches.audit_file:
            self._audit = AuditLog(self.switches.audit_file, self.identity)
        timings = self.config.lease.timings()
        # dead letters live under the namespace, where `singleton dead-letters` looks
        dead_letters = DeadLetterStore(self.mongo, database=self.config.namespace)
        for listener in self._listeners:
            elector = Elector(
                self.backend,
                listener.lease_name,
                identity=self.identity,
                timings=timings,
                unsafe_disable_fencing=unsafe,
                gate=self.balancer,
            )
            runner = ListenerRunner(
                listener,
                elector,
                self.mongo,
                checkpoints=self.checkpoints,
                dead_letters=dead_letters,
                audit=None if self._audit is None else self._audit.bound(listener.lease_name),
                drain_timeout=self.config.drain_timeout,
            )
            self.hosted.append(Hosted(listener.lease_name, elector, runner, listener))

    def _seed_partitions(self, store: CheckpointStore) -> None:
        """After ``partitions`` changed, start the new layout from the old one's oldest
        checkpoint (:func:`listeners.stream.partition.seed_partitions`); refuses (exit 2) while the
        old
        layout still runs somewhere."""
        seen = set()
        for listener, lc in self._placed:
            if listener.name is None or listener.name in seen:
                continue
            seen.add(listener.name)
            try:
                seed_partitions(
                    store,
                    listener.name,
                    lc.partitions,
                    lambda lease: self.backend.inspect(lease) is not None,
                )
            except BackendUnavailableError as exc:
                logger.warning("cannot check the partitions of {}: {}", listener.name, exc)

    def _check_deployments(self, store: CheckpointStore) -> None:
        """Refuse to start (exit 2) for a listener whose checkpoint belongs to another
        deployment; an unreachable store is left to the claim at the first tenure."""
        for listener in self._listeners:
            try:
                check_deployment(store, listener)
            except BackendUnavailableError as exc:
                logger.warning(
                    "cannot check checkpoint {} at start-up (the first tenure will): {}",
                    listener.lease_name,
                    exc,
                )

    def request_stop(self, *_: Any) -> None:
        """Signal-safe: wakes :meth:`wait`."""
        self._stop.set()

    def wait(self, timeout: float | None = None) -> bool:
        """Until :meth:`request_stop` (or ``timeout``). Wakes every :data:`SIGNAL_POLL` seconds:
        Python runs signal handlers only in the main thread, and a signal the kernel delivered
        to another thread would otherwise wait for this wait to end."""
        end = None if timeout is None else time.monotonic() + timeout
        while not self._stop.wait(
            SIGNAL_POLL if end is None else min(SIGNAL_POLL, end - time.monotonic())
        ):
            if end is not None and time.monotonic() >= end:
                return False
        return True

    def stop(self) -> None:
        """Drain, checkpoint and release every lease this replica leads (in parallel)."""
        self._stop.set()
        t0 = time.monotonic()
        faulthandler.dump_traceback_later(STOP_DUMP_AFTER, file=sys.stderr)
        try:
            self._stop_all()
        finally:
            faulthandler.cancel_dump_traceback_later()
        logger.info("replica {} stopped in {:.3f}s", self.identity, time.monotonic() - t0)

    def _stop_all(self) -> None:
        # One deadline for the whole stop, whatever the sink does (a bulk request that will
        # never be answered included): what is still in flight then is unacknowledged, and the
        # successor replays it. The CLI does not wait past it either (:attr:`stop_deadline`).
        end = self.stop_deadline = time.monotonic() + self.config.shutdown_timeout

        def left() -> float:
            return max(0.05, end - time.monotonic())

        if self.balancer is not None:  # leave first: the others' shares grow before we release
            self.balancer.stop(self.config.shutdown_timeout)
        threads = [
            threading.Thread(target=h.elector.stop, kwargs={"release": True}, daemon=True)
            for h in self.hosted
        ]
        if self.jobs is not None:
            threads.append(threading.Thread(target=self.jobs.stop, daemon=True))
        for t in threads:
            t.start()
        for t in threads:
            t.join(left())
        for h in self.hosted:
            h.runner.stop(timeout=left())
        if self.checkpoints is not None:
            self.checkpoints.close()
        if self.mongo is not None:
            self.mongo.close()
        if self._audit is not None:
            self._audit.close()
        if self._own_backend:
            self.backend.close()

    def run(self) -> int:
        """Start, wait for SIGTERM/SIGINT, hand over, return the exit code (0)."""
        previous = {}
        for sig in (signal.SIGTERM, signal.SIGINT):
            previous[sig] = signal.signal(sig, self._on_signal)
        previous[signal.SIGUSR1] = signal.signal(signal.SIGUSR1, self._on_rotate)
        gc.collect()
        gc.freeze()  # modules and configuration live as long as the process: never scan them
        gc.set_threshold(GC_THRESHOLD, *gc.get_threshold()[1:])
        try:
            self.start()
            self.wait()
        finally:
            self.stop()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        return 0

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        logger.info(
            "replica {} received {}: handing over", self.identity, signal.Signals(signum).name
        )
        faulthandler.dump_traceback_later(STOP_DUMP_AFTER, file=sys.stderr)  # stop() re-arms it
        self.request_stop()

    def _on_rotate(self, signum: int, frame: FrameType | None) -> None:
        """SIGUSR1: every lease this replica leads is handed over now (drain, then release)."""
        for h in self.hosted:
            h.elector.rotate()
        if self.jobs is not None:
            for name in self.jobs.names:
                self.jobs.elector(name).rotate()

    def problems(self) -> list[str]:
        """Why this replica is not ready, one sentence per listener (empty: ready)."""
        out = []
        for h in self.hosted:
            status = h.runner.status()
            if not status.ready:
                left = ""
                if status.cooldown_until is not None:
                    left = (
                        f", retrying in {max(0.0, status.cooldown_until - time.monotonic()):.0f}s"
                    )
                out.append(
                    f"listener {h.name} failed ({status.failed_tenures} in a row{left}): "
                    f"{status.failure}"
                )
            if h.elector.failing:
                out.append(f"listener {h.name}: lease store refuses us: {h.elector.last_error}")
        if self.jobs is not None:
            out += self.jobs.problems()
        return out

    def status(self) -> dict[str, Any]:
        """This replica's local view (what ``/status`` serves)."""
        out = []
        for h in self.hosted:
            ld = h.elector.leadership
            entry: dict[str, Any] = {
                "name": h.name,
                "leader": ld is not None,
                "token": None if ld is None else ld.token,
                "valid_for": None if ld is None else round(ld.remaining(), 3),
            }
            entry["runner"] = h.runner.status().as_dict()
            out.append(entry)
        jobs = [] if self.jobs is None else [s.as_dict() for s in self.jobs.status()]
        balance = None if self.balancer is None else self.balancer.view().as_dict()
        return {"identity": self.identity, "listeners": out, "jobs": jobs, "balance": balance}
