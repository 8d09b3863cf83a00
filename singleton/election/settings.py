"""An elector's keyword options, validated once into one frozen value that every driver shares.

Failure model: a wrong option must fail when the elector is built, naming the value, and never
half-way through a campaign; so :meth:`ElectorSettings.of` checks everything (the timing rule
through :class:`~singleton.lease.timings.LeaseTimings`) before any thread or I/O starts. An
unknown keyword is a ``TypeError``, as it would be for any function, with a near miss named.
"""

from __future__ import annotations

import os
import random
import socket
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypedDict

from singleton.clock import SYSTEM_CLOCK, Clock
from singleton.election.callbacks import BeforeRelease, OnElected, OnLost, OnNewLeader
from singleton.election.gate import Gate
from singleton.errors import ConfigurationError
from singleton.lease.contract import HOLDER_SEPARATOR
from singleton.lease.timings import LeaseTimings
from singleton.options import reject_unknown
from singleton.retry import Backoff

if TYPE_CHECKING:
    from typing_extensions import Unpack  # typing.Unpack from Python 3.11

#: The contend backoff doubles from ``retry_interval`` up to this (or ``retry_interval``).
MAX_RETRY_BACKOFF = 30.0
#: A refused follower contends again this long after the lease's remaining ttl, as the store
#: reported it, has run out: room for the store's clock (Redis and MongoDB keep milliseconds).
EXPIRY_MARGIN = 0.01


def default_identity() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


class ElectionOptions(TypedDict, total=False):
    """The options every driver of an election takes (the thread ``Elector``, the asyncio
    ``AsyncElector``), its callbacks aside: each driver types those its own way."""

    identity: str | None
    ttl: float
    renew_interval: float | None
    renew_deadline: float | None
    retry_interval: float
    max_tenure: float | None
    cooldown: float | None
    release_timeout: float | None
    timings: LeaseTimings | None
    clock: Clock | None
    jitter: float
    seed: int | None
    unsafe_disable_fencing: bool
    gate: Gate | None


class ElectorOptions(ElectionOptions, total=False):
    """The keyword options of ``Elector(backend, name, **options)``; every one is optional.

    Timings (seconds; see :class:`ElectorSettings` for the rule and defaults) come one by one or
    whole as ``timings`` (which then wins). ``clock`` defaults to the system's, ``jitter`` to 0.1.
    """

    on_elected: OnElected | None
    on_lost: OnLost | None
    on_new_leader: OnNewLeader | None
    before_release: BeforeRelease | None


_TIMING_KEYS = (
    "ttl",
    "renew_interval",
    "renew_deadline",
    "retry_interval",
    "max_tenure",
    "cooldown",
    "release_timeout",
)


def check_lease_name(name: object) -> str:
    """``name`` if it is a usable lease name, else :class:`ConfigurationError` naming it."""
    if not isinstance(name, str) or not name:
        raise ConfigurationError(f"lease name must be a non-empty string, got {name!r}")
    return name


def _check_identity(identity: object) -> str:
    if identity is None:
        return default_identity()
    if not isinstance(identity, str) or not identity:
        raise ConfigurationError(f"identity must be a non-empty string, got {identity!r}")
    if HOLDER_SEPARATOR in identity:
        raise ConfigurationError(
            f"identity must not contain {HOLDER_SEPARATOR!r}, got {identity!r}"
        )
    return identity


def _check_jitter(jitter: object) -> float:
    if isinstance(jitter, bool) or not isinstance(jitter, (int, float)) or not 0 <= jitter < 1:
        raise ConfigurationError(f"jitter must be in [0, 1), got {jitter!r}")
    return float(jitter)


@dataclass(frozen=True)
class ElectorSettings:
    """Everything an election needs besides its backend and lease name, checked once.

    ``timings`` satisfy ``ttl > renew_deadline > 1.2 * renew_interval > 0`` (defaults:
    ``renew_interval = ttl / 3``, ``renew_deadline = 2 * ttl / 3``, ``cooldown = retry_interval``,
    ``release_timeout = renew_deadline / 2``). ``jitter`` spreads retries and tenures by that
    fraction; ``seed`` makes it repeatable. ``fenced`` is False only in the failover drill's
    unsafe mode (``unsafe_disable_fencing=True``). Build with :meth:`of`.
    """

    identity: str
    timings: LeaseTimings
    clock: Clock
    jitter: float
    seed: int | None
    fenced: bool
    gate: Gate | None
    on_elected: OnElected | None
    on_lost: OnLost | None
    on_new_leader: OnNewLeader | None
    before_release: BeforeRelease | None

    @classmethod
    def of(cls, **options: Unpack[ElectorOptions]) -> ElectorSettings:
        """Fill the defaults and validate; raises :class:`ConfigurationError` naming a bad
        value, ``TypeError`` for an unknown option."""
        reject_unknown("Elector", options, ElectorOptions.__annotations__)
        identity = _check_identity(options.get("identity"))
        jitter = _check_jitter(options.get("jitter", 0.1))
        given: dict[str, Any] = {k: v for k, v in options.items() if k in _TIMING_KEYS}
        timings = options.get("timings") or LeaseTimings.of(**given)
        return cls(
            identity=identity,
            timings=timings,
            clock=options.get("clock") or SYSTEM_CLOCK,
            jitter=jitter,
            seed=options.get("seed"),
            fenced=not options.get("unsafe_disable_fencing", False),
            gate=options.get("gate"),
            on_elected=options.get("on_elected"),
            on_lost=options.get("on_lost"),
            on_new_leader=options.get("on_new_leader"),
            before_release=options.get("before_release"),
        )

    def backoff(self) -> Backoff:
        """A fresh contend backoff: from ``retry_interval``, doubling up to
        :data:`MAX_RETRY_BACKOFF` (or ``retry_interval`` if longer), jittered."""
        base = self.timings.retry_interval
        return Backoff(
            base, max(MAX_RETRY_BACKOFF, base), jitter=self.jitter, rng=random.Random(self.seed)
        )
