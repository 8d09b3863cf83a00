"""One lease name's election as a state machine: every decision, and no I/O, thread or sleep.

Failure model: this process may pause at any point (GC, SIGSTOP, a blocked socket), and the
lease store may stop answering. Safety therefore never depends on a call returning: a tenure is
valid only until ``renew_deadline`` seconds after the last renewal that was *sent* and then
confirmed, measured on the injected monotonic clock. Because ``renew_deadline < ttl`` and the
server starts its ``ttl`` no earlier than we sent the request, the local tenure ends before the
store can grant the lease to anyone else (clock *rates* are assumed to agree within
``(ttl - renew_deadline) / ttl``; offsets do not matter). A failed call is retried (contends with
a capped :class:`~singleton.retry.Backoff`), logged (at ERROR when retrying cannot fix it) and
kept in :attr:`Election.health`.

The protocol: :meth:`Election.tick` returns the action due now. A :class:`Wait` ends the step;
any other action is the driver's to perform (it alone calls the backend), and the driver reports
the result with the matching method (:meth:`~Election.contended`, :meth:`~Election.renewed`,
:meth:`~Election.drained`, :meth:`~Election.released`), which returns the next action: perform
that at once, until a :class:`Wait`. So a thread driver and an asyncio driver run the very same
rules; only the waiting (and ``before_release``'s bound) differ.
"""

from __future__ import annotations

import secrets
import threading
from collections.abc import Callable
from dataclasses import dataclass

from loguru import logger

from singleton.election.actions import Action, Contend, Contended, Drain, Release, Renew, Wait
from singleton.election.callbacks import Callbacks
from singleton.election.health import ElectorStats, StoreHealth
from singleton.election.leadership import Leadership
from singleton.election.settings import EXPIRY_MARGIN, ElectorSettings
from singleton.errors import ConfigurationError, SingletonError
from singleton.lease.contract import HOLDER_SEPARATOR, Lease, identity_of
from singleton.stdlog import seconds


@dataclass(frozen=True)
class _Handover:
    """A planned end of a tenure in progress: drain, demote with ``reason``, then release."""

    leadership: Leadership
    reason: str
    release: bool
    cooldown: bool  # sit out ``timings.cooldown`` once done (a rotation, not a stop)


class Election:
    """The rules of one lease's campaign, as decisions: contend, lead, renew, hand over, demote.

    Thread-safe where a driver needs it: the watchdog (:meth:`check_deadline`), :meth:`rotate`,
    :meth:`resign` and :meth:`finish` may run while another thread is inside a step. ``changed``
    is called, outside every lock, whenever a tenure starts, is renewed or ends, so that the
    driver re-reads :attr:`tenure` and wakes its waits. ``store`` names the backend in logs.
    """

    def __init__(
        self, name: str, settings: ElectorSettings, *, store: str, changed: Callable[[], None]
    ) -> None:
        self.name = name
        self.identity = settings.identity
        self.timings = settings.timings
        self.store = store
        self.stats = ElectorStats()
        self.health = StoreHealth(self.stats, f"lease={name} backend={store}")
        self.callbacks = Callbacks(name)
        self.callbacks.add(
            on_elected=settings.on_elected,
            on_lost=settings.on_lost,
            on_new_leader=settings.on_new_leader,
            before_release=settings.before_release,
        )
        self._clock = settings.clock
        self._backoff = settings.backoff()
        self._fenced = settings.fenced
        self._gate = settings.gate
        self._changed = changed
        self._lock = threading.Lock()
        self._holder = self._new_holder()
        self._leadership: Leadership | None = None
        self._observed: str | None = None
        self._next_renew = 0.0
        self._tenure_end: float | None = None
        self._cooldown_until = 0.0
        self._rotate = False
        # The step in flight (touched only by the thread that steps): the action handed out and
        # not yet reported, and the handover it belongs to, if any.
        self._pending: Action | None = None
        self._handover: _Handover | None = None

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
    def tick(self) -> Action:
        """The action due now (see the module's protocol)."""
        self.check_deadline()
        ld = self._leadership
        return self._hand_out(self._follow() if ld is None else self._lead(ld))

    def contended(self, action: Contend, result: Contended) -> Action:
        """``action``'s result: lead, follow the holder, or back off."""
        self._settle(action)
        try:
            return self._hand_out(self._after_contend(result))
        finally:
            if self._gate is not None:  # after _elected: a won lease already counts as held
                self._gate.done(self.name)

    def renewed(
        self, action: Renew, answer: Lease | SingletonError | None, sent_at: float
    ) -> Action:
        """``action``'s answer, the call sent at monotonic ``sent_at``: a later deadline (counted
        from ``sent_at``), a loss, or a retry."""
        in_handover = self._settle(action) and self._handover is not None
        self._apply_renewal(action.leadership, answer, sent_at)
        if not in_handover:
            return Wait(0.0)
        if action.leadership.valid():
            return self._hand_out(Drain(action.leadership, self.timings.release_timeout))
        return self._hand_out(self._end_handover())

    def drained(self, action: Drain, finished: bool) -> Action:
        """The drain returned (``finished``) or its bound passed: stop acting, then release."""
        self._settle(action)
        if not finished:
            logger.warning(
                "before_release did not finish within {}, releasing anyway (the successor"
                " replays what was not acknowledged): lease={} token={}",
                seconds(action.timeout),
                self.name,
                action.leadership.token,
            )
        return self._hand_out(self._end_handover())

    def released(self, action: Release, answer: bool | SingletonError) -> Action:
        """The release's answer; a failure only means the lease will expire instead."""
        in_step = self._settle(action)  # else a resign()'s release, on the resigning thread
        ld = action.leadership
        if isinstance(answer, SingletonError):
            log = logger.warning if self.health.failed(answer) else logger.error
            log(
                "release failed (lease will expire): lease={} backend={}: {}",
                self.name,
                self.store,
                self.health.last_error,
            )
            self.callbacks.released(ld, False)
        else:
            self.health.answered()
            logger.info(
                "released: lease={} identity={} token={} ok={}",
                self.name,
                self.identity,
                ld.token,
                answer,
            )
            self.callbacks.released(ld, answer)
        return self._handover_done() if in_step else Wait(0.0)

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

    def crashed(self, exc: BaseException) -> Wait:
        """A step raised (a bug): a leader must not go on unrenewed, so demote; then retry."""
        self.health.failed(exc)
        if isinstance(self._pending, Contend) and self._gate is not None:
            self._gate.done(self.name)  # the contend the gate admitted is over
        self._pending = None
        self._handover = None  # abandoned: its lease, if any, is left to expire
        ld = self._leadership
        if ld is not None:
            self._demote(ld, "lost")
        return self._waiting(self._backoff.jittered(self.timings.retry_interval))

    def resign(
        self, cooldown: float, reason: str = "failed", leadership: Leadership | None = None
    ) -> Release | None:
        """End the current tenure now because its work failed for good, and sit out
        ``cooldown`` seconds before campaigning again.

        The work has already stopped, so there is no drain: the tenure is demoted with
        ``reason`` (``on_lost`` fires, on the caller's thread) and the :class:`Release` to
        perform at once is returned (report it with :meth:`released`), so that another replica
        takes over without waiting for expiry. ``None``, changing nothing, on a follower or if
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
                return None
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
        return Release(ld)

    def finish(self, release: bool) -> Action:
        """The end of the campaign: hand over a valid tenure (releasing it if ``release``), or
        end one past its deadline; the first action of that, or ``Wait(0)`` on a follower."""
        ld = self._leadership
        if ld is None:
            return Wait(0.0)
        if ld.valid():
            return self._hand_out(self._hand_over(ld, "stopped", release=release, cooldown=False))
        self._demote(ld, "expired")
        # The store may keep it a little longer than our deadline: give it back.
        return self._hand_out(Release(ld)) if release else Wait(0.0)

    # -- states -------------------------------------------------------------------------------
    def _follow(self) -> Action:
        now = self._clock.monotonic()
        if now < self._cooldown_until:
            return self._waiting(self._cooldown_until - now)
        if self._gate is not None:  # a balancer may ask us to leave this lease to others
            wait = self._gate.gate(self.name)
            if wait > 0:
                return self._waiting(wait)
        return Contend(self.name, self._holder, self.timings.ttl)

    def _after_contend(self, result: Contended) -> Wait:
        if result.error is not None:
            self.stats.contend_failures += 1
            delay = self._backoff.next()
            transient = self.health.failed(result.error)
            (logger.warning if transient else logger.error)(
                "contend failed{} (attempt {}), retrying in {:.2f}s: lease={} backend={}: {}",
                "" if transient else " and retrying will not help: fix the credentials or config",
                self._backoff.attempts,
                delay,
                self.name,
                self.store,
                self.health.last_error,
            )
            return self._waiting(delay)
        self._backoff.reset()
        self.health.answered()
        if result.granted is not None:
            self._elected(result.granted, result.sent_at)
            return Wait(0.0)
        held = result.held_by
        self._observe(None if held is None else held.holder)
        if held is None:  # held a moment ago, free now: try again at once
            return Wait(0.0)
        # Contend again when the lease runs out by the store's own clock (the holder's last
        # renewal decides it; a release wakes us sooner), or after retry_interval if the holder
        # keeps renewing. Counted from now, after the answer came back: never early, by at most
        # the return trip late.
        retry = self._backoff.jittered(self.timings.retry_interval)
        return self._waiting(
            min(retry, held.ttl_remaining + EXPIRY_MARGIN), since=result.release_mark
        )

    def _lead(self, ld: Leadership) -> Action:
        now = self._clock.monotonic()
        if self._rotate or (self._tenure_end is not None and now >= self._tenure_end):
            self._rotate = False
            return self._hand_over(ld, "released", release=True, cooldown=True)
        due = min(self._next_renew, self._tenure_end or self._next_renew)
        if now < due:
            return self._waiting(due - now)
        return Renew(ld, self.timings.ttl)

    def _apply_renewal(
        self, ld: Leadership, answer: Lease | SingletonError | None, sent: float
    ) -> None:
        t = self.timings
        if isinstance(answer, SingletonError):
            self.stats.renew_failures += 1
            retry = min(t.renew_interval, t.retry_interval) / 2
            log = logger.warning if self.health.failed(answer) else logger.error
            log(
                "renew failed, retrying in {:.2f}s: lease={} token={} valid_for={:.2f}s"
                " backend={}: {}",
                retry,
                self.name,
                ld.token,
                ld.remaining(),
                self.store,
                self.health.last_error,
            )
            self._next_renew = self._clock.monotonic() + retry
            return
        self.health.answered()
        self.stats.renewed(self._clock.monotonic() - sent)
        if answer is None:
            self._demote(ld, "lost")
            return
        with self._lock:
            confirmed = self._leadership is ld and not ld.lost.is_set()
            if confirmed:
                ld._confirm(answer, sent + t.renew_deadline)
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
        self.callbacks.elected(ld)

    # -- a planned handover: drain while still valid, stop acting, then release ---------------
    def _hand_over(self, ld: Leadership, reason: str, *, release: bool, cooldown: bool) -> Action:
        """Start a planned end of ``ld``: a renewal for a fresh deadline if anyone drains, then
        the drain, the demotion, the release.

        The drain is bounded (``release_timeout``) and the lease is released whether or not it
        finished: a planned handover never leaves its lease to expire (only ``release=False``
        does). The demotion comes first, so work still running after the bound fails its next
        ``check()``, its checkpoint writes are refused once the successor claims, and the
        successor replays what was not acknowledged (the sink's versions make that harmless).
        """
        self._handover = _Handover(ld, reason, release, cooldown)
        if self.callbacks.drains and ld.valid():
            return Renew(ld, self.timings.ttl)
        return self._end_handover()

    def _end_handover(self) -> Action:
        handover = self._handover
        if handover is None:
            return Wait(0.0)
        self._demote(handover.leadership, handover.reason)
        if handover.release:
            return Release(handover.leadership)
        return self._handover_done()

    def _handover_done(self) -> Wait:
        handover, self._handover = self._handover, None
        if handover is not None and handover.cooldown:
            self._cooldown_until = self._clock.monotonic() + self.timings.cooldown
        return Wait(0.0)

    # -- bookkeeping --------------------------------------------------------------------------
    def _hand_out(self, action: Action) -> Action:
        self._pending = None if isinstance(action, Wait) else action
        return action

    def _settle(self, action: Action) -> bool:
        """Whether ``action`` is the step's own (else it was performed outside the step)."""
        if action is not self._pending:
            return False
        self._pending = None
        return True

    def _waiting(self, seconds: float, since: int | None = None) -> Wait:
        return Wait(seconds, for_release=self.idle(), since=since)

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
        self.callbacks.lost(ld, reason)

    def _observe(self, holder: str | None) -> None:
        identity = None if holder is None else identity_of(holder)
        with self._lock:
            if identity == self._observed:
                return
            self._observed = identity
        logger.info("leader is now {}: lease={}", identity, self.name)
        self.callbacks.new_leader(identity)

    def _new_holder(self) -> str:
        return f"{self.identity}{HOLDER_SEPARATOR}{secrets.token_hex(8)}"
