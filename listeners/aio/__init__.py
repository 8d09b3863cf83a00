"""Change-stream listeners for asyncio applications: :class:`AsyncListenerRunner`."""

from __future__ import annotations

from listeners.aio.runner import AsyncListenerRunner

__all__ = ["AsyncListenerRunner"]
