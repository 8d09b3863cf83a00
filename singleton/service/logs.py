"""Log set-up for the command line: loguru, human-readable or JSON, credentials redacted.

Libraries do not configure logging; only the CLI (and the demo/drill it runs) calls this. As a
library, singleton and listeners are silent (``import singleton`` disables their loggers): the
service enables them here, and redacts every record with the same patcher as the library's
routes (:func:`singleton.stdlog.redact_record`).
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from loguru import logger

from singleton.stdlog import PACKAGES, redact_record

if TYPE_CHECKING:
    from loguru import Record

TEXT_FORMAT = (
    "<green>{time:HH:mm:ss.SSS}</green> <level>{level: <7}</level> "
    "<cyan>{extra[identity]}</cyan> {message}"
)


class _Stderr:
    """``sys.stderr`` as it is at each write, not as it was at set-up: a caller that swaps it
    (a test's capture, a redirect) is followed, and a closed replacement never receives."""

    def write(self, message: str) -> None:
        sys.stderr.write(message)

    def flush(self) -> None:
        sys.stderr.flush()

    def isatty(self) -> bool:
        return sys.stderr.isatty()


def _patch(record: Record) -> None:
    redact_record(record)
    record["extra"].setdefault("identity", "-")


def setup_logging(fmt: str = "text", level: str = "INFO", identity: str | None = None) -> None:
    logger.remove()
    kwargs: dict[str, Any] = {"level": level.upper(), "backtrace": False, "diagnose": False}
    if fmt == "json":
        logger.add(_Stderr(), serialize=True, **kwargs)
    else:
        logger.add(_Stderr(), format=TEXT_FORMAT, colorize=None, **kwargs)
    logger.configure(patcher=_patch, extra={"identity": identity or "-"})
    for package in PACKAGES:
        logger.enable(package)
