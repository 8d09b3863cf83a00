"""singleton for asyncio applications: the same election, from the same state machine.

``AsyncElector`` drives :class:`~singleton.election.machine.Election` (the rules the thread
:class:`~singleton.Elector` runs) with awaited calls to an asyncio lease backend:
``AsyncRedisLeaseBackend`` (``redis.asyncio``) or ``AsyncMongoLeaseBackend`` (pymongo's
``AsyncMongoClient``). The backends import their drivers only when first named.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from singleton.aio.elector import AsyncElector, AsyncElectorOptions, Work
from singleton.aio.leases import AsyncLeases

if TYPE_CHECKING:
    from singleton.aio.mongo import AsyncMongoLeaseBackend
    from singleton.aio.redis import AsyncRedisLeaseBackend

__all__ = [
    "AsyncElector",
    "AsyncElectorOptions",
    "AsyncLeases",
    "AsyncMongoLeaseBackend",
    "AsyncRedisLeaseBackend",
    "Work",
]

_LAZY = {
    "AsyncRedisLeaseBackend": "singleton.aio.redis",
    "AsyncMongoLeaseBackend": "singleton.aio.mongo",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'singleton.aio' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
