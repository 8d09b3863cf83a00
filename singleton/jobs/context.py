"""What a leader-only job sees and reports: the context each call gets, the status each replica
keeps of each job.

The context is the job's whole view of its tenure: the fire time it stands for and the fencing
token to carry on every side effect. The status is what ``/status`` and ``/metrics`` read.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

from singleton.election.leadership import Leadership

# Until singleton/service/drill/jobs.py imports it from singleton.jobs.triggers, its home.
from singleton.jobs.triggers import epoch_ms as epoch_ms


@dataclass(frozen=True)
class JobContext:
    """Passed to every call of a job: ``function(ctx)``.

    ``fire_time`` is the scheduled time (tz-aware UTC), not the time the call started; a call
    that runs late (after a takeover) still sees the fire time it stands for. ``token`` is the
    fencing token of the tenure that claimed that fire time: carry it on every side effect.
    """

    name: str
    token: int
    fire_time: datetime
    leadership: Leadership

    def check(self) -> None:
        """Raise :class:`~singleton.errors.LeaseLostError` once the job's lease is in doubt.
        Call before every side effect."""
        self.leadership.check()

    def valid(self) -> bool:
        return self.leadership.valid()


@dataclass
class JobStatus:
    """One job in one replica (what ``/status`` and ``/metrics`` read)."""

    name: str
    leader: bool = False
    token: int | None = None
    #: The latest fire time this replica ran (or tried to), UTC.
    last_fire: datetime | None = None
    #: When APScheduler will fire it next here (``None`` while a follower: the job is paused).
    next_fire: datetime | None = None
    #: ``"ok"``, ``"error: <Type>: <message>"``, ``"lost"`` or ``"missed"``.
    last_outcome: str | None = None
    runs: int = 0
    failures: int = 0
    missed: int = 0
    #: Seconds between the fire time and the start of the latest call.
    lateness_seconds: float | None = None
    consecutive_failures: int = 0
    #: Why the latest tenure failed (``max_failures`` calls in a row raised), until a call runs.
    failure: str | None = None
    cooldown_until: float | None = None

    @property
    def ready(self) -> bool:
        return self.failure is None

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        for key in ("last_fire", "next_fire"):
            value = out[key]
            out[key] = None if value is None else value.isoformat()
        out["ready"] = self.ready
        return out
