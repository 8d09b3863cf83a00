"""singleton: exactly one active instance out of N replicas, with fenced leases.

The election core knows nothing about MongoDB change streams or Elasticsearch; those live in the
``listeners`` package, which depends on this one (never the reverse).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from singleton.abc import Lease, LeaseBackend, LeaseState
from singleton.clock import Clock, SystemClock
from singleton.elector import ElectionTimeoutError, Elector
from singleton.errors import (
    BackendError,
    BackendUnavailableError,
    ConfigurationError,
    HistoryLostError,
    LeaseLostError,
    PermissionDeniedError,
    SingletonError,
    SinkError,
    StaleWriterError,
)
from singleton.leadership import Leadership

if TYPE_CHECKING:
    from singleton.backends.mongo import MongoLeaseBackend
    from singleton.backends.redis import RedisLeaseBackend
    from singleton.jobs import LeaderScheduler
    from singleton.jobs_context import JobContext

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
    "RedisLeaseBackend": "singleton.backends.redis",
    "MongoLeaseBackend": "singleton.backends.mongo",
    "LeaderScheduler": "singleton.jobs",
    "JobContext": "singleton.jobs_context",
}


def __getattr__(name: str) -> Any:
    # Backends and jobs import their drivers (and APScheduler) lazily: `import singleton` stays
    # cheap.
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'singleton' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
