"""singleton: exactly one active instance out of N replicas, with fenced leases.

The election core knows nothing about MongoDB change streams or Elasticsearch; those live in the
``listeners`` package, which depends on this one (never the reverse).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from singleton.clock import Clock, SystemClock
from singleton.election.elector import Elector
from singleton.election.leadership import Leadership
from singleton.errors import (
    BackendError,
    BackendUnavailableError,
    ConfigurationError,
    ElectionTimeoutError,
    HistoryLostError,
    LeaseLostError,
    PermissionDeniedError,
    SingletonError,
    SinkError,
    StaleWriterError,
)
from singleton.lease.contract import Lease, LeaseBackend, LeaseState

if TYPE_CHECKING:
    from singleton.jobs.context import JobContext
    from singleton.jobs.scheduler import LeaderScheduler
    from singleton.lease.mongo import MongoLeaseBackend
    from singleton.lease.redis import RedisLeaseBackend

__all__ = [
    "BackendError",
    "BackendUnavailableError",
    "Clock",
    "ConfigurationError",
    "ElectionTimeoutError",
    "Elector",
    "HistoryLostError",
    "JobContext",
    "LeaderScheduler",
    "Leadership",
    "Lease",
    "LeaseBackend",
    "LeaseLostError",
    "LeaseState",
    "MongoLeaseBackend",
    "PermissionDeniedError",
    "RedisLeaseBackend",
    "SingletonError",
    "SinkError",
    "StaleWriterError",
    "SystemClock",
]

__version__ = "0.1.0"

_LAZY = {
    "RedisLeaseBackend": "singleton.lease.redis",
    "MongoLeaseBackend": "singleton.lease.mongo",
    "LeaderScheduler": "singleton.jobs.scheduler",
    "JobContext": "singleton.jobs.context",
}


def __getattr__(name: str) -> Any:
    # Backends and jobs import their drivers (and APScheduler) lazily: `import singleton` stays
    # cheap.
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'singleton' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
