"""What an :class:`~singleton.election.machine.Election` asks of its driver, and what the driver
answers: the whole protocol between the rules and the I/O, so that every driver (the thread one
today, an asyncio one later) speaks it without knowing the rules.

Failure model: an action is carried out at most once, and its result reported back with the
monotonic time read just before the call; a driver that cannot report (it hung) is overtaken by
the machine's deadline, never trusted past it.
"""

from __future__ import annotations

from dataclasses import dataclass

from singleton.election.leadership import Leadership
from singleton.errors import SingletonError
from singleton.lease.contract import Lease, LeaseState


@dataclass(frozen=True)
class Contend:
    """Read ``backend.release_mark(name)``, then the clock, then call
    ``backend.contend(name, holder, ttl)``; report a :class:`Contended`."""

    name: str
    holder: str
    ttl: float


@dataclass(frozen=True)
class Renew:
    """Read the clock, then call ``backend.renew(lease, ttl)``; report the lease, ``None``
    (refused) or the :class:`~singleton.errors.SingletonError` raised, with the time sent."""

    leadership: Leadership
    ttl: float

    @property
    def lease(self) -> Lease:
        return self.leadership.lease


@dataclass(frozen=True)
class Drain:
    """Run ``callbacks.before_release(leadership)`` for at most ``timeout`` seconds (it may
    block); report whether it finished in time. Work it leaves running is fenced off anyway."""

    leadership: Leadership
    timeout: float


@dataclass(frozen=True)
class Release:
    """Call ``backend.release(lease)``; report its answer or the error raised."""

    leadership: Leadership

    @property
    def lease(self) -> Lease:
        return self.leadership.lease


@dataclass(frozen=True)
class Wait:
    """Nothing to do for ``seconds`` (0: tick again at once); a wake (stop, rotate, a tenure
    that changed) may end it sooner. With ``for_release`` a follower may also end it when the
    lease is released: ``backend.wait_for_release(name, seconds, since=since)``."""

    seconds: float
    for_release: bool = False
    since: int | None = None


Action = Contend | Renew | Drain | Release | Wait


@dataclass(frozen=True)
class Contended:
    """What a :class:`Contend` came back with. Build it with :meth:`of` from the backend's answer.

    ``sent_at`` is the monotonic time read just before the call (a tenure's deadline counts
    from it); ``release_mark`` the backend's mark read before that, for the wait that follows a
    refusal. Exactly one of ``granted``, ``held_by`` and ``error`` is set, or none: the lease was
    held but vanished before it could be inspected.
    """

    sent_at: float
    granted: Lease | None = None
    held_by: LeaseState | None = None
    error: SingletonError | None = None
    release_mark: int | None = None

    @classmethod
    def of(
        cls,
        answer: Lease | LeaseState | SingletonError | None,
        *,
        sent_at: float,
        release_mark: int | None = None,
    ) -> Contended:
        if isinstance(answer, Lease):
            return cls(sent_at, granted=answer, release_mark=release_mark)
        if isinstance(answer, LeaseState):
            return cls(sent_at, held_by=answer, release_mark=release_mark)
        return cls(sent_at, error=answer, release_mark=release_mark)
