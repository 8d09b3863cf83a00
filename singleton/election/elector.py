"""The thread driver: an :class:`~singleton.election.machine.Election` run on two threads.

Failure model: the election's rules (see :mod:`singleton.election.machine`) keep a tenure valid only
until its renew deadline; this module makes that deadline bite on time. A backend call may hang
(a black-holed socket) or the elector thread may stall, so a second thread, the watchdog, sleeps
on a condition until the current tenure's deadline and demotes it then, whatever the elector
thread is doing.

Threads: one elector thread (it performs the election's actions: contend, renew, drain,
release) and one watchdog thread per started Elector, plus one short-lived thread per drain.
Callbacks run on those threads (``on_lost`` after :meth:`Elector.resign` on the resigning thread)
and must return quickly; ``before_release`` is the one callback allowed to block, bounded by
``release_timeout``. Every wait is on an event or a condition with a timeout, so ``stop()`` wakes
them all.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from loguru import logger

from singleton.election.actions import Action, Contend, Contended, Drain, Release, Renew, Wait
from singleton.election.callbacks import (
    BeforeRelease,
    OnElected,
    OnLost,
    OnNewLeader,
    Subscribers,
)
from singleton.election.health import ElectorStats
from singleton.election.leadership import Leadership
from singleton.election.machine import Election
from singleton.election.settings import (
    ElectorOptions,
    ElectorSettings,
    check_lease_name,
    default_identity,
)
from singleton.errors import ElectionTimeoutError, SingletonError
from singleton.lease.contract import Lease, LeaseBackend, LeaseState

if TYPE_CHECKING:
    from typing_extensions import Unpack  # typing.Unpack from Python 3.11

__all__ = [
    "BeforeRelease",
    "ElectionTimeoutError",
    "Elector",
    "ElectorOptions",
    "ElectorStats",
    "OnElected",
    "OnLost",
    "OnNewLeader",
    "default_identity",
]


class Elector:
    """Keep one replica in charge of lease ``name`` on ``backend``, from background threads.

    ``start()`` campaigns; while elected the tenure is renewed, and on any doubt it ends
    (``on_lost``) before the store could grant the lease to anyone else. The keyword options
    (:class:`~singleton.election.settings.ElectorOptions`) are checked at once. Timings
    (seconds) must satisfy ``ttl > renew_deadline > 1.2 * renew_interval > 0`` (defaults:
    ``renew_interval = ttl / 3``, ``renew_deadline = 2 * ttl / 3``), or come whole as
    ``timings``. With ``max_tenure`` set, the leader hands over voluntarily after about that
    long, then sits out ``cooldown`` (default ``retry_interval``) so that another replica takes
    over. ``jitter`` spreads retries and tenures by that fraction; ``seed`` makes it repeatable.
    ``gate`` (a :class:`singleton.balance.balancer.Balancer`) is asked before every attempt to
    acquire (a positive answer is the seconds to wait instead) and told when the attempt returned.
    """

    def __init__(self, backend: LeaseBackend, name: str, **options: Unpack[ElectorOptions]) -> None:
        check_lease_name(name)
        settings = ElectorSettings.of(**options)
        t = settings.timings
        self.settings = settings
        self.backend = backend
        self.name = name
        self.identity = settings.identity
        self.timings = t
        self.ttl = t.ttl
        self.renew_interval = t.renew_interval
        self.renew_deadline = t.renew_deadline
        self.retry_interval = t.retry_interval
        self.max_tenure = t.max_tenure
        self.cooldown = t.cooldown
        self.release_timeout = t.release_timeout
        self._clock = settings.clock
        self._cv = threading.Condition()  # the watchdog waits on it for the next deadline
        self._wake = threading.Event()  # interrupts the elector thread's wait
        self._stopping = threading.Event()
        self._release_on_stop = True
        self._threads: list[threading.Thread] = []
        self._started = False
        self._election = Election(name, settings, store=backend.describe(), changed=self._changed)

    # -- public API -----------------------------------------------------------------------
    def subscribe(self, **callbacks: Unpack[Subscribers]) -> None:
        """Add callbacks (for example a listener runner's), in addition to the constructor's:
        any of ``on_elected``, ``on_lost``, ``on_new_leader`` and ``before_release``."""
        self._election.callbacks.add(**callbacks)

    @property
    def leadership(self) -> Leadership | None:
        """The current tenure if it is still valid, else ``None``."""
        return self._election.leadership

    @property
    def is_leader(self) -> bool:
        return self.leadership is not None

    @property
    def holder(self) -> str:
        """The holder value this elector currently campaigns with (identity + random part)."""
        return self._election.holder

    @property
    def running(self) -> bool:
        return self._started and not self._stopping.is_set()

    @property
    def stats(self) -> ElectorStats:
        return self._election.stats

    @property
    def last_error(self) -> str | None:
        """The latest failed call to the lease store (type and redacted message, naming the
        store), or ``None`` once the store has answered since. For status pages."""
        return self._election.health.last_error

    @property
    def cooling(self) -> bool:
        """True while this elector sits out a cooldown and will not contend (after a handover,
        or after :meth:`resign`)."""
        return self._election.cooling()

    @property
    def failing(self) -> bool:
        """True while the latest call to the store failed with an error that retrying will not
        fix (refused credentials or permissions, a misconfiguration): this replica cannot lead
        until an operator acts, though it keeps retrying. For readiness checks."""
        return self._election.health.failing

    def start(self) -> Elector:
        """Start campaigning in background threads. Idempotent."""
        with self._cv:
            if self._started:
                return self
            self._started = True
        logger.info(  # seconds as people write them (1.67s, not 1.6666666666666667)
            "elector starting: lease={} identity={} ttl={:g}s renew_interval={:g}s"
            " renew_deadline={:g}s backend={}",
            self.name,
            self.identity,
            round(self.ttl, 2),
            round(self.renew_interval, 2),
            round(self.renew_deadline, 2),
            self.backend.describe(),
        )
        for target, suffix in ((self._run, "elector"), (self._watch, "watchdog")):
            t = threading.Thread(target=target, name=f"singleton-{suffix}-{self.name}", daemon=True)
            self._threads.append(t)
            t.start()
        return self

    def stop(self, release: bool = True, timeout: float | None = None) -> None:
        """Stop campaigning. A leader first drains (``before_release``), then releases the lease
        if ``release`` (else lets it expire); ``on_lost`` fires with reason ``"stopped"``."""
        with self._cv:
            self._release_on_stop = release
            self._stopping.set()
            self._wake.set()
            self._cv.notify_all()
        for t in self._threads:
            if t is not threading.current_thread():
                t.join(timeout)
        if not self._threads:  # never started, or driven by tick()
            self._finish()

    def rotate(self) -> None:
        """Ask the leader to hand over now, as if ``max_tenure`` had passed."""
        if self._election.rotate():
            self._wake.set()

    def resign(
        self, cooldown: float, reason: str = "failed", *, leadership: Leadership | None = None
    ) -> bool:
        """The work under the lease failed for good: end the tenure now, release the lease so
        another replica takes over at once, and do not campaign for ``cooldown`` seconds.

        For the thread that ran the work (it has stopped, so ``before_release`` is not called);
        ``on_lost`` fires with ``reason`` on that thread, and the release is one bounded call to
        the store. Pass the ``leadership`` the work ran under so that a late call cannot end a
        newer tenure. Returns whether a tenure was ended (``False`` on a follower).
        """
        release = self._election.resign(cooldown, reason, leadership)
        if release is None:
            return False
        self._carry_out(release)
        return True

    @contextlib.contextmanager
    def lead(self, timeout: float | None = None) -> Iterator[Leadership]:
        """Block until elected and yield the :class:`Leadership`; on exit, stop and release.

        Raises :class:`ElectionTimeoutError` if not elected within ``timeout`` seconds.
        """
        elected = threading.Event()
        self.subscribe(on_elected=lambda _ld: elected.set())
        self.start()
        try:
            deadline = None if timeout is None else self._clock.monotonic() + timeout
            while True:
                ld = self.leadership
                if ld is not None:
                    break
                left = None if deadline is None else deadline - self._clock.monotonic()
                if left is not None and left <= 0:
                    raise ElectionTimeoutError(
                        f"not elected for lease {self.name!r} within {timeout} s"
                    )
                elected.wait(None if left is None else min(left, self.retry_interval))
                elected.clear()
            yield ld
        finally:
            self.stop(release=True)

    def tick(self) -> float:
        """Run one step of the state machine in the caller's thread; return seconds until the
        next step is due. For deterministic tests with a fake clock; ``start()`` loops on it."""
        if self._stopping.is_set():
            self._election.check_deadline()
            return 0.0
        return self._step().seconds

    # -- threads --------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while not self._stopping.is_set():
                try:
                    wait = self._step()
                except Exception as exc:  # a bug must not leave a leader running unrenewed
                    logger.exception("elector step crashed: lease={}", self.name)
                    wait = self._election.crashed(exc)
                if wait.seconds > 0:
                    self._wait(wait)
        finally:
            self._finish()
            self._changed()

    def _step(self) -> Wait:
        return self._carry_out(self._election.tick())

    def _carry_out(self, action: Action) -> Wait:
        """Perform ``action`` and those the election asks for after it, until it says wait."""
        while not isinstance(action, Wait):
            action = self._perform(action)
        return action

    def _perform(self, action: Contend | Renew | Drain | Release) -> Action:
        # The only calls to the backend; each reports back, and the election decides the rest.
        election = self._election
        if isinstance(action, Contend):
            return election.contended(action, self._contend(action))
        if isinstance(action, Renew):
            sent_at = self._clock.monotonic()
            renewed: Lease | SingletonError | None
            try:
                renewed = self.backend.renew(action.lease, action.ttl)
            except SingletonError as exc:
                renewed = exc
            return election.renewed(action, renewed, sent_at)
        if isinstance(action, Drain):
            ld = action.leadership
            finished = self._run_bounded(
                lambda: election.callbacks.before_release(ld), action.timeout
            )
            return election.drained(action, finished)
        released: bool | SingletonError
        try:
            released = self.backend.release(action.lease)
        except SingletonError as exc:
            released = exc
        return election.released(action, released)

    def _contend(self, action: Contend) -> Contended:
        # Read before the round trip: a release applied after the server refused us is
        # observed after this read, so the wait that follows returns even if it came first.
        mark = self.backend.release_mark(action.name)
        sent_at = self._clock.monotonic()
        answer: Lease | LeaseState | SingletonError | None
        try:
            answer = self.backend.contend(action.name, action.holder, action.ttl)
        except SingletonError as exc:
            answer = exc
        return Contended.of(answer, sent_at=sent_at, release_mark=mark)

    def _wait(self, wait: Wait) -> None:
        self._wake.clear()
        if self._stopping.is_set() or self._election.rotate_pending:
            return
        if not wait.for_release:
            self._wake.wait(wait.seconds)
            return
        try:
            self.backend.wait_for_release(
                self.name, wait.seconds, wake=self._wake, since=wait.since
            )
        except SingletonError as exc:
            logger.debug("wait_for_release failed: lease={}: {}", self.name, exc)
            self._wake.wait(wait.seconds)

    def _watch(self) -> None:
        # Demoting (and so on_lost) happens outside the condition: on_lost may join threads
        # that call into the elector.
        while True:
            with self._cv:
                ld = self._election.tenure
                if ld is None or ld.lost.is_set():
                    if self._stopping.is_set():
                        return
                    self._cv.wait()
                    continue
                left = ld.remaining()
                if left > 0 or not ld.fenced:  # unsafe test mode: no deadline to watch
                    self._cv.wait(left if left > 0 else self.renew_interval)
                    continue
            self._election.check_deadline()

    def _changed(self) -> None:
        """A tenure started, was renewed or ended: wake the waits that depend on it."""
        self._wake.set()
        with self._cv:
            self._cv.notify_all()

    def _run_bounded(self, work: Callable[[], None], timeout: float) -> bool:
        done = threading.Event()

        def run() -> None:
            try:
                work()
            finally:
                done.set()

        threading.Thread(target=run, name=f"singleton-drain-{self.name}", daemon=True).start()
        return done.wait(timeout)

    def _finish(self) -> None:
        self._carry_out(self._election.finish(release=self._release_on_stop))
        logger.info("elector stopped: lease={} identity={}", self.name, self.identity)

    def __repr__(self) -> str:
        ld = self.leadership
        state = f"leader token={ld.token}" if ld is not None else "follower"
        if self.failing:
            state += " failing"
        return f"<Elector {self.name!r} {self.identity!r} {state}>"
