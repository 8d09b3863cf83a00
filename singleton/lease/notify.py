"""Release notifications: the in-process fan-out to waiters, and the feed that fills it.

Failure model: a feed (a Redis pub/sub subscription, a MongoDB change stream) only shortens
:meth:`~singleton.lease.leases.Leases.wait_for_release`. While it is down, waiters run to their
timeout and their caller contends again, so a lost notification costs latency, never safety. The
feed's thread reopens it with :class:`~singleton.retry.Backoff` delays until the backend closes.

A release can also come before its waiter registers: between a candidate's failed contend and
its wait. So every notification moves a per-name counter, the *release mark*; a candidate reads
the mark before it sends its contend and waits ``since`` it, and a wait whose mark has already
moved returns at once. That is enough: a release the server applies after the failed contend is
notified after the contend was sent, so after the mark was read; one applied before it can only
cost a spurious wake (one more contend). What remains is the feed being down, or not yet open
for the first wait (a mark read before it listens cannot move for a release it did not see).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from loguru import logger

from singleton.lease.leases import validate_lease_args
from singleton.redact import redact
from singleton.retry import Backoff

#: Delays between attempts to reopen a feed that went down: 0.1 s doubling up to 5 s.
REOPEN_BASE = 0.1
REOPEN_CAP = 5.0


#: What cuts a wait short besides a release (``None``: nothing), and a release mark to wait past.
Wake = threading.Event | None
Mark = int | None


class _Waiter:
    __slots__ = ("event", "fired")

    def __init__(self, event: threading.Event) -> None:
        self.event = event
        self.fired = False


class ReleaseNotifier:
    """Waiters register an event per lease name; :meth:`notify` sets them all and moves the
    name's :meth:`mark` (one int per name ever notified: lease names are few)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiters: dict[str, set[_Waiter]] = {}
        self._marks: dict[str, int] = {}

    def notify(self, name: str) -> None:
        with self._lock:
            self._marks[name] = self._marks.get(name, 0) + 1
            waiters = list(self._waiters.get(name, ()))
        for waiter in waiters:
            waiter.fired = True
            waiter.event.set()

    def has_waiters(self, name: str | None = None) -> bool:
        with self._lock:
            if name is None:
                return any(self._waiters.values())
            return bool(self._waiters.get(name))

    def mark(self, name: str) -> int:
        """How many releases of ``name`` were notified so far."""
        with self._lock:
            return self._marks.get(name, 0)

    def wait(self, name: str, timeout: float, wake: Wake = None, since: Mark = None) -> bool:
        """Until :meth:`notify` (``True``), ``timeout`` or ``wake``; ``True`` at once if the
        :meth:`mark` of ``name`` moved past ``since`` already."""
        waiter = _Waiter(wake if wake is not None else threading.Event())
        with self._lock:  # the check and the registration in one step: no notify between them
            if since is not None and self._marks.get(name, 0) > since:
                return True
            self._waiters.setdefault(name, set()).add(waiter)
        try:
            waiter.event.wait(max(0.0, timeout))
            return waiter.fired
        finally:
            with self._lock:
                bucket = self._waiters.get(name)
                if bucket is not None:
                    bucket.discard(waiter)
                    if not bucket:
                        del self._waiters[name]


class ReleaseFeed:
    """A thread that keeps one subscription to release events open, started by the first wait.

    ``session`` runs one subscription until :attr:`closed` is set or it raises (``errors`` are
    the expected failures; anything else is logged as an error and reopened all the same). It
    calls :meth:`opened` once it listens and :meth:`notify` for every release it sees. ``what``
    names the subscription in logs (no credentials).
    """

    def __init__(
        self,
        thread_name: str,
        what: str,
        session: Callable[[], None],
        errors: tuple[type[BaseException], ...],
        *,
        open_timeout: float,
    ) -> None:
        self.closed = threading.Event()
        self._notifier = ReleaseNotifier()
        self._thread_name = thread_name
        self._what = what
        self._session = session
        self._errors = errors
        self._open_timeout = open_timeout
        self._backoff = Backoff(REOPEN_BASE, REOPEN_CAP, jitter=0.2)
        #: Set when the first attempt to open ended, listening or not.
        self._tried = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def notify(self, name: str) -> None:
        self._notifier.notify(name)

    def mark(self, name: str) -> int:
        """:meth:`~singleton.lease.leases.Leases.release_mark` on this feed (without
        starting it)."""
        return self._notifier.mark(name)

    def opened(self) -> None:
        self._tried.set()
        self._backoff.reset()
        logger.debug("listening: {}", self._what)

    def wait(self, name: str, timeout: float, wake: Wake = None, since: Mark = None) -> bool:
        """:meth:`~singleton.lease.leases.Leases.wait_for_release` on this feed."""
        if since is not None and self._notifier.mark(name) > since:
            return True
        self._start()
        # Until the first open attempt has ended, a release could pass unseen: wait for it
        # (within the timeout). Later waiters never wait for a reopening: while the feed is
        # down they simply run to their timeout.
        if not self._tried.is_set():
            timeout -= self._wait_first_open(min(timeout, self._open_timeout), wake)
        if wake is not None and wake.is_set():
            return False
        return self._notifier.wait(name, timeout, wake, since)

    def close(self, join_timeout: float) -> None:
        self.closed.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(join_timeout)

    def _start(self) -> None:
        with self._lock:
            if self._thread is not None or self.closed.is_set():
                return
            self._thread = threading.Thread(target=self._run, name=self._thread_name, daemon=True)
            self._thread.start()

    def _wait_first_open(self, budget: float, wake: threading.Event | None) -> float:
        """Wait up to ``budget`` for the first open attempt (or ``wake``); return time spent."""
        start = time.monotonic()
        while not self._tried.is_set() and not self.closed.is_set():
            left = budget - (time.monotonic() - start)
            if left <= 0 or (wake is not None and wake.is_set()):
                break
            # Two events to wait for, ours and the caller's wake, and threading cannot wait on
            # either: look at wake every 10 ms, for at most the budget.
            self._tried.wait(min(0.01, left))
        return time.monotonic() - start

    def _run(self) -> None:
        while not self.closed.is_set():
            try:
                self._session()
            except Exception as exc:  # a bug too must not end the feed without a word
                if self.closed.is_set():
                    return
                delay = self._backoff.next()
                # No traceback even for a bug: its text could quote a URL with a password.
                log = logger.warning if isinstance(exc, self._errors) else logger.error
                log(
                    "{} down, reopening in {:.2f}s (waiters fall back to their timeout): {}: {}",
                    self._what,
                    delay,
                    type(exc).__name__,
                    redact(str(exc)),
                )
                self.closed.wait(delay)
            finally:
                self._tried.set()


class NotifiedReleases:
    """:meth:`~singleton.lease.leases.Leases.wait_for_release` and ``release_mark`` for a backend
    whose releases reach it through ``_releases`` (a :class:`ReleaseNotifier` in one process, a
    :class:`ReleaseFeed` from a server): put it before the contract among the bases."""

    _releases: ReleaseNotifier | ReleaseFeed

    def wait_for_release(
        self, name: str, timeout: float, wake: Wake = None, *, since: Mark = None
    ) -> bool:
        validate_lease_args(name)
        return self._releases.wait(name, timeout, wake, since)

    def release_mark(self, name: str) -> int:
        return self._releases.mark(name)
