"""When a tenure saves its checkpoint, and which position it saves.

When: after a delivered batch at most every ``interval`` seconds under sustained load (0 = after
every batch); as soon as the stream catches up; every ``idle_interval`` seconds while an idle
stream's resume token advances; before a handover (what was acknowledged: events read but not
delivered are the successor's); before an invalidate. A crash therefore
replays at most ``interval`` seconds of handled events, and a planned handover replays nothing.

Where a tenure starts: the position its claim returned (:meth:`CheckpointPolicy.claim`), which
also fences the record against every older tenure.

What: the resume token after the last *acknowledged* batch, with the highest cluster time known
for it: the token's own, the batch's last event's, the previous checkpoint's. The position never
moves backwards, even when a token carries no readable time. The sink's answers
(``handle_batch``, ``flush``) say how many events it acknowledged; :class:`InFlight` turns them
into positions, so that a resume token is saved only after the sink acknowledged every event
before it, whatever a sink keeps in flight.

Failure model: the tenure may end at any instant. ``ctx.check()`` runs before every write and the
store fences it by token (:mod:`listeners.checkpoints.stores`), so a paused ex-leader cannot move
the position after a successor did.
"""

from __future__ import annotations

import contextlib
import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pymongo
from bson.timestamp import Timestamp
from loguru import logger

from listeners.checkpoints.stores import Checkpoint, CheckpointStore, Deployment
from listeners.runtime.audit import AuditLog, ts_pair
from listeners.stream.reader import StartPosition
from listeners.stream.tokens import event_time, token_time
from singleton.errors import SingletonError, SinkUnavailableError

if TYPE_CHECKING:
    from listeners.base import ChangeEvent, ListenerContext
    from listeners.checkpoints.marker import CheckpointMarker
    from listeners.runtime.status import StatusBoard

#: The least time a handover's checkpoint write gets, even when the drain's budget is spent.
RELEASE_FLOOR = 0.02
#: A stream position: the resume token after a batch, and its last event's cluster time.
Position = tuple[Any, "Timestamp | None"]


class LastSeen:
    """The newest checkpoint one runner has seen for its name, as leader or as follower (the
    standby check), kept across its tenures: a claim that then finds none means the checkpoint
    disappeared (a wiped store), which must not pass for "never started". In memory only: a
    restarted replica forgets it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cp: Checkpoint | None = None

    @property
    def checkpoint(self) -> Checkpoint | None:
        return self._cp

    def saw(self, checkpoint: Checkpoint | None) -> None:
        if checkpoint is None:
            return
        with self._lock:
            if self._cp is None or checkpoint.cluster_time >= self._cp.cluster_time:
                self._cp = checkpoint


@dataclass(frozen=True)
class CheckpointSettings:
    """How every tenure of one runner checkpoints (see ``ListenerRunner`` for the meanings)."""

    store: CheckpointStore
    interval: float
    idle_interval: float
    last_seen: LastSeen


class InFlight:
    """What one tenure handed to its sink and the sink has not acknowledged yet, in stream
    order: runs of events (one per ``handle_batch`` call that returned) and, between them, the
    stream position after each batch. An answer of ``n`` acknowledges the ``n`` leading events;
    a position is reached once every event before it is acknowledged. Events of a call that
    raised are never counted (the sink never acknowledges them: they are delivered again)."""

    def __init__(self) -> None:
        # [events not yet acknowledged, position] with exactly one of them set.
        self._queue: deque[list[Any]] = deque()
        #: Events handed over and not acknowledged yet.
        self.events = 0

    def handed(self, events: int, answer: int | None) -> Position | None:
        """One ``handle_batch`` call of ``events`` returned ``answer``; the newest position
        reached, if any (see :meth:`answered`)."""
        if events:
            self._queue.append([events, None])
            self.events += events
        return self.answered(answer)

    def delivered(self, position: Position) -> Position | None:
        """Every call of a batch returned; ``position`` follows it. The newest position reached
        (this one, when the sink acknowledged all of it)."""
        self._queue.append([0, position])
        return self.answered(0)

    def answered(self, answer: int | None) -> Position | None:
        """The sink acknowledged ``answer`` more of the leading events (``None``: all of them);
        returns the newest position that every acknowledged event now reaches."""
        left = self.events if answer is None else answer
        if left > self.events:
            raise SingletonError(
                f"the sink acknowledged {answer} events, but only {self.events} were handed to it "
                "and not acknowledged yet"
            )
        self.events -= left
        reached: Position | None = None
        queue = self._queue
        while queue:
            head = queue[0]
            if head[0] > left:
                head[0] -= left
                break
            left -= head[0]
            queue.popleft()
            if head[1] is not None:
                reached = head[1]
        return reached

    def clear(self) -> None:
        self._queue.clear()
        self.events = 0


class CheckpointPolicy:
    """The checkpoint of one tenure: the last one saved, the acknowledged-but-unsaved position,
    what the sink still holds (:class:`InFlight`), and the decisions above. Every accepted write
    is also recorded in the lease store's ``marker``, the runner's ``last_seen`` and its status
    ``board``. ``routine`` goes around a save under load or while idle (the tenure makes it an
    opening of its handover gate: a drain does not wait for a slow store - it saves the same
    position itself, and the worker's write, fenced, is the successor's to refuse or harmless);
    ``bounded`` around every store call."""

    def __init__(
        self,
        settings: CheckpointSettings,
        ctx: ListenerContext,
        *,
        bounded: Callable[[], contextlib.AbstractContextManager[None]],
        routine: Callable[[], contextlib.AbstractContextManager[None]],
        marker: CheckpointMarker,
        board: StatusBoard,
        audit: AuditLog | None = None,
        deployment: Deployment | None = None,
    ) -> None:
        self._settings, self._store, self._ctx = settings, settings.store, ctx
        self._clock = ctx.clock
        self._deployment = deployment
        self._bounded, self._routine = bounded, routine
        self._marker, self._board, self._audit = marker, board, audit
        #: The last checkpoint saved (or loaded): where a reopened stream starts.
        self.last: Checkpoint | None = None
        #: What the sink holds unacknowledged; ``acknowledged``: the position it reached.
        self.in_flight = InFlight()
        self._acknowledged: Position | None = None  # acknowledged, not saved yet
        self._last_save = self._clock.monotonic()
        #: The checkpoint whose write is in flight (a drain does not write an older one).
        self._writing: Checkpoint | None = None

    @property
    def name(self) -> str:
        return self._ctx.listener_name

    # -- where to start -------------------------------------------------------------------
    def claim(self) -> Checkpoint | None:
        """Start of a tenure: fence the record with this tenure's token and take the position
        stored at that instant (an older tenure's later writes are refused from now on)."""
        ld = self._ctx.leadership
        self._ctx.check()
        with self._bounded():
            self.last = self._store.claim(self.name, ld.token, ld.holder, self._deployment or {})
        return self.last

    def salvage(self) -> None:
        """The tenure is failing: save what the sink acknowledged, if the tenure still may.
        Best effort; the failure being reported matters more than this write."""
        if self._acknowledged is None or not self._ctx.valid():
            return
        try:
            self._save_acknowledged(*self._acknowledged)
        except Exception as exc:
            logger.warning("final checkpoint not saved: listener={}: {!r}", self.name, exc)

    def reload(self) -> None:
        """After a stream failure: pick up the stored checkpoint (kept if unreadable)."""
        try:
            with self._bounded():
                self.last = self._store.load(self.name) or self.last
        except SingletonError as exc:
            logger.warning("checkpoint reload failed: listener={}: {}", self.name, exc)

    def resume_position(self, otherwise: StartPosition) -> StartPosition:
        """Where a reopened stream continues within this tenure: right after the last batch the
        sink acknowledged, saved or not yet (so a reconnect replays nothing this tenure already
        delivered), else the last saved checkpoint, else ``otherwise``."""
        if self._acknowledged is not None and self._acknowledged[0] is not None:
            return StartPosition(resume_after=self._acknowledged[0])
        return otherwise if self.last is None else StartPosition.of(self.last)

    # -- what the sink acknowledged -------------------------------------------------------
    def opened(self, token: Any, at_time: Timestamp | None) -> None:
        """A stream was opened (the sink holds nothing of an earlier one: the tenure flushed
        it); ``at_time`` when it is a fresh one, whose start is saved before anything is handled
        (a successor must never start from a later "now").

        An acknowledged position not saved yet is kept: the stream reopened right after it
        (:meth:`resume_position`), and should this stream fail before its first batch, the next
        one must start there too, not at the older saved checkpoint (which would replay every
        event acknowledged since)."""
        self.in_flight.clear()
        if at_time is not None:
            self.moved(token, at_time)

    def handed(self, events: int, answer: int | None) -> None:
        """The sink returned ``answer`` from a ``handle_batch`` of ``events`` events."""
        self._reached(self.in_flight.handed(events, answer))

    def delivered(self, token: Any, batch: Sequence[ChangeEvent]) -> None:
        """``batch`` was delivered (every ``handle_batch`` of it returned); ``token`` is the
        position after it."""
        self._reached(self.in_flight.delivered((token, event_time(batch[-1]))))

    def flushed(self, answer: int | None) -> None:
        """The sink's ``flush`` returned ``answer``."""
        self._reached(self.in_flight.answered(answer))

    def _reached(self, position: Position | None) -> None:
        if position is not None:
            self._acknowledged = position

    def require_acknowledged(self) -> None:
        """Before a step past every delivered event (an invalidate, a replay): the sink's flush
        must have acknowledged all of it, else the stream reopens after what it did."""
        if self.in_flight.events:
            raise SinkUnavailableError(
                f"listener {self.name!r}: flush() returned with {self.in_flight.events} events "
                "not acknowledged"
            )

    # -- when to save ---------------------------------------------------------------------
    def after_batch(self) -> None:
        """Under load: save the acknowledged position at most every ``interval`` seconds (at
        once if it replaces a bare cluster time)."""
        ack = self._acknowledged
        if ack is not None and (self._due(self._settings.interval) or self._bare(ack[0])):
            with self._routine():
                self._save_acknowledged(*ack)

    def caught_up(self, token: Any) -> None:
        """The stream is idle at ``token``: save what was acknowledged, or the idle advance
        (only when the sink holds nothing: ``token`` is past every delivered event)."""
        if self.in_flight.events:
            token = None if self._acknowledged is None else self._acknowledged[0]
            if token is None:
                return
        if self._acknowledged is not None or (
            (self._due(self._settings.idle_interval) or self._bare(token))
            and token != self.saved_token
        ):
            with self._routine():
                self._save_acknowledged(token, self._acknowledged_time)

    def passed(self, token: Any) -> None:
        """Save ``token``, the position after everything delivered (the sink acknowledged all
        of it: :meth:`require_acknowledged`), unless it is saved already."""
        self.require_acknowledged()
        if token != self.saved_token:
            self._save_acknowledged(token, self._acknowledged_time)

    def release(self) -> None:
        """Before an invalidate, and at a planned handover (on whichever thread closes the
        tenure's handover gate, within :meth:`within`): save what the sink acknowledged. Events
        read but not acknowledged are not saved past: the successor reads them."""
        if self._acknowledged is not None:
            self._save_acknowledged(*self._acknowledged)

    @staticmethod
    def within(left: float) -> contextlib.AbstractContextManager[None]:
        """Every MongoDB call inside ends within ``left`` seconds from now (at least
        :data:`RELEASE_FLOOR`, or sooner if an enclosing bound says so): a slow store at a
        handover leaves the successor more to replay rather than the handover waiting for it.
        Other stores rely on their own timeouts."""
        return pymongo.timeout(max(left, RELEASE_FLOOR))

    # -- what to save ---------------------------------------------------------------------
    @property
    def saved_token(self) -> Any:
        return None if self.last is None else self.last.resume_token

    @property
    def _acknowledged_time(self) -> Timestamp | None:
        return None if self._acknowledged is None else self._acknowledged[1]

    def _bare(self, token: Any) -> bool:
        """Whether ``token`` should replace the saved position at once: that position is a
        bare cluster time (right after a copy, or a resync), and a cluster time is checked
        against the oplog's bounds only approximately, a resume token exactly."""
        return token is not None and self.last is not None and self.last.resume_token is None

    def _due(self, interval: float) -> bool:
        return self._clock.monotonic() - self._last_save >= interval

    def _save_acknowledged(self, token: Any, fallback: Timestamp | None) -> None:
        self.save(token, fallback)
        self._acknowledged, self._last_save = None, self._clock.monotonic()

    def moved(self, token: Any, at: Timestamp | None, *, start_after: bool = False) -> None:
        """The stream goes on from a new place (after a copy, past lost history or an
        invalidate): save it; the acknowledged position before it is no longer where a reopened
        stream starts."""
        self.save(token, at, start_after=start_after)
        self._acknowledged, self._last_save = None, self._clock.monotonic()

    def save(self, token: Any, fallback: Timestamp | None, *, start_after: bool = False) -> None:
        """Save ``token`` at the highest cluster time known for it (never backwards)."""
        times = [t for t in (token_time(token), fallback) if t is not None]
        if self.last is not None:
            times.append(self.last.cluster_time)
        if not times:
            raise SingletonError(f"listener {self.name!r}: no cluster time for a checkpoint")
        ld = self._ctx.leadership
        cp = Checkpoint(
            self.name,
            token,
            max(times),
            ld.token,
            ld.holder,
            start_after=start_after,
            deployment=self._deployment,
        )
        writing = self._writing  # a drain during a routine save of this position or later
        if (
            writing is not None
            and writing.fencing_token == ld.token
            and writing.cluster_time >= cp.cluster_time
        ):
            logger.debug("checkpoint: listener={} already being saved", self.name)
            return
        self._ctx.check()
        sent = self._audit.now() if self._audit is not None else 0.0
        self._writing = cp
        try:
            with self._bounded():
                self._store.save(cp)
        finally:
            if self._writing is cp:
                self._writing = None
        if self._audit is not None:
            self._audit.record("checkpoint", token=ld.token, ct=ts_pair(cp.cluster_time), sent=sent)
        self.last = cp
        self._recorded(cp)
        logger.debug("checkpoint: listener={} token={} at={}", self.name, ld.token, cp.cluster_time)

    def _recorded(self, cp: Checkpoint) -> None:
        """An accepted write: the runner's memory, the lease store's marker, the status."""
        self._settings.last_seen.saw(cp)
        self._marker.saved(cp)
        self._board.set(
            last_checkpoint_cluster_time=cp.cluster_time, last_checkpoint_at=self._clock.time()
        )
