"""Standby readiness: could this follower take over right now?

On a follower, every ``interval`` seconds: can the saved token still be resumed (open and close a
stream with it), and how far is the checkpoint from the oldest oplog entry? Warns when the
headroom is below ``headroom_warning`` of the oplog window.

Failure model: none of this is on the safety path. It only reads, every call is bounded, any
error becomes part of the result, and the result is advice for operators
(``ListenerRunner.status().standby``). Limitation: the window is measured in seconds between
the oldest and newest oplog entries; a burst of writes can shrink it faster than one
``interval``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pymongo
from loguru import logger

from listeners.stream.reader import StartPosition, oplog_bounds, watch
from singleton.clock import SYSTEM_CLOCK, Clock
from singleton.drivers.mongo import classify
from singleton.stdlog import seconds

if TYPE_CHECKING:
    from listeners.base import ChangeStreamListener
    from listeners.checkpoints.stores import Checkpoint, CheckpointStore

#: Bound on one whole check (it runs off the safety path, so it may take longer than a read).
CHECK_TIMEOUT = 10.0


class StandbyChecker:
    """Runs the check in its own thread while ``is_leading()`` is false, until ``stopping``.
    ``on_seen`` is told of every checkpoint found, so that the runner knows one existed (a
    claim that later finds none reports it as disappeared)."""

    # Built by the runner alone, from what it already holds: a settings value would only rename it.
    def __init__(  # noqa: PLR0913
        self,
        client: Any,
        checkpoints: CheckpointStore,
        listener: ChangeStreamListener,
        *,
        interval: float | None,
        headroom_warning: float,
        is_leading: Callable[[], bool],
        stopping: threading.Event,
        clock: Clock = SYSTEM_CLOCK,
        on_seen: Callable[[Checkpoint], None] = lambda _cp: None,
    ) -> None:
        self._on_seen = on_seen
        self._sources = (client, checkpoints, listener)
        self.interval, self.headroom_warning = interval, headroom_warning
        self._is_leading, self._stopping, self._clock = is_leading, stopping, clock
        self._result: dict[str, Any] = {"checked_at": None}
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self.interval is None or self._thread is not None:
            return
        self._thread = threading.Thread(
            target=self._loop, name=f"listener-standby-{self._sources[2].name}", daemon=True
        )
        self._thread.start()

    def stop(self, timeout: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def result(self) -> dict[str, Any]:
        return dict(self._result)

    def _loop(self) -> None:
        assert self.interval is not None
        while True:
            if not self._is_leading():
                try:
                    self.check()
                except Exception as exc:  # advice only: never let it kill the thread
                    logger.warning("standby check failed: listener={}: {!r}", self._sources[2], exc)
            if self._stopping.wait(self.interval):
                return

    def check(self) -> dict[str, Any]:
        """Run one check now and return (and keep) its result."""
        _, checkpoints, listener = self._sources
        with pymongo.timeout(CHECK_TIMEOUT):
            cp = checkpoints.load(listener.lease_name)
            result: dict[str, Any] = {
                "checked_at": self._clock.time(),
                "checkpoint_cluster_time": None if cp is None else cp.cluster_time,
                "resumable": None,
                "error": None,
                "oplog_headroom_seconds": None,
                "oplog_window_seconds": None,
                "at_risk": False,
            }
            if cp is not None:
                self._on_seen(cp)
                self._try_resume(cp, result)
                self._measure_headroom(cp, result)
                self._warn(cp, result)
        self._result = result
        return result

    def _try_resume(self, cp: Checkpoint, result: dict[str, Any]) -> None:
        client, _, listener = self._sources
        try:
            with watch(client, listener, StartPosition.of(cp), max_await_time=0.001):
                pass
            result["resumable"] = True
        except Exception as exc:
            result["resumable"] = False if classify(exc) == "history_lost" else None
            result["error"] = f"{type(exc).__name__}: {exc}"

    def _measure_headroom(self, cp: Checkpoint, result: dict[str, Any]) -> None:
        try:
            bounds = oplog_bounds(self._sources[0])
        except Exception as exc:
            result["error"] = result["error"] or f"oplog unreadable: {exc}"
            return
        if bounds is not None:
            oldest, newest = bounds
            headroom = cp.cluster_time.time - oldest.time
            window = newest.time - oldest.time
            result["oplog_headroom_seconds"] = headroom
            result["oplog_window_seconds"] = window
            result["at_risk"] = headroom < self.headroom_warning * window

    def _warn(self, cp: Checkpoint, result: dict[str, Any]) -> None:
        if result["resumable"] is False or result["at_risk"]:
            logger.warning(
                "standby: checkpoint of listener={} at {} is {} (oplog headroom {} of {})",
                cp.name,
                cp.cluster_time,
                "no longer resumable" if result["resumable"] is False else "close to expiry",
                seconds(result["oplog_headroom_seconds"]),
                seconds(result["oplog_window_seconds"]),
            )
