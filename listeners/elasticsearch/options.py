"""The numeric options of :class:`~listeners.elasticsearch.sync.ElasticsearchSync`, checked."""

from __future__ import annotations

from typing import Any

from singleton.errors import ConfigurationError
from singleton.retry import Backoff

POSITIVE_INTEGERS = ("bulk_actions", "bulk_bytes", "concurrency", "copy_batch_size", "window_bytes")
POSITIVE_NUMBERS = (
    "request_timeout",
    "ttl",
    "gc_safety_factor",
    "retry_timeout",
    "target_bulk_seconds",
)


def check_numbers(listener: Any, cls: str) -> None:
    """Raise :class:`ConfigurationError` naming the first bad numeric option of ``listener``."""
    for opt in POSITIVE_INTEGERS:
        value = getattr(listener, opt)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigurationError(f"{cls}.{opt} must be an integer >= 1, got {value!r}")
    for opt in POSITIVE_NUMBERS:
        value = getattr(listener, opt)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise ConfigurationError(f"{cls}.{opt} must be a number > 0, got {value!r}")
    for opt in ("pipelined", "adaptive_batch"):
        if not isinstance(getattr(listener, opt), bool):
            raise ConfigurationError(
                f"{cls}.{opt} must be true or false, got {getattr(listener, opt)!r}"
            )
    wait = listener.handover_wait
    if isinstance(wait, bool) or not isinstance(wait, (int, float)) or not 0 <= wait < 1e9:
        raise ConfigurationError(f"{cls}.handover_wait must be a number >= 0, got {wait!r}")
    if listener.gc_safety_factor < 1:
        raise ConfigurationError(
            f"{cls}.gc_safety_factor must be >= 1, got {listener.gc_safety_factor!r}"
        )
    try:
        Backoff(listener.backoff_base, listener.backoff_max)
    except ConfigurationError as exc:
        raise ConfigurationError(f"{cls}.backoff_base / backoff_max: {exc}") from exc
