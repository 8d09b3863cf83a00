"""How a planned handover stops a tenure's worker between two acts, without waiting for a read.

Failure model: a drain (``before_release``) is bounded, and the lease is released when the bound
passes whether or not the worker has stopped (:mod:`singleton.election`). So the drain must not
wait for what does not matter: a ``getMore`` that waits up to ``max_await_time`` for new events,
opening a stream, a reconnect backoff. It only waits for the act in hand (a ``handle_batch``, a
checkpoint write), then saves the position the sink acknowledged, and the worker never acts again.

:class:`HandoverGate` does that with one lock. The worker holds it for the whole tenure and lets
go of it only while it waits for input (:meth:`HandoverGate.waiting`). A drain takes it, bounded
(:meth:`HandoverGate.close`): either the worker is between acts and the drain saves the
acknowledged position itself, or the worker notices the drain first at its next step
(:meth:`HandoverGate.check`) and saves it. Either way it is saved once, under the lock, and the
worker's next read ends in :class:`Drained`. Events read but not yet delivered are dropped: the
checkpoint stands before them and the successor reads them. When the bound passes first, the
tenure is demoted before the release, so the act still running fails its next ``ctx.check()``
and the checkpoint store refuses its writes once the successor has claimed.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator

from loguru import logger

from singleton.errors import SingletonError


class Drained(Exception):
    """The planned handover finished: what the sink acknowledged is saved."""


class HandoverGate:
    """One tenure's gate between its worker's acts and a planned handover (see above).

    ``drain`` is the tenure's drain flag (set by ``before_release`` before :meth:`close`).
    """

    def __init__(self, drain: threading.Event) -> None:
        self._drain = drain
        self._lock = threading.Lock()
        self._closed = False
        self._final: Callable[[], None] = lambda: None

    @contextlib.contextmanager
    def acting(self, final: Callable[[], None]) -> Iterator[None]:
        """The worker's tenure: it holds the gate, but inside :meth:`waiting`. ``final`` saves
        what the sink acknowledged; it runs at most once, on the thread that closes the gate."""
        with self._lock:
            self._final = final
            try:
                if self._closed:
                    raise Drained
                yield
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
            if not self._closed:
                self._closed = True
                self._final()
            raise Drained

    def close(self, timeout: float) -> bool:
        """The drain: wait at most ``timeout`` seconds for the act in hand, then save what the
        sink acknowledged; the worker acts no more. False if the act outlasted ``timeout``."""
        if not self._lock.acquire(timeout=timeout):
            return False
        try:
            if not self._closed:
                self._closed = True
                self._final()
        except SingletonError as exc:  # lost meanwhile, or refused: the successor replays
            logger.warning("handover checkpoint not saved: {}", exc)
        finally:
            self._lock.release()
        return True
