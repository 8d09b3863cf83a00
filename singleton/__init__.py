"""singleton: exactly one active instance out of N replicas, with fenced leases.

The election core knows nothing about MongoDB change streams or Elasticsearch; those live in the
``listeners`` package, which depends on this one (never the reverse).

As a library it writes no log line until the application asks: ``logger.enable("singleton")``
(loguru) or :func:`singleton.use_stdlib_logging` (the standard ``logging`` module).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from loguru import logger

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
from singleton.stdlog import PACKAGES, use_stdlib_logging

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
    "__version__",
    "use_stdlib_logging",
]

#: The one place the version is written (pyproject.toml reads it from here).
__version__ = "0.1.0"

# A library logs nothing until the application enables it (loguru's advice for libraries).
# ``listeners`` too, here: it always imports this package first, so an application that enabled
# logging before its first ``import listeners`` is not silenced again by that import.
for _package in PACKAGES:
    logger.disable(_package)

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
