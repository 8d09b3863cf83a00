"""How a planned handover stops a tenure's worker between two acts, without waiting for a read.

Failure model: a drain (``before_release``) is bounded, and the lease is released when the bound
passes whether or not the worker has stopped (:mod:`singleton.election.machine`). So the drain must
not wait for what does not matter: a ``getMore`` that waits up to ``max_await_time`` for new events,
opening a stream, a reconnect backoff. It only waits for the act in hand (a ``handle_batch``, a
checkpoint write), then saves the position the sink acknowledged, and the worker never acts again.

:class:`HandoverGate` does that with one lock. The worker holds it for the whole tenure and lets
go of it only while it waits for input or for a routine checkpoint write
(:meth:`HandoverGate.waiting`). A drain takes it, bounded
(:meth:`HandoverGate.close`): either the worker is between acts and the drain saves the
acknowledged position itself, or the worker notices the drain first at its next step
(:meth:`HandoverGate.check`) and saves it. Either way it is saved once, under the lock, and the
worker's next read ends in :class:`Drained`. Events read but not yet delivered are dropped: the
checkpoint stands before them and the successor reads them. When the bound passes first, the
tenure is demoted before the release, so the act still running fails its next ``ctx.check()``
and the checkpoint store refuses its writes once the successor has claimed.

One budget covers the whole drain: taking the gate and saving. ``final`` gets the seconds left of
it, so a sink with writes in flight waits for them only that long (what is still in flight then
is the successor's to replay). An act that waits on its sink need not run to its end either: it
may notice the drain (``ListenerContext.handing_over()``) and raise :class:`HandoverInterrupted`;
the gate then saves what was acknowledged before it, on the worker's thread, as above.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path

from loguru import logger

from singleton.clock import SYSTEM_CLOCK, Clock
from singleton.errors import BackendUnavailableError, SingletonError

#: Saves what the sink acknowledged; gets the seconds left of the drain's budget.
Final = Callable[[float], None]


class Drained(Exception):
    """The planned handover finished: what the sink acknowledged is saved."""


class HandoverInterrupted(Drained):
    """Raised by an act (a ``handle_batch`` waiting on its sink) that a planned handover cut
    short: what it had not finished is not acknowledged, so the successor replays it."""


class HandoverGate:
    """One tenure's gate between its worker's acts and a planned handover (see above).

    ``drain`` is the tenure's drain flag (set by ``before_release`` before :meth:`close`);
    ``budget``: seconds for the whole drain, from when it is first noticed (default: the
    ``timeout`` given to :meth:`close`, else 0.25 s).
    """

    def __init__(
        self, drain: threading.Event, budget: float | None = None, clock: Clock = SYSTEM_CLOCK
    ) -> None:
        self._drain = drain
        self._budget = budget
        self._clock = clock
        self._deadline: float | None = None
        self._lock = threading.Lock()
        self._closed = False
        self._final: Final = lambda _left: None
        self._worker: int | None = None  # the acting thread, for where_acting()

    def _left(self, budget: float | None = None) -> float:
        """Seconds left of the drain's budget (its clock starts at the first call)."""
        now = self._clock.monotonic()
        if self._deadline is None:
            self._deadline = now + (self._budget if self._budget is not None else budget or 0.25)
        return max(0.0, self._deadline - now)

    def _finish(self) -> None:
        if not self._closed:
            self._closed = True
            try:
                self._final(self._left())
            except BackendUnavailableError as exc:  # slow or down: the successor replays more
                logger.warning("handover checkpoint not saved: {}", exc)

    @contextlib.contextmanager
    def acting(self, final: Final) -> Iterator[None]:
        """The worker's tenure: it holds the gate, but inside :meth:`waiting`. ``final`` saves
        what the sink acknowledged; it runs at most once, on the thread that closes the gate
        (the worker's, when an act ends in :class:`HandoverInterrupted`)."""
        with self._lock:
            self._final = final
            self._worker = threading.get_ident()
            try:
                if self._closed:
                    raise Drained
                yield
            except Drained:
                self._finish()  # an act cut short by the drain: save what came before it
                raise
            finally:
                self._closed = True  # the tenure is over: a late drain has nothing to do

    @contextlib.contextmanager
    def waiting(self) -> Iterator[None]:
        """Around a wait for input: a drain may close the gate meanwhile, and the worker then
        ends as soon as the wait returns, whatever it read."""
        self._lock.release()
        try:
            yield
        finally:
            self._lock.acquire()
            if self._closed:
                raise Drained  # anything read meanwhile is the successor's to read
        self.check()

    def check(self) -> None:
        """Between two acts of the worker: on a drain, save and end now (raises ``Drained``, or
        ``LeaseLostError`` when the bound has passed and the tenure was demoted meanwhile)."""
        if self._drain.is_set():
            self._finish()
            raise Drained

    def where_acting(self, depth: int = 6) -> str:
        """Where the worker is now, innermost first (``file:line function``, for the warning
        of a drain that did not get the gate)."""
        frame = sys._current_frames().get(self._worker or -1)
        stack = traceback.extract_stack(frame, limit=depth) if frame is not None else []
        return " < ".join(f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in reversed(stack))

    def close(self, timeout: float) -> bool:
        """The drain: wait for the act in hand, then save what the sink acknowledged, all within
        the budget (``timeout`` unless the gate was given one); the worker acts no more. False
        if the act outlasted it."""
        if not self._lock.acquire(timeout=self._left(timeout)):
            return False
        try:
            self._finish()
        except SingletonError as exc:  # lost meanwhile, or refused: the successor replays
            logger.warning("handover checkpoint not saved: {}", exc)
        finally:
            self._lock.release()
        return True
