"""What happened during a drill, recorded as it happens.

* :class:`Sampler` polls the lease store (who holds the faults' lease, with which token) every
  ``lease_interval`` and the checkpoint store (every listener lease's checkpoint) every
  ``checkpoint_interval``, on the drill's own direct connections, and keeps every change with its
  ``time.monotonic()``.
* :class:`AuditTail` reads the replicas' audit files (:mod:`listeners.runtime.audit`) incrementally.
* :func:`raw_stream_rate` reads the change stream with pymongo alone, the stand-in's own speed,
  printed next to the replicas' lag.

Both keep plain tuples and dicts so that a failed run can be saved as JSON and replayed.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from loguru import logger

from singleton.lease.contract import LeaseState

#: (monotonic time, identity or None, token or None); identity "?" when the store did not answer
LeaseSample = tuple[float, str | None, int | None]
#: (monotonic time, fencing token, [cluster time, increment])
CheckpointSample = tuple[float, int, list[int]]


class Sampler:
    """Polls ``inspect()`` and ``load_checkpoint(name)`` for each of ``checkpoints`` in a
    thread until :meth:`stop`."""

    def __init__(
        self,
        inspect: Callable[[], LeaseState | None],
        load_checkpoint: Callable[[str], Any],
        checkpoints: Sequence[str],
        lease_interval: float = 0.02,
        checkpoint_interval: float = 0.1,
    ) -> None:
        self._inspect = inspect
        self._load = load_checkpoint
        self._intervals = (lease_interval, checkpoint_interval)
        self.leases: list[LeaseSample] = []
        #: checkpoint name -> its changes
        self.checkpoints: dict[str, list[CheckpointSample]] = {n: [] for n in checkpoints}
        self.errors = 0
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._poll_leases, name="drill-lease-sampler", daemon=True),
            threading.Thread(target=self._poll_checkpoints, name="drill-cp-sampler", daemon=True),
        ]

    def start(self) -> Sampler:
        for t in self._threads:
            t.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(10)

    def _poll_leases(self) -> None:
        last: tuple[str | None, int | None] | None = None
        while not self._stop.is_set():
            try:
                state = self._inspect()
                now: tuple[str | None, int | None] = (
                    (None, None) if state is None else (state.identity, state.token)
                )
            except Exception as exc:  # the store is down or paused: that is part of the drill
                logger.debug("lease sample failed: {}", exc)
                self.errors += 1
                now = ("?", None)
            if now != last:
                self.leases.append((time.monotonic(), *now))
                last = now
            self._stop.wait(self._intervals[0])

    def _poll_checkpoints(self) -> None:
        last: dict[str, tuple[int, list[int]]] = {}
        while not self._stop.is_set():
            for name, samples in self.checkpoints.items():
                try:
                    cp = self._load(name)
                except Exception as exc:
                    logger.debug("checkpoint sample failed: {}", exc)
                    cp = None
                if cp is not None:
                    now = (int(cp.fencing_token), [cp.cluster_time.time, cp.cluster_time.inc])
                    if now != last.get(name):
                        samples.append((time.monotonic(), *now))
                        last[name] = now
            self._stop.wait(self._intervals[1])


def raw_stream_rate(coll: Any, since: tuple[int, int] | None, limit: int) -> dict[str, Any]:
    """Events per second pymongo alone reads from ``coll``'s change stream, from cluster time
    ``since`` until ``limit`` events or a ``getMore`` that comes back empty."""
    from bson.timestamp import Timestamp

    if since is None:
        return {"events": 0, "seconds": None, "per_s": None}
    n = 0
    started = time.monotonic()
    try:
        with coll.watch(
            start_at_operation_time=Timestamp(*since), max_await_time_ms=200, batch_size=1000
        ) as stream:
            while n < limit and stream.try_next() is not None:
                n += 1
    except Exception as exc:  # the position left the oplog: report no figure, not a failure
        logger.warning("raw stream rate not measured: {}", exc)
        return {"events": n, "seconds": None, "per_s": None}
    seconds = time.monotonic() - started
    return {
        "events": n,
        "seconds": round(seconds, 3),
        "per_s": round(n / seconds, 1) if seconds > 0 else None,
    }


class AuditTail:
    """Every record of every audit file so far; :meth:`poll` reads what was appended since."""

    def __init__(self, paths: Iterable[Path]) -> None:
        self._offsets = {Path(p): 0 for p in paths}
        self._partial: dict[Path, bytes] = {}
        self.records: list[dict[str, Any]] = []
        self._lock = threading.Lock()

    def poll(self) -> list[dict[str, Any]]:
        """Read new complete lines; returns the new records (a torn last line waits)."""
        new: list[dict[str, Any]] = []
        with self._lock:
            for path, offset in self._offsets.items():
                try:
                    with open(path, "rb") as f:
                        f.seek(offset)
                        data = f.read()
                except FileNotFoundError:
                    continue
                self._offsets[path] = offset + len(data)
                data = self._partial.pop(path, b"") + data
                lines = data.split(b"\n")
                if lines[-1]:
                    self._partial[path] = lines[-1]
                for line in lines[:-1]:
                    try:
                        new.append(json.loads(line))
                    except ValueError:
                        continue  # torn by a SIGKILL mid-write
            self.records.extend(new)
        return new

    def latest(
        self, kind: str, token: int | None = None, lease: str | None = None
    ) -> dict[str, Any] | None:
        """The newest record of ``kind`` (of ``token``, of ``lease``, when given)."""
        with self._lock:
            for rec in reversed(self.records):
                if (
                    rec.get("kind") == kind
                    and (token is None or rec.get("token") == token)
                    and (lease is None or rec.get("lease") == lease)
                ):
                    return dict(rec)
        return None
