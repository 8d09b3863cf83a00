"""Building a replica's parts from the configuration: listeners (one per partition), the
scheduler of its jobs, and the start-up checks that need no running replica."""

from __future__ import annotations

from loguru import logger

from listeners.base import ChangeStreamListener
from listeners.stream.partition import Partition
from singleton.balance.balancer import Balancer
from singleton.errors import ConfigurationError, SingletonError
from singleton.jobs.context import make_trigger
from singleton.jobs.scheduler import LeaderScheduler
from singleton.lease.contract import LeaseBackend
from singleton.redact import redact
from singleton.service.config import Config, ListenerConfig
from singleton.service.registry import job_function, listener_kind


def build_listener(lc: ListenerConfig, config: Config) -> ChangeStreamListener:
    """Instantiate a ``[[listeners]]`` table: every key but ``use`` is a keyword argument;
    the service settings its kind declares (Elasticsearch URL and credentials, lease ttl) fill
    in what the table did not set."""
    kind = listener_kind(lc.use)
    options = dict(lc.options)
    for option, key in kind.service_options.items():
        table, _, sub = key.partition(".")
        value = getattr(getattr(config, table), sub) if sub else getattr(config, key)
        if option not in options and value is not None:
            options[option] = value
    try:
        return kind.cls(**options)
    except SingletonError:
        raise
    except Exception as exc:  # a user's __init__ may raise anything: name the listener
        raise ConfigurationError(f"listener {lc.use!r}: {type(exc).__name__}: {exc}") from exc


def build_listeners(config: Config) -> list[ChangeStreamListener]:
    """Every configured listener, one instance per partition (``partitions = K``); their lease
    names must be unique."""
    return [listener for listener, _ in placed_listeners(config)]


def placed_listeners(config: Config) -> list[tuple[ChangeStreamListener, ListenerConfig]]:
    """:func:`build_listeners`, each with the table it came from (for its placement keys)."""
    built = []
    for lc in config.listeners:
        if lc.partitions == 1:
            built.append((build_listener(lc, config), lc))
            continue
        for i in range(lc.partitions):
            listener = build_listener(lc, config)
            listener.partition = Partition(i, lc.partitions)
            built.append((listener, lc))
    names = [listener.lease_name for listener, _ in built]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ConfigurationError(f"listener names must be unique, repeated: {', '.join(dupes)}")
    return built


def build_scheduler(
    config: Config, backend: LeaseBackend, identity: str, gate: Balancer | None
) -> LeaderScheduler:
    """Every ``[[jobs]]`` table in one :class:`LeaderScheduler` (each job its own lease)."""
    scheduler = LeaderScheduler(
        backend, identity=identity, timings=config.lease.timings(), gate=gate
    )
    for job in config.jobs:
        scheduler.add_job(
            job_function(job.use),
            make_trigger(job.every, job.cron),
            name=job.name,
            coalesce=job.coalesce,
            misfire_grace_time=job.misfire_grace,
            max_instances=job.max_instances,
            max_failures=job.max_failures,
        )
    return scheduler


def warn_without_persistence(redis_url: str) -> None:
    """A Redis checkpoint store that keeps nothing on disk loses every position on a restart:
    say so once at start-up (a managed Redis that hides ``CONFIG`` is given the benefit of the
    doubt)."""
    import redis

    from singleton.drivers.redis import client_from_url

    # Under Sentinel this asks the current master (replicas should persist alike; not checked).
    client = client_from_url(redis_url, socket_timeout=2, socket_connect_timeout=2)
    try:
        aof = client.config_get("appendonly").get("appendonly")
        save = client.config_get("save").get("save")
    except redis.RedisError:
        return
    finally:
        client.close()
    if aof == "no" and not save:
        logger.warning(
            "checkpoint_store = redis, but {} keeps nothing on disk (appendonly no, no save "
            "points): a restart loses every checkpoint; enable appendonly or use the mongo store",
            redact(redis_url),
        )
