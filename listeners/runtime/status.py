"""What a runner reports: its status as a value, and how each tenure ended.

The worker thread writes through a :class:`StatusBoard`; readers (``/status``, ``/metrics``,
tests) get a :class:`RunnerStatus` snapshot, which never changes under them. The checkpoint's
age is measured between two cluster times (the checkpoint's and the newest the stream
delivered), never against this machine's clock, so a skewed or stepped local clock cannot make
a healthy listener look behind.
"""

from __future__ import annotations

import dataclasses
import threading
from dataclasses import dataclass, field
from typing import Any, Literal

from bson.timestamp import Timestamp

from singleton.drivers.mongo import classify
from singleton.errors import HistoryLostError, PoisonEventError, RetriesExhaustedError, SinkError
from singleton.latency import Latencies, LatencySnapshot

RunnerState = Literal[
    "follower", "starting", "syncing", "streaming", "reconnecting", "draining", "failed", "stopped"
]
OutcomeKind = Literal["completed", "lost", "failed"]


@dataclass(frozen=True)
class TenureOutcome:
    """How one tenure ended.

    ``completed``: the tenure handed over cleanly (drained and checkpointed, or stopped).
    ``lost``: the lease ended under it (expired, taken, or a newer token wrote the checkpoint).
    ``failed``: the listener or the stream raised; ``retryable`` says whether another tenure
    could do better (a transient error) or would fail the same way (history lost with policy
    ``fail``, a poison event with policy ``stop``, a refused permission, a bug).
    """

    kind: OutcomeKind
    reason: str
    retryable: bool
    fencing_token: int | None = None

    @classmethod
    def failure(cls, reason: str, exc: BaseException, token: int | None) -> TenureOutcome:
        """A failed tenure; retryable only when ``exc`` is one another tenure could outlive."""
        if isinstance(exc, (SinkError, RetriesExhaustedError)):
            retryable = True  # the sink gave up for now; it may be back by the next tenure
        elif isinstance(exc, (HistoryLostError, PoisonEventError)):
            retryable = False  # the same position, the same event: it would fail the same way
        else:
            retryable = classify(exc) == "transient"
        return cls("failed", reason, retryable, token)

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class RunnerStatus:
    """A snapshot of one runner (see :meth:`listeners.runtime.runner.ListenerRunner.status`)."""

    listener: str
    state: RunnerState = "follower"
    leader: bool = False
    fencing_token: int | None = None
    #: The position of the last checkpoint this runner saved, and when (wall clock, display).
    last_checkpoint_cluster_time: Timestamp | None = None
    last_checkpoint_at: float | None = None
    #: The newest cluster time the stream delivered (an event, or an idle stream's token).
    last_seen_cluster_time: Timestamp | None = None
    events_handled: int = 0
    batches: int = 0
    dead_lettered: int = 0
    #: ``handle_batch`` attempts that raised (each retry counts): the sink's errors.
    sink_errors: int = 0
    #: Seconds the last batch took to deliver, retries included, and all of them as a histogram.
    last_batch_seconds: float | None = None
    batch_latency: LatencySnapshot = field(default_factory=LatencySnapshot)
    #: The batch size the stream reader last asked for (``next_batch_size()``, as each batch
    #: starts: ElasticsearchSync adapts it). ``None`` before this tenure's first batch, and
    #: between tenures.
    batch_size: int | None = None
    history_lost: int = 0
    #: resyncs because the sink lost what it held (its index or alias deleted under it)
    sink_lost: int = 0
    reconnects: int = 0
    last_error: str | None = None
    last_outcome: TenureOutcome | None = None
    #: Why this runner's last tenure failed, while that is the latest word: set when a tenure
    #: fails (and the lease is resigned), cleared once a later tenure streams. ``None``: ready.
    failure: str | None = None
    #: Consecutive failed tenures (each lengthens the cooldown before campaigning again).
    failed_tenures: int = 0
    #: Seconds (monotonic clock) until which this runner does not campaign after a failure.
    cooldown_until: float | None = None
    #: The follower's standby check (``listeners.runtime.standby``); ``{"checked_at": None}`` if
    #: none ran.
    standby: dict[str, Any] = field(default_factory=lambda: {"checked_at": None})

    @property
    def checkpoint_age_seconds(self) -> float | None:
        """Cluster-time seconds between the last checkpoint and the newest position seen: how
        much a successor would replay. ``None`` until both are known."""
        saved, seen = self.last_checkpoint_cluster_time, self.last_seen_cluster_time
        if saved is None or seen is None:
            return None
        return float(max(0, seen.time - saved.time))

    def lag_seconds(self, now: float) -> float | None:
        """End-to-end lag: ``now`` (wall-clock seconds) minus the cluster time of the newest
        position this runner acknowledged or caught up to (an idle stream's token advances with
        the server, so a quiet collection shows no lag). ``None`` before the first one, or
        while this replica does not lead."""
        seen = self.last_seen_cluster_time
        if seen is None or not self.leader:
            return None
        return max(0.0, now - float(seen.time))

    @property
    def ready(self) -> bool:
        """False while the last tenure's failure stands (``/readyz`` answers 503 with
        :attr:`failure`): this replica could not do the work the last time it held the lease."""
        return self.failure is None

    @property
    def listener_failed(self) -> int:
        """1 while not :attr:`ready`, else 0: the ``singleton_listener_failed`` gauge."""
        return 0 if self.ready else 1

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready: cluster times as ``[seconds, increment]`` (as in the audit log)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["checkpoint_age_seconds"] = self.checkpoint_age_seconds
        out["ready"] = self.ready
        out["last_outcome"] = None if self.last_outcome is None else self.last_outcome.as_dict()
        latency = self.batch_latency
        out["batch_latency"] = {"count": latency.count, "sum_seconds": round(latency.total, 6)}
        return {key: _jsonable(value) for key, value in out.items()}

    def __getitem__(self, key: str) -> Any:
        """Read-only mapping access, for callers written against the old dict status
        (``status()["state"]``); new code reads the attributes."""
        if key in ("checkpoint_age_seconds", "ready", "listener_failed"):
            return getattr(self, key)
        if key in self.__dataclass_fields__:
            return getattr(self, key)
        raise KeyError(key)


def sink_error_counts(listener: object) -> dict[str, int]:
    """The sink's own error counts by kind, read at scrape time from another thread. A listener
    whose ``stats`` offers ``errors_by_kind()`` reports those (ElasticsearchSync's bulk writer:
    ``unavailable`` and ``rejected`` requests that raised, items retried (``item_retried``),
    refused as older (``item_conflict``, harmless: a replay) and ``dead_lettered``); any other
    listener reports none, and its failures count as ``RunnerStatus.sink_errors``."""
    by_kind = getattr(getattr(listener, "stats", None), "errors_by_kind", None)
    return {str(k): int(v) for k, v in by_kind().items()} if callable(by_kind) else {}


def per_collection(listener: object) -> dict[str, dict[str, int]]:
    """Events and dead letters per collection of a listener that counts them (a shaped
    ElasticsearchSync's ``by_collection``), else ``{}``."""
    snapshot = getattr(getattr(listener, "by_collection", None), "snapshot", None)
    return snapshot() if callable(snapshot) else {}


def collection_drops(listener: object) -> int | None:
    """Drops and renames of a watched collection the listener saw (``drops_seen``:
    ElasticsearchSync), else ``None``."""
    seen = getattr(listener, "drops_seen", None)
    return seen if isinstance(seen, int) and not isinstance(seen, bool) else None


def sink_bytes(listener: object) -> int | None:
    """Bytes the listener sent to its sink (request bodies, retries included), when its
    ``stats`` counts them (``sent_bytes``: ElasticsearchSync's bulk writer); else ``None``."""
    sent = getattr(getattr(listener, "stats", None), "sent_bytes", None)
    return sent if isinstance(sent, int) and not isinstance(sent, bool) else None


def _jsonable(value: Any) -> Any:
    if isinstance(value, Timestamp):
        return [int(value.time), int(value.inc)]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    return value


class StatusBoard:
    """The live, mutable side of :class:`RunnerStatus`: written by the worker thread, read as
    snapshots (thread-safe)."""

    def __init__(self, listener: str) -> None:
        self._lock = threading.Lock()
        self._value = RunnerStatus(listener)
        self._batch_latency = Latencies()
        #: ``RunnerStatus.batch_size``, written by the stream reader as each batch starts: a
        #: plain attribute (one reference store, no lock on the hot path), copied into each
        #: snapshot.
        self.batch_size: int | None = None

    def set(self, **fields: Any) -> None:
        with self._lock:
            self._value = dataclasses.replace(self._value, **fields)

    def count(self, **deltas: int) -> None:
        """Add ``deltas`` to the named counters."""
        with self._lock:
            now = {k: getattr(self._value, k) + v for k, v in deltas.items()}
            self._value = dataclasses.replace(self._value, **now)

    def seen(self, cluster_time: Timestamp | None) -> None:
        """The stream got as far as ``cluster_time`` (never moves back)."""
        with self._lock:
            self._value = dataclasses.replace(
                self._value, last_seen_cluster_time=self._later(cluster_time)
            )

    def delivered(
        self,
        events: int,
        *,
        dead_lettered: int,
        errors: int,
        seconds: float,
        cluster_time: Timestamp | None,
    ) -> None:
        """One batch of ``events`` was delivered (``dead_lettered`` of them as dead letters,
        after ``errors`` failed tries) in ``seconds``, up to ``cluster_time``: one update."""
        self._batch_latency.observe(seconds)
        with self._lock:
            v = self._value
            self._value = dataclasses.replace(
                v,
                batch_latency=self._batch_latency.snapshot(),
                events_handled=v.events_handled + events - dead_lettered,
                dead_lettered=v.dead_lettered + dead_lettered,
                sink_errors=v.sink_errors + errors,
                batches=v.batches + 1,
                last_batch_seconds=seconds,
                last_seen_cluster_time=self._later(cluster_time),
            )

    def _later(self, cluster_time: Timestamp | None) -> Timestamp | None:
        last = self._value.last_seen_cluster_time
        if cluster_time is None or (last is not None and last >= cluster_time):
            return last
        return cluster_time

    @property
    def state(self) -> RunnerState:
        return self._value.state

    def snapshot(self, **live: Any) -> RunnerStatus:
        """The current value, with ``live`` fields (``leader``, ``standby``) filled in."""
        with self._lock:
            return dataclasses.replace(self._value, batch_size=self.batch_size, **live)
