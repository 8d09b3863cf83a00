"""In-process fan-out of release notifications to :meth:`LeaseBackend.wait_for_release` callers."""

from __future__ import annotations

import threading


class _Waiter:
    __slots__ = ("event", "fired")

    def __init__(self, event: threading.Event) -> None:
        self.event = event
        self.fired = False


class ReleaseNotifier:
    """Waiters register an event per lease name; :meth:`notify` sets them all."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiters: dict[str, set[_Waiter]] = {}

    def notify(self, name: str) -> None:
        with self._lock:
            waiters = list(self._waiters.get(name, ()))
        for waiter in waiters:
            waiter.fired = True
            waiter.event.set()

    def has_waiters(self, name: str | None = None) -> bool:
        with self._lock:
            if name is None:
                return any(self._waiters.values())
            return bool(self._waiters.get(name))

    def wait(self, name: str, timeout: float, wake: threading.Event | None = None) -> bool:
        waiter = _Waiter(wake if wake is not None else threading.Event())
        with self._lock:
            self._waiters.setdefault(name, set()).add(waiter)
        try:
            waiter.event.wait(max(0.0, timeout))
            return waiter.fired
        finally:
            with self._lock:
                bucket = self._waiters.get(name)
                if bucket is not None:
                    bucket.discard(waiter)
                    if not bucket:
                        del self._waiters[name]
