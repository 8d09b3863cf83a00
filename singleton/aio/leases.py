"""The lease capability, awaited: :class:`AsyncLeases`, and the release feed of its server backends.

The invariants are those of :class:`singleton.lease.leases.Leases`, written there once (mutual
exclusion, fencing that survives losing the store, ownership by holder *and* token, releases
observed and never guessed); the asyncio backends send the very same Lua scripts and
``findOneAndUpdate`` documents as the thread ones, only awaited
(``tests/integration/aio/test_contract.py`` checks them on both, on real servers). Leases are
all there is here: facts, fire claims and membership stay on the thread backends.

Failure model: as for the thread backends. A call that gets no answer in its bound raises
:class:`~singleton.errors.BackendUnavailableError`; nothing ever blocks the event loop (every
call is a coroutine on an asyncio driver). The release feed (a pub/sub subscription, a change
stream) is one task per backend, reopened with a capped backoff; while it is down, waiters run
to their timeout: a lost notification costs latency, never safety.
"""

from __future__ import annotations

import asyncio
import contextlib
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from types import TracebackType

from loguru import logger

from singleton.lease.leases import Lease, LeaseState, validate_lease_args
from singleton.lease.notify import REOPEN_BASE, REOPEN_CAP
from singleton.redact import redact
from singleton.retry import Backoff


class AsyncLeases(ABC):
    """Named, expiring, fenced leases, awaited. Each method is its namesake of
    :class:`singleton.lease.leases.Leases`, with the same contract; ``wake`` is an
    :class:`asyncio.Event`."""

    @abstractmethod
    async def contend(self, name: str, holder: str, ttl: float) -> Lease | LeaseState | None: ...

    async def try_acquire(self, name: str, holder: str, ttl: float) -> Lease | None:
        result = await self.contend(name, holder, ttl)
        return result if isinstance(result, Lease) else None

    @abstractmethod
    async def renew(self, lease: Lease, ttl: float | None = None) -> Lease | None: ...

    @abstractmethod
    async def release(self, lease: Lease) -> bool: ...

    @abstractmethod
    async def inspect(self, name: str) -> LeaseState | None: ...

    @abstractmethod
    def release_mark(self, name: str) -> int: ...

    @abstractmethod
    async def wait_for_release(
        self,
        name: str,
        timeout: float,
        wake: asyncio.Event | None = None,
        *,
        since: int | None = None,
    ) -> bool: ...

    def describe(self) -> str:
        """A short description for logs, with any credentials redacted."""
        return type(self).__name__

    @abstractmethod
    async def aclose(self) -> None:
        """Stop the release feed and close the client if this backend built it."""

    async def __aenter__(self) -> AsyncLeases:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()


class _Waiter:
    __slots__ = ("event", "fired")

    def __init__(self, event: asyncio.Event) -> None:
        self.event = event
        self.fired = False


class AsyncReleaseFeed:
    """One task keeping one subscription to release events open, started by the first wait:
    the asyncio twin of :class:`singleton.lease.notify.ReleaseFeed` (same marks, same rule for
    the first open). ``session`` runs one subscription until :attr:`closed` or it raises,
    calling :meth:`opened` once it listens and :meth:`notify` for every release it sees."""

    def __init__(
        self,
        what: str,
        session: Callable[[], Awaitable[None]],
        errors: tuple[type[BaseException], ...],
        *,
        open_timeout: float,
    ) -> None:
        self.closed = False
        self._what = what
        self._session = session
        self._errors = errors
        self._open_timeout = open_timeout
        self._backoff = Backoff(REOPEN_BASE, REOPEN_CAP, jitter=0.2)
        self._marks: dict[str, int] = {}
        self._waiters: dict[str, set[_Waiter]] = {}
        self._tried = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def notify(self, name: str) -> None:
        self._marks[name] = self._marks.get(name, 0) + 1
        for waiter in self._waiters.get(name, ()):
            waiter.fired = True
            waiter.event.set()

    def mark(self, name: str) -> int:
        return self._marks.get(name, 0)

    def opened(self) -> None:
        self._tried.set()
        self._backoff.reset()
        logger.debug("listening: {}", self._what)

    async def wait(
        self, name: str, timeout: float, wake: asyncio.Event | None, since: int | None
    ) -> bool:
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        if self._moved(name, since):
            return True
        if self._task is None and not self.closed:
            self._task = loop.create_task(self._run(), name=f"singleton-feed {self._what}")
        if not self._tried.is_set():
            await _first(self._tried, wake, min(timeout, self._open_timeout))
        if wake is not None and wake.is_set():
            return False
        # No await between this check and the registration: no notify can fall in between.
        if self._moved(name, since):
            return True
        waiter = _Waiter(wake if wake is not None else asyncio.Event())
        bucket = self._waiters.setdefault(name, set())
        bucket.add(waiter)
        try:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(waiter.event.wait(), max(0.0, end - loop.time()))
            return waiter.fired
        finally:
            bucket.discard(waiter)
            if not bucket:
                self._waiters.pop(name, None)

    async def close(self) -> None:
        self.closed = True
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    def _moved(self, name: str, since: int | None) -> bool:
        return since is not None and self.mark(name) > since

    async def _run(self) -> None:
        while not self.closed:
            try:
                await self._session()
            except Exception as exc:  # a bug too must not end the feed without a word
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
                self._tried.set()
                await asyncio.sleep(delay)  # the backoff between reopenings, not a sync point
            finally:
                self._tried.set()


async def _first(event: asyncio.Event, wake: asyncio.Event | None, timeout: float) -> None:
    """Until ``event`` or ``wake`` is set, or ``timeout`` passes."""
    waits = [asyncio.ensure_future(e.wait()) for e in (event, wake) if e is not None]
    try:
        await asyncio.wait(waits, timeout=max(0.0, timeout), return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()


class AsyncServerLeases(AsyncLeases):
    """A backend whose releases arrive on ``_releases`` (the Redis and MongoDB ones)."""

    _releases: AsyncReleaseFeed

    def release_mark(self, name: str) -> int:
        return self._releases.mark(name)

    async def wait_for_release(
        self,
        name: str,
        timeout: float,
        wake: asyncio.Event | None = None,
        *,
        since: int | None = None,
    ) -> bool:
        validate_lease_args(name)
        return await self._releases.wait(name, timeout, wake, since)
