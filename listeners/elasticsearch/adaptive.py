"""The stream batch size of :class:`~listeners.elasticsearch.ElasticsearchSync`, adapted to what
the sink's bulk requests measure (additive increase, multiplicative decrease).

One stream batch fills one bulk request, so the batch size is the request size. The configured
``batch_size`` is the ceiling and the start: a healthy sink never sees a smaller request than
before. Every bulk request then reports its items, bytes, seconds and whether the sink pushed
back (HTTP 429, a 5xx, a timeout, or items to retry):

- pushed back, or slower than ``target_bulk_seconds`` (default 5 s: trouble, not a big
  request): the size halves (not below :data:`FLOOR`), at most once per request latency - the
  requests already in flight were sized before the cut and must not cut it again;
- answered in time and at least half full: the size grows by a twentieth of the ceiling.

And whatever AIMD says, a batch is at most as many events as fit ``bulk_bytes`` at the mean
event size measured so far, so that a batch of large documents is one request rather than a
request and a remainder.

Failure model: none of this decides what is written or acknowledged, only how many events the
next batch may hold; a wrong size costs throughput, never correctness.
"""

from __future__ import annotations

import threading

from loguru import logger

#: The smallest batch the sizer goes down to.
FLOOR = 50
#: Weight of the newest request in the mean bytes per item.
ALPHA = 0.2


class BatchSizer:
    """AIMD over the batch size within ``[min(FLOOR, ceiling), ceiling]`` (see the module). It
    reads no clock: each answer says when it came (on the bulk writer's clock)."""

    def __init__(self, ceiling: int, *, target: float, max_bytes: int, name: str = "") -> None:
        self.ceiling = ceiling
        self.floor = min(FLOOR, ceiling)
        self.target = target
        self.max_bytes = max_bytes
        self._name = name
        self._size = ceiling
        self._step = max(1, ceiling // 20)
        self._item_bytes: float | None = None
        self._quiet_until = float("-inf")
        self._lock = threading.Lock()
        #: How often the size was cut (each cut is also logged at INFO).
        self.cuts = 0

    @property
    def size(self) -> int:
        """Events the next batch may hold."""
        size = self._size
        if self._item_bytes:
            size = min(size, max(self.floor, int(self.max_bytes // self._item_bytes)))
        return size

    def observe(
        self, items: int, nbytes: int, seconds: float, pushed_back: bool, at: float
    ) -> None:
        """One bulk request of ``items`` (``nbytes``) answered after ``seconds``, at monotonic
        time ``at``; thread-safe."""
        if items <= 0:
            return
        with self._lock:
            per_item = nbytes / items
            self._item_bytes = (
                per_item
                if self._item_bytes is None
                else self._item_bytes + ALPHA * (per_item - self._item_bytes)
            )
            if pushed_back or seconds > self.target:
                if at < self._quiet_until:
                    return
                before, self._size = self._size, max(self.floor, self._size // 2)
                self._quiet_until = at + seconds
                if self._size < before:
                    self.cuts += 1
                    logger.info(
                        "bulk: batch size {} -> {} for {} ({} in {:.3f} s, target {} s)",
                        before,
                        self._size,
                        self._name,
                        "pushed back" if pushed_back else f"{items} items",
                        seconds,
                        self.target,
                    )
            elif items * 2 >= self._size:
                self._size = min(self.ceiling, self._size + self._step)
