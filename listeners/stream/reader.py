"""Reading a change stream: where it starts, how it is opened, and how events become batches.

Kept apart from the runner so that each reads in one sitting: this module knows nothing of
leases or checkpoints. :class:`StreamReader` reads one event per call (each read bounded by the
caller's timeout) and says what the caller should do next: deliver a full batch, deliver what it
has because the stream caught up, or handle an invalidate. What an error means is
:func:`singleton.drivers.mongo.classify`'s business, said once for every MongoDB user.
"""

from __future__ import annotations

import contextlib
import itertools
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from bson.timestamp import Timestamp

from listeners.checkpoints.stores import Checkpoint, ResumeToken
from singleton.clock import Clock

if TYPE_CHECKING:
    from listeners.base import ChangeEvent, ChangeStreamListener
    from listeners.runtime.status import StatusBoard


@dataclass(frozen=True)
class StartPosition:
    """How to open the next stream. All ``None``: "now" (and save it before handling)."""

    resume_after: ResumeToken | None = None
    start_after: ResumeToken | None = None
    at_time: Timestamp | None = None

    @classmethod
    def of(cls, cp: Checkpoint) -> StartPosition:
        if cp.resume_token is None:
            return cls(at_time=cp.cluster_time)
        if cp.start_after:
            return cls(start_after=cp.resume_token)
        return cls(resume_after=cp.resume_token)

    @property
    def fresh(self) -> bool:
        return self.resume_after is None and self.start_after is None and self.at_time is None

    def watch_kwargs(self) -> dict[str, Any]:
        if self.resume_after is not None:
            return {"resume_after": self.resume_after}
        if self.start_after is not None:
            return {"start_after": self.start_after}
        if self.at_time is not None:
            return {"start_at_operation_time": self.at_time}
        return {}


def oplog_bounds(client: Any) -> tuple[Timestamp, Timestamp] | None:
    """``(oldest, newest)`` oplog entry times from ``local.oplog.rs``, or ``None`` if unreadable
    (no permission, or a deployment that hides it)."""
    oplog = client["local"]["oplog.rs"]
    oldest = oplog.find_one({}, {"ts": 1}, sort=[("$natural", 1)])
    newest = oplog.find_one({}, {"ts": 1}, sort=[("$natural", -1)])
    if oldest is None or newest is None:
        return None
    return oldest["ts"], newest["ts"]


def watch(
    client: Any,
    listener: ChangeStreamListener,
    position: StartPosition,
    *,
    max_await_time: float,
    at_time: Timestamp | None = None,
    pipeline: Sequence[Mapping[str, Any]] | None = None,
    batch_size: int | None = None,
) -> Any:
    """Open ``listener``'s change stream at ``position`` (``at_time`` for a fresh one) with
    ``pipeline`` (default: the listener's); each ``getMore`` waits at most ``max_await_time``
    seconds and returns at most ``batch_size`` events (default: the listener's)."""
    target: Any = client[listener.database or ""]
    if listener.collection is not None:
        target = target[listener.collection]
    kwargs = position.watch_kwargs()
    if at_time is not None:
        kwargs["start_at_operation_time"] = at_time
    if listener.full_document is not None:
        kwargs["full_document"] = listener.full_document
    if listener.full_document_before_change is not None:
        kwargs["full_document_before_change"] = listener.full_document_before_change
    return target.watch(
        list(listener.pipeline if pipeline is None else pipeline),
        max_await_time_ms=max(1, int(max_await_time * 1000)),
        batch_size=listener.batch_size if batch_size is None else batch_size,
        **kwargs,
    )


def oversized_reply(exc: BaseException) -> bool:
    """Whether ``exc`` is the driver refusing a reply over its message limit (48 MB): a
    ``getMore`` whose events together are too large, each of them under 16 MB (the server
    packs up to ``batchSize`` of them). A smaller batch reads them; retrying the same does not."""
    import pymongo.errors as pe

    return isinstance(exc, pe.ProtocolError) and "larger than server max message size" in str(exc)


@dataclass
class Step:
    """What one read asks of the caller.

    ``full``: deliver ``batch`` (``batch_size`` events, or older than ``max_batch_wait``).
    ``idle``: the stream caught up; deliver ``batch`` (possibly empty). ``invalidate``: deliver
    ``batch`` (the events before it), then handle ``event``. ``token`` is the position after
    ``batch`` (the post-batch resume token while idle).
    """

    kind: Literal["full", "idle", "invalidate"]
    token: Any
    batch: list[ChangeEvent] = field(default_factory=list)
    event: ChangeEvent | None = None


class StreamReader:
    """Gathers one open stream's events into batches. ``bounded()`` wraps every read that may
    do I/O (the caller's timeout, so a hung server cannot outlast the renew deadline).

    The listener's ``next_batch_size()`` is asked as each batch starts (it may change between
    batches); the answer goes to ``board.batch_size`` (the status and ``/metrics`` show it).
    Events the driver decoded already (the rest of a ``getMore``'s batch) are taken straight
    from its buffer, all but the last, without a ``try_next`` each (pymongo 4 internals, looked
    up on every read: without them every event goes through ``try_next``, only slower). The
    driver's resume token then lags behind; :attr:`resume_token` is what ``try_next`` would have
    made it: the event's own ``_id`` (``try_next`` puts the post-batch token in its place only
    for the last event of a buffer, which is always read by ``try_next``, as is every event
    that may need I/O).

    A ``getMore`` made while a partial batch is in hand waits at most what is left of the
    listener's ``max_batch_wait`` (never more than the stream's own ``max_await_time``), so a
    partial batch is handed over ``max_batch_wait`` after its first event at the latest, or as
    soon as the stream has caught up (an empty ``getMore``); with no batch in hand it waits the
    stream's whole ``max_await_time`` (the server answers as soon as an event comes).
    """

    def __init__(
        self,
        stream: Any,
        listener: ChangeStreamListener,
        *,
        clock: Clock,
        bounded: Callable[[], contextlib.AbstractContextManager[None]],
        board: StatusBoard | None = None,
    ) -> None:
        self._stream = stream
        self._board = board
        self._listener = listener
        self._partition = listener.partition
        self._batch_size = 0  # read as each batch, or run of others' events, starts
        self._max_wait = listener.max_batch_wait
        self._clock = clock
        self._bounded = bounded
        self._batch: list[ChangeEvent] = []
        self._first_at = 0.0
        self._skips = 0
        #: The token after the last event taken from the buffer (None: the stream's is right).
        self._taken: Any = None
        #: The stream's own getMore wait in ms (``None``: not a pymongo 4 stream, left alone).
        self._await_ms: int | None = _await_ms(stream)

    @property
    def resume_token(self) -> Any:
        return self._stream.resume_token if self._taken is None else self._taken

    def _skipped(self, now: float) -> Step | None:
        """After an event of another partition: hand over a batch that waited long enough, and
        let the position move past a long run of others' events (as if caught up), so that a
        quiet partition of a busy stream still checkpoints."""
        if self._batch and now - self._first_at >= self._max_wait:
            return Step("full", self.resume_token, self.in_hand())
        if not self._skips and not self._batch:
            self._batch_size = self._listener.batch_size  # a run of others' events starts
        self._skips += 1
        if not self._batch and self._skips >= self._batch_size:
            self._skips = 0
            return Step("idle", self.resume_token, [])
        return None

    def in_hand(self) -> list[ChangeEvent]:
        """Take the events read but not yet handed out (a drain delivers them)."""
        batch, self._batch = self._batch, []
        return batch

    def read(self) -> Step | None:
        """Take the events the driver holds decoded (see the class docstring), then read at most
        one more; ``None`` while a batch is still filling."""
        stream = self._stream
        held = _held(stream)
        if held is not None and len(held) > 1:
            step = self._take_held(held)
            if step is not None:
                return step
        # With events held, try_next() answers from them with no I/O, so the timeout context
        # can be skipped.
        if held:
            event = stream.try_next()
        else:
            if self._await_ms is not None:
                self._linger(self._await_ms)
            with self._bounded():
                event = stream.try_next()
        self._taken = None
        now = self._clock.monotonic()
        if event is None:
            return Step("idle", self.resume_token, self.in_hand())
        if event.get("operationType") == "invalidate":
            batch = self.in_hand()
            return Step("invalidate", batch[-1]["_id"] if batch else None, batch, event)
        return self._add(event, now)

    def _linger(self, wait_ms: int) -> None:
        """Bound the next ``getMore``'s wait (``wait_ms``, the stream's own) by what is left of
        the batch's ``max_batch_wait``."""
        if self._batch:
            left = self._max_wait - (self._clock.monotonic() - self._first_at)
            wait_ms = max(1, min(wait_ms, int(left * 1000)))
        with contextlib.suppress(AttributeError):  # (a driver whose cursor is gone or changed)
            self._stream._cursor._max_await_time_ms = wait_ms

    def _take_held(self, held: deque[Any]) -> Step | None:
        """Take the held events but the last (see the class docstring): a run at a time into
        the batch (this runs for nearly every event), one at a time for a partition."""
        now = self._clock.monotonic()  # (they are taken within microseconds of each other)
        if self._partition is not None:
            return self._take_each(held, now)
        while len(held) > 1:
            if not self._take_run(held, now):
                return None
            step = self._due(now)
            if step is not None:
                return step
        return None

    def _take_run(self, held: deque[Any], now: float) -> bool:
        """Move the leading held events (as many as the batch has room for, all but the last)
        into the batch; False if the first is one that ``try_next`` must handle (an error, the
        end of the stream)."""
        batch = self._batch
        if not batch:
            self._start_batch(now)
        room = self._batch_size - len(batch)
        if now - self._first_at >= self._max_wait:
            room = 1  # (the batch is due already: one more event, as one at a time)
        taken = 0
        for event in itertools.islice(held, 0, min(room, len(held) - 1)):
            if event.get("_id") is None or event.get("operationType") == "invalidate":
                break
            taken += 1
        if not taken:
            return False
        popleft = held.popleft
        batch.extend([popleft() for _ in range(taken)])
        self._taken = batch[-1]["_id"]
        return True

    def _take_each(self, held: deque[Any], now: float) -> Step | None:
        while len(held) > 1:
            event = held[0]
            token = event.get("_id")
            if token is None or event.get("operationType") == "invalidate":
                return None  # try_next handles these (an error; the end of the stream)
            held.popleft()
            self._taken = token
            step = self._add(event, now)
            if step is not None:
                return step
        return None

    def _add(self, event: ChangeEvent, now: float) -> Step | None:
        if self._partition is not None and not self._partition.owns(event):
            return self._skipped(now)  # another partition's
        if not self._batch:
            self._start_batch(now)
        self._batch.append(event)
        return self._due(now)

    def _start_batch(self, now: float) -> None:
        self._first_at = now
        self._batch_size = size = self._listener.next_batch_size()
        if self._board is not None:
            self._board.batch_size = size

    def _due(self, now: float) -> Step | None:
        """A full step if the batch is full or waited long enough."""
        if len(self._batch) >= self._batch_size or now - self._first_at >= self._max_wait:
            return Step("full", self.resume_token, self.in_hand())
        return None


def _await_ms(stream: Any) -> int | None:
    """The ``maxAwaitTimeMS`` a pymongo 4 change stream sends with each ``getMore`` (``None``
    if it is not one, or sends none)."""
    try:
        wait = stream._cursor._max_await_time_ms
    except AttributeError:
        return None
    return wait if type(wait) is int and wait > 0 else None


def _held(stream: Any) -> deque[Any] | None:
    """The decoded events a pymongo 4 change stream holds (``None`` if it is not one, or if
    it decodes each event as ``try_next`` returns it)."""
    try:
        if stream._decode_custom:
            return None
        held = stream._cursor._data
    except AttributeError:
        return None
    return held if isinstance(held, deque) else None
