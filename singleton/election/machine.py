"""One lease name's election as a state machine: every decision, and no thread, no sleep.

Failure model: this process may pause at any point (GC, SIGSTOP, a blocked socket), and the
lease store may stop answering. Safety therefore never depends on a call returning: a tenure is
valid only until ``renew_deadline`` seconds after the last renewal that was *sent* and then
confirmed, measured on the injected monotonic clock. Because ``renew_deadline < ttl`` and the
server starts its ``ttl`` no earlier than we sent the request, the local tenure ends before the
store can grant the lease to anyone else (clock *rates* are assumed to agree within
``(ttl - renew_deadline) / ttl``; offsets do not matter).

:class:`Election` decides (contend, lead, renew, hand over, demote) from its state, the backend's
answers and the clock; :meth:`Election.tick` takes one step and says how long until the next is
due. Running it is a driver's job: :class:`singleton.election.elector.Elector` runs it on an elector
thread, with a watchdog thread that calls :meth:`Election.check_deadline` at the deadline even
while the elector thread hangs inside a backend call. The one wait a step needs, the drain
bounded by ``release_timeout``, is the driver's too (``run_bounded``), so an asyncio driver
would reuse these rules rather than copy them.

Never stuck, never silent: a failed call to the store is retried (contending with a capped
:class:`~singleton.retry.Backoff`), logged (at ERROR, naming the store, when retrying cannot fix
it) and kept in :attr:`Election.health` (see :mod:`singleton.election.health`). When the work under
a lease fails for good, :meth:`Election.resign` ends the tenure at once and releases the lease.
"""

from __future__ import annotations

import secrets
import threading
from collections.abc import Callable

from loguru import logger

from singleton.clock import Clock
from singleton.election.callbacks import Callbacks, RunBounded
from singleton.election.gate import Gate
from singleton.election.health import ElectorStats, StoreHealth
from singleton.election.leadership import Leadership
from singleton.errors import ConfigurationError, SingletonError
from singleton.lease.contract import HOLDER_SEPARATOR, Lease, LeaseBackend, LeaseState, identity_of
from singleton.lease.timings import LeaseTimings
from singleton.retry import Backoff


class Election:
    """Campaign for ``name`` on ``backend``; while elected, renew; on any doubt, step down.

    Thread-safe: the driver's watchdog and ``stop()`` may demote while a step runs. ``changed``
    is called, outside every lock, whenever a tenure starts, is renewed or ends, so that the
    driver re-reads :attr:`tenure` and wakes its waits.
    """

    def __init__(
        self,
        backend: LeaseBackend,
        name: str,
        identity: str,
        timings: LeaseTimings,
        *,
        clock: Clock,
        backoff: Backoff,
        callbacks: Callbacks,
        run_bounded: RunBounded,
        changed: Callable[[], None],
        fenced: bool = True,
        gate: Gate | None = None,
    ) -> None:
        self.backend = backend
        self.name = name
        self.identity = identity
        self.timings = timings
        self.stats = ElectorStats()
        self.health = StoreHealth(self.stats, f"lease={name} backend={backend.describe()}")
        self._clock = clock
        self._backoff = backoff
        self._callbacks = callbacks
        self._run_bounded = run_bounded
        self._changed = changed
        self._fenced = fenced
        self._gate = gate
        self._lock = threading.Lock()
        self._holder = self._new_holder()
        self._leadership: Leadership | None = None
        self._observed: str | None = None
        self._next_renew = 0.0
        self._tenure_end: float | None = None
        self._cooldown_until = 0.0
        self._rotate = False
        #: After a step whose contend found the lease held: the backend's release mark read
        #: before that contend, for the driver's wait (``wait_for_release(since=...)``).
        self.release_mark: int | None = None

    # -- what a driver reads ----------------------------------------------------------------
    @property
    def holder(self) -> str:
        """The holder value campaigned with now (identity + a random part, new every tenure)."""
        return self._holder

    @property
    def tenure(self) -> Leadership | None:
        """The current tenure, even past its deadline until it is demoted."""
        return self._leadership

    @property
    def leadership(self) -> Leadership | None:
        """The current tenure if it is still valid, else ``None``."""
        ld = self._leadership
        return ld if ld is not None and ld.valid() else None

    @property
    def rotate_pending(self) -> bool:
        return self._rotate

    def idle(self) -> bool:
        """Following, and not sitting out a cooldown: a release is the only news to wait for."""
        return self._leadership is None and self._clock.monotonic() >= self._cooldown_until

    def cooling(self) -> bool:
        """Sitting out a cooldown (after a handover, or a tenure whose work failed)."""
        return self._clock.monotonic() < self._cooldown_until

    # -- steps --------------------------------------------------------------------------------
    def tick(self) -> float:
        """Take the step that is due; return the seconds until the next one."""
        self.check_deadline()
        self.release_mark = None
        ld = self._leadership
        return self._contend() if ld is None else self._lead(ld)

    def rotate(self) -> bool:
        """Hand over at the next step, as if ``max_tenure`` had passed; False on a follower."""
        with self._lock:
            if self._leadership is None:  # nothing to hand over; its next tenure stays whole
                return False
            self._rotate = True
        return True

    def check_deadline(self) -> None:
        """Demote a tenure whose renew deadline has passed (the watchdog calls this on time)."""
        ld = self._leadership
        if ld is not None and not ld.lost.is_set() and not ld.valid():
            self._demote(ld, "expired")

    def crashed(self, exc: BaseException) -> float:
        """A step raised (a bug): a leader must not go on unrenewed, so demote; then retry."""
        self.health.failed(exc)
        ld = self._leadership
        if ld is not None:
            self._demote(ld, "lost")
        return self._backoff.jittered(self.timings.retry_interval)

    def resign(
        self, cooldown: float, reason: str = "failed", leadership: Leadership | None = None
    ) -> bool:
        """End the current tenure now because its work failed for good, and sit out
        ``cooldown`` seconds before campaigning again.

        The work has already stopped, so there is no drain (``before_release`` is not called):
        the tenure is demoted with ``reason`` (``on_lost`` fires, on the caller's thread), then
        the lease is released (conditional on holder and token, as always) so that another
        replica takes over at once. Returns ``False`` and changes nothing on a follower, or if
        ``leadership`` is given and is not the current tenure (a late call about an older one).
        """
        if isinstance(cooldown, bool) or not isinstance(cooldown, (int, float)):
            raise ConfigurationError(f"cooldown must be a number of seconds, got {cooldown!r}")
        if not 0 <= cooldown < float("inf"):
            raise ConfigurationError(f"cooldown must be finite and >= 0, got {cooldown!r}")
        if not isinstance(reason, str) or not reason:
            raise ConfigurationError(f"reason must be a non-empty string, got {reason!r}")
        with self._lock:
            ld = self._leadership
            if ld is None or (leadership is not None and leadership is not ld):
                return False
            self._rotate = False
            # Set before the demotion is visible, so the elector thread cannot contend first.
            self._cooldown_until = max(self._cooldown_until, self._clock.monotonic() + cooldown)
        self.stats.resignations += 1
        logger.warning(
            "resigning ({}): lease={} identity={} token={}; not contending for {:.2f}s",
            reason,
            self.name,
            self.identity,
            ld.token,
            cooldown,
        )
        self._demote(ld, reason)
        self._release(ld)
        return True

    def finish(self, release: bool) -> None:
        """The end of the campaign: hand over a valid tenure (releasing it if ``release``)."""
        ld = self._leadership
        if ld is None:
            return
        if ld.valid():
            self._handover(ld, "stopped", release=release)
            return
        self._demote(ld, "expired")
        if release:  # the store may keep it a little longer than our deadline: give it back
            self._release(ld)

    # -- states -------------------------------------------------------------------------------
    def _contend(self) -> float:
        now = self._clock.monotonic()
        if now < self._cooldown_until:
            return self._cooldown_until - now
        if self._gate is not None:  # a balancer may ask us to leave this lease to others
            wait = self._gate.gate(self.name)
            if wait > 0:
                return wait
        try:
            return self._attempt()
        finally:
            if self._gate is not None:  # after _elected: a won lease already counts as held
                self._gate.done(self.name)

    def _attempt(self) -> float:
        # Read before the round trip: a release applied after the server refused us is
        # observed after this read, so the wait that follows returns even if it came first.
        mark = self.backend.release_mark(self.name)
        sent = self._clock.monotonic()
        try:
            result = self.backend.contend(self.name, self._holder, self.timings.ttl)
        except SingletonError as exc:
            self.stats.contend_failures += 1
            delay = self._backoff.next()
            transient = self.health.failed(exc)
            (logger.warning if transient else logger.error)(
                "contend failed{} (attempt {}), retrying in {:.2f}s: lease={} backend={}: {}",
                "" if transient else " and retrying will not help: fix the credentials or config",
                self._backoff.attempts,
                delay,
                self.name,
                self.backend.describe(),
                self.health.last_error,
            )
            return delay
        self._backoff.reset()
        self.health.answered()
        if isinstance(result, Lease):
            self._elected(result, sent)
            return 0.0
        self._observe(result.holder if isinstance(result, LeaseState) else None)
        if result is None:  # held a moment ago, free now: try again at once
            return 0.0
        self.release_mark = mark
        return self._backoff.jittered(self.timings.retry_interval)

    def _lead(self, ld: Leadership) -> float:
        now = self._clock.monotonic()
        if self._rotate or (self._tenure_end is not None and now >= self._tenure_end):
            self._rotate = False
            self._handover(ld, "released")
            self._cooldown_until = self._clock.monotonic() + self.timings.cooldown
            return 0.0
        due = min(self._next_renew, self._tenure_end or self._next_renew)
        if now < due:
            return due - now
        self._renew(ld)
        return 0.0

    def _renew(self, ld: Leadership) -> None:
        t = self.timings
        sent = self._clock.monotonic()
        try:
            renewed = self.backend.renew(ld.lease, t.ttl)
        except SingletonError as exc:
            self.stats.renew_failures += 1
            retry = min(t.renew_interval, t.retry_interval) / 2
            log = logger.warning if self.health.failed(exc) else logger.error
            log(
                "renew failed, retrying in {:.2f}s: lease={} token={} valid_for={:.2f}s"
                " backend={}: {}",
                retry,
                self.name,
                ld.token,
                ld.remaining(),
                self.backend.describe(),
                self.health.last_error,
            )
            self._next_renew = self._clock.monotonic() + retry
            return
        self.health.answered()
        self.stats.renewed(self._clock.monotonic() - sent)
        if renewed is None:
            self._demote(ld, "lost")
            return
        with self._lock:
            confirmed = self._leadership is ld and not ld.lost.is_set()
            if confirmed:
                ld._confirm(renewed, sent + t.renew_deadline)
        if confirmed:
            self._changed()
        logger.debug("renewed: lease={} token={}", self.name, ld.token)
        self._next_renew = sent + t.renew_interval

    def _elected(self, lease: Lease, sent: float) -> None:
        t = self.timings
        ld = Leadership(
            lease, self.identity, sent + t.renew_deadline, self._clock, fenced=self._fenced
        )
        with self._lock:
            self._leadership = ld
            self._rotate = False
            self._next_renew = sent + t.renew_interval
            self._tenure_end = (
                None if t.max_tenure is None else sent + self._backoff.jittered(t.max_tenure)
            )
        self._changed()
        self.stats.elections += 1
        logger.info("elected: lease={} identity={} token={}", self.name, self.identity, lease.token)
        self._observe(lease.holder)
        self._callbacks.elected(ld)

    def _handover(self, ld: Leadership, reason: str, release: bool = True) -> None:
        """Planned end of a tenure: drain while still valid, stop acting, then release.

        The drain is bounded (``release_timeout``) and the lease is released whether or not it
        finished: a planned handover never leaves its lease to expire (only ``release=False``
        does). The demotion comes first, so work still running after the bound fails its next
        ``check()``, its checkpoint writes are refused once the successor claims, and the
        successor replays what was not acknowledged (the sink's versions make that harmless).
        """
        if self._callbacks.drains and ld.valid():
            self._renew(ld)  # a fresh deadline for the drain
            if ld.valid():
                self._drain(ld)
        self._demote(ld, reason)
        if release:
            self._release(ld)

    def _release(self, ld: Leadership) -> None:
        """Release an ended tenure's lease; a failure only means it will expire instead."""
        try:
            released = self.backend.release(ld.lease)
        except SingletonError as exc:
            log = logger.warning if self.health.failed(exc) else logger.error
            log(
                "release failed (lease will expire): lease={} backend={}: {}",
                self.name,
                self.backend.describe(),
                self.health.last_error,
            )
            self._callbacks.released(ld, False)
            return
        self.health.answered()
        logger.info(
            "released: lease={} identity={} token={} ok={}",
            self.name,
            self.identity,
            ld.token,
            released,
        )
        self._callbacks.released(ld, released)

    def _drain(self, ld: Leadership) -> bool:
        timeout = self.timings.release_timeout
        if not self._run_bounded(lambda: self._callbacks.before_release(ld), timeout):
            logger.warning(
                "before_release did not finish within {}s, releasing anyway (the successor"
                " replays what was not acknowledged): lease={} token={}",
                timeout,
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
        self._changed()
        log = logger.warning if reason in ("expired", "lost", "failed") else logger.info
        log(
            "demoted ({}): lease={} identity={} token={}",
            reason,
            self.name,
            self.identity,
            ld.token,
        )
        self._callbacks.lost(ld, reason)

    def _observe(self, holder: str | None) -> None:
        identity = None if holder is None else identity_of(holder)
        with self._lock:
            if identity == self._observed:
                return
            self._observed = identity
        logger.info("leader is now {}: lease={}", identity, self.name)
        self._callbacks.new_leader(identity)

    def _new_holder(self) -> str:
        return f"{self.identity}{HOLDER_SEPARATOR}{secrets.token_hex(8)}"
