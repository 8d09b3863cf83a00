"""MongoDB facts, said once: what an error code means, how a client is built, what time it is.

The lease backend, the checkpoint store, the listener runner and the Elasticsearch copy all talk
to MongoDB; they classify errors with :func:`classify`, translate them with :func:`translate`,
build clients with :func:`client` and read the cluster time with :func:`cluster_time`, so that a
code added here is understood everywhere.

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
from typing import TYPE_CHECKING, Any, Literal

from bson.timestamp import Timestamp

from singleton.errors import (
    BackendError,
    BackendUnavailableError,
    ConfigurationError,
    PermissionDeniedError,
    SingletonError,
)
from singleton.redact import redact

if TYPE_CHECKING:
    from pymongo import MongoClient

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


def client(
    client_or_url: MongoClient[dict[str, Any]] | str,
    *,
    timeout: float = 3.0,
    socket_timeout: float | None = None,
) -> tuple[MongoClient[dict[str, Any]], bool]:
    """``(client, owned)``. A URL becomes a client that is owned by the caller (close it), with
    server selection and connection bounded by ``timeout`` seconds, socket reads by
    ``socket_timeout`` (default ``timeout + 2``), timezone-aware datetimes, and no connection
    until first use. A client passed in is returned as it is, not owned."""
    import pymongo

    if isinstance(client_or_url, pymongo.MongoClient):
        return client_or_url, False
    if not isinstance(client_or_url, str):
        raise ConfigurationError(
            f"expected a pymongo.MongoClient or a URL string, got {type(client_or_url)!r}"
        )
    ms = max(1, int(timeout * 1000))
    socket_ms = ms + 2000 if socket_timeout is None else max(1, int(socket_timeout * 1000))
    try:
        built: MongoClient[dict[str, Any]] = pymongo.MongoClient(
            client_or_url,
            serverSelectionTimeoutMS=ms,
            connectTimeoutMS=ms,
            socketTimeoutMS=socket_ms,
            tz_aware=True,
            connect=False,
        )
    except (pymongo.errors.PyMongoError, ValueError, TypeError) as exc:
        raise ConfigurationError(
            f"invalid MongoDB URL {redact(client_or_url)!r}: {redact(str(exc))}"
        ) from exc
    return built, True


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
