"""Clocks, injected everywhere a decision depends on time.

Local decisions (renew deadline, tenure, retry) use :meth:`Clock.monotonic`, which wall-clock
jumps (NTP steps, ``faketime``) cannot move. Wall time is only used for display and logs.
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    """What singleton needs from a clock; pass your own (or ``singleton.testing.FakeClock``)."""

    def monotonic(self) -> float:
        """Seconds on a clock that never goes backwards; only differences are meaningful."""
        ...

    def time(self) -> float:
        """Wall-clock seconds since the epoch, for display only."""
        ...


class SystemClock:
    """The process's real clocks."""

    def monotonic(self) -> float:
        return time.monotonic()

    def time(self) -> float:
        return time.time()


SYSTEM_CLOCK = SystemClock()
