"""The Elector: an :class:`~singleton.election.machine.Election` run on threads.

Failure model: the election's rules (see :mod:`singleton.election.machine`) keep a tenure valid only
until its renew deadline; this module makes that deadline bite on time. A backend call may hang
(a black-holed socket) or the elector thread may stall, so a second thread, the watchdog, sleeps
on a condition until the current tenure's deadline and demotes it then, whatever the elector
thread is doing.

Threads: one elector thread (contend, renew, rotate) and one watchdog thread per started
Elector, plus one short-lived thread per drain. Callbacks run on those threads (``on_lost``
after :meth:`Elector.resign` on the resigning thread) and must return quickly;
``before_release`` is the one callback allowed to block, bounded by ``release_timeout``. Every
wait is on an event or a condition with a timeout, so ``stop()`` wakes them all.
"""

from __future__ import annotations

import contextlib
import os
import random
import socket
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from loguru import logger

from singleton.clock import SYSTEM_CLOCK, Clock
from singleton.election.callbacks import (
    BeforeRelease,
    Callbacks,
    OnElected,
    OnLost,
    OnNewLeader,
    Subscribers,
)
from singleton.election.gate import Gate
from singleton.election.health import ElectorStats
from singleton.election.leadership import Leadership
from singleton.election.machine import Election
from singleton.errors import ConfigurationError, ElectionTimeoutError, SingletonError
from singleton.lease.contract import HOLDER_SEPARATOR, LeaseBackend, takes_since
from singleton.lease.timings import LeaseTimings
from singleton.retry import Backoff

if TYPE_CHECKING:
    from typing_extensions import Unpack  # typing.Unpack from Python 3.11

__all__ = [
    "BeforeRelease",
    "ElectionTimeoutError",
    "Elector",
    "ElectorStats",
    "OnElected",
    "OnLost",
    "OnNewLeader",
    "default_identity",
]

#: The contend backoff doubles from ``retry_interval`` up to this (or ``retry_interval``).
MAX_RETRY_BACKOFF = 30.0


def default_identity() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


def _check_arguments(name: object, identity: object, jitter: float) -> None:
    if not isinstance(name, str) or not name:
        raise ConfigurationError(f"lease name must be a non-empty string, got {name!r}")
    if identity is not None and (not isinstance(identity, str) or not identity):
        raise ConfigurationError(f"identity must be a non-empty string, got {identity!r}")
    if isinstance(identity, str) and HOLDER_SEPARATOR in identity:
        raise ConfigurationError(
            f"identity must not contain {HOLDER_SEPARATOR!r}, got {identity!r}"
        )
    if not 0 <= jitter < 1:
        raise ConfigurationError(f"jitter must be in [0, 1), got {jitter!r}")


class Elector:
    """Campaign for ``name`` on ``backend``; while elected, renew; on any doubt, step down.

    Timings (seconds) must satisfy ``ttl > renew_deadline > 1.2 * renew_interval > 0``
    (defaults: ``renew_interval = ttl / 3``, ``renew_deadline = 2 * ttl / 3``), or come whole as
    ``timings``. With ``max_tenure`` set, the leader hands over voluntarily after about that
    long, then sits out ``cooldown`` (default ``retry_interval``) so that another replica takes
    over. ``jitter`` spreads retries and tenures by that fraction; ``seed`` makes it repeatable.
    ``gate`` (a :class:`singleton.balance.balancer.Balancer`) is asked before every attempt to
    acquire (a positive answer is the seconds to wait instead) and told when the attempt returned.
    """

    def __init__(
        self,
        backend: LeaseBackend,
        name: str,
        *,
        identity: str | None = None,
        ttl: float = 15.0,
        renew_interval: float | None = None,
        renew_deadline: float | None = None,
        retry_interval: float = 2.0,
        max_tenure: float | None = None,
        cooldown: float | None = None,
        release_timeout: float | None = None,
        timings: LeaseTimings | None = None,
        on_elected: OnElected | None = None,
        on_lost: OnLost | None = None,
        on_new_leader: OnNewLeader | None = None,
        before_release: BeforeRelease | None = None,
        clock: Clock | None = None,
        jitter: float = 0.1,
        seed: int | None = None,
        unsafe_disable_fencing: bool = False,
        gate: Gate | None = None,
    ) -> None:
        _check_arguments(name, identity, jitter)
        t = timings or LeaseTimings.of(
            ttl,
            renew_interval,
            renew_deadline,
            retry_interval,
            max_tenure,
            cooldown,
            release_timeout,
        )
        self.backend = backend
        self.name = name
        self.identity = identity or default_identity()
        self.timings = t
        self.ttl = t.ttl
        self.renew_interval = t.renew_interval
        self.renew_deadline = t.renew_deadline
        self.retry_interval = t.retry_interval
        self.max_tenure = t.max_tenure
        self.cooldown = t.cooldown
        self.release_timeout = t.release_timeout
        self._clock = clock or SYSTEM_CLOCK
        self._callbacks = Callbacks(name)
        self._callbacks.add(
            on_elected=on_elected,
            on_lost=on_lost,
            on_new_leader=on_new_leader,
            before_release=before_release,
        )
        self._cv = threading.Condition()  # the watchdog waits on it for the next deadline
        self._wake = threading.Event()  # interrupts the elector thread's wait
        self._stopping = threading.Event()
        self._release_on_stop = True
        self._threads: list[threading.Thread] = []
        self._started = False
        self._gate = gate
        self._takes_since = takes_since(backend)  # backends older than release marks do not
        self._election = self._new_election(t, jitter, seed, fenced=not unsafe_disable_fencing)

    # -- public API -----------------------------------------------------------------------
    def subscribe(self, **callbacks: Unpack[Subscribers]) -> None:
        """Add callbacks (for example a listener runner's), in addition to the constructor's:
        any of ``on_elected``, ``on_lost``, ``on_new_leader`` and ``before_release``."""
        self._callbacks.add(**callbacks)

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
        logger.info(
            "elector starting: lease={} identity={} ttl={} renew_interval={} renew_deadline={}"
            " backend={}",
            self.name,
            self.identity,
            self.ttl,
            self.renew_interval,
            self.renew_deadline,
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
        return self._election.resign(cooldown, reason, leadership)

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
        return self._election.tick()

    # -- threads --------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while not self._stopping.is_set():
                try:
                    delay = self.tick()
                except Exception as exc:  # a bug must not leave a leader running unrenewed
                    logger.exception("elector step crashed: lease={}", self.name)
                    delay = self._election.crashed(exc)
                if delay > 0:
                    self._wait(delay)
        finally:
            self._finish()
            self._changed()

    def _wait(self, delay: float) -> None:
        self._wake.clear()
        if self._stopping.is_set() or self._election.rotate_pending:
            return
        if not self._election.idle():
            self._wake.wait(delay)
            return
        since = self._election.release_mark if self._takes_since else None
        try:
            if since is None:
                self.backend.wait_for_release(self.name, delay, wake=self._wake)
            else:
                self.backend.wait_for_release(self.name, delay, wake=self._wake, since=since)
        except SingletonError as exc:
            logger.debug("wait_for_release failed: lease={}: {}", self.name, exc)
            self._wake.wait(delay)

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

    def _new_election(
        self, t: LeaseTimings, jitter: float, seed: int | None, *, fenced: bool
    ) -> Election:
        retries = Backoff(
            t.retry_interval,
            max(MAX_RETRY_BACKOFF, t.retry_interval),
            jitter=jitter,
            rng=random.Random(seed),
        )
        return Election(
            self.backend,
            self.name,
            self.identity,
            t,
            clock=self._clock,
            backoff=retries,
            callbacks=self._callbacks,
            run_bounded=self._run_bounded,
            changed=self._changed,
            fenced=fenced,
            gate=self._gate,
        )

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
        self._election.finish(release=self._release_on_stop)
        logger.info("elector stopped: lease={} identity={}", self.name, self.identity)

    def __repr__(self) -> str:
        ld = self.leadership
        state = f"leader token={ld.token}" if ld is not None else "follower"
        if self.failing:
            state += " failing"
        return f"<Elector {self.name!r} {self.identity!r} {state}>"
