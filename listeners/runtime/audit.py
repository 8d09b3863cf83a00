"""An optional audit trail of what a runner had acknowledged: evidence for the failover drill.

Pass an :class:`AuditLog` to :class:`~listeners.runtime.runner.ListenerRunner` (``audit=``;
``singleton
run`` opens one when ``SINGLETON_AUDIT_FILE`` is set) and the runner appends one JSON object per
line (one ``write(2)`` on an ``O_APPEND`` descriptor, so a SIGKILL leaves at most one torn last
line, which readers skip)::

    {"kind": "elected",    "token": 7, "identity": "replica-2", "mono": ..., "wall": ...}
    {"kind": "lost",       "token": 7, "reason": "released", ...}
    {"kind": "released",   "token": 7, "ok": true, ...}     (the lease was given back)
    {"kind": "batch",      "token": 7, "n": 12, "ct": [1700000000, 3], "sent": ..., "mono": ...}
    {"kind": "checkpoint", "token": 7, "ct": [1700000000, 3], "sent": ..., "mono": ...}

``mono`` is ``time.monotonic()`` when the record was written (after the write was acknowledged),
``sent`` when the acknowledged operation began; Linux's ``CLOCK_MONOTONIC`` is shared by every
process of a machine (and is left alone by ``faketime`` with ``FAKETIME_DONT_FAKE_MONOTONIC=1``),
so records of different replicas can be ordered. ``wall`` is ``time.time()``, for display only.
``ct`` is the cluster time of the last event of the batch, or of the checkpoint. A replica hosting
several leases gives each runner :meth:`AuditLog.bound` to its lease, so that every record also
carries ``"lease": "<name>"`` (tokens and positions are comparable only within one lease).
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


class _File:
    """The descriptor every view of one audit file shares (closed once, by its owner)."""

    def __init__(self, path: str) -> None:
        self.fd: int | None = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self.lock = threading.Lock()


class AuditLog:
    """Appends audit records to ``path`` (thread-safe)."""

    def __init__(self, path: str, identity: str = "", *, _file: _File | None = None) -> None:
        self.path = path
        self.identity = identity
        #: only the log that opened the file closes it
        self._owner = _file is None
        self._file = _file or _File(path)
        self._fields: dict[str, Any] = {}

    def bound(self, lease: str) -> AuditLog:
        """A view of this log whose records also carry ``"lease": lease`` (same file; closing
        the view does nothing, closing this log closes the file for every view)."""
        view = AuditLog(self.path, self.identity, _file=self._file)
        view._fields = {**self._fields, "lease": lease}
        return view

    @staticmethod
    def now() -> float:
        return time.monotonic()

    def record(self, kind: str, **fields: Any) -> None:
        entry = {"kind": kind, "identity": self.identity, **self._fields, **fields}
        entry["mono"] = time.monotonic()
        entry["wall"] = time.time()
        line = (json.dumps(entry, default=str) + "\n").encode()
        with self._file.lock:
            if self._file.fd is not None:
                os.write(self._file.fd, line)

    def close(self) -> None:
        if not self._owner:
            return
        with self._file.lock:
            fd, self._file.fd = self._file.fd, None
        if fd is not None:
            os.close(fd)
