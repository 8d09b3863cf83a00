"""Lease timings: one validated value, used by the Elector and by the service's configuration.

The rule (after client-go's ``NewLeaderElector``): ``ttl > renew_deadline > 1.2 * renew_interval
> 0``. ``renew_deadline < ttl`` is what makes "stop before expiry" hold: a leader that has not
confirmed a renewal within ``renew_deadline`` of sending it stops acting before the store can
grant the lease to anyone else. ``renew_deadline > 1.2 * renew_interval`` leaves room for at least
one more renewal attempt before the deadline. Every value is finite.

These are the library's bounds, which tests and embedders may push as low as they like; the
service's configuration (:mod:`singleton.service.config`) adds bounds of its own (a ttl from
1 s to 1 hour, renewals at most 20 a second...) on top.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from singleton.errors import ConfigurationError

#: Largest ttl accepted (about 11.5 days): beyond it, millisecond arithmetic in the stores and
#: "a crashed leader is replaced within ttl" stop meaning anything useful.
MAX_TTL = 1e6


def _seconds(name: str, value: object) -> float:
    """``value`` as seconds; never NaN nor infinite (an infinite interval is a wait that never
    ends, an infinite ``max_tenure`` overflows the deadline arithmetic: unset it instead)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigurationError(f"{name} must be a finite number of seconds, got {value!r}")
    return float(value)


def _show(name: str, value: float, derived: str | None) -> str:
    shown = f"{value:.6g}"
    return f"{name}={shown} (derived: {derived})" if derived else f"{name}={shown}"


@dataclass(frozen=True)
class LeaseTimings:
    """Seconds. Build with :meth:`of`, which fills the defaults and checks the rule."""

    ttl: float
    renew_interval: float
    renew_deadline: float
    retry_interval: float
    max_tenure: float | None
    cooldown: float
    release_timeout: float

    @classmethod
    def of(
        cls,
        ttl: float = 15.0,
        renew_interval: float | None = None,
        renew_deadline: float | None = None,
        retry_interval: float = 2.0,
        max_tenure: float | None = None,
        cooldown: float | None = None,
        release_timeout: float | None = None,
    ) -> LeaseTimings:
        """Defaults: ``renew_interval = ttl / 3``, ``renew_deadline = 2 * ttl / 3``,
        ``cooldown = retry_interval``, ``release_timeout = renew_deadline / 2``; ``max_tenure``
        ``None`` means no voluntary rotation. Raises :class:`ConfigurationError` naming the
        values (and which of them were derived) when the rule does not hold."""
        t = _seconds("ttl", ttl)
        if t >= MAX_TTL:
            raise ConfigurationError(f"ttl must be < {MAX_TTL:.0f} seconds, got {ttl!r}")
        interval = t / 3 if renew_interval is None else _seconds("renew_interval", renew_interval)
        deadline = (
            2 * t / 3 if renew_deadline is None else _seconds("renew_deadline", renew_deadline)
        )
        if not (t > deadline > 1.2 * interval > 0):
            raise ConfigurationError(
                "lease timings must satisfy ttl > renew_deadline > 1.2 * renew_interval > 0, got "
                + ", ".join(
                    (
                        _show("ttl", t, None),
                        _show(
                            "renew_deadline",
                            deadline,
                            None if renew_deadline is not None else "2*ttl/3",
                        ),
                        _show(
                            "renew_interval",
                            interval,
                            None if renew_interval is not None else "ttl/3",
                        ),
                    )
                )
            )
        retry = _seconds("retry_interval", retry_interval)
        if retry <= 0:
            raise ConfigurationError(f"retry_interval must be > 0, got {retry_interval!r}")
        tenure = None if max_tenure is None else _seconds("max_tenure", max_tenure)
        if tenure is not None and tenure <= 0:
            raise ConfigurationError(f"max_tenure must be > 0 or unset, got {max_tenure!r}")
        cool = retry if cooldown is None else _seconds("cooldown", cooldown)
        if cool < 0:
            raise ConfigurationError(f"cooldown must be >= 0, got {cooldown!r}")
        drain = (
            deadline / 2
            if release_timeout is None
            else _seconds("release_timeout", release_timeout)
        )
        if drain <= 0:
            raise ConfigurationError(f"release_timeout must be > 0, got {release_timeout!r}")
        return cls(t, interval, deadline, retry, tenure, cool, drain)
