"""Retry timing, said once: capped exponential backoff with symmetric jitter.

Every retry loop in singleton (contending for a lease, reconnecting a change stream, resending a
bulk request, writing a dead letter) takes its delays from a :class:`Backoff`, so that one
formula governs them all: attempt ``n`` (from 1) waits ``min(cap, base * 2 ** (n - 1))``, scaled
by a uniform factor in ``[1 - jitter, 1 + jitter]`` so that replicas that failed together do not
retry together. Callers wait on an event with that delay as the timeout, never a bare sleep, and
retry only errors they have classified as transient.
"""

from __future__ import annotations

import random

from singleton.errors import ConfigurationError


class Backoff:
    """Delays for consecutive failures of one operation; :meth:`reset` after a success."""

    def __init__(
        self,
        base: float,
        cap: float,
        *,
        jitter: float = 0.1,
        rng: random.Random | None = None,
    ) -> None:
        if not 0 < base <= cap:
            raise ConfigurationError(
                f"backoff needs 0 < base <= cap, got base={base!r}, cap={cap!r}"
            )
        if not 0 <= jitter < 1:
            raise ConfigurationError(f"backoff jitter must be in [0, 1), got {jitter!r}")
        self.base = base
        self.cap = cap
        self.jitter = jitter
        self.attempts = 0
        self._rng = rng or random.Random()

    def next(self) -> float:
        """Count one more failure and return how long to wait before the next attempt."""
        self.attempts += 1
        return self.jittered(min(self.cap, self.base * 2 ** min(self.attempts - 1, 60)))

    def reset(self) -> None:
        self.attempts = 0

    def jittered(self, value: float) -> float:
        """``value`` scaled by a random factor in ``[1 - jitter, 1 + jitter]``."""
        if self.jitter == 0:
            return value
        return value * (1 + self._rng.uniform(-self.jitter, self.jitter))
