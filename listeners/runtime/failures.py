"""One tenure's run of consecutive failures: one backoff, one budget, counts that only grow.

Whatever fails in a tenure (claiming its checkpoint, opening the stream, reading it, delivering
to the sink, saving a checkpoint) is one more failure of the same :class:`FailureStreak`: each
waits the next delay of one :class:`~singleton.retry.Backoff` (jittered, doubling up to its cap)
and carries the next attempt number; the last wait is cut to end with ``failure_budget`` seconds
after the streak's first failure, and a failure after that ends the tenure
(:class:`RetriesExhaustedError`).

Failure model: a retry loop must never reset its own budget. A loop retries from the last
acknowledged position, so whatever it does before failing again (opening the stream, reading the
next event) proves nothing. The streak therefore remembers the furthest *stage* that failed
(``start`` < ``open`` < ``read`` < ``deliver`` < ``save``) and ends only when that stage, or a
later one, succeeds: a sink that is down keeps failing at ``deliver`` however well the stream
reads, and a checkpoint store that is down keeps failing at ``save`` however well the sink
takes the events. A state machine without I/O: the tenure waits and logs (and
:class:`DeliveryRetries` for an event its poison handler retries alone).
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING, Literal

from loguru import logger

from singleton.errors import RetriesExhaustedError

if TYPE_CHECKING:
    from listeners.base import ListenerContext
    from singleton.clock import Clock
    from singleton.retry import Backoff

Stage = Literal["start", "open", "read", "deliver", "save"]
_ORDER: dict[Stage, int] = {"start": 0, "open": 1, "read": 2, "deliver": 3, "save": 4}
#: What a tenure does at each stage, for the WARNING of a retry.
DOING: dict[Stage, str] = {
    "start": "starting the tenure",
    "open": "opening the change stream",
    "read": "reading the change stream",
    "deliver": "delivering to the listener",
    "save": "saving the checkpoint",
}


class FailureStreak:
    """Consecutive failures of one tenure (``name`` for messages). :meth:`failed` counts one and
    says how long to wait; :meth:`succeeded` ends the streak when the stage that succeeded is at
    least the furthest one that failed."""

    def __init__(self, name: str, backoff: Backoff, budget: float, clock: Clock) -> None:
        self.name = name
        self.budget = budget
        self._backoff = backoff
        self._clock = clock
        self._since: float | None = None
        self._stage: Stage = "start"

    @property
    def failing(self) -> bool:
        return self._since is not None

    @property
    def attempts(self) -> int:
        """Failures in this streak so far (only grows until the streak ends)."""
        return self._backoff.attempts

    @property
    def stage(self) -> Stage:
        """The furthest stage that failed in this streak."""
        return self._stage

    def spent(self) -> float:
        """Seconds since the streak's first failure (0 when not failing)."""
        return 0.0 if self._since is None else self._clock.monotonic() - self._since

    def failed(self, stage: Stage, error: BaseException) -> float:
        """Count a failure at ``stage``; the seconds to wait before the next attempt (the
        backoff's next delay, cut to what is left of the budget, so the last attempt is made as
        the budget ends). Raises :class:`RetriesExhaustedError` (from ``error``) once the budget
        is spent: no attempt starts after ``failure_budget`` seconds of failing."""
        now = self._clock.monotonic()
        if self._since is None:
            self._since, self._stage = now, stage
        elif _ORDER[stage] > _ORDER[self._stage]:
            self._stage = stage
        delay = self._backoff.next()
        spent = now - self._since
        if spent < self.budget:
            return min(delay, self.budget - spent)
        raise RetriesExhaustedError(
            f"listener {self.name!r}: still failing after {spent:.1f}s and "
            f"{self.attempts} attempts (failure_budget {self.budget:g}s), at {self._stage}: "
            f"{type(error).__name__}: {error}"
        ) from error

    def succeeded(self, stage: Stage) -> bool:
        """``stage`` succeeded: the streak ends (True) if no later stage failed in it."""
        if self._since is None or _ORDER[stage] < _ORDER[self._stage]:
            return False
        self._since, self._stage = None, "start"
        self._backoff.reset()
        return True


class UserErrors:
    """Exceptions raised by a listener's own code (``handle_batch``, ``flush``, a transform):
    each logged at ERROR with its traceback once per tenure and distinct error (its type and
    the line that raised it), so a listener failing a thousand times says where once."""

    def __init__(self, listener: str) -> None:
        self._listener = listener
        self._seen: set[tuple[str, str, int]] = set()

    def report(self, error: BaseException, where: str) -> bool:
        """Log ``error`` (raised by ``where``) unless it was logged already; True if logged."""
        frames = traceback.extract_tb(error.__traceback__)
        last = frames[-1] if frames else None
        key = (
            type(error).__qualname__,
            last.filename if last is not None else "",
            (last.lineno or 0) if last is not None else 0,
        )
        if key in self._seen:
            return False
        self._seen.add(key)
        logger.opt(exception=error).error(
            "{} raised {}: {} (traceback logged once per tenure): listener={}",
            where,
            type(error).__name__,
            error,
            self._listener,
        )
        return True


class DeliveryRetries:
    """The tenure's side of its poison handler (:class:`listeners.deadletters.Retries`): an
    event that failed alone is one more failure of the tenure's ``streak`` (at ``deliver``),
    waited out with ``pause``; a proven poison event is delivery getting past what failed."""

    def __init__(
        self, streak: FailureStreak, errors: UserErrors, pause: Callable[[float], None]
    ) -> None:
        self._streak, self._errors, self._pause = streak, errors, pause

    def retry(self, error: Exception, what: str, ctx: ListenerContext) -> None:
        delay = self._streak.failed("deliver", error)
        logger.warning(
            "{} (attempt {}, {:.1f}s of failure_budget {:g}s), retrying it alone in {:.2f}s: "
            "listener={} token={}: {!r}",
            what,
            self._streak.attempts,
            self._streak.spent(),
            self._streak.budget,
            delay,
            self._streak.name,
            ctx.token,
            error,
        )
        self._pause(delay)

    def progressed(self) -> None:
        self._streak.succeeded("deliver")

    def raised(self, error: Exception, where: str) -> None:
        self._errors.report(error, where)
