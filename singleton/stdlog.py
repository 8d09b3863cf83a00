"""singleton and listeners log through loguru, and write nothing until the application asks.

``import singleton`` disables the ``singleton`` and ``listeners`` loggers (loguru's advice for
libraries). An application turns them on in one of two ways:

* it uses loguru itself: ``logger.enable("singleton")`` and ``logger.enable("listeners")``, and
  (to have credentials redacted in what drivers put in messages) ``logger.configure(patcher=
  singleton.stdlog.redact_record)``;
* it uses the standard :mod:`logging` module: :func:`use_stdlib_logging` hands every record to
  ``logging.getLogger(<module name>)`` (``singleton.election.elector``,
  ``listeners.runtime.tenure``...), level mapped, fields as attributes of the
  :class:`logging.LogRecord` (those bound with ``logger.bind``, and the ``name=value`` pairs
  the message names: ``lease``, ``identity``, ``token``...; a bound one wins), message and
  exception arguments redacted (:func:`singleton.redact.redact`).

Failure model: a handler of the application's that raises is the :mod:`logging` module's
business (``logging.raiseExceptions``): loguru's ``catch=True`` keeps it from reaching the
thread that logged, so an election never dies of a log line.
"""

from __future__ import annotations

import contextlib
import logging
import math
import re
import threading
from typing import TYPE_CHECKING

from loguru import logger

from singleton.redact import redact

if TYPE_CHECKING:
    from loguru import Message, Record

#: The import packages whose records are ours.
PACKAGES = ("singleton", "listeners")

#: loguru levels with no namesake in :mod:`logging`.
_LEVELS = {"TRACE": logging.DEBUG, "SUCCESS": logging.INFO}

#: Attribute names a :class:`logging.LogRecord` has already: a bound field of that name is
#: renamed ``field_<name>`` (``makeRecord`` refuses to overwrite them).
_RESERVED = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime"}

#: A ``name=value`` pair in a message (``elected: lease=orders identity=host/1 token=7``).
_FIELD = re.compile(r"(?<![\w.])([a-z_][a-z0-9_]*)=([^\s,;()]+)")

_lock = threading.Lock()
_handler_id: int | None = None


def seconds(value: float | None) -> str:
    """A duration as people write it in a log line: ``0.67s``, ``2s``, ``0.05s``, ``300s``."""
    if value is None:
        return "none"
    if not math.isfinite(value):
        return f"{value}s"
    if abs(value) >= 100:
        text = f"{value:.0f}"
    elif abs(value) >= 0.1 or value == 0:
        text = f"{value:.2f}".rstrip("0").rstrip(".")
    else:
        text = f"{value:.2g}"
    return f"{text}s"


def redact_record(record: Record) -> None:
    """A loguru patcher: the message, string bound fields and the exception's string arguments
    redacted, in place (so every sink, ours or the application's, sees them redacted)."""
    record["message"] = redact(record["message"])
    extra = record["extra"]
    for key, value in extra.items():
        if isinstance(value, str):
            extra[key] = redact(value)
    exc = record["exception"]
    if exc is not None and exc.value is not None:
        exc.value.args = tuple(redact(a) if isinstance(a, str) else a for a in exc.value.args)


def is_ours(record: Record) -> bool:
    """Whether ``record`` was logged by a module of :data:`PACKAGES`."""
    name = record["name"] or ""
    return any(name == p or name.startswith(p + ".") for p in PACKAGES)


def stdlib_level(name: str, number: int) -> int:
    """The :mod:`logging` level for loguru's level ``name`` (number ``number``)."""
    mapped = _LEVELS.get(name)
    if mapped is not None:
        return mapped
    known = logging.getLevelName(name)
    return known if isinstance(known, int) else number


def _forward(message: Message) -> None:
    record = message.record
    redact_record(record)
    target = logging.getLogger(record["name"] or "singleton")
    level = stdlib_level(record["level"].name, record["level"].no)
    if not target.isEnabledFor(level):
        return
    exc = record["exception"]
    exc_info = None
    if exc is not None and exc.type is not None and exc.value is not None:
        exc_info = (exc.type, exc.value, exc.traceback)
    fields: dict[str, object] = dict(_FIELD.findall(record["message"]))
    fields.update(record["extra"])
    extra = {(f"field_{k}" if k in _RESERVED else k): v for k, v in fields.items()}
    log_record = target.makeRecord(
        target.name,
        level,
        record["file"].path,
        record["line"],
        record["message"],
        (),
        exc_info,
        func=record["function"],
        extra=extra,
    )
    # When loguru made the record, not when it reached us.
    log_record.created = record["time"].timestamp()
    log_record.msecs = log_record.created % 1 * 1000
    target.handle(log_record)


def use_stdlib_logging() -> None:
    """Send singleton's and listeners' records to the standard :mod:`logging` module, redacted,
    under each module's own logger name; nothing else (an application's own loguru records stay
    where they were). Idempotent. Levels and handlers are the application's: with
    ``logging.basicConfig(level="INFO")`` the election's state changes show, heartbeats
    (DEBUG) do not.

    loguru's default handler (the one writing every record to stderr, id 0) is removed if it is
    still there, so a record is not written twice; an application that configured loguru
    itself had removed it already."""
    global _handler_id
    with _lock:
        if _handler_id is not None:
            return
        # (removed already: the application's loguru set-up stays as it is)
        with contextlib.suppress(ValueError):
            logger.remove(0)
        _handler_id = logger.add(_forward, level=0, filter=is_ours, format="{message}", catch=True)
        for package in PACKAGES:
            logger.enable(package)


def stop_stdlib_logging() -> None:
    """Stop what :func:`use_stdlib_logging` started: records no longer go to :mod:`logging`
    (the loggers stay enabled, as an application may have enabled them for a sink of its own)."""
    global _handler_id
    with _lock:
        if _handler_id is not None:
            logger.remove(_handler_id)
            _handler_id = None


__all__: list[str] = ["redact_record", "seconds", "stop_stdlib_logging", "use_stdlib_logging"]
