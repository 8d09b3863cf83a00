"""What an election knows about its own health: counters for metrics, and the state of its lease
store for status pages and readiness checks.

Failure model: the store may be unreachable for a while (transient: the election retries and
says so at WARNING), or refuse us for good (wrong password, missing role, a misconfiguration:
retrying cannot help, so every attempt says so at ERROR and :attr:`StoreHealth.failing` stays
true until the store answers). Nothing here decides anything; it only records, so that no
failure is silent.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from loguru import logger

from singleton.errors import BackendUnavailableError
from singleton.latency import Latencies
from singleton.redact import redact


@dataclass
class ElectorStats:
    """Counters for metrics; read without locking (monotone, approximate is fine)."""

    elections: int = 0
    losses: int = 0
    #: Renewals answered (confirmed or refused), then those that raised.
    renewals: int = 0
    renew_failures: int = 0
    #: The answered renewals' latency: the sum (for a mean) and the latest.
    renew_seconds_total: float = 0.0
    last_renew_seconds: float = 0.0
    #: Contends that raised.
    contend_failures: int = 0
    #: Failures that retrying will not fix: refused credentials or permissions, a
    #: misconfiguration, a crashed step (a bug).
    fatal_errors: int = 0
    #: Failures in a row since the store last answered (0 while it answers).
    consecutive_failures: int = 0
    #: Tenures ended by ``resign()`` because the work under the lease failed.
    resignations: int = 0
    #: Every answered renewal's round trip, for the ``singleton_renew_latency_seconds`` histogram.
    renew_latency: Latencies = field(default_factory=Latencies)

    def renewed(self, latency: float) -> None:
        self.renewals += 1
        self.renew_seconds_total += latency
        self.last_renew_seconds = latency
        self.renew_latency.observe(latency)


def is_transient(exc: BaseException) -> bool:
    """Whether retrying ``exc`` may help: only an unknown outcome (unreachable, timed out)."""
    return isinstance(exc, BackendUnavailableError)


class StoreHealth:
    """The outcome of the latest call to the lease store, as :attr:`last_error` and
    :attr:`failing`. Thread-safe; ``what`` names the lease and store in the recovery log."""

    def __init__(self, stats: ElectorStats, what: str) -> None:
        self._stats = stats
        self._what = what
        self._lock = threading.Lock()
        self._last_error: str | None = None
        self._failing = False

    @property
    def last_error(self) -> str | None:
        """The latest failure (its type and redacted message), or ``None`` once the store has
        answered since."""
        return self._last_error

    @property
    def failing(self) -> bool:
        """Whether the latest failure is one that retrying will not fix (see
        :func:`is_transient`): the election keeps retrying, but an operator has to act."""
        return self._failing

    def failed(self, exc: BaseException) -> bool:
        """Record a failed store call (or a crashed step); return whether it is transient."""
        transient = is_transient(exc)
        self._stats.consecutive_failures += 1
        if not transient:
            self._stats.fatal_errors += 1
        with self._lock:
            self._last_error = f"{type(exc).__name__}: {redact(str(exc))}"
            self._failing = not transient
        return transient

    def answered(self) -> None:
        """The store answered: whatever failed before works again."""
        self._stats.consecutive_failures = 0
        if self._last_error is None:
            return
        with self._lock:
            self._last_error, self._failing = None, False
        logger.info("the lease store answers again: {}", self._what)
