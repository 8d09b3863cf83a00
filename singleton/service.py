"""One replica of the service: listeners, each under its own Elector and lease name.

Failure model: the replica may be SIGKILLed at any instant (safe by design: leases expire, fenced
checkpoints refuse stale writers), or asked to stop with SIGTERM/SIGINT, in which case every
leader drains, checkpoints and releases within ``shutdown_timeout`` so that a rolling deploy
hands over in milliseconds instead of a lease TTL.

``singleton`` does not import ``listeners``: the listener classes and the runner are resolved by
name (``singleton.registry``) when the replica is built.
"""

from __future__ import annotations

import signal
import threading
import time
from dataclasses import dataclass
from types import FrameType
from typing import Any

from loguru import logger

from singleton.abc import LeaseBackend
from singleton.config import Config, ListenerConfig
from singleton.elector import Elector, default_identity
from singleton.errors import ConfigurationError, SingletonError
from singleton.registry import RUNNER, resolve

#: listener option -> service setting, filled in when the class accepts it and the table omits it
SERVICE_OPTIONS = {"es": "es_url", "api_key": "es_api_key", "ca_certs": "es_ca_certs"}


def make_backend(config: Config) -> LeaseBackend:
    """The lease backend named by ``config.backend`` (the replica owns it)."""
    if config.backend == "redis":
        from singleton.backends.redis import RedisLeaseBackend

        return RedisLeaseBackend(config.redis_url, namespace=config.namespace)
    if config.backend == "mongo":
        from singleton.backends.mongo import MongoLeaseBackend

        return MongoLeaseBackend(config.mongo_url, database=config.namespace)
    raise ConfigurationError(f"backend must be redis or mongo, got {config.backend!r}")


def make_checkpoint_store(config: Config, mongo_client: Any) -> Any:
    if config.checkpoint_store == "redis":
        cls = resolve("listeners.checkpoint:RedisCheckpointStore", {}, "checkpoint store")
        return cls(config.redis_url, namespace=config.namespace)
    cls = resolve("listeners.checkpoint:MongoCheckpointStore", {}, "checkpoint store")
    return cls(mongo_client, database=config.namespace)


def build_listener(lc: ListenerConfig, config: Config) -> Any:
    """Instantiate a ``[[listeners]]`` table: every key but ``use`` is a keyword argument;
    service-wide settings (Elasticsearch URL and credentials, lease ttl) fill in what the class
    accepts and the table did not set."""
    cls = resolve(lc.use)
    options = dict(lc.options)
    accepted: frozenset[str] = getattr(cls, "extra_options", frozenset())
    for option, key in SERVICE_OPTIONS.items():
        if option in accepted and option not in options and getattr(config, key) is not None:
            options[option] = getattr(config, key)
    if "ttl" in accepted and "ttl" not in options:  # sizes index.gc_deletes from the lease
        options["ttl"] = config.lease.ttl
    try:
        return cls(**options)
    except SingletonError:
        raise
    except TypeError as exc:
        raise ConfigurationError(f"listener {lc.use!r}: {exc}") from exc


@dataclass
class Hosted:
    """One listener with its elector and runner."""

    name: str
    elector: Elector
    runner: Any
    listener: Any


class Replica:
    """Hosts every configured listener; ``start()``, then ``stop()`` (or ``run()`` for both
    with signal handling)."""

    def __init__(self, config: Config, *, backend: LeaseBackend | None = None) -> None:
        if not config.listeners:
            raise ConfigurationError("no listeners configured: add a [[listeners]] table")
        self.config = config
        self.identity = config.identity or default_identity()
        self._own_backend = backend is None
        self.backend = backend or make_backend(config)
        self._stop = threading.Event()
        self.started_at: float | None = None
        self.hosted: list[Hosted] = []
        self.mongo: Any = None
        self.checkpoints: Any = None
        self._listeners = [build_listener(lc, config) for lc in config.listeners]

    def start(self) -> Replica:
        import pymongo

        self.mongo = pymongo.MongoClient(
            self.config.mongo_url,
            serverSelectionTimeoutMS=5000,
            connectTimeoutMS=3000,
            socketTimeoutMS=max(5000, int(self.config.lease.ttl * 1000)),
        )
        self.checkpoints = make_checkpoint_store(self.config, self.mongo)
        runner_cls = resolve(RUNNER, {}, "runner")
        lease = self.config.lease.resolved()
        for listener in self._listeners:
            elector = Elector(
                self.backend,
                listener.lease_name,
                identity=self.identity,
                ttl=lease.ttl,
                renew_interval=lease.renew_interval,
                renew_deadline=lease.renew_deadline,
                retry_interval=lease.retry_interval,
                max_tenure=lease.max_tenure,
                cooldown=lease.cooldown,
            )
            runner = runner_cls(listener, elector, self.mongo, checkpoints=self.checkpoints)
            self.hosted.append(Hosted(listener.lease_name, elector, runner, listener))
        for h in self.hosted:
            h.runner.start()
            h.elector.start()
        self.started_at = time.monotonic()
        logger.info(
            "replica {} started: backend={} listeners={}",
            self.identity,
            self.backend.describe(),
            [h.name for h in self.hosted],
        )
        return self

    def request_stop(self, *_: Any) -> None:
        """Signal-safe: wakes :meth:`wait`."""
        self._stop.set()

    def wait(self, timeout: float | None = None) -> bool:
        return self._stop.wait(timeout)

    def stop(self) -> None:
        """Drain, checkpoint and release every lease this replica leads (in parallel)."""
        self._stop.set()
        t0 = time.monotonic()
        threads = [
            threading.Thread(target=h.elector.stop, kwargs={"release": True}, daemon=True)
            for h in self.hosted
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(self.config.shutdown_timeout)
        for h in self.hosted:
            h.runner.stop()
        if self.checkpoints is not None:
            self.checkpoints.close()
        if self.mongo is not None:
            self.mongo.close()
        if self._own_backend:
            self.backend.close()
        logger.info("replica {} stopped in {:.3f}s", self.identity, time.monotonic() - t0)

    def run(self) -> int:
        """Start, wait for SIGTERM/SIGINT, hand over, return the exit code (0)."""
        previous = {}
        for sig in (signal.SIGTERM, signal.SIGINT):
            previous[sig] = signal.signal(sig, self._on_signal)
        previous[signal.SIGUSR1] = signal.signal(signal.SIGUSR1, self._on_rotate)
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
        self.request_stop()

    def _on_rotate(self, signum: int, frame: FrameType | None) -> None:
        """SIGUSR1: every lease this replica leads is handed over now (drain, then release)."""
        for h in self.hosted:
            h.elector.rotate()

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
            runner_status = getattr(h.runner, "status", None)
            if callable(runner_status):
                entry["runner"] = runner_status()
            out.append(entry)
        return {"identity": self.identity, "listeners": out}
