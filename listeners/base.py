"""The class users subclass: a MongoDB change-stream listener that runs only while elected.

Subclass :class:`ChangeStreamListener`, implement :meth:`~ChangeStreamListener.handle_batch`, and
hand it to a runner (``listeners.runtime.runner.ListenerRunner``) or to ``singleton run``. The
runner opens the stream where the previous leader's checkpoint says, calls ``handle_batch`` once
per batch with events in oplog order, and learns from its answer what the sink acknowledged: a
resume token is saved only after the sink acknowledged every event before it.

Failure model: the process may lose its lease at any moment. ``ctx.check()`` raises
:class:`singleton.LeaseLostError` once the tenure is over; call it before any side effect that a
successor could duplicate, and pass ``ctx.token`` (the fencing token) to sinks that can fence.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol, get_args

from loguru import logger as _logger

from listeners.stream.partition import Partition
from singleton.clock import SYSTEM_CLOCK, Clock
from singleton.errors import ConfigurationError

if TYPE_CHECKING:
    from loguru import Logger
    from pymongo import MongoClient

    from singleton.election.leadership import Leadership

#: A change event as pymongo returns it (``_id`` is the event's resume token).
ChangeEvent = Mapping[str, Any]

HistoryLostPolicy = Literal["fail", "resync", "resume_from_now"]
PoisonPolicy = Literal["dead_letter", "stop"]
StopReason = Literal["released", "expired", "lost", "stopped", "error"]
_FULL_DOCUMENT_MODES = (None, "default", "updateLookup", "whenAvailable", "required")
#: The key of the progress record under which the runner marks a resync in progress; a
#: listener never sees it (:meth:`ListenerContext.load_progress` leaves it out).
RESYNC_MARK = "singleton_resync"


class ProgressStore(Protocol):
    """Fenced storage for a listener's own progress (for example a resumable initial copy).
    The checkpoint stores implement it next to the resume token."""

    def load_progress(self, name: str) -> dict[str, Any] | None: ...

    def save_progress(
        self, name: str, data: Mapping[str, Any] | None, leadership: Leadership
    ) -> None:
        """Store ``data`` (``None`` clears it); raises StaleWriterError for an older token."""
        ...


class DeadLetterSink(Protocol):
    """Where events that cannot be handled are recorded (:class:`~listeners.deadletters.
    DeadLetterStore`)."""

    def put(
        self, event: ChangeEvent, error: BaseException, attempts: int, ctx: ListenerContext
    ) -> None:
        """Record (or update) the dead letter of ``event``'s document."""
        ...


class DrainFlag(threading.Event):
    """A tenure's drain flag: a :class:`threading.Event` that, as it is set, also calls the
    hooks given to :meth:`when_set` (on the setter's thread, once each). A wait on something
    else (a sink's requests) can so end the moment a planned handover begins, instead of looking
    at the flag every few milliseconds: each timed wake-up costs a context switch, and a
    sink-bound stream waits most of the time."""

    def __init__(self) -> None:
        super().__init__()
        self._hooks: list[Callable[[], None]] = []

    def set(self) -> None:
        super().set()
        for hook in list(self._hooks):
            try:
                hook()
            except Exception:  # a hook never stops the drain
                _logger.exception("a drain hook raised; the drain goes on")

    def when_set(self, hook: Callable[[], None]) -> Callable[[], None]:
        """Call ``hook`` once the flag is set (now, if it is); returns what unregisters it.
        ``hook`` may run twice when it races :meth:`set`: make it idempotent."""
        self._hooks.append(hook)
        if self.is_set():
            hook()

        def remove() -> None:
            if hook in self._hooks:
                self._hooks.remove(hook)

        return remove


@dataclass
class ListenerContext:
    """What a listener gets with every call: the tenure it acts under, and its resources."""

    leadership: Leadership
    client: MongoClient[dict[str, Any]]
    logger: Logger
    listener_name: str
    progress: ProgressStore | None = None
    #: Where the runner keeps dead letters (a sink with its own item-level rejections writes
    #: there too, so that ``singleton dead-letters`` sees them all).
    dead_letters: DeadLetterSink | None = None
    #: Free-form per-tenure state for the listener's own use.
    state: dict[str, Any] = field(default_factory=dict)
    #: Set by the runner when a planned handover begins (see :meth:`handing_over`).
    draining: threading.Event | None = None
    #: The runner's clock: every deadline of the tenure, the sink's included, is read from it
    #: (``flush``'s ``deadline`` is a ``clock.monotonic()`` time).
    clock: Clock = SYSTEM_CLOCK
    #: Set by the runner when the tenure resumed from a saved checkpoint: what the listener
    #: wrote before is expected to be there (a sink that finds its target gone raises
    #: :class:`~singleton.errors.SinkLostError`, and the tenure resyncs).
    resumed: bool = False
    #: Why a resync of this tenure runs, while it runs (:meth:`begin_resync`).
    resyncing: str | None = None

    @property
    def token(self) -> int:
        """The fencing token of this tenure: pass it to every fenced write."""
        return self.leadership.token

    def valid(self) -> bool:
        return self.leadership.valid()

    def check(self) -> None:
        """Raise :class:`singleton.LeaseLostError` if this tenure is over."""
        self.leadership.check()

    def handing_over(self) -> bool:
        """True once a planned handover (SIGTERM, rotation) began. The drain waits for the act
        in hand only briefly; an act that waits on its sink may stop early by raising
        :class:`listeners.runtime.handover.HandoverInterrupted`: what it had not finished is not
        acknowledged, and the successor replays it."""
        return self.draining is not None and self.draining.is_set()

    def on_handover(self, hook: Callable[[], None]) -> Callable[[], None] | None:
        """Have ``hook`` called (on the runner's thread; keep it short, and idempotent) when a
        planned handover begins, so that an act waiting on its sink can stop waiting at once;
        returns what unregisters it. ``None`` when this context's runner cannot call it (a
        plain :class:`threading.Event` for ``draining``): then look at :meth:`handing_over`
        from time to time instead."""
        if isinstance(self.draining, DrainFlag):
            return self.draining.when_set(hook)
        return None

    def load_progress(self) -> dict[str, Any] | None:
        """The listener's progress last saved by :meth:`save_progress`, or ``None``."""
        data = {k: v for k, v in (self._stored_progress() or {}).items() if k != RESYNC_MARK}
        return data or None

    def save_progress(self, data: Mapping[str, Any] | None) -> None:
        """Save listener progress, fenced by this tenure's token (checked first)."""
        self.check()
        if self.progress is None:
            return
        record = dict(data or {})
        if self.resyncing is not None:  # the runner's mark stays beside it (see below)
            record[RESYNC_MARK] = self.resyncing
        self.progress.save_progress(self.listener_name, record or None, self.leadership)

    # -- the runner's durable mark of a resync in progress ----------------------------------
    def unfinished_resync(self) -> str | None:
        """Why an earlier tenure began a resync that did not finish (its copy is the only
        repair of what the sink lost, and no checkpoint says so), or ``None``."""
        mark = (self._stored_progress() or {}).get(RESYNC_MARK)
        return None if mark is None else str(mark)

    def begin_resync(self, why: str) -> None:
        """Record, fenced and before the copy starts, that a resync is needed (``why``): a
        successor whose tenure starts before :meth:`end_resync` resyncs too."""
        self.resyncing = why
        self.save_progress(self.load_progress())

    def end_resync(self) -> None:
        """The resync finished and its position is saved: clear the mark."""
        if self.resyncing is None:
            return
        self.resyncing = None
        self.save_progress(self.load_progress())

    def _stored_progress(self) -> dict[str, Any] | None:
        return None if self.progress is None else self.progress.load_progress(self.listener_name)


class ChangeStreamListener:
    """Base class for listeners. Options are class attributes, overridable per instance by
    keyword arguments (which is how ``singleton.toml`` ``[[listeners]]`` tables reach it)::

        class OrdersToAudit(ChangeStreamListener):
            database = "shop"
            collection = "orders"

            def handle_batch(self, events, ctx):
                audit.insert_many([dict(e) for e in events])  # durable on return
    """

    #: Lease and checkpoint key; defaults to ``database.collection``.
    name: str | None = None
    database: str | None = None
    #: ``None`` watches the whole database.
    collection: str | None = None
    pipeline: Sequence[Mapping[str, Any]] = ()
    full_document: str | None = "updateLookup"
    #: ``fullDocumentBeforeChange`` (MongoDB 6.0+, on collections with
    #: ``changeStreamPreAndPostImages``): ``None`` (off), ``whenAvailable`` or ``required``.
    full_document_before_change: str | None = None
    batch_size: int = 500
    #: Seconds to wait for more events before handing a partial batch over (it goes sooner
    #: when the stream has caught up: a ``getMore`` came back empty).
    max_batch_wait: float = 0.2
    on_history_lost: HistoryLostPolicy = "fail"
    #: What a proven poison event becomes: a dead letter, or the end of the tenure (``stop``).
    #: An event is proven poison only when the listener handled the events after it right
    #: after it failed alone (``listeners.deadletters.PoisonHandler``); a failure every event
    #: meets is the listener's, retried within ``failure_budget``, never a dead letter.
    on_poison: PoisonPolicy = "dead_letter"
    #: Retries of an event that fails alone: all but one before the events after it are tried
    #: (so one flaky call neither reorders nor dead-letters it), the last right after one of
    #: them was handled. ``0``: the first failure alone, once a later event is handled, proves it.
    max_retries: int = 3
    #: Seconds a failing tenure of this listener retries in place (whatever fails: the stream,
    #: the listener, the checkpoint) before it fails and resigns its lease; ``None``: the
    #: runner's ``failure_budget`` (60 s by default).
    failure_budget: float | None = None
    #: Whether a dead letter keeps the document: ``False`` (the default) records the event
    #: without ``fullDocument``, ``fullDocumentBeforeChange`` and ``updateDescription`` (a
    #: sink's copy of the source too), so that ``singleton dead-letters list`` never shows what
    #: the documents hold; a replay then delivers the current document, looked up by ``_id``.
    dead_letter_source: bool = False
    #: Set by the service for ``partitions = K``: this instance handles one partition's events
    #: (:mod:`listeners.stream.partition`) under its own lease and checkpoint.
    partition: Partition | None = None

    #: Keyword arguments accepted besides the options above (subclasses extend it).
    extra_options: ClassVar[frozenset[str]] = frozenset()
    _base_options: ClassVar[frozenset[str]] = frozenset(
        {
            "name",
            "database",
            "collection",
            "pipeline",
            "full_document",
            "full_document_before_change",
            "batch_size",
            "max_batch_wait",
            "on_history_lost",
            "on_poison",
            "max_retries",
            "failure_budget",
            "dead_letter_source",
        }
    )

    def __init__(self, **options: Any) -> None:
        allowed = self._base_options | self.extra_options
        for key, value in options.items():
            if key not in allowed:
                raise ConfigurationError(
                    f"{type(self).__name__} got an unknown option {key!r}; known options: "
                    f"{', '.join(sorted(allowed))}"
                )
            setattr(self, key, value)
        self._validate()

    def _validate(self) -> None:
        """Raise :class:`ConfigurationError` naming the first option that breaks its rule."""
        rules: list[tuple[str, bool, str]] = [
            ("database", _is_name(self.database), "a database name"),
            ("collection", self.collection is None or _is_name(self.collection), "a name or None"),
            ("batch_size", _at_least(self.batch_size, 1, integer=True), "an integer >= 1"),
            ("max_batch_wait", _at_least(self.max_batch_wait, 0), "seconds >= 0"),
            (
                "on_history_lost",
                self.on_history_lost in get_args(HistoryLostPolicy),
                "fail, resync or resume_from_now",
            ),
            ("on_poison", self.on_poison in get_args(PoisonPolicy), "dead_letter or stop"),
            ("max_retries", _at_least(self.max_retries, 0, integer=True), "an integer >= 0"),
            ("dead_letter_source", isinstance(self.dead_letter_source, bool), "true or false"),
            (
                "failure_budget",
                self.failure_budget is None
                or (_at_least(self.failure_budget, 0) and 0 < self.failure_budget < math.inf),
                "None or seconds > 0",
            ),
            (
                "full_document",
                self.full_document in _FULL_DOCUMENT_MODES,
                "None or a mode (default, updateLookup, whenAvailable, required)",
            ),
            (
                "full_document_before_change",
                self.full_document_before_change in (None, "off", "whenAvailable", "required"),
                "None or a mode (off, whenAvailable, required)",
            ),
        ]
        for option, ok, rule in rules:
            if not ok:
                raise ConfigurationError(
                    f"{type(self).__name__}.{option} must be {rule}, got {getattr(self, option)!r}"
                )
        if self.name is None:
            self.name = f"{self.database}.{self.collection or '*'}"

    @property
    def lease_name(self) -> str:
        """The lease and checkpoint key: ``name``, or ``name.<i>-of-<K>`` for a partition."""
        assert self.name is not None
        return self.name if self.partition is None else self.partition.lease_name(self.name)

    def deployment(self) -> dict[str, str]:
        """What this listener's checkpoint is for, recorded with it (``CheckpointStore.claim``):
        a record claimed by another deployment under the same name is refused, never shared.
        ``listener`` is the class as "module:Class", ``namespace`` "database.collection", and
        ``sink`` is :meth:`sink_identity`."""
        cls = type(self)
        return {
            "listener": f"{cls.__module__}:{cls.__qualname__}",
            "namespace": f"{self.database}.{self.collection or '*'}",
            "sink": self.sink_identity(),
        }

    def sink_identity(self) -> str:
        """Where this listener writes, for :meth:`deployment` (for example an index and a
        redacted host); never a secret. Sinks override it; ``""`` means "not told"."""
        return ""

    # -- what users implement --------------------------------------------------------------
    def handle_batch(self, events: Sequence[ChangeEvent], ctx: ListenerContext) -> int | None:
        """Process ``events`` (oplog order); raise if they could not be handled.

        After a raise the runner splits the batch to find the event at fault: an event is a
        dead letter only if the events after it are handled right after it failed alone; a
        failure that every event meets is the listener's (its downstream is down), retried
        with backoff within ``failure_budget``, then the tenure fails. Raise
        :class:`singleton.errors.SinkUnavailableError` to say "down, retry" outright (never
        split), :class:`singleton.errors.SinkRejectedError` to fail the tenure at once.

        Return ``None`` once they are durably handled: the runner may checkpoint past them.
        A sink that keeps writes in flight after it returns answers instead how many events
        became durable: of every event handed to it and not yet acknowledged (earlier batches'
        first, then these), that many leading ones. The runner checkpoints only past those and
        asks :meth:`flush` for the rest. After a raise, what was not acknowledged is delivered
        again from the last acknowledged event (the stream reopens there)."""
        raise NotImplementedError(f"{type(self).__name__} must implement handle_batch()")

    def flush(self, deadline: float | None, ctx: ListenerContext) -> int | None:
        """Wait for what is still in flight, at most until ``deadline`` (a
        ``ctx.clock.monotonic()`` time; ``None``: until all of it is durable), and answer as
        :meth:`handle_batch` does. The runner calls it only while something is unacknowledged:
        before it saves an idle position or an invalidate, after a dead-letter replay, when a
        stream reopens, and with the drain's deadline at a planned handover (what is still in
        flight then is the successor's to replay). Default: nothing is ever in flight."""
        return None

    def next_batch_size(self) -> int:
        """How many events the next batch may hold; the runner asks as each batch starts.
        Default ``batch_size``; a sink may adapt it to what it measures (``ElasticsearchSync``
        does, :mod:`listeners.elasticsearch.adaptive`), never above ``batch_size``."""
        return self.batch_size

    # -- optional hooks ----------------------------------------------------------------------
    def on_start(self, ctx: ListenerContext) -> None:
        """Called when a tenure starts, before the stream opens."""

    def stale_sink(self, ctx: ListenerContext) -> str | None:
        """Called when a tenure resumes from a checkpoint, after :meth:`on_start`: why what the
        sink holds must be rebuilt (an initial sync) before streaming on, or ``None``. A shaped
        ``ElasticsearchSync`` whose rules changed answers so. Default: ``None``."""
        return None

    def on_idle(self, ctx: ListenerContext) -> None:
        """Called each time the stream has caught up, after what was delivered is acknowledged
        and its position saved (as often as every ``getMore`` wait while nothing happens: keep
        it cheap, or rate it by ``ctx.clock``). A sink may check here that its target is still
        what it wrote to, and raise :class:`~singleton.errors.SinkLostError` if not (the tenure
        then resyncs): ``ElasticsearchSync`` does, every ``target_check_interval`` seconds."""

    def on_stop(self, ctx: ListenerContext, reason: StopReason) -> None:
        """Called when a tenure's stream has stopped (after the last checkpoint, if any)."""

    def on_invalidate(self, event: ChangeEvent, ctx: ListenerContext) -> None:
        """The watched collection was dropped or renamed; the runner then continues with
        ``start_after`` this event."""

    def large_event_projection(self) -> Mapping[str, Any]:
        """The stage that makes every change event small enough to read, used when one over
        16 MB failed the stream (BSONObjectTooLarge): the runner then reads on from the last
        checkpoint with this stage added to :attr:`pipeline` (before a
        ``$changeStreamSplitLargeEvent`` stage), for a while (:mod:`listeners.stream.large_events`).
        The events of that while arrive without these fields: complete them (ElasticsearchSync
        looks the document up) or do without."""
        return {
            "$project": {"fullDocument": 0, "fullDocumentBeforeChange": 0, "updateDescription": 0}
        }

    def initial_sync(self, ctx: ListenerContext) -> None:
        """Copy existing data when there is no checkpoint yet (and for ``resync``).

        The runner takes the cluster time *before* calling this and streams from it afterwards,
        so writes made during the copy are not missed. Not overriding it means "no copy"."""
        raise NotImplementedError

    @classmethod
    def has_initial_sync(cls) -> bool:
        return cls.initial_sync is not ChangeStreamListener.initial_sync

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"


def _is_name(value: object) -> bool:
    return isinstance(value, str) and bool(value)


def _at_least(value: object, low: float, *, integer: bool = False) -> bool:
    """A number (never a bool) >= ``low``; an ``int`` when ``integer``."""
    kinds = int if integer else (int, float)
    return not isinstance(value, bool) and isinstance(value, kinds) and value >= low


def default_logger() -> Logger:
    return _logger
