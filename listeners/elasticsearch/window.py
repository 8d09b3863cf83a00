"""A bounded window of bulk requests in flight, and which stream position they acknowledge.

The stream's batches become *entries*, in stream order: the requests sent for the batch and,
once the runner names it, the position after the batch. Requests run on the writer's pool while
the runner reads and encodes the next batch; at most ``max_requests`` requests and
``max_bytes`` bytes are in flight (:meth:`BulkWindow.submit` waits for room), so memory and the
tail a handover must wait for stay bounded.

:meth:`BulkWindow.acknowledged` answers the newest position whose entry *and every earlier entry*
finished: requests may complete out of order (external versions keep each document's order), but
the position handed back never passes a request still in flight. The first failed request fails
the window: the other requests are waited for, every entry is dropped (nothing more is
acknowledged) and the error is raised, so the runner reopens the stream after the last
acknowledged position and the unacknowledged tail is delivered again.

A planned handover waits for the window only briefly (:meth:`BulkWindow.flush` with a timeout):
what is still in flight then is not acknowledged, and the successor replays it. A batch waiting
for room stops as soon as ``stop()`` says a handover began (:class:`HandoverInterrupted`), so a
slow sink never holds up the drain.

Thread model: one caller (the tenure's worker) calls every method; only the requests run on the
pool. ``check`` runs before every request (:class:`~listeners.elasticsearch.bulk.BulkWriter`).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ALL_COMPLETED, FIRST_COMPLETED, Future, wait
from dataclasses import dataclass, field

from listeners.base import Acknowledged
from listeners.elasticsearch.bulk import BulkItem, BulkWriter, Check, Wait
from listeners.runtime.handover import HandoverInterrupted
from singleton.errors import LeaseLostError, SinkRejectedError, SinkUnavailableError

__all__ = ["BulkWindow"]

#: How often a batch waiting for room looks at ``stop()`` (its wait is on the requests).
STOP_POLL = 0.02


@dataclass
class _Entry:
    requests: list[Future[None]] = field(default_factory=list)
    position: Acknowledged | None = None


class BulkWindow:
    """Bulk requests in flight for one listener (see the module docstring)."""

    def __init__(self, writer: BulkWriter, *, max_requests: int, max_bytes: int) -> None:
        self._w = writer
        self.max_requests, self.max_bytes = max_requests, max_bytes
        self._entries: deque[_Entry] = deque()
        self._inflight: dict[Future[None], int] = {}  # request -> its bytes
        self._bytes = 0

    @property
    def in_flight(self) -> int:
        """Requests sent and not finished yet."""
        return len(self._inflight)

    def open(self) -> None:
        """Start the entry of the next batch (its requests follow, then :meth:`mark`)."""
        self._entries.append(_Entry())

    def submit(
        self,
        items: Sequence[BulkItem],
        check: Check,
        wait_fn: Wait,
        stop: Callable[[], bool] | None = None,
    ) -> None:
        """Send ``items`` in requests of at most ``bulk_actions`` items / ``bulk_bytes`` bytes,
        each once the window has room, as part of the newest entry. Raises
        :class:`HandoverInterrupted` when ``stop()`` turns true while it waits for room."""
        if not self._entries:
            self.open()
        limits, versioned = self._w.limits, self._w.versioned
        chunk: list[BulkItem] = []
        size = 0
        for item in items:
            n = len(item.encoded(versioned))
            if chunk and (len(chunk) >= limits.bulk_actions or size + n > limits.bulk_bytes):
                self._send(chunk, size, check, wait_fn, stop)
                chunk, size = [], 0
            chunk.append(item)
            size += n
        if chunk:
            self._send(chunk, size, check, wait_fn, stop)

    def _send(
        self,
        chunk: list[BulkItem],
        size: int,
        check: Check,
        wait_fn: Wait,
        stop: Callable[[], bool] | None,
    ) -> None:
        while self._inflight and (
            len(self._inflight) >= self.max_requests or self._bytes + size > self.max_bytes
        ):
            if stop is not None and stop():
                raise HandoverInterrupted("a planned handover began while a batch waited")
            self._reap(FIRST_COMPLETED, None if stop is None else STOP_POLL)
        check()
        fut = self._w.executor().submit(self._w.send, chunk, check, wait_fn)
        self._inflight[fut] = size
        self._bytes += size
        self._entries[-1].requests.append(fut)

    def mark(self, position: Acknowledged) -> None:
        """The newest entry ends at ``position``."""
        if not self._entries:
            self.open()
        self._entries[-1].position = position

    def acknowledged(self) -> Acknowledged | None:
        """Drop the finished entries at the head; the newest position among them, if any.
        Raises the error of a failed request (see the module docstring)."""
        self._reap(None)
        newest: Acknowledged | None = None
        while self._entries and all(f.done() for f in self._entries[0].requests):
            entry = self._entries.popleft()
            if entry.position is not None:
                newest = entry.position
        return newest

    def wait(self, timeout: float | None = None, stop: Callable[[], bool] | None = None) -> None:
        """Wait until every request finished, or at most ``timeout`` seconds (raises the first
        error; :class:`HandoverInterrupted` once ``stop()`` says a handover began)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self._inflight:
            if stop is not None and stop():
                raise HandoverInterrupted("a planned handover began while a flush waited")
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return
            if stop is not None:
                left = STOP_POLL if left is None else min(left, STOP_POLL)
            self._reap(ALL_COMPLETED, left)

    def flush(
        self, timeout: float | None = None, stop: Callable[[], bool] | None = None
    ) -> Acknowledged | None:
        """Wait for every request (at most ``timeout`` seconds, and see :meth:`wait` for
        ``stop``); the newest position whose every earlier request finished."""
        self.wait(timeout, stop)
        return self.acknowledged()

    def abandon(self) -> None:
        """Forget every entry after waiting for the requests in flight (their errors too)."""
        if self._inflight:
            wait(list(self._inflight))
        self._inflight.clear()
        self._entries.clear()
        self._bytes = 0

    def _reap(self, how: str | None, timeout: float | None = None) -> None:
        if how is None:
            done = [f for f in self._inflight if f.done()]
        else:
            done = list(wait(list(self._inflight), timeout, return_when=how).done)
        for fut in done:
            self._bytes -= self._inflight.pop(fut)
        for fut in done:
            exc = fut.exception()
            if exc is not None:
                self.abandon()
                raise _sink_error(exc)


def _sink_error(exc: BaseException) -> BaseException:
    """A failed request as the runner must see it: never an error the poison handler would
    pin on the events of a later batch (which had nothing to do with it)."""
    if isinstance(exc, (LeaseLostError, SinkUnavailableError, SinkRejectedError)):
        return exc
    failed = SinkUnavailableError(f"bulk request failed: {type(exc).__name__}: {exc}")
    failed.__cause__ = exc
    return failed
