"""The asyncio driver: an :class:`~singleton.election.machine.Election` run on an event loop.

The rules are the thread driver's, because they are the same object: this module performs what
the machine asks (contend, renew, drain, release) with awaited backend calls and reports each
answer back, exactly as :mod:`singleton.election.elector` does with blocking ones.

Failure model: the election's (a tenure is valid only until ``renew_deadline`` after the last
renewal sent and confirmed, on the monotonic clock), plus an event loop that the application
itself may hog. So the deadline is enforced three ways: :meth:`Leadership.check` reads the clock
itself and raises from the deadline on, whatever the loop is doing; a watchdog thread waits for
the deadline on a condition and at that instant queues the demotion on the loop
(``call_soon_threadsafe``), so the work is cancelled on the loop's first turn after the deadline,
before the work's own next step; and a backend call that hangs holds up only the driver task.
Callbacks run on the loop; a coroutine callback is run as a task (``before_release`` ones are
awaited by the drain, bounded by ``release_timeout``).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any

from loguru import logger

from singleton.aio.leases import AsyncLeases
from singleton.election.actions import Action, Contend, Contended, Drain, Release, Renew, Wait
from singleton.election.health import ElectorStats
from singleton.election.leadership import Leadership
from singleton.election.machine import Election
from singleton.election.settings import ElectionOptions, ElectorSettings, check_lease_name
from singleton.errors import ElectionTimeoutError, LeaseLostError, SingletonError
from singleton.lease.leases import Lease, LeaseState

if TYPE_CHECKING:
    from typing_extensions import Unpack  # typing.Unpack from Python 3.11

#: What ``run`` runs while this replica leads: ``async def work(leadership)``.
Work = Callable[[Leadership], Coroutine[Any, Any, None]]
_CALLBACKS = ("on_elected", "on_lost", "on_new_leader", "before_release")
#: A callback: a plain function, or a coroutine function (run as a task, or awaited by a drain).
Callback = Callable[..., "Awaitable[None] | None"]


class AsyncElectorOptions(ElectionOptions, total=False):
    """The keyword options of ``AsyncElector``: ``Elector``'s, with callbacks that may be
    coroutine functions (``on_lost`` takes the leadership and the reason, the others one
    argument)."""

    on_elected: Callback | None
    on_lost: Callback | None
    on_new_leader: Callback | None
    before_release: Callback | None


class AsyncElector:
    """Keep one replica in charge of lease ``name`` on an asyncio ``backend``.

    The keyword options are :class:`~singleton.election.elector.Elector`'s (checked at once, the
    same timing rule); ``on_elected``, ``on_lost``, ``on_new_leader`` and ``before_release`` may
    be plain functions or coroutine functions. Use it one of two ways: ``async with
    elector.lead() as leadership`` (the body is cancelled, and :class:`LeaseLostError` raised
    out of the block, when the tenure ends), or ``await elector.run(work)``.
    """

    def __init__(
        self, backend: AsyncLeases, name: str, **options: Unpack[AsyncElectorOptions]
    ) -> None:
        check_lease_name(name)
        given: dict[str, Any] = dict(options)
        callbacks = {k: given.pop(k) for k in _CALLBACKS if k in given}
        settings = ElectorSettings.of(**given)
        self.settings = settings
        self.backend = backend
        self.name = name
        self.identity = settings.identity
        self.timings = settings.timings
        self._clock = settings.clock
        self._tasks: set[asyncio.Task[Any]] = set()
        self._drains: list[Awaitable[Any]] = []
        self._wake = asyncio.Event()  # cuts the driver's wait short
        self._tenures = asyncio.Event()  # a tenure started or ended
        self._stopping = False
        self._release_on_stop = True
        self._driver: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._cv = threading.Condition()  # the watchdog thread waits on it for the deadline
        self._watchdog: threading.Thread | None = None
        self._posted: Leadership | None = None  # the tenure whose deadline was queued
        self._work: tuple[Leadership, asyncio.Task[Any]] | None = None
        self._guarded: dict[int, tuple[Leadership, asyncio.Task[Any]]] = {}
        self._draining_work = False
        self._election = Election(name, settings, store=backend.describe(), changed=self._changed)
        # First, so that the work stops before any user callback hears of the loss.
        self._election.callbacks.add(on_lost=self._cancel_work)
        self.subscribe(**callbacks)

    # -- what an application reads ----------------------------------------------------------
    @property
    def leadership(self) -> Leadership | None:
        """The current tenure if it is still valid (on the clock, now), else ``None``."""
        return self._election.leadership

    @property
    def is_leader(self) -> bool:
        return self.leadership is not None

    @property
    def running(self) -> bool:
        return self._driver is not None and not self._stopping

    @property
    def stats(self) -> ElectorStats:
        return self._election.stats

    @property
    def last_error(self) -> str | None:
        return self._election.health.last_error

    @property
    def failing(self) -> bool:
        return self._election.health.failing

    @property
    def cooling(self) -> bool:
        return self._election.cooling()

    # -- control ------------------------------------------------------------------------------
    def subscribe(self, **callbacks: Any) -> None:
        """Add callbacks (plain or coroutine functions) to the constructor's: any of
        ``on_elected``, ``on_lost``, ``on_new_leader`` and ``before_release``."""
        unknown = set(callbacks) - set(_CALLBACKS)
        if unknown:
            raise TypeError(f"AsyncElector.subscribe() got unknown callbacks {sorted(unknown)}")
        bridged = {
            kind: self._bridge(cb, kind == "before_release")
            for kind, cb in callbacks.items()
            if cb is not None
        }
        self._election.callbacks.add(**bridged)

    def start(self) -> AsyncElector:
        """Start campaigning in a task of the running loop (and the deadline's watchdog
        thread). Idempotent."""
        if self._driver is not None:
            return self
        self._loop = asyncio.get_running_loop()
        t = self.timings
        logger.info(
            "async elector starting: lease={} identity={} ttl={:g}s renew_interval={:g}s"
            " renew_deadline={:g}s backend={}",
            self.name,
            self.identity,
            round(t.ttl, 2),
            round(t.renew_interval, 2),
            round(t.renew_deadline, 2),
            self.backend.describe(),
        )
        self._driver = self._loop.create_task(self._drive(), name=f"singleton-elector-{self.name}")
        self._watchdog = threading.Thread(
            target=self._watch, name=f"singleton-aio-watchdog-{self.name}", daemon=True
        )
        self._watchdog.start()
        return self

    async def stop(self, release: bool = True) -> None:
        """Stop campaigning. A leader cancels its work (waiting for it at most
        ``release_timeout``) and releases the lease if ``release``: the successor starts at
        once. ``on_lost`` fires with reason ``"stopped"``."""
        self._release_on_stop = release
        self._stopping = True
        self._wake.set()
        self._tenures.set()
        driver = self._driver
        try:
            if driver is None:
                await self._finish()
            elif driver is not asyncio.current_task():
                # Shielded: a stop() awaited by the work that the drain cancels must not
                # cancel the driver with it.
                await asyncio.shield(driver)
        finally:
            with self._cv:
                self._cv.notify_all()

    def rotate(self) -> None:
        """Ask the leader to hand over now, as if ``max_tenure`` had passed."""
        if self._election.rotate():
            self._wake.set()

    async def resign(
        self, cooldown: float, reason: str = "failed", *, leadership: Leadership | None = None
    ) -> bool:
        """The work failed for good: end the tenure now, release the lease, and do not campaign
        for ``cooldown`` seconds (see :meth:`Elector.resign`)."""
        release = self._election.resign(cooldown, reason, leadership)
        if release is None:
            return False
        await self._carry_out(release)
        return True

    @contextlib.asynccontextmanager
    async def lead(self, timeout: float | None = None) -> AsyncIterator[Leadership]:
        """Wait until elected and yield the :class:`Leadership`; on exit, stop and release.

        When the tenure ends while the body runs, the body is cancelled and
        :class:`LeaseLostError` comes out of the ``async with``; :class:`ElectionTimeoutError`
        if not elected within ``timeout`` seconds.
        """
        self.start()
        task = asyncio.current_task()
        try:
            ld = await self._elected(timeout)
            if ld is None:
                raise ElectionTimeoutError(f"stopped before elected for lease {self.name!r}")
            if task is None:  # pragma: no cover - an async with always runs in a task
                yield ld
                return
            self._guarded[id(task)] = (ld, task)
            try:
                yield ld
            except asyncio.CancelledError:
                if self._guarded.pop(id(task), None) is None and _uncancel(task) == 0:
                    ld.check()  # we cancelled it because the tenure ended: LeaseLostError
                raise
            finally:
                self._guarded.pop(id(task), None)
        finally:
            await self.stop(release=True)

    async def run(self, work: Work) -> None:
        """Run ``await work(leadership)`` whenever this replica leads, until :meth:`stop`.

        The work is cancelled (``CancelledError`` at its next ``await``) when its tenure ends;
        a planned handover cancels it too and waits for it at most ``release_timeout``. Work
        that returns hands the lease over (another replica may take it); work that raises is
        logged and the tenure resigned, sitting out ``max(ttl, 1 s)`` before campaigning again.
        """
        if not self._draining_work:
            self._draining_work = True
            self._election.callbacks.add(before_release=self._drain_work)
        self.start()
        served: Leadership | None = None
        while True:
            ld = await self._elected(None, after=served)  # never twice in one tenure
            if ld is None:
                break
            await self._serve(work, ld)
            served = ld
        driver = self._driver
        if driver is not None:
            await asyncio.shield(driver)

    async def tick(self) -> float:
        """One step of the machine on the caller's task; seconds until the next is due. For
        deterministic tests with a fake clock (no driver task, no watchdog thread)."""
        if self._stopping:
            self._election.check_deadline()
            return 0.0
        return (await self._carry_out(self._election.tick())).seconds

    # -- the work -----------------------------------------------------------------------------
    async def _serve(self, work: Work, ld: Leadership) -> None:
        task = asyncio.get_running_loop().create_task(work(ld), name=f"singleton-work-{self.name}")
        self._work = (ld, task)
        try:
            await asyncio.wait({task})
        except asyncio.CancelledError:  # run() itself was cancelled: so is its work
            task.cancel()
            raise
        finally:
            self._work = None
        if task.cancelled():
            return
        exc = task.exception()
        if isinstance(exc, LeaseLostError):  # its check() saw the tenure end: not a failure
            logger.info("leader work stopped, its tenure ended: lease={}", self.name)
        elif exc is not None:
            logger.opt(exception=exc).error(
                "leader work failed: lease={} token={}", self.name, ld.token
            )
            await self.resign(max(self.timings.ttl, 1.0), "failed", leadership=ld)
        elif ld.valid() and not self._stopping:
            logger.info("leader work returned, handing over: lease={}", self.name)
            self.rotate()

    def _cancel_work(self, ld: Leadership, _reason: str) -> None:
        current = asyncio.current_task()
        work = self._work
        if work is not None and work[0] is ld and work[1] is not current:
            work[1].cancel()
        for key, (guarded_ld, task) in list(self._guarded.items()):
            if guarded_ld is ld and task is not current:
                del self._guarded[key]
                task.cancel()

    def _drain_work(self, ld: Leadership) -> None:
        work = self._work
        if work is not None and work[0] is ld:
            work[1].cancel()
            self._drains.append(asyncio.wait({work[1]}))

    async def _elected(
        self, timeout: float | None, after: Leadership | None = None
    ) -> Leadership | None:
        """The next valid tenure other than ``after``, or ``None`` once stopping."""
        try:
            return await asyncio.wait_for(self._next_tenure(after), timeout)
        except asyncio.TimeoutError:
            raise ElectionTimeoutError(
                f"not elected for lease {self.name!r} within {timeout} s"
            ) from None

    async def _next_tenure(self, after: Leadership | None) -> Leadership | None:
        while not self._stopping:
            self._tenures.clear()
            ld = self.leadership
            if ld is not None and ld is not after:
                return ld
            await self._tenures.wait()
        return None

    # -- the driver -----------------------------------------------------------------------------
    async def _drive(self) -> None:
        try:
            while not self._stopping:
                try:
                    wait = await self._carry_out(self._election.tick())
                except Exception as exc:  # a bug must not leave a leader running unrenewed
                    logger.exception("async elector step crashed: lease={}", self.name)
                    wait = self._election.crashed(exc)
                if wait.seconds > 0:
                    await self._wait(wait)
        finally:
            await self._finish()

    async def _carry_out(self, action: Action) -> Wait:
        while not isinstance(action, Wait):
            action = await self._perform(action)
        return action

    async def _perform(self, action: Contend | Renew | Drain | Release) -> Action:
        # The only calls to the backend; each reports back, and the election decides the rest.
        election = self._election
        if isinstance(action, Contend):
            mark = self.backend.release_mark(action.name)
            sent_at = self._clock.monotonic()
            answer: Lease | LeaseState | SingletonError | None
            try:
                answer = await self.backend.contend(action.name, action.holder, action.ttl)
            except SingletonError as exc:
                answer = exc
            return election.contended(
                action, Contended.of(answer, sent_at=sent_at, release_mark=mark)
            )
        if isinstance(action, Renew):
            sent_at = self._clock.monotonic()
            renewed: Lease | SingletonError | None
            try:
                renewed = await self.backend.renew(action.lease, action.ttl)
            except SingletonError as exc:
                renewed = exc
            return election.renewed(action, renewed, sent_at)
        if isinstance(action, Drain):
            return election.drained(action, await self._drain(action))
        released: bool | SingletonError
        try:
            released = await self.backend.release(action.lease)
        except SingletonError as exc:
            released = exc
        return election.released(action, released)

    async def _drain(self, action: Drain) -> bool:
        self._drains = []
        self._election.callbacks.before_release(action.leadership)
        pending = [asyncio.ensure_future(d) for d in self._drains]
        self._drains = []
        if not pending:
            return True
        _, late = await asyncio.wait(pending, timeout=action.timeout)
        return not late

    async def _wait(self, wait: Wait) -> None:
        self._wake.clear()
        if self._stopping or self._election.rotate_pending:
            return
        if wait.for_release:
            try:
                await self.backend.wait_for_release(
                    self.name, wait.seconds, wake=self._wake, since=wait.since
                )
                return
            except SingletonError as exc:
                logger.debug("wait_for_release failed: lease={}: {}", self.name, exc)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._wake.wait(), wait.seconds)

    async def _finish(self) -> None:
        await self._carry_out(self._election.finish(release=self._release_on_stop))
        logger.info("async elector stopped: lease={} identity={}", self.name, self.identity)

    def _changed(self) -> None:
        """A tenure started, was renewed or ended: wake the waits that depend on it."""
        self._wake.set()
        self._tenures.set()
        with self._cv:
            self._cv.notify_all()

    # -- the deadline, off the loop ---------------------------------------------------------------
    def _watch(self) -> None:
        loop = self._loop
        assert loop is not None
        while not loop.is_closed():
            with self._cv:
                if self._stopping and self._election.tenure is None:
                    return
                ld = self._election.tenure
                if ld is None or ld.lost.is_set() or not ld.fenced or ld is self._posted:
                    self._cv.wait(self.timings.renew_interval)
                    continue
                left = ld.remaining()
                if left > 0:
                    self._cv.wait(left)
                    continue
                self._posted = ld
            try:
                loop.call_soon_threadsafe(self._deadline_passed, ld)
            except RuntimeError:  # the loop is closed: nothing left to cancel
                return

    def _deadline_passed(self, ld: Leadership) -> None:
        self._election.check_deadline()
        if not ld.lost.is_set():  # renewed meanwhile, after all: watch its new deadline
            with self._cv:
                self._posted = None
                self._cv.notify_all()

    # -- callbacks ---------------------------------------------------------------------------------
    def _bridge(self, callback: Callable[..., Any], drain: bool) -> Callable[..., None]:
        def call(*args: Any) -> None:
            result = callback(*args)
            if not inspect.isawaitable(result):
                return
            if drain:
                self._drains.append(result)
                return
            task = asyncio.ensure_future(result)
            self._tasks.add(task)
            task.add_done_callback(self._callback_done)

        return call

    def _callback_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            logger.opt(exception=task.exception()).error(
                "callback task failed: lease={}", self.name
            )

    def __repr__(self) -> str:
        ld = self.leadership
        state = f"leader token={ld.token}" if ld is not None else "follower"
        return f"<AsyncElector {self.name!r} {self.identity!r} {state}>"


def _uncancel(task: asyncio.Task[Any]) -> int:
    """``task.uncancel()`` where it exists (Python 3.11+): the cancellation requests left."""
    uncancel = getattr(task, "uncancel", None)
    return 0 if uncancel is None else int(uncancel())
