"""A bounded window of bulk requests in flight, and how many of the stream's events they settle.

The stream's batches become *entries*, in stream order: the requests sent for the batch and,
once the batch was handed over whole, its number of events. Requests run on the writer's pool
while the runner reads and encodes the next batch; at most ``max_requests`` requests and
``max_bytes`` bytes are in flight (:meth:`BulkWindow.submit` waits for room), so memory and the
tail a handover must wait for stay bounded.

:meth:`BulkWindow.acknowledged` answers how many events the finished entries at the head carry,
an entry counting only once it *and every earlier entry* finished: requests may complete out of
order (external versions keep each document's order), but what is acknowledged never passes a
request still in flight. An entry whose batch raised before it was handed over whole counts no
events (the runner delivers that batch again). The first failed request fails the window: the
other requests are waited for, every entry is dropped (none of them is ever acknowledged) and
the error is raised, so the runner reopens the stream after the last acknowledged event and the
unacknowledged tail is delivered again.

A planned handover waits for the window only until its deadline (:meth:`BulkWindow.flush`): what
is still in flight then is not acknowledged, and the successor replays it. A batch waiting for
room stops as soon as ``stop()`` says a handover began (:class:`HandoverInterrupted`), so a slow
sink never holds up the drain. A window given ``on_handover`` (ElasticsearchSync passes
``ListenerContext.on_handover``: it has :meth:`BulkWindow.interrupt` called as a handover
begins; :meth:`BulkWindow.end` unregisters it) waits on its requests alone, looking at
``stop()`` only when one finishes, when interrupted and at least every :data:`IDLE_POLL`
seconds; any other looks at it every :data:`POLL` seconds: a sink-bound stream waits most of
the time, and each timed wake-up is a context switch (measured: 1.3-4 us of CPU per event of a
backlog, half the listener thread's context switches). Deadlines are read from the injected
``clock``; a wait with one looks at the clock at least every :data:`POLL` seconds.

Thread model: one caller (the tenure's worker) calls every method; only the requests run on the
pool. ``check`` runs before every request (:class:`~listeners.elasticsearch.bulk.BulkWriter`).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, wait
from dataclasses import dataclass, field

from listeners.elasticsearch.bulk import BulkItem, BulkWriter, Check, Wait
from listeners.runtime.handover import HandoverInterrupted
from singleton.clock import SYSTEM_CLOCK, Clock
from singleton.errors import (
    LeaseLostError,
    SinkLostError,
    SinkRejectedError,
    SinkUnavailableError,
)

__all__ = ["BulkWindow"]

#: How often a wait looks at ``stop()`` and at the clock (its wait is on the requests).
POLL = 0.02
#: How often an interruptible window's wait without a deadline looks at ``stop()`` (a ceiling
#: only: :meth:`BulkWindow.interrupt` ends it at once).
IDLE_POLL = 1.0


@dataclass
class _Entry:
    requests: list[Future[None]] = field(default_factory=list)
    #: Events of the batch, set once it was handed over whole (0 until then, and for writes
    #: that are no stream batch: an initial sync's replay).
    events: int = 0


class BulkWindow:
    """Bulk requests in flight for one tenure (see the module docstring)."""

    def __init__(
        self,
        writer: BulkWriter,
        *,
        max_requests: int,
        max_bytes: int,
        clock: Clock = SYSTEM_CLOCK,
        on_handover: Callable[[Callable[[], None]], Callable[[], None] | None] | None = None,
    ) -> None:
        self._writer = writer
        self.max_requests, self.max_bytes = max_requests, max_bytes
        self._clock = clock
        self._entries: deque[_Entry] = deque()
        self._inflight: dict[Future[None], int] = {}  # request -> its bytes
        self._bytes = 0
        #: Set by each request as it finishes (its done callback), and by :meth:`interrupt`:
        #: what a wait waits on.
        self._finished = threading.Event()
        #: ``on_handover(self.interrupt)``'s unregistering (``None``: not interruptible).
        self._unhook = None if on_handover is None else on_handover(self.interrupt)
        self._poll = POLL if self._unhook is None else IDLE_POLL

    @property
    def in_flight(self) -> int:
        """Requests sent and not finished yet."""
        return len(self._inflight)

    def open(self) -> None:
        """Start the entry of the next batch (its requests follow, then :meth:`close`)."""
        self._entries.append(_Entry())

    def close(self, events: int) -> None:
        """The newest entry's batch, of ``events`` events, was handed over whole."""
        if not self._entries:
            self.open()
        self._entries[-1].events = events

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
        limits, versioned = self._writer.limits, self._writer.versioned
        sizes = [len(item.lines or item.encoded(versioned)) for item in items]
        total = sum(sizes)
        if items and len(items) <= limits.bulk_actions and total <= limits.bulk_bytes:
            self._send(list(items), total, check, wait_fn, stop)  # (a stream batch: one request)
            return
        chunk: list[BulkItem] = []
        size = 0
        for item, n in zip(items, sizes, strict=True):
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
            self._reap(True, None if stop is None else self._poll, stop)
        check()
        fut = self._writer.executor().submit(self._writer.send, chunk, check, wait_fn)
        fut.add_done_callback(self._wake)
        self._inflight[fut] = size
        self._bytes += size
        self._entries[-1].requests.append(fut)

    def acknowledged(self) -> int:
        """Drop the finished entries at the head; the events they carry. Raises the error of a
        failed request (see the module docstring)."""
        self._reap(False)
        events = 0
        while self._entries and all(f.done() for f in self._entries[0].requests):
            events += self._entries.popleft().events
        return events

    def wait(self, deadline: float | None = None, stop: Callable[[], bool] | None = None) -> None:
        """Wait until every request finished, or until ``deadline`` on the clock (raises the
        first error; :class:`HandoverInterrupted` once ``stop()`` says a handover began)."""
        while self._inflight:
            if stop is not None and stop():
                raise HandoverInterrupted("a planned handover began while a flush waited")
            timeout: float | None = None
            if deadline is not None:
                left = deadline - self._clock.monotonic()
                if left <= 0:
                    return
                timeout = min(left, POLL)
            elif stop is not None:
                timeout = self._poll
            self._reap(True, timeout, stop)

    def flush(self, deadline: float | None = None, stop: Callable[[], bool] | None = None) -> int:
        """Wait for every request (until ``deadline`` at most, and see :meth:`wait` for
        ``stop``); the events of the entries now acknowledged."""
        self.wait(deadline, stop)
        return self.acknowledged()

    def abandon(self) -> None:
        """Forget every entry after waiting for the requests in flight (their errors too)."""
        if self._inflight:
            wait(list(self._inflight))
        self._inflight.clear()
        self._entries.clear()
        self._bytes = 0

    def interrupt(self) -> None:
        """End the wait in progress now (it looks at its ``stop()`` again): call it when a
        planned handover begins, from any thread."""
        self._finished.set()

    def end(self) -> None:
        """:meth:`abandon`, and no more interrupts (the session is over)."""
        if self._unhook is not None:
            self._unhook()
            self._unhook = None
        self.abandon()

    def _wake(self, _request: Future[None]) -> None:
        self._finished.set()

    def _reap(
        self, block: bool, timeout: float | None = None, stop: Callable[[], bool] | None = None
    ) -> None:
        """Drop the finished requests (raising the first error); with ``block``, first wait
        until one finishes, :meth:`interrupt` is called or ``stop()`` is true, or ``timeout``
        seconds. The wait is on :attr:`_finished`, not on the requests:
        ``concurrent.futures.wait`` installs and removes a waiter on every future at each call
        (0.7-1.5 us of CPU per event of a sink-bound stream, measured)."""
        if block:
            self._finished.clear()  # (a request or an interrupt from here on sets it again)
            if all(not f.done() for f in self._inflight) and not (stop is not None and stop()):
                self._finished.wait(timeout)
        done = [f for f in self._inflight if f.done()]
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
    if isinstance(exc, (LeaseLostError, SinkLostError, SinkUnavailableError, SinkRejectedError)):
        return exc
    failed = SinkUnavailableError(f"bulk request failed: {type(exc).__name__}: {exc}")
    failed.__cause__ = exc
    return failed
