"""An optional audit trail of what a runner had acknowledged: evidence for the failover drill.

Pass an :class:`AuditLog` to :class:`~listeners.runner.ListenerRunner` (``audit=``; ``singleton
run`` opens one when ``SINGLETON_AUDIT_FILE`` is set) and the runner appends one JSON object per
line (one ``write(2)`` on an ``O_APPEND`` descriptor, so a SIGKILL leaves at most one torn last
line, which readers skip)::

    {"kind": "elected",    "token": 7, "identity": "replica-2", "mono": ..., "wall": ...}
    {"kind": "lost",       "token": 7, "reason": "released", ...}
    {"kind": "batch",      "token": 7, "n": 12, "ct": [1700000000, 3], "sent": ..., "mono": ...}
    {"kind": "checkpoint", "token": 7, "ct": [1700000000, 3], "sent": ..., "mono": ...}

``mono`` is ``time.monotonic()`` when the record was written (after the write was acknowledged),
``sent`` when the acknowledged operation began; Linux's ``CLOCK_MONOTONIC`` is shared by every
process of a machine (and is left alone by ``faketime`` with ``FAKETIME_DONT_FAKE_MONOTONIC=1``),
so records of different replicas can be ordered. ``wall`` is ``time.time()``, for display only.
``ct`` is the cluster time of the last event of the batch, or of the checkpoint.
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any


def ts_pair(ts: Any) -> list[int] | None:
    """A BSON ``Timestamp`` as ``[time, inc]`` (``None`` stays ``None``)."""
    return None if ts is None else [int(ts.time), int(ts.inc)]


class AuditLog:
    """Appends audit records to ``path`` (thread-safe)."""

    def __init__(self, path: str, identity: str = "") -> None:
        self.path = path
        self.identity = identity
        self._fd: int | None = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._lock = threading.Lock()

    @staticmethod
    def now() -> float:
        return time.monotonic()

    def record(self, kind: str, **fields: Any) -> None:
        entry = {"kind": kind, "identity": self.identity, **fields}
        entry["mono"] = time.monotonic()
        entry["wall"] = time.time()
        line = (json.dumps(entry, default=str) + "\n").encode()
        with self._lock:
            if self._fd is not None:
                os.write(self._fd, line)

    def close(self) -> None:
        with self._lock:
            fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)
