"""The lease backend contract, documented once here; implementations stay terse.

Failure model: processes crash, pause (GC, SIGSTOP) and lose their network at any moment; the
store itself may be slow, unreachable or restarted. Clocks of different machines disagree, so a
backend decides expiry with *one* clock, its own server's, and callers make local decisions on
their own monotonic clock with a safety margin (see :class:`singleton.Elector`).
"""

from __future__ import annotations

import inspect
import threading
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import TracebackType

from singleton.errors import ConfigurationError


@dataclass(frozen=True)
class Lease:
    """A granted lease. Immutable: a renewal returns a new ``Lease`` with the same token.

    ``holder`` is the random per-candidate value that proves ownership; ``token`` is the fencing
    token, an integer that strictly increases with every new acquisition of ``name``.
    """

    name: str
    holder: str
    token: int
    ttl: float


@dataclass(frozen=True)
class LeaseState:
    """What :meth:`LeaseBackend.inspect` sees: the current holder of a live lease."""

    name: str
    holder: str
    token: int
    ttl_remaining: float

    @property
    def identity(self) -> str:
        """The human part of ``holder`` (see :func:`identity_of`)."""
        return identity_of(self.holder)


@dataclass(frozen=True)
class FireClaim:
    """One fire time of a scheduled job, claimed under a lease by :meth:`LeaseBackend.claim_fire`:
    ``fire_ms`` (the scheduled time, epoch milliseconds, UTC), and the claimer's ``token`` and
    ``holder``."""

    fire_ms: int
    token: int
    holder: str


@dataclass(frozen=True)
class Member:
    """One live member: its ``identity``, the seconds its heartbeat has left on the store's
    clock, and the ``info`` it published with it (values as strings)."""

    identity: str
    ttl_remaining: float
    info: Mapping[str, str] = field(default_factory=dict)


class Membership(ABC):
    """Heartbeats and the live set of a group, on the store's clock.

    Invariants every implementation keeps (````tests/integration/test_membership.py```` checks
    them against each store):

    * **Liveness by the store's clock.** A member is live from a :meth:`heartbeat` until ``ttl``
      seconds after its latest one, measured by the store, or until it :meth:`leave` s.
    * **One atomic write.** A heartbeat (record, expiry and ``info`` together) is one atomic
      step; readers never see a member without its ``info``.
    * **Unknown outcomes are errors**, translated into :mod:`singleton.errors`, as for leases.
    * **Garbage goes by itself.** Expired members are pruned by the store or by later
      heartbeats; nothing needs a janitor.
    """

    @abstractmethod
    def heartbeat(
        self, group: str, identity: str, ttl: float, info: Mapping[str, str | int]
    ) -> None:
        """Mark ``identity`` live in ``group`` for ``ttl`` seconds from now (store time), with
        ``info`` replacing what it published before."""

    @abstractmethod
    def members(self, group: str) -> list[Member]:
        """The live members of ``group``, sorted by identity."""

    @abstractmethod
    def leave(self, group: str, identity: str) -> None:
        """Drop ``identity`` from ``group`` now (a clean stop), so the others rebalance at once."""


def validate_heartbeat(
    group: str, identity: str, ttl: float, info: Mapping[str, str | int]
) -> dict[str, str]:
    """Check :meth:`Membership.heartbeat`'s arguments before any I/O; ``info`` as strings."""
    validate_lease_args(group, identity, ttl)
    if "\n" in identity:
        raise ConfigurationError(f"member identity must be one line, got {identity!r}")
    return validate_facts(group, info) if info else {}


HOLDER_SEPARATOR = "/"


def identity_of(holder: str) -> str:
    """``"web-1/3f9c..."`` -> ``"web-1"``: electors build holders as identity + ``/`` + random."""
    return holder.rsplit(HOLDER_SEPARATOR, 1)[0]


class LeaseBackend(ABC):
    """A store that grants named, expiring, fenced leases.

    Invariants every implementation keeps (``tests/integration/test_contract.py`` checks them
    against each backend):

    * **Mutual exclusion.** At most one holder has a live lease for a name at any instant of the
      backend's own clock. A lease is live from its grant until ``ttl`` seconds after its last
      grant or renewal, measured by the server, or until released.
    * **Fencing.** Every successful :meth:`try_acquire` of a name returns a ``token`` strictly
      greater than every token previously granted for that name, forever, including when the
      previous lease expired without being released. Renewal keeps the token.
    * **Fencing survives losing the store.** A new grant's token is
      ``max(stored token + 1, the server's clock in milliseconds)``, minted in the same atomic
      step, so when the store loses its data (a restart without persistence, a dropped
      collection, a failover that lost the last writes) the next token still exceeds every
      earlier one, and fenced checkpoints accept the new leader. This holds as long as the
      server's clock does not step back and a name gets fewer than 1,000 grants a second.
    * **Ownership.** :meth:`renew` and :meth:`release` succeed only if the stored holder *and*
      token equal the lease's; a non-holder can never extend, release or overwrite a lease.
    * **Atomicity.** Each operation is one atomic step on the server (a Lua script, a
      ``findOneAndUpdate``); there is no read-then-write window.
    * **Unknown outcomes are errors.** When the server cannot be reached or does not answer in
      time, operations raise :class:`~singleton.errors.BackendUnavailableError` (never return a
      guess). Driver exceptions never leak: they are translated into ``singleton.errors``.
    * **Facts outlive leases, not the store.** :meth:`remember` keeps a small record per name
      beside the lease, untouched by grants, renewals, releases and expiry, and lost only with
      the store's data (with the fencing counter). It lets work under a lease leave a note that
      survives losing *its* store, e.g. "this listener has had a checkpoint".
    * **Fire times are claimed once, fenced.** :meth:`claim_fire` records a scheduled job's fire
      time beside the lease in one atomic step conditional on the stored holder *and* token and
      on the fire time being later than every one claimed before for that name, so no fire time
      is claimed twice and a deposed holder claims nothing; nor a fire time further ahead of the
      store's clock than the caller allows. Claims live as long as the store's
      data, like facts; only the latest ``keep`` are kept.
    * **Ownership of clients.** A backend closes only a client it created from a URL.
    """

    @abstractmethod
    def try_acquire(self, name: str, holder: str, ttl: float) -> Lease | None:
        """Grant ``name`` to ``holder`` for ``ttl`` seconds if it is free or expired.

        Returns the new :class:`Lease` (with a fresh, larger token), or ``None`` if another holder
        has a live lease. If ``holder`` already holds it, the lease is extended, the token kept.
        """

    @abstractmethod
    def renew(self, lease: Lease, ttl: float | None = None) -> Lease | None:
        """Extend ``lease`` to ``ttl`` (default ``lease.ttl``) seconds from now, server time.

        Returns the renewed lease, or ``None`` if the stored holder or token differs (or the lease
        expired): the caller has lost it and must stop acting on it.
        """

    @abstractmethod
    def release(self, lease: Lease) -> bool:
        """Free ``lease`` now and wake :meth:`wait_for_release` waiters.

        Returns ``False`` (and changes nothing) unless the stored holder and token equal the
        lease's. The fencing counter is kept, so the next grant gets a larger token.
        """

    @abstractmethod
    def inspect(self, name: str) -> LeaseState | None:
        """The live lease of ``name`` with its remaining time, or ``None`` if it is free."""

    @abstractmethod
    def wait_for_release(
        self,
        name: str,
        timeout: float,
        wake: threading.Event | None = None,
        *,
        since: int | None = None,
    ) -> bool:
        """Block until ``name`` is released, ``timeout`` passes, or ``wake`` is set.

        Returns ``True`` if a release was observed. Backends with notifications wake within
        milliseconds of a release; others may poll at most every ``timeout``. ``wake`` lets the
        caller interrupt the wait (for example on ``stop()``); it is set, never cleared, by the
        backend. ``since``, a :meth:`release_mark` of ``name``, makes the wait return ``True``
        at once if a release was observed after that mark was read, so a release that came
        before the wait began is not missed. Ignoring ``since`` is correct, only slower; a
        backend that overrides :meth:`release_mark` must accept it.
        """

    def release_mark(self, name: str) -> int:
        """A counter of the releases of ``name`` this backend has observed, to pass as
        ``since`` to a later :meth:`wait_for_release`. Cheap and local: no I/O, never raises.

        Read it *before* a :meth:`contend` round trip: a release the server applies after that
        contend is observed after the read. The default, for backends without notifications,
        is ``0``, a mark that never moves: their waits behave as without ``since``.
        """
        return 0

    @abstractmethod
    def remember(self, name: str, facts: Mapping[str, str | int]) -> None:
        """Merge ``facts`` into the record of ``name`` (creating it), in one atomic write.

        Fields not named in ``facts`` are kept. Values are stored as strings. The record is not
        fenced (anyone may write it: write only facts that stay true whoever wrote them last) and
        has no expiry: it lasts as long as the store keeps its data, whatever the lease does.
        Field names are non-empty strings without ``.`` and not starting with ``$``.
        """

    @abstractmethod
    def recall(self, name: str) -> dict[str, str]:
        """The record :meth:`remember` keeps for ``name``: every field, values as strings;
        empty if nothing was remembered (or the store lost its data since)."""

    @abstractmethod
    def claim_fire(
        self, lease: Lease, fire_ms: int, keep: int = 100, ahead_ms: int = 10_000
    ) -> bool:
        """Claim the fire time ``fire_ms`` (epoch ms) of the job run under ``lease``.

        One atomic step: succeeds (returns ``True``) only if ``lease`` is live with the stored
        holder *and* token, ``fire_ms`` is greater than the latest fire time claimed for
        ``lease.name`` by anyone, and ``fire_ms`` is at most ``ahead_ms`` later than the store's
        own clock (so a claimer whose wall clock runs far ahead cannot claim the future away
        from its successors); it then records :class:`FireClaim` ``(fire_ms, token, holder)``
        as the latest and keeps only the latest ``keep`` claims. Otherwise changes nothing and
        returns ``False``. Grants, renewals, releases and expiry leave claims alone.
        """

    @abstractmethod
    def fires(self, name: str) -> list[FireClaim]:
        """The claims :meth:`claim_fire` kept for ``name``, latest first (empty if none, or if
        the store lost its data since)."""

    def contend(self, name: str, holder: str, ttl: float) -> Lease | LeaseState | None:
        """Try to acquire; on failure say who holds it, ideally in one round trip.

        Returns the new :class:`Lease`, the current holder's :class:`LeaseState`, or ``None`` if
        the lease was held but vanished before it could be inspected. The default does two calls;
        backends override it with one.
        """
        lease = self.try_acquire(name, holder, ttl)
        if lease is not None:
            return lease
        return self.inspect(name)

    def membership(self) -> Membership:
        """Heartbeats and live members (:mod:`singleton.balance.membership`) on this backend's own
        client and clock; for spreading leases over replicas (:mod:`singleton.balance.balancer`)."""
        raise ConfigurationError(f"{type(self).__name__} keeps no membership")

    def describe(self) -> str:
        """A short description for logs, with any credentials redacted."""
        return type(self).__name__

    def close(self) -> None:  # noqa: B027 - optional hook, most backends own nothing
        """Release resources this backend created (never a client passed in by the caller)."""

    def __enter__(self) -> LeaseBackend:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def takes_since(backend: LeaseBackend) -> bool:
    """Whether ``backend.wait_for_release`` accepts ``since``: backends written before it was
    added do not, and are called without it."""
    try:
        params = inspect.signature(backend.wait_for_release).parameters.values()
    except (TypeError, ValueError):  # no signature to read (a C callable, a strange wrapper)
        return False
    return any(p.name == "since" or p.kind is p.VAR_KEYWORD for p in params)


def validate_lease_args(name: str, holder: str | None = None, ttl: float | None = None) -> None:
    """Reject bad arguments before any I/O, naming the bad value."""
    if not isinstance(name, str) or not name:
        raise ConfigurationError(f"lease name must be a non-empty string, got {name!r}")
    if holder is not None and (not isinstance(holder, str) or not holder):
        raise ConfigurationError(f"lease holder must be a non-empty string, got {holder!r}")
    if ttl is not None and (
        isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or not ttl > 0
    ):
        raise ConfigurationError(f"lease ttl must be a positive number of seconds, got {ttl!r}")


def validate_facts(name: str, facts: Mapping[str, str | int]) -> dict[str, str]:
    """Check :meth:`LeaseBackend.remember`'s arguments before any I/O; the fields as strings."""
    validate_lease_args(name)
    if not isinstance(facts, Mapping) or not facts:
        raise ConfigurationError(f"facts must be a non-empty mapping, got {facts!r}")
    fields: dict[str, str] = {}
    for key, value in facts.items():
        if not isinstance(key, str) or not key or "." in key or key.startswith("$"):
            raise ConfigurationError(
                f"fact names must be non-empty strings without '.' or a leading '$', got {key!r}"
            )
        if isinstance(value, bool) or not isinstance(value, (str, int)):
            raise ConfigurationError(f"fact {key!r} must be a str or an int, got {value!r}")
        fields[key] = str(value)
    return fields


def validate_claim(lease: Lease, fire_ms: int, keep: int, ahead_ms: int) -> None:
    """Check :meth:`LeaseBackend.claim_fire`'s arguments before any I/O."""
    validate_lease_args(lease.name, lease.holder)
    for label, value, least in (
        ("fire_ms", fire_ms, 0),
        ("keep", keep, 1),
        ("ahead_ms", ahead_ms, 0),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise ConfigurationError(f"{label} must be an int >= {least}, got {value!r}")
