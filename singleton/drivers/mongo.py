"""MongoDB facts, said once: what an error code means, how a client is built, what time it is.

The lease backend, the checkpoint store, the listener runner and the Elasticsearch copy all talk
to MongoDB; they classify errors with :func:`classify`, translate them with :func:`translate`,
build clients with :func:`client` (bounded by one of the named :class:`Timeouts`) and read the
cluster time with :func:`cluster_time`, so that a code added here is understood everywhere.

Error classes follow the drivers' change-streams and retryable-operations specs: network errors,
``CursorNotFound`` and the ``ResumableChangeStreamError`` / ``RetryableWriteError`` labels are
transient (the outcome of a write is then unknown); 286 ``ChangeStreamHistoryLost``, 280
``ChangeStreamFatalError`` ("resume token was not found") and 136 ``CappedPositionLost`` mean a
saved position is gone and retrying it would loop forever; authentication and authorization
errors will not heal by retrying. 10334 ``BSONObjectTooLarge`` on a change stream means one event
is over 16 MB: retrying the same read fails the same way forever, yet the stream is not broken (a
reader can reopen it with the large fields projected away), so it is neither transient nor fatal.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from bson.timestamp import Timestamp

from singleton.errors import (
    BackendError,
    BackendUnavailableError,
    ConfigurationError,
    PermissionDeniedError,
    SingletonError,
)
from singleton.redact import (
    cut_short,
    redact,
    redact_refused,
    refuse_control_characters,
    userinfo_cut_short,
)

if TYPE_CHECKING:
    from pymongo import MongoClient
    from pymongo.errors import OperationFailure

ErrorKind = Literal["history_lost", "permission", "too_large", "transient", "fatal"]

#: "That position is no longer in the oplog".
HISTORY_LOST_CODES = frozenset({136, 280, 286})
HISTORY_LOST_MESSAGES = (
    "no longer be in the oplog",
    "resume token was not found",
    "changestreamhistorylost",
    "resume point may no longer",
)
#: BSONObjectTooLarge: a document (for a change stream, one event) over the 16 MB BSON limit.
TOO_LARGE_CODES = frozenset({10334})
#: Unauthorized (13), AuthenticationFailed (18), UserNotFound (11), Atlas "not allowed" (8000),
#: PasswordExpired/AuthenticationRestrictionUnmet-style refusals (31, 33).
PERMISSION_CODES = frozenset({11, 13, 18, 31, 33, 8000})
#: How a refused handshake reads when it is quoted inside a server-selection timeout.
AUTH_FAILED_MESSAGES = ("authentication failed", "authenticationfailed")
#: Server answers that mean "try again later" (the spec's resumable and retryable codes, with
#: CursorNotFound (43) and MaxTimeMSExpired (50): our own bound on every call).
TRANSIENT_CODES = frozenset(
    {
        6,
        7,
        43,
        50,
        63,
        64,
        89,
        91,
        133,
        150,
        189,
        234,
        262,
        9001,
        10107,
        11600,
        11602,
        13388,
        13435,
        13436,
    }
)
_TRANSIENT_LABELS = ("ResumableChangeStreamError", "RetryableWriteError")


def classify(exc: BaseException) -> ErrorKind:
    """Which of the five error classes ``exc`` belongs to (see the module docstring)."""
    import pymongo.errors as pe

    if isinstance(exc, pe.OperationFailure):
        return _classify_answer(exc)
    if isinstance(exc, BackendUnavailableError):
        return "transient"
    if isinstance(exc, PermissionDeniedError):
        return "permission"
    if isinstance(exc, pe.ServerSelectionTimeoutError) and any(
        m in str(exc).lower() for m in AUTH_FAILED_MESSAGES
    ):
        # After one failed handshake the driver marks the server unknown with the auth error,
        # and later calls time out selecting it: the same refusal, not a network problem.
        return "permission"
    if isinstance(exc, (pe.ConnectionFailure, pe.WTimeoutError)) or getattr(exc, "timeout", False):
        return "transient"
    if isinstance(exc, (pe.InvalidOperation, pe.ConfigurationError, SingletonError)):
        return "fatal"
    if isinstance(exc, pe.PyMongoError):
        return "transient"
    return "fatal"


def _classify_answer(exc: OperationFailure) -> ErrorKind:
    """What an answer of the server's own means: by its code or its words, then by the spec's
    error labels."""
    message = str(exc).lower()
    if exc.code in HISTORY_LOST_CODES or any(m in message for m in HISTORY_LOST_MESSAGES):
        return "history_lost"
    if exc.code in PERMISSION_CODES or "not authorized" in message:
        return "permission"
    if exc.code in TOO_LARGE_CODES:
        return "too_large"
    if exc.code in TRANSIENT_CODES or exc.timeout:
        return "transient"
    if any(exc.has_error_label(label) for label in _TRANSIENT_LABELS):
        return "transient"
    return "fatal"


@contextlib.contextmanager
def translate(what: str) -> Iterator[None]:
    """Turn every pymongo error raised inside the block into a :class:`SingletonError`:
    unreachable, timed out or "try again" -> :class:`BackendUnavailableError` (outcome unknown);
    refused credentials or roles -> :class:`PermissionDeniedError`; a bad URL or option ->
    :class:`ConfigurationError`; anything else -> :class:`BackendError`. Messages are redacted."""
    import pymongo.errors as pe

    try:
        yield
    except pe.PyMongoError as exc:
        if isinstance(exc, pe.OperationFailure) and exc.details:
            detail = redact(str(exc.details.get("errmsg", exc)))
            code = f" (code {exc.code})"
        else:
            detail, code = redact(f"{type(exc).__name__}: {exc}"), ""
        if isinstance(exc, pe.ConfigurationError):
            raise ConfigurationError(f"{what}: {detail}") from exc
        kind = classify(exc)
        if kind == "permission":
            raise PermissionDeniedError(f"{what}: MongoDB refused: {detail}{code}") from exc
        if kind == "transient":
            raise BackendUnavailableError(f"{what}: outcome unknown: {detail}{code}") from exc
        raise BackendError(f"{what}: {detail}{code}") from exc


@dataclass(frozen=True)
class Timeouts:
    """How long a client built by :func:`client` waits, in seconds: ``connect`` bounds server
    selection and the connection handshake, ``socket`` one reply on an open connection. A caller
    names its use, never a pair of numbers:

    * :attr:`STORE` (3 s / 5 s), the default: the stores on a listener's path (checkpoints, dead
      letters, the runner's own client). A call stuck on a dead primary fails well inside a
      renew interval, so the tenure learns of it while its lease still holds.
    * :meth:`lease_bound` (3 s / the lease ttl, at least 5 s): the replica's one client, shared by
      every runner and store it hosts; a reply may take as long as the lease it serves.
    * :attr:`COMMAND` (5 s / 7 s): one command a person waits for (``singleton dead-letters``,
      the drill's harness), over links slower than a replica's.
    * :attr:`BULK_READ` (10 s / 60 s): ``singleton verify`` scanning a whole collection, where one
      batch of a large scan may take long.
    * :attr:`BULK_WRITE` (5 s / 30 s): the demo and the drill seeding their data (``insert_many``).
    * :attr:`PROBE` (0.5 s / 2.5 s): "is the server up yet?", asked in a loop.
    * :meth:`within` (``s`` / ``s``): everything inside one deadline (``singleton status``).
    """

    connect: float
    socket: float

    STORE: ClassVar[Timeouts]
    COMMAND: ClassVar[Timeouts]
    BULK_READ: ClassVar[Timeouts]
    BULK_WRITE: ClassVar[Timeouts]
    PROBE: ClassVar[Timeouts]

    def __post_init__(self) -> None:
        for label, value in (("connect", self.connect), ("socket", self.socket)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ConfigurationError(f"MongoDB {label} timeout must be > 0 s, got {value!r}")

    @classmethod
    def within(cls, seconds: float) -> Timeouts:
        return cls(seconds, seconds)

    @classmethod
    def lease_bound(cls, ttl: float) -> Timeouts:
        return cls(cls.STORE.connect, max(cls.STORE.socket, ttl))


Timeouts.STORE = Timeouts(3.0, 5.0)
Timeouts.COMMAND = Timeouts(5.0, 7.0)
Timeouts.BULK_READ = Timeouts(10.0, 60.0)
Timeouts.BULK_WRITE = Timeouts(5.0, 30.0)
Timeouts.PROBE = Timeouts(0.5, 2.5)


def client(
    client_or_url: MongoClient[dict[str, Any]] | str,
    timeouts: Timeouts | None = None,
    *,
    timeout: float | None = None,
    socket_timeout: float | None = None,
) -> tuple[MongoClient[dict[str, Any]], bool]:
    """``(client, owned)``. A URL becomes a client that is owned by the caller (close it),
    bounded by ``timeouts`` (default :attr:`Timeouts.STORE`), with timezone-aware datetimes and
    no connection until first use. A client passed in is returned as it is, not owned.

    ``timeout`` / ``socket_timeout`` are the older spelling (``socket_timeout`` defaulting to
    ``timeout + 2``), kept only until the last callers name a :class:`Timeouts`."""
    import pymongo

    if timeout is not None or socket_timeout is not None:
        if timeouts is not None:
            raise ConfigurationError("pass either timeouts or timeout/socket_timeout, not both")
        connect = Timeouts.STORE.connect if timeout is None else timeout
        timeouts = Timeouts(connect, connect + 2.0 if socket_timeout is None else socket_timeout)
    timeouts = timeouts or Timeouts.STORE
    if isinstance(client_or_url, pymongo.MongoClient):
        return client_or_url, False
    if not isinstance(client_or_url, str):
        raise ConfigurationError(
            f"expected a pymongo.MongoClient or a URL string, got {type(client_or_url)!r}"
        )
    with building_client(client_or_url):
        built: MongoClient[dict[str, Any]] = pymongo.MongoClient(
            client_or_url, **client_options(timeouts)
        )
    return built, True


def client_options(timeouts: Timeouts) -> dict[str, Any]:
    """The keywords every client built here gets (thread or asyncio): ``timeouts``,
    timezone-aware datetimes, no connection until first use."""
    ms = max(1, int(timeouts.connect * 1000))
    return {
        "serverSelectionTimeoutMS": ms,
        "connectTimeoutMS": ms,
        "socketTimeoutMS": max(1, int(timeouts.socket * 1000)),
        "tz_aware": True,
        "connect": False,
    }


@contextlib.contextmanager
def building_client(url: str) -> Iterator[None]:
    """Check ``url``'s form, then turn what the client's constructor raises inside the block
    into a :class:`ConfigurationError` naming the (redacted) URL."""
    import pymongo

    refuse_control_characters("the MongoDB URL", url)
    if userinfo_cut_short(url, "/?"):  # pymongo reads a raw '#' in a password
        raise ConfigurationError(f"invalid MongoDB URL: {cut_short(url, '/?')}")
    try:
        yield
    except (pymongo.errors.PyMongoError, ValueError, TypeError) as exc:
        raise ConfigurationError(
            f"invalid MongoDB URL {redact_refused(url)!r}: {redact(str(exc))}"
        ) from exc


def cluster_time(mongo: Any) -> Timestamp:
    """The deployment's current cluster time: the ``operationTime`` of a ``ping`` (the earliest
    time that reply vouches for, so a stream started there misses nothing)."""
    reply = mongo.admin.command("ping")
    ts = reply.get("operationTime") or (reply.get("$clusterTime") or {}).get("clusterTime")
    if not isinstance(ts, Timestamp):
        raise ConfigurationError(
            "the MongoDB deployment reports no cluster time: change streams need a replica set"
        )
    return ts
