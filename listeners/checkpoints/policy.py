"""When a tenure saves its checkpoint, and which position it saves.

When: after a delivered batch at most every ``interval`` seconds under sustained load (0 = after
every batch); as soon as the stream catches up; every ``idle_interval`` seconds while an idle
stream's resume token advances; before a handover (what was acknowledged: events read but not
delivered are the successor's); before an invalidate. A crash therefore
replays at most ``interval`` seconds of handled events, and a planned handover replays nothing.

Where a tenure starts: the position its claim returned (:meth:`CheckpointPolicy.claim`), which
also fences the record against every older tenure.

What: the resume token after the last *delivered* event, with the highest cluster time known for
it: the token's own, the batch's last event's, the previous checkpoint's. The position never
moves backwards, even when a token carries no readable time.

Failure model: the tenure may end at any instant. ``ctx.check()`` runs before every write and the
store fences it by token (:mod:`listeners.checkpoints.stores`), so a paused ex-leader cannot move
the position after a successor did.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pymongo
from bson.timestamp import Timestamp
from loguru import logger

from listeners.checkpoints.stores import Checkpoint, CheckpointStore, Deployment
from listeners.runtime.audit import AuditLog, ts_pair
from listeners.stream.reader import StartPosition
from listeners.stream.tokens import event_time, token_time
from singleton.clock import Clock
from singleton.errors import SingletonError

if TYPE_CHECKING:
    from listeners.base import ChangeEvent, ListenerContext

#: The least time a handover's checkpoint write gets, even when the drain's budget is spent.
RELEASE_FLOOR = 0.02


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


class CheckpointPolicy:
    """The checkpoint of one tenure: the last one saved, the handled-but-unsaved position, and
    the decisions above. ``on_saved`` is told of every accepted write (for the status)."""

    def __init__(
        self,
        store: CheckpointStore,
        ctx: ListenerContext,
        *,
        clock: Clock,
        interval: float,
        idle_interval: float,
        bounded: Callable[[], contextlib.AbstractContextManager[None]],
        audit: AuditLog | None = None,
        on_saved: Callable[[Checkpoint], None] = lambda _cp: None,
        deployment: Deployment | None = None,
    ) -> None:
        self._store, self._ctx, self._clock = store, ctx, clock
        self._deployment = deployment
        self.interval, self.idle_interval = interval, idle_interval
        self._bounded, self._audit, self._on_saved = bounded, audit, on_saved
        #: The last checkpoint saved (or loaded): where a reopened stream starts.
        self.last: Checkpoint | None = None
        # Handled but not yet saved: (position after the batch, its last event's cluster time).
        self._pending: tuple[Any, Timestamp | None] | None = None
        self._last_save = clock.monotonic()
        #: The checkpoint whose write is in flight (a drain does not write an older one).
        self._writing: Checkpoint | None = None
        #: Around a routine save on the worker's thread (under load, or idle): the tenure makes
        #: it an opening of its handover gate, so a drain does not wait for a slow store - it
        #: saves the same position itself, and the worker's write, fenced, is the successor's
        #: to refuse or harmless.
        self.routine: Callable[[], contextlib.AbstractContextManager[None]] = contextlib.nullcontext

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
        if self._pending is None or not self._ctx.valid():
            return
        try:
            self._save_pending(*self._pending)
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
        if self._pending is not None and self._pending[0] is not None:
            return StartPosition(resume_after=self._pending[0])
        return otherwise if self.last is None else StartPosition.of(self.last)

    # -- when to save ---------------------------------------------------------------------
    def opened(self, token: Any, at_time: Timestamp | None) -> None:
        """A stream was opened; ``at_time`` when it is a fresh one, whose start is saved before
        anything is handled (a successor must never start from a later "now")."""
        self._pending, self._last_save = None, self._clock.monotonic()
        if at_time is not None:
            self.save(token, at_time)

    def handled(self, token: Any, batch: list[ChangeEvent]) -> None:
        """``batch`` was delivered; ``token`` is the position after it."""
        self._pending = (token, event_time(batch[-1]))

    def after_batch(self) -> None:
        """Under load: save the handled position at most every ``interval`` seconds."""
        if self._pending is not None and self._due(self.interval):
            with self.routine():
                self._save_pending(*self._pending)

    def caught_up(self, token: Any) -> None:
        """The stream is idle at ``token``: save what was handled, or the idle advance."""
        if self._pending is not None or (
            self._due(self.idle_interval) and token != self.saved_token
        ):
            with self.routine():
                self._save_pending(token, self._pending_time)

    def handover(self, token: Any) -> None:
        """Before the lease is released: everything handled is saved, so nothing replays."""
        if token != self.saved_token:
            self.save(token, self._pending_time)

    def before_invalidate(self) -> None:
        if self._pending is not None:
            self._save_pending(*self._pending)

    def release(self, left: float) -> None:
        """A planned handover, on whichever thread closes the tenure's handover gate: save what
        the sink acknowledged, as before an invalidate (a pipelining subclass first waits for
        what is in flight, within ``left`` seconds of the drain's budget). Events read but not
        delivered are not saved past: the successor reads them. The save, too, ends within
        ``left`` (at least :data:`RELEASE_FLOOR`): a slow store leaves the successor more to
        replay rather than the handover waiting for it."""
        with self.within(left):
            self.before_invalidate()

    @staticmethod
    def within(left: float) -> contextlib.AbstractContextManager[None]:
        """Every MongoDB call inside ends within ``left`` seconds from now (or sooner, if an
        enclosing bound says so); other stores rely on their own timeouts."""
        return pymongo.timeout(max(left, RELEASE_FLOOR))

    # -- what to save ---------------------------------------------------------------------
    @property
    def saved_token(self) -> Any:
        return None if self.last is None else self.last.resume_token

    @property
    def _pending_time(self) -> Timestamp | None:
        return None if self._pending is None else self._pending[1]

    def _due(self, interval: float) -> bool:
        return self._clock.monotonic() - self._last_save >= interval

    def _save_pending(self, token: Any, fallback: Timestamp | None) -> None:
        self.save(token, fallback)
        self._pending, self._last_save = None, self._clock.monotonic()

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
        self._on_saved(cp)
        logger.debug("checkpoint: listener={} token={} at={}", self.name, ld.token, cp.cluster_time)
