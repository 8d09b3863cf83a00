"""Change-stream listeners that run under a singleton Elector.

Logs nothing until the application asks (``logger.enable("listeners")`` or
:func:`singleton.use_stdlib_logging`): ``import singleton``, which this package's first import
runs, disables its logger.
"""

from __future__ import annotations

from listeners.base import ChangeStreamListener, ListenerContext
from listeners.checkpoints.stores import (
    Checkpoint,
    CheckpointStore,
    MongoCheckpointStore,
    RedisCheckpointStore,
    check_deployment,
)
from listeners.deadletters import DeadLetterStore
from listeners.elasticsearch import ElasticsearchSync as ElasticsearchSync
from listeners.logging import LoggingListener
from listeners.runtime.runner import ListenerRunner
from listeners.runtime.status import RunnerStatus, TenureOutcome
from singleton.errors import PoisonEventError

__all__ = [
    "ChangeStreamListener",
    "Checkpoint",
    "CheckpointStore",
    "DeadLetterStore",
    "ListenerContext",
    "ListenerRunner",
    "LoggingListener",
    "MongoCheckpointStore",
    "PoisonEventError",
    "RedisCheckpointStore",
    "RunnerStatus",
    "TenureOutcome",
    "check_deployment",
]
