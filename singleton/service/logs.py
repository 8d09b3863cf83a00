"""Log set-up for the command line: loguru, human-readable or JSON, credentials redacted.

Libraries do not configure logging; only the CLI (and the demo/drill it runs) calls this.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from loguru import logger

from singleton.redact import redact

if TYPE_CHECKING:
    from loguru import Record

TEXT_FORMAT = (
    "<green>{time:HH:mm:ss.SSS}</green> <level>{level: <7}</level> "
    "<cyan>{extra[identity]}</cyan> {message}"
)


def _patch(record: Record) -> None:
    record["message"] = redact(record["message"])
    record["extra"].setdefault("identity", "-")
    exc = record["exception"]
    if exc is not None and exc.value is not None:
        exc.value.args = tuple(redact(a) if isinstance(a, str) else a for a in exc.value.args)


def setup_logging(fmt: str = "text", level: str = "INFO", identity: str | None = None) -> None:
    logger.remove()
    kwargs: dict[str, Any] = {"level": level.upper(), "backtrace": False, "diagnose": False}
    if fmt == "json":
        logger.add(sys.stderr, serialize=True, **kwargs)
    else:
        logger.add(sys.stderr, format=TEXT_FORMAT, colorize=None, **kwargs)
    logger.configure(patcher=_patch, extra={"identity": identity or "-"})
