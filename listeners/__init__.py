"""Change-stream listeners that run under a singleton Elector."""

from __future__ import annotations

from listeners.base import ChangeStreamListener, ListenerContext
from listeners.checkpoint import (
    Checkpoint,
    CheckpointStore,
    MongoCheckpointStore,
    RedisCheckpointStore,
    check_deployment,
)
from listeners.deadletter import DeadLetterStore, PoisonEventError
from listeners.elasticsearch import ElasticsearchSync as ElasticsearchSync
from listeners.logging import LoggingListener
from listeners.runner import ListenerRunner
from listeners.status import RunnerStatus, TenureOutcome

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
