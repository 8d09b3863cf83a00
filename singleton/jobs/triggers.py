"""When a leader-only job fires: its trigger, built once from a ``[[jobs]]`` table's ``every`` or
``cron``, and the walk over fire times that the scheduler, a new tenure and ``singleton status``
share, so that all three agree on the next fire time.

Fire times are wall-clock UTC instants by nature; the claims that make each run once store them
in whole milliseconds (:func:`epoch_ms`, :func:`from_ms`). Every replica computes the same fire
times from the same trigger: ``every`` counts from :data:`ANCHOR`, not from when a replica started.
"""

from __future__ import annotations

from datetime import datetime, timezone

from apscheduler.triggers.base import BaseTrigger
from apscheduler.triggers.cron import CronTrigger
from apscheduler.triggers.interval import IntervalTrigger

from singleton.errors import ConfigurationError

#: ``every`` triggers count intervals from this instant, so every replica computes the same
#: fire times (``every = 1.0`` fires on whole seconds, ``every = 60`` on whole minutes).
ANCHOR = datetime(2000, 1, 1, tzinfo=timezone.utc)


def make_trigger(every: float | None = None, cron: str | None = None) -> BaseTrigger:
    """The trigger of a ``[[jobs]]`` table: exactly one of ``every`` (seconds, counted from
    :data:`ANCHOR`) or ``cron`` (a 5-field crontab, UTC). Raises naming the value."""
    if (every is None) == (cron is None):
        raise ConfigurationError(
            f"a job needs exactly one of every (seconds) or cron (5 fields), got every={every!r}"
            f" cron={cron!r}"
        )
    if every is not None:
        if isinstance(every, bool) or not isinstance(every, (int, float)) or not every > 0:
            raise ConfigurationError(f"every must be a positive number of seconds, got {every!r}")
        return IntervalTrigger(seconds=float(every), start_date=ANCHOR, timezone=timezone.utc)
    if not isinstance(cron, str) or len(cron.split()) != 5:
        raise ConfigurationError(f"cron must be a crontab of 5 fields, got {cron!r}")
    minute, hour, day, month, weekdays = cron.split()
    try:
        return CronTrigger(
            minute=minute,
            hour=hour,
            day=day,
            month=month,
            day_of_week=crontab_weekdays(weekdays),
            timezone=timezone.utc,
        )
    except ValueError as exc:
        raise ConfigurationError(f"cron {cron!r} is not a valid crontab: {exc}") from None


_WEEKDAYS = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")


def crontab_weekdays(text: str) -> str:
    """A crontab day-of-week field (0 or 7 = Sunday) as names for APScheduler 3, whose numbers
    start at Monday (its issue 286): ``"1-5"`` -> ``"mon,tue,wed,thu,fri"``."""
    if text in ("*", "?"):
        return "*"
    days: set[int] = set()
    for part in text.split(","):
        span, _, step_text = part.partition("/")
        if span == "*":
            first, last = 0, 6
        else:
            low, _, high = span.partition("-")
            first = _weekday(low, text)
            last = _weekday(high, text) if high else (6 if step_text else first)
            if high and last == 0:
                last = 7  # "5-7" / "fri-sun": through Sunday
        step = int(step_text) if step_text.isdigit() and int(step_text) > 0 else None
        if (step_text and step is None) or first > last:
            raise ValueError(f"bad day-of-week {part!r} in {text!r}")
        days.update(d % 7 for d in range(first, last + 1, step or 1))
    return ",".join(_WEEKDAYS[d] for d in sorted(days))


def _weekday(token: str, text: str) -> int:
    token = token.strip().lower()
    if token.isdigit() and int(token) <= 7:
        return int(token)
    if token[:3] in _WEEKDAYS and len(token) == 3:
        return _WEEKDAYS.index(token)
    raise ValueError(f"bad day of week {token!r} in {text!r}")


def next_fire_after(trigger: BaseTrigger, last: datetime | None, now: datetime) -> datetime | None:
    """The first fire time after ``last`` (the latest claimed), or the next one from ``now``
    when nothing was claimed yet. Where a new tenure resumes a job."""
    if last is None:
        found: datetime | None = trigger.get_next_fire_time(None, now)
    else:
        # now=last: the search starts just after the latest claim whatever this host's clock
        # says, so a replica whose clock is behind still never resumes at or before it.
        found = trigger.get_next_fire_time(last, last)
    return None if found is None else found.astimezone(timezone.utc)


def due_fire_times(
    trigger: BaseTrigger, first: datetime | None, now: datetime
) -> tuple[list[datetime], datetime | None]:
    """``first`` and the fire times after it, up to ``now`` included; and the one after them
    (``None``: the trigger has no more)."""
    due: list[datetime] = []
    nxt = first
    while nxt is not None and nxt <= now:
        due.append(nxt)
        nxt = trigger.get_next_fire_time(nxt, now)
    return due, nxt


def epoch_ms(when: datetime) -> int:
    return round(when.timestamp() * 1000)


def from_ms(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, timezone.utc)
