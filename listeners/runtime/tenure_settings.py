"""What every tenure of one runner shares: read-only settings, built once by the runner."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from listeners.base import ChangeStreamListener
    from listeners.checkpoints.policy import LastSeen
    from listeners.checkpoints.stores import CheckpointStore
    from listeners.deadletters import DeadLetterStore
    from listeners.runtime.audit import AuditLog
    from singleton.clock import Clock
    from singleton.lease.contract import LeaseBackend


@dataclass(frozen=True)
class TenureSettings:
    """What every tenure of one runner shares (see ``ListenerRunner`` for the meanings)."""

    listener: ChangeStreamListener
    client: Any
    checkpoints: CheckpointStore
    dead_letters: DeadLetterStore
    clock: Clock
    max_await_time: float
    op_timeout: float
    #: Opening a stream (a read; the server searches its oplog for the token) may take longer.
    open_timeout: float
    checkpoint_interval: float
    idle_checkpoint_interval: float
    reconnect_backoff: float
    max_reconnect_backoff: float
    rng: random.Random
    audit: AuditLog | None
    failure_budget: float
    last_seen: LastSeen
    #: The elector's lease store, where the checkpoint marker lives.
    lease_store: LeaseBackend
