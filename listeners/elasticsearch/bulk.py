"""Bulk writes with per-item results (elasticsearch-py ``streaming_bulk``'s model, with retries).

Every item ends in exactly one of: written (2xx), already newer (409 under external versioning,
counted as success), or dead-lettered (any other 4xx: it will never succeed, so it must not block
the stream). 429 / 5xx items and requests that got no answer are retried, alone, with bounded
exponential backoff and full jitter until ``retry_timeout``; after that :class:`SinkError` is
raised and the caller (the runner) retries the batch later. Re-sending is always safe: versions
make every write idempotent.

Memory is bounded: a :class:`BulkSession` holds at most ``concurrency`` requests in flight plus one
being filled, and :meth:`BulkSession.add` blocks while they are busy. Before every request the
``check`` callback runs (the listener passes ``ctx.check``), so a deposed leader stops writing.
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

from loguru import logger as _default_logger

from listeners.elasticsearch.transport import EsUnavailableError, Transport, error_text
from singleton.errors import SinkError

#: Item or request statuses worth retrying: overload, gateway trouble, unavailable shards.
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})


@dataclass(slots=True)
class BulkItem:
    """One bulk action: ``index`` (with ``source``) or ``delete``, under an external version."""

    op: str
    index: str
    doc_id: str
    version: int
    source: bytes | None = None
    #: What produced it (operation type, resume token...), kept for the dead-letter record.
    origin: dict[str, Any] = field(default_factory=dict)
    _encoded: bytes = b""

    def encoded(self, versioned: bool = True) -> bytes:
        """The action line (and source line) of this item; ``versioned=False`` is the drill's
        unsafe mode (last writer wins), never used by a fenced tenure."""
        if not self._encoded:
            meta: dict[str, dict[str, Any]] = {self.op: {"_index": self.index, "_id": self.doc_id}}
            if versioned:
                meta[self.op].update(version=self.version, version_type="external")
            line = json.dumps(meta, separators=(",", ":")).encode() + b"\n"
            if self.op == "index":
                line += (self.source or b"{}") + b"\n"
            self._encoded = line
        return self._encoded


@dataclass(frozen=True, slots=True)
class DeadLetter:
    item: BulkItem
    status: int
    reason: str


@dataclass
class BulkStats:
    items: int = 0
    written: int = 0
    conflicts: int = 0
    retried: int = 0
    dead: int = 0
    requests: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, **counts: int) -> None:
        with self._lock:
            for key, n in counts.items():
                setattr(self, key, getattr(self, key) + n)


Check = Callable[[], None]
#: ``wait(seconds) -> bool``: sleep interruptibly; True means "stop now" (then ``check`` raises).
Wait = Callable[[float], bool]
OnDead = Callable[[list[DeadLetter]], None]


class BulkWriter:
    """Sends :class:`BulkItem` batches. Owns a thread pool when ``concurrency > 1``."""

    def __init__(
        self,
        transport: Transport,
        *,
        on_dead: OnDead,
        max_actions: int = 1000,
        max_bytes: int = 5 * 1024 * 1024,
        flush_interval: float = 1.0,
        concurrency: int = 1,
        backoff_base: float = 0.05,
        backoff_max: float = 5.0,
        retry_timeout: float = 300.0,
        logger: Any = None,
        versioned: bool = True,
    ) -> None:
        self.transport = transport
        #: external versions on every action (False only in the drill's unfenced mode)
        self.versioned = versioned
        self.on_dead = on_dead
        self.max_actions = max_actions
        self.max_bytes = max_bytes
        self.flush_interval = flush_interval
        self.concurrency = concurrency
        self.backoff_base = backoff_base
        self.backoff_max = backoff_max
        self.retry_timeout = retry_timeout
        self.stats = BulkStats()
        self.log = logger or _default_logger
        self._pool: ThreadPoolExecutor | None = None

    def session(self, check: Check, wait_fn: Wait) -> BulkSession:
        return BulkSession(self, check, wait_fn)

    def executor(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.concurrency, thread_name_prefix="es-bulk")
        return self._pool

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    def send(self, items: list[BulkItem], check: Check, wait_fn: Wait) -> None:
        """Send ``items`` until each is written, already newer, or dead-lettered."""
        pending = items
        attempt = 0
        deadline = time.monotonic() + self.retry_timeout
        self.stats.add(items=len(items))
        while pending:
            check()
            pending, why = self._attempt(pending)
            if not pending:
                return
            attempt += 1
            self.stats.add(retried=len(pending))
            if time.monotonic() >= deadline:
                raise SinkError(
                    f"{len(pending)} bulk items still failing after {self.retry_timeout} s on "
                    f"{self.transport.description}: {why}"
                )
            delay = random.uniform(0, min(self.backoff_max, self.backoff_base * 2**attempt))
            self.log.info(
                "bulk: retrying {} items in {:.3f} s (attempt {}): {}",
                len(pending),
                delay,
                attempt,
                why,
            )
            if wait_fn(delay):
                check()

    def _attempt(self, pending: list[BulkItem]) -> tuple[list[BulkItem], str]:
        body = b"".join(item.encoded(self.versioned) for item in pending)
        self.stats.add(requests=1)
        try:
            status, resp = self.transport.request("POST", "/_bulk", body, ndjson=True)
        except EsUnavailableError as exc:
            return pending, str(exc)
        if status in RETRY_STATUSES:
            return pending, f"HTTP {status} {error_text(resp)}"
        if not 200 <= status < 300 or not isinstance(resp, dict):
            raise SinkError(
                f"bulk request refused by {self.transport.description}: HTTP {status} "
                f"{error_text(resp)}"
            )
        results = resp.get("items")
        if not isinstance(results, list) or len(results) != len(pending):
            raise SinkError(
                f"bulk answer from {self.transport.description} has "
                f"{len(results) if isinstance(results, list) else 'no'} items for {len(pending)}"
            )
        retry: list[BulkItem] = []
        dead: list[DeadLetter] = []
        written = conflicts = 0
        why = ""
        for item, result in zip(pending, results, strict=True):
            r = next(iter(result.values())) if isinstance(result, dict) and result else {}
            st = int(r.get("status", 0) or 0)
            if 200 <= st < 300 or (st == 404 and item.op == "delete"):
                # A delete of an absent document still records its version (a tombstone).
                written += 1
            elif st == 409:
                conflicts += 1
            elif st in RETRY_STATUSES or st == 0:
                retry.append(item)
                why = f"item HTTP {st} {error_text(r)}"
            else:
                dead.append(DeadLetter(item, st, error_text(r)))
        self.stats.add(written=written, conflicts=conflicts, dead=len(dead))
        if dead:
            for d in dead:
                self.log.warning(
                    "bulk: dead-lettering {} {}/{} (HTTP {}): {}",
                    d.item.op,
                    d.item.index,
                    d.item.doc_id,
                    d.status,
                    d.reason,
                )
            self.on_dead(dead)
        return retry, why


class BulkSession:
    """Collects items and sends them in requests flushed by count, bytes or age; at most
    ``concurrency`` requests in flight. Call :meth:`finish` to wait for all of them."""

    def __init__(self, writer: BulkWriter, check: Check, wait_fn: Wait) -> None:
        self.w = writer
        self.check = check
        self.wait_fn = wait_fn
        self._buf: list[BulkItem] = []
        self._bytes = 0
        self._first = 0.0
        self._inflight: set[Future[None]] = set()

    def add(self, item: BulkItem) -> None:
        if not self._buf:
            self._first = time.monotonic()
        self._buf.append(item)
        self._bytes += len(item.encoded(self.w.versioned))
        if (
            len(self._buf) >= self.w.max_actions
            or self._bytes >= self.w.max_bytes
            or time.monotonic() - self._first >= self.w.flush_interval
        ):
            self.flush()

    def flush(self) -> None:
        if not self._buf:
            return
        chunk, self._buf, self._bytes = self._buf, [], 0
        if self.w.concurrency <= 1:
            self.w.send(chunk, self.check, self.wait_fn)
            return
        while len(self._inflight) >= self.w.concurrency:
            self._reap(FIRST_COMPLETED)
        self._inflight.add(self.w.executor().submit(self.w.send, chunk, self.check, self.wait_fn))

    def _reap(self, how: str) -> None:
        done, self._inflight = wait(self._inflight, return_when=how)
        for fut in done:
            exc = fut.exception()
            if exc is not None:
                self._reap_all_quietly()
                raise exc

    def _reap_all_quietly(self) -> None:
        if self._inflight:
            wait(self._inflight)
            self._inflight = set()

    def finish(self) -> None:
        """Send what is buffered and wait until every item is settled (raises the first error)."""
        self.flush()
        while self._inflight:
            self._reap("ALL_COMPLETED")
