"""Candidacy, renewal, the renew deadline, and voluntary rotation for one lease name.

Failure model: this process may pause at any point (GC, SIGSTOP, a blocked socket), and the
lease store may stop answering. Safety therefore never depends on a call returning: a tenure is
valid only until ``renew_deadline`` seconds after the last renewal that was *sent* and then
confirmed, measured on the local monotonic clock, and a watchdog thread ends it at that instant
even while the elector thread is stuck inside a backend call. Because ``renew_deadline < ttl``
and the server starts its ``ttl`` no earlier than we sent the request, the local tenure ends
before the store can grant the lease to anyone else (clock *rates* are assumed to agree within
``(ttl - renew_deadline) / ttl``; offsets do not matter).

Threads: one elector thread (contend, renew, rotate) and one watchdog thread per started
Elector. Callbacks run on those threads and must return quickly; ``before_release`` is the one
callback allowed to block, bounded by ``release_timeout``.
"""

from __future__ import annotations

import contextlib
import os
import random
import secrets
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from loguru import logger

from singleton.abc import HOLDER_SEPARATOR, Lease, LeaseBackend, LeaseState, identity_of
from singleton.clock import SYSTEM_CLOCK, Clock
from singleton.errors import ConfigurationError, SingletonError
from singleton.leadership import Leadership
from singleton.timings import LeaseTimings


class OnElected(Protocol):
    def __call__(self, leadership: Leadership, /) -> None: ...


class OnLost(Protocol):
    def __call__(self, leadership: Leadership, reason: str, /) -> None: ...


class OnNewLeader(Protocol):
    def __call__(self, identity: str | None, /) -> None: ...


class BeforeRelease(Protocol):
    def __call__(self, leadership: Leadership, /) -> None: ...


@dataclass
class ElectorStats:
    """Counters for metrics; read without locking (monotone, approximate is fine)."""

    elections: int = 0
    losses: int = 0
    renewals: int = 0
    renew_failures: int = 0
    renew_seconds_total: float = 0.0
    last_renew_seconds: float = 0.0


class ElectionTimeoutError(SingletonError, TimeoutError):
    """:meth:`Elector.lead` was not elected within its timeout."""


def default_identity() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


class Elector:
    """Campaign for ``name`` on ``backend``; while elected, renew; on any doubt, step down.

    Timings (seconds) must satisfy ``ttl > renew_deadline > 1.2 * renew_interval > 0``
    (defaults: ``renew_interval = ttl / 3``, ``renew_deadline = 2 * ttl / 3``).
    With ``max_tenure`` set, the leader hands over voluntarily after about that long, then sits
    out ``cooldown`` (default ``retry_interval``) so that another replica takes over.
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
    ) -> None:
        if not isinstance(name, str) or not name:
            raise ConfigurationError(f"lease name must be a non-empty string, got {name!r}")
        if identity is not None and (not isinstance(identity, str) or not identity):
            raise ConfigurationError(f"identity must be a non-empty string, got {identity!r}")
        if timings is None:
            timings = LeaseTimings.of(
                ttl,
                renew_interval,
                renew_deadline,
                retry_interval,
                max_tenure,
                cooldown,
                release_timeout,
            )
        if not 0 <= jitter < 1:
            raise ConfigurationError(f"jitter must be in [0, 1), got {jitter!r}")
        if HOLDER_SEPARATOR in (identity or ""):
            raise ConfigurationError(
                f"identity must not contain {HOLDER_SEPARATOR!r}, got {identity!r}"
            )

        self.backend = backend
        self.name = name
        self.identity = identity or default_identity()
        self.timings = timings
        self.ttl = timings.ttl
        self.renew_interval = timings.renew_interval
        self.renew_deadline = timings.renew_deadline
        self.retry_interval = timings.retry_interval
        self.max_tenure = timings.max_tenure
        self.cooldown = timings.cooldown
        self.release_timeout = timings.release_timeout
        self._clock = clock or SYSTEM_CLOCK
        self._jitter = jitter
        self._rng = random.Random(seed)
        self._fenced = not unsafe_disable_fencing

        self._on_elected: list[OnElected] = [on_elected] if on_elected else []
        self._on_lost: list[OnLost] = [on_lost] if on_lost else []
        self._on_new_leader: list[OnNewLeader] = [on_new_leader] if on_new_leader else []
        self._before_release: list[BeforeRelease] = [before_release] if before_release else []

        self._lock = threading.RLock()
        self._cv = threading.Condition(self._lock)
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._release_on_stop = True
        self._rotate_requested = False
        self._holder = self._new_holder()
        self._leadership: Leadership | None = None
        self._observed_leader: str | None = None
        self._next_renew = 0.0
        self._tenure_end: float | None = None
        self._cooldown_until = 0.0
        self._failures = 0
        self._threads: list[threading.Thread] = []
        self._started = False
        self.stats = ElectorStats()

    # -- public API -----------------------------------------------------------------------
    def subscribe(
        self,
        *,
        on_elected: OnElected | None = None,
        on_lost: OnLost | None = None,
        on_new_leader: OnNewLeader | None = None,
        before_release: BeforeRelease | None = None,
    ) -> None:
        """Add callbacks (for example a listener runner's), in addition to the constructor's."""
        with self._lock:
            if on_elected:
                self._on_elected.append(on_elected)
            if on_lost:
                self._on_lost.append(on_lost)
            if on_new_leader:
                self._on_new_leader.append(on_new_leader)
            if before_release:
                self._before_release.append(before_release)

    @property
    def leadership(self) -> Leadership | None:
        """The current tenure if it is still valid, else ``None``."""
        ld = self._leadership
        return ld if ld is not None and ld.valid() else None

    @property
    def is_leader(self) -> bool:
        return self.leadership is not None

    @property
    def holder(self) -> str:
        """The holder value this elector currently campaigns with (identity + random part)."""
        return self._holder

    @property
    def running(self) -> bool:
        return self._started and not self._stopping.is_set()

    def start(self) -> Elector:
        """Start campaigning in background threads. Idempotent."""
        with self._lock:
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
        with self._lock:
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
        with self._lock:
            if self._leadership is None:  # a follower has nothing to hand over
                return
            self._rotate_requested = True
            self._wake.set()

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
        self._check_deadline()
        if self._stopping.is_set():
            return 0.0
        ld = self._leadership
        if ld is None:
            return self._contend()
        return self._lead(ld)

    # -- states ---------------------------------------------------------------------------
    def _contend(self) -> float:
        now = self._clock.monotonic()
        if now < self._cooldown_until:
            return self._cooldown_until - now
        sent = self._clock.monotonic()
        try:
            result = self.backend.contend(self.name, self._holder, self.ttl)
        except SingletonError as exc:
            return self._backoff("contend", exc)
        self._failures = 0
        if isinstance(result, Lease):
            self._elected(result, sent)
            return 0.0
        self._observe(result.holder if isinstance(result, LeaseState) else None)
        if result is None:  # held a moment ago, free now: try again at once
            return 0.0
        return self._jittered(self.retry_interval)

    def _lead(self, ld: Leadership) -> float:
        now = self._clock.monotonic()
        if self._rotate_requested or (self._tenure_end is not None and now >= self._tenure_end):
            self._rotate_requested = False
            self._handover(ld, "released")
            self._cooldown_until = self._clock.monotonic() + self.cooldown
            return 0.0
        due = min(self._next_renew, self._tenure_end or self._next_renew)
        if now < due:
            return due - now
        self._renew(ld)
        return 0.0

    def _renew(self, ld: Leadership) -> bool:
        sent = self._clock.monotonic()
        try:
            renewed = self.backend.renew(ld.lease, self.ttl)
        except SingletonError as exc:
            self.stats.renew_failures += 1
            retry = min(self.renew_interval, self.retry_interval) / 2
            logger.warning(
                "renew failed, retrying in {:.2f}s: lease={} token={} valid_for={:.2f}s: {}",
                retry,
                self.name,
                ld.token,
                ld.remaining(),
                exc,
            )
            self._next_renew = self._clock.monotonic() + retry
            return False
        latency = self._clock.monotonic() - sent
        self.stats.renewals += 1
        self.stats.renew_seconds_total += latency
        self.stats.last_renew_seconds = latency
        if renewed is None:
            self._demote(ld, "lost")
            return False
        with self._lock:
            if self._leadership is ld and not ld.lost.is_set():
                ld._confirm(renewed, sent + self.renew_deadline)
                self._cv.notify_all()
        logger.debug("renewed: lease={} token={}", self.name, ld.token)
        self._next_renew = sent + self.renew_interval
        return True

    def _elected(self, lease: Lease, sent: float) -> None:
        ld = Leadership(
            lease, self.identity, sent + self.renew_deadline, self._clock, fenced=self._fenced
        )
        with self._lock:
            self._leadership = ld
            self._rotate_requested = False
            self._next_renew = sent + self.renew_interval
            self._tenure_end = (
                None if self.max_tenure is None else sent + self._jittered(self.max_tenure)
            )
            self._cv.notify_all()
        self.stats.elections += 1
        logger.info("elected: lease={} identity={} token={}", self.name, self.identity, lease.token)
        self._observe(lease.holder)
        self._fire(self._on_elected, ld)

    def _handover(self, ld: Leadership, reason: str, release: bool = True) -> None:
        """Planned end of a tenure: drain while still valid, stop acting, then release."""
        drained = True
        if self._before_release and ld.valid():
            self._renew(ld)  # a fresh deadline for the drain
            drained = ld.valid() and self._run_before_release(ld)
        self._demote(ld, reason)
        if not (release and drained):
            if release:
                logger.warning(
                    "not releasing: lease={} token={}: drain did not finish; it will expire",
                    self.name,
                    ld.token,
                )
            return
        try:
            released = self.backend.release(ld.lease)
        except SingletonError as exc:
            logger.warning("release failed (lease will expire): lease={}: {}", self.name, exc)
            return
        logger.info(
            "released: lease={} identity={} token={} ok={}",
            self.name,
            self.identity,
            ld.token,
            released,
        )

    def _run_before_release(self, ld: Leadership) -> bool:
        done = threading.Event()

        def drain() -> None:
            try:
                self._fire(self._before_release, ld)
            finally:
                done.set()

        t = threading.Thread(target=drain, name=f"singleton-drain-{self.name}", daemon=True)
        t.start()
        if not done.wait(self.release_timeout):
            logger.error(
                "before_release did not finish within {}s: lease={} token={}",
                self.release_timeout,
                self.name,
                ld.token,
            )
            return False
        return ld.valid()

    def _demote(self, ld: Leadership, reason: str) -> None:
        with self._lock:
            if self._leadership is not ld or not ld._end(reason):
                return
            self._leadership = None
            self._tenure_end = None
            self.stats.losses += 1
            # A fresh holder value: a lease we may still own on the server (renewed late) is left
            # to expire, so our next tenure always gets a new, larger fencing token.
            self._holder = self._new_holder()
            self._wake.set()
            self._cv.notify_all()
        log = logger.warning if reason in ("expired", "lost") else logger.info
        log(
            "demoted ({}): lease={} identity={} token={}",
            reason,
            self.name,
            self.identity,
            ld.token,
        )
        self._fire(self._on_lost, ld, reason)

    def _check_deadline(self) -> None:
        ld = self._leadership
        if ld is not None and not ld.lost.is_set() and not ld.valid():
            self._demote(ld, "expired")

    def _observe(self, holder: str | None) -> None:
        identity = None if holder is None else identity_of(holder)
        with self._lock:
            if identity == self._observed_leader:
                return
            self._observed_leader = identity
        logger.info("leader is now {}: lease={}", identity, self.name)
        self._fire(self._on_new_leader, identity)

    def _backoff(self, what: str, exc: Exception) -> float:
        self._failures += 1
        delay = min(self.retry_interval * 2 ** (self._failures - 1), max(30.0, self.retry_interval))
        delay = self._jittered(delay)
        logger.warning(
            "{} failed (attempt {}), retrying in {:.2f}s: lease={}: {}",
            what,
            self._failures,
            delay,
            self.name,
            exc,
        )
        return delay

    def _finish(self) -> None:
        ld = self._leadership
        if ld is not None:
            if ld.valid():
                self._handover(ld, "stopped", release=self._release_on_stop)
            else:
                self._demote(ld, "expired")
        logger.info("elector stopped: lease={} identity={}", self.name, self.identity)

    # -- threads --------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while not self._stopping.is_set():
                try:
                    delay = self.tick()
                except Exception:  # a bug must not leave a leader running unrenewed
                    logger.exception("elector step crashed: lease={}", self.name)
                    ld = self._leadership
                    if ld is not None:
                        self._demote(ld, "lost")
                    delay = self._jittered(self.retry_interval)
                if delay <= 0:
                    continue
                self._wait(delay)
        finally:
            self._finish()
            with self._lock:
                self._cv.notify_all()

    def _wait(self, delay: float) -> None:
        self._wake.clear()
        if self._stopping.is_set() or self._rotate_requested:
            return
        if self._leadership is None and self._clock.monotonic() >= self._cooldown_until:
            try:
                self.backend.wait_for_release(self.name, delay, wake=self._wake)
            except SingletonError as exc:
                logger.debug("wait_for_release failed: lease={}: {}", self.name, exc)
                self._wake.wait(delay)
        else:
            self._wake.wait(delay)

    def _watch(self) -> None:
        # Callbacks fire outside the lock: on_lost may join threads that call into the elector.
        while True:
            with self._lock:
                ld = self._leadership
                if ld is None or ld.lost.is_set():
                    if self._stopping.is_set():
                        return
                    self._cv.wait()
                    continue
                left = ld._valid_until - self._clock.monotonic()
                if left > 0 or not ld.fenced:  # unsafe test mode: no deadline to watch
                    self._cv.wait(left if left > 0 else self.renew_interval)
                    continue
            self._check_deadline()

    # -- helpers --------------------------------------------------------------------------
    def _fire(self, callbacks: list[Any], *args: Any) -> None:
        for cb in list(callbacks):
            try:
                cb(*args)
            except Exception:
                logger.exception("callback {!r} failed: lease={}", cb, self.name)

    def _jittered(self, value: float) -> float:
        if self._jitter == 0:
            return value
        return value * (1 + self._rng.uniform(-self._jitter, self._jitter))

    def _new_holder(self) -> str:
        return f"{self.identity}{HOLDER_SEPARATOR}{secrets.token_hex(8)}"

    def __repr__(self) -> str:
        ld = self._leadership
        state = f"leader token={ld.token}" if ld is not None and ld.valid() else "follower"
        return f"<Elector {self.name!r} {self.identity!r} {state}>"
