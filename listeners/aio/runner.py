"""Run a :class:`~listeners.base.ChangeStreamListener` whose ``handle_batch``, ``flush`` and
hooks (``on_start``, ``stale_sink``, ``initial_sync``, ``on_idle``, ``on_invalidate``,
``on_stop``) may be ``async def``, from an asyncio application, with the threaded runner's rules
unchanged. Any other method of the base written as ``async def`` (``sink_identity``,
``next_batch_size``, ...: values the runner reads, not work it awaits) is refused at
construction (:class:`~singleton.errors.ConfigurationError`), never silently not awaited.

Design: the tenure (claiming the checkpoint, reading the change stream with bounded calls, the
checkpoint policy, fencing, the drain and handover, the failure budget and resignation) is
:class:`~listeners.runtime.runner.ListenerRunner`'s, on its threads with its
:class:`~singleton.Elector`: it already keeps every rule, and a second copy would drift. Only the
sink's coroutines run on the application's event loop: the tenure thread submits each
``handle_batch`` (and hook) with ``asyncio.run_coroutine_threadsafe`` and waits for it no longer
than the tenure may act (``on_stop``, which runs when the tenure is over: to its end). So the
blocking reads never touch the loop, and the loop's coroutines never outlive their lease.

Failure model: the runner's (see :mod:`listeners.runtime.runner`), plus a loop that may be slow or
hogged. A batch whose coroutine has not finished when the tenure's renew deadline passes (or the
tenure is demoted) is cancelled on the loop (``CancelledError`` at its next ``await``) and counts
as not delivered: the tenure ends as lost and the successor replays that batch, exactly as for a
threaded ``handle_batch`` cut off by its deadline. A planned handover waits for the batch in hand
at most ``drain_timeout``, as the threaded runner does.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

from loguru import logger

from listeners.base import ChangeStreamListener, ListenerContext
from listeners.runtime.runner import ListenerRunner, RunnerOptions
from listeners.runtime.status import RunnerStatus
from singleton.errors import ConfigurationError

if TYPE_CHECKING:
    from pymongo import MongoClient
    from typing_extensions import Unpack  # typing.Unpack from Python 3.11

    from singleton.election.elector import Elector
    from singleton.election.leadership import Leadership

#: The methods that may be coroutine functions; each is awaited on the loop while its tenure
#: may act, except :data:`UNBOUNDED`'s (cleanup, once the tenure is over).
BRIDGED = (
    "handle_batch",
    "flush",
    "on_start",
    "stale_sink",
    "initial_sync",
    "on_idle",
    "on_invalidate",
    "on_stop",
)
UNBOUNDED = frozenset({"on_stop"})
#: How often a tenure thread waiting for a batch's coroutine looks at its tenure: bounds how
#: late a demotion before the deadline (a refused renewal, a drain's end) cancels the batch.
LOOK_EVERY = 0.05


class AsyncListenerRunner:
    """:class:`~listeners.runtime.runner.ListenerRunner` for an asyncio application: the same
    arguments and options, ``await start()`` / ``await stop()``, and a listener whose
    ``handle_batch`` and ``flush`` may be coroutine functions (run on the loop that called
    :meth:`start`). The election is the threaded ``elector``'s, off the loop."""

    def __init__(
        self,
        listener: ChangeStreamListener,
        elector: Elector,
        client_or_url: MongoClient[dict[str, Any]] | str,
        **options: Unpack[RunnerOptions],
    ) -> None:
        self.listener = listener
        self._loop: asyncio.AbstractEventLoop | None = None
        for method in BRIDGED:
            bound = getattr(listener, method)
            if inspect.iscoroutinefunction(bound):
                setattr(listener, method, self._bridge(bound, method in UNBOUNDED))
        for method, _ in inspect.getmembers(ChangeStreamListener, callable):
            if method in BRIDGED or method.startswith("_"):
                continue
            if inspect.iscoroutinefunction(getattr(listener, method, None)):
                raise ConfigurationError(
                    f"{type(listener).__name__}.{method} is async def: the runner calls it"
                    " for a value, it never awaits it; make it a plain method (only"
                    f" {', '.join(BRIDGED)} may be coroutines)"
                )
        self.runner = ListenerRunner(listener, elector, client_or_url, **options)
        self.elector = elector

    async def start(self) -> AsyncListenerRunner:
        """Start campaigning (idempotent); the listener's coroutines run on this loop."""
        self._loop = asyncio.get_running_loop()
        await asyncio.to_thread(self.runner.start)
        return self

    async def stop(self, release: bool = True, timeout: float | None = 30.0) -> None:
        """Stop as :meth:`ListenerRunner.stop` does (drain, checkpoint, release), off the loop,
        which keeps running the batch in hand while the tenure waits for it."""
        await asyncio.to_thread(self.runner.stop, release, timeout)

    def status(self) -> RunnerStatus:
        return self.runner.status()

    @property
    def is_leader(self) -> bool:
        return self.elector.is_leader

    def _bridge(
        self, method: Callable[..., Coroutine[Any, Any, Any]], unbounded: bool
    ) -> Callable[..., Any]:
        def on_the_loop(*args: Any) -> Any:
            ctx = next(a for a in args if isinstance(a, ListenerContext))
            loop = self._loop
            if loop is None or loop.is_closed():
                raise RuntimeError("AsyncListenerRunner: start() it from a running event loop")
            future = asyncio.run_coroutine_threadsafe(method(*args), loop)
            if unbounded:
                return future.result()
            return _within_tenure(future, ctx.leadership)

        return on_the_loop


def _within_tenure(future: concurrent.futures.Future[Any], ld: Leadership) -> Any:
    """``future``'s result, waited for while ``ld`` may act; else cancelled on the loop and
    :class:`~singleton.errors.LeaseLostError` (the batch is not delivered: it is replayed)."""
    while True:
        # The drill's unsafe mode (no fencing) acts until told it lost, not until a deadline.
        left = ld.remaining() if ld.fenced else (0.0 if ld.lost.is_set() else LOOK_EVERY)
        if left <= 0 or not ld.valid():
            if future.cancel():
                logger.warning(
                    "batch coroutine cancelled, its tenure ended first: lease={} token={}",
                    ld.name,
                    ld.token,
                )
            else:
                with_result = future.done() and not future.cancelled()
                if with_result and future.exception() is None:
                    return future.result()  # it finished in the same instant: keep it
            ld.check()
        try:
            return future.result(timeout=min(left, LOOK_EVERY))
        except concurrent.futures.TimeoutError:
            continue
