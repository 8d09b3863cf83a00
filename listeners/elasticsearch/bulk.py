"""Bulk writes with per-item results (elasticsearch-py ``streaming_bulk``'s model, with retries).

Every item ends in exactly one of: written (2xx), already newer (409 under external versioning,
counted as success), or dead-lettered: only a rejection of *that document* (a mapping or parse
error, an invalid or too long id, a document too large: a 4xx other than those below), which will
never succeed and so must not block the stream.

Everything else is about the sink, not the document, and is never dead-lettered:

* 429 / 5xx items, 429 / 5xx answers to the whole request, and requests that got no answer
  (connection refused, timeout) are retried, the failing items alone, with the bounded,
  jittered backoff of every retry loop (:class:`singleton.retry.Backoff`), ``check()`` before
  each attempt, for ``retry_timeout``; then :class:`SinkUnavailableError` is raised and the
  runner retries the batch in place within its failure budget.
* any other failed answer to the whole request (401, 403, a 400 about the request) and items
  refused for a reason that holds for every document (401, 403, a missing index) raise
  :class:`SinkRejectedError` at once: the tenure fails and resigns the lease.

Re-sending is always safe: versions make every write idempotent.

Memory is bounded: a :class:`BulkSession` holds at most ``concurrency`` requests in flight plus one
being filled, and :meth:`BulkSession.add` blocks while they are busy. Before every request the
``check`` callback runs (the listener passes ``ctx.check``), so a deposed leader stops writing.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from json.encoder import encode_basestring_ascii as _string
from types import MappingProxyType
from typing import Any, NamedTuple, cast

from loguru import logger as _default_logger

from listeners.elasticsearch.transport import (
    RETRY_STATUSES,
    Transport,
    error_text,
    request_error,
)
from singleton.clock import SYSTEM_CLOCK, Clock
from singleton.errors import (
    EsUnavailableError,
    SinkLostError,
    SinkRejectedError,
    SinkUnavailableError,
)
from singleton.retry import Backoff

__all__ = ["RETRY_STATUSES", "BulkItem", "BulkLimits", "BulkStats", "BulkWriter", "DeadLetter"]

#: Only what the answer is read for: the items' statuses and errors (a far smaller answer to
#: parse than the full one; servers that ignore ``filter_path`` give the full one, also fine).
_BULK_PATH = "/_bulk?filter_path=errors,items.*.status,items.*.error"
#: Item statuses that concern every document alike: the whole tenure fails (see above).
_SINK_REFUSALS = frozenset({401, 403})
#: The same request for a target known to be an alias: an alias removed under the listener is
#: then a 404, never an index Elasticsearch creates on the fly in its place.
_BULK_ALIAS_PATH = _BULK_PATH + "&require_alias=true"
#: And with each item's physical index, for a target whose physical index is watched (a
#: partition's: another partition may have replaced a deleted index behind the alias).
_BULK_WATCHED_PATH = _BULK_PATH + ",items.*._index&require_alias=true"
#: Item errors about the target index itself, which every document meets alike: a closed index,
#: a (read-only, disk) block, an alias without a write index. The sink's failure, never a dead
#: letter: retried as a sink that is down, within the tenure's failure budget.
_INDEX_REFUSALS = frozenset({"index_closed_exception", "cluster_block_exception"})
#: How a retried item's reason ends when every document meets it (a block the disk's flood
#: stage put on: a 429): each retry of it says so at WARNING, not at INFO.
_BLOCKED = " (a block every document meets: free the disk, or lift the block)"


#: An action line after its head (:func:`action_head`) and id, then the source line, if any.
_VERSIONED = b'%s%s,"version":%d,"version_type":"external"}}\n%s'
_UNVERSIONED = b"%s%s}}\n%s"
#: An index action's two lines after the head, from the quoted id, version and source, in one
#: formatting (:func:`index_lines`).
INDEX_VERSIONED = b'%s%s,"version":%d,"version_type":"external"}}\n%s\n'
#: What an item made by :func:`copy` or by the stream was made from (empty: not told).
_NO_ORIGIN: Mapping[str, Any] = MappingProxyType({})


@functools.lru_cache(maxsize=64)
def action_head(op: str, index: str) -> bytes:
    """``{"index":{"_index":"<index>","_id":``: the same for every item of one batch."""
    return f'{{"{op}":{{"_index":{_string(index)},"_id":'.encode()


def quoted_id(doc_id: str) -> bytes:
    """``doc_id`` as a JSON string, as the action line holds it."""
    return _string(doc_id).encode()


def encode_lines(
    op: str, index: str, doc_id: str, version: int, source: bytes | None, versioned: bool
) -> bytes:
    """The action line of ``op`` on ``index``/``doc_id`` at ``version`` and, for ``index``, the
    source line (``{}`` without a ``source``); ``versioned=False`` is the drill's unsafe mode
    (last writer wins), never used by a fenced tenure. Built as bytes, the same JSON
    ``json.dumps`` gives, keys in the same order (one ``json.dumps`` per item cost as much as
    its source)."""
    if op == "index" and source is not None and versioned:
        return index_lines(index, doc_id, version, source, True)
    head, doc = action_head(op, index), quoted_id(doc_id)
    body = b"%s\n" % (source or b"{}") if op == "index" else b""
    if versioned:
        return _VERSIONED % (head, doc, int(version), body)
    return _UNVERSIONED % (head, doc, body)


def index_lines(index: str, doc_id: str, version: int, source: bytes, versioned: bool) -> bytes:
    """:func:`encode_lines` of an index action with ``source``, in one formatting."""
    head = action_head("index", index)
    if versioned:
        return INDEX_VERSIONED % (head, quoted_id(doc_id), int(version), source)
    return _UNVERSIONED % (head, quoted_id(doc_id), b"%s\n" % source)


class BulkItem(NamedTuple):
    """One bulk action: ``index`` (with ``source``) or ``delete``, under an external version.

    A tuple, so that the stream makes one per event with :data:`new_item`, without a Python-level
    constructor. Items made by the listener carry their encoded ``lines`` (:func:`encode_lines`),
    built once and reused by every request that carries them; the stream's carry no ``source``
    besides (a batch's sources then live once, in the lines: :meth:`source_json` reads one
    back)."""

    op: str
    index: str  # type: ignore[assignment]  # (shadows tuple.index: the bulk target)
    doc_id: str
    version: int
    source: bytes | None = None
    #: What produced it (operation type, resume token...), kept for the dead-letter record.
    origin: Mapping[str, Any] = _NO_ORIGIN
    lines: bytes = b""
    #: The resume token of the change event it mirrors, when ``origin`` does not hold it (the
    #: stream's commonest items share one ``origin`` per operation type: a dict less per event).
    token: Any = None

    def encoded(self, versioned: bool = True) -> bytes:
        """:attr:`lines`, or the lines :func:`encode_lines` gives (see there for
        ``versioned``)."""
        if self.lines:
            return self.lines
        return encode_lines(self.op, self.index, self.doc_id, self.version, self.source, versioned)

    def event_token(self) -> Any:
        """The resume token of the change event that made it (``None``: a copied document)."""
        return self.origin.get("token") if self.token is None else self.token

    def source_json(self) -> bytes | None:
        """The JSON source of an index action (``None`` for a delete, or an index item made
        without one): :attr:`source`, else the second of its encoded lines."""
        if self.op != "index" or self.source is not None or not self.lines:
            return self.source
        return self.lines.split(b"\n", 2)[1]


#: ``new_item((op, index, doc_id, version, source, origin, lines, token))``: a
#: :class:`BulkItem` of all its fields, made by ``tuple.__new__`` (C) rather than the generated
#: ``__new__`` (a Python call, 3,000 instructions a dataclass's ``__init__`` took per event).
new_item = cast(
    "Callable[[tuple[str, str, str, int, bytes | None, Mapping[str, Any], bytes, Any]], BulkItem]",
    functools.partial(tuple.__new__, BulkItem),
)


@dataclass(frozen=True, slots=True)
class DeadLetter:
    item: BulkItem
    status: int
    reason: str


class BulkStats:
    """What a writer did, summed over every request: ``items`` handed to it, ``written``,
    ``conflicts`` (409: the index already held a newer version), ``retried``, ``dead``
    (dead-lettered), ``requests`` sent and their body bytes (``sent_bytes``, retries included),
    and sends that raised SinkUnavailableError (``unavailable``) or SinkRejectedError
    (``rejected``). :meth:`add` is thread-safe."""

    def __init__(self) -> None:
        self.items = self.written = self.conflicts = self.retried = self.dead = self.requests = 0
        self.unavailable = self.rejected = self.sent_bytes = 0
        self._lock = threading.Lock()

    def errors_by_kind(self) -> dict[str, int]:
        """What ``/metrics`` shows as ``singleton_sink_errors_total{kind}``
        (docs/reference/metrics.md)."""
        with self._lock:
            return {"unavailable": self.unavailable, "rejected": self.rejected,
                    "item_retried": self.retried, "item_conflict": self.conflicts,
                    "dead_lettered": self.dead}  # fmt: skip

    def add(self, **counts: int) -> None:
        with self._lock:
            for key, n in counts.items():
                setattr(self, key, getattr(self, key) + n)

    def __repr__(self) -> str:
        counts = ", ".join(f"{k}={v}" for k, v in vars(self).items() if not k.startswith("_"))
        return f"BulkStats({counts})"


@dataclass(frozen=True)
class BulkLimits:
    """When a request goes out (``bulk_actions`` items, ``bulk_bytes`` bytes or
    ``flush_interval`` seconds after its first item), how many are in flight (``concurrency``),
    and how failing items are retried (backoff from ``backoff_base`` to ``backoff_max``, for at
    most ``retry_timeout`` seconds). Named as the listener's options that set them."""

    bulk_actions: int
    bulk_bytes: int
    flush_interval: float
    concurrency: int
    backoff_base: float
    backoff_max: float
    retry_timeout: float


Check = Callable[[], None]
#: ``wait(seconds) -> bool``: sleep interruptibly; True means "stop now" (then ``check`` raises).
Wait = Callable[[float], bool]
OnDead = Callable[[list[DeadLetter]], None]
#: ``observe(items, bytes, seconds, pushed_back, at)``: told of every bulk request's answer
#: (``at``: when it came, on the writer's clock).
Observe = Callable[[int, int, float, bool, float], None]


class BulkWriter:
    """Sends :class:`BulkItem` batches. Owns a thread pool when ``concurrency > 1``. Every
    deadline (``retry_timeout``, ``flush_interval``) is read from ``clock``; ``stats`` (default: a
    fresh one) is where it counts what it did."""

    def __init__(
        self,
        transport: Transport,
        limits: BulkLimits,
        *,
        on_dead: OnDead,
        logger: Any = None,
        versioned: bool = True,
        observe: Observe | None = None,
        clock: Clock = SYSTEM_CLOCK,
        stats: BulkStats | None = None,
    ) -> None:
        self.transport = transport
        self.observe = observe
        self.limits = limits
        self.on_dead = on_dead
        #: external versions on every action (False only in the drill's unfenced mode)
        self.versioned = versioned
        self.clock = clock
        self.stats = stats if stats is not None else BulkStats()
        self.log = logger or _default_logger
        #: targets known to be aliases (the index keeper adds them): written with
        #: ``require_alias``
        self.aliases: set[str] = set()
        #: alias -> the physical indexes it pointed to when the tenure found it: a write that
        #: lands elsewhere means the index was replaced under the listener (a partition's)
        self.watched: dict[str, frozenset[str]] = {}
        self._pool: ThreadPoolExecutor | None = None

    def session(self, check: Check, wait_fn: Wait) -> BulkSession:
        return BulkSession(self, check, wait_fn)

    def executor(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.limits.concurrency, thread_name_prefix="es-bulk")
        return self._pool

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    def send(self, items: list[BulkItem], check: Check, wait_fn: Wait) -> None:
        """Send ``items`` until each is written, already newer, or dead-lettered."""
        pending = items
        backoff = Backoff(self.limits.backoff_base, self.limits.backoff_max)
        deadline = self.clock.monotonic() + self.limits.retry_timeout
        self.stats.add(items=len(items))
        while True:
            check()
            try:
                pending, why = self._attempt(pending)
            except (SinkUnavailableError, SinkRejectedError) as exc:
                rejected = isinstance(exc, SinkRejectedError)
                self.stats.add(rejected=int(rejected), unavailable=int(not rejected))
                raise
            if not pending:
                return
            self.stats.add(retried=len(pending))
            if self.clock.monotonic() >= deadline:
                self.stats.add(unavailable=1)
                raise SinkUnavailableError(
                    f"{len(pending)} bulk items still failing after {self.limits.retry_timeout} s "
                    f"on {self.transport.description}: {why}"
                )
            delay = backoff.next()
            say = self.log.warning if why.endswith(_BLOCKED) else self.log.info
            say(
                "bulk: retrying {} items in {:.3f} s (attempt {}): {}",
                len(pending),
                delay,
                backoff.attempts,
                why,
            )
            if wait_fn(delay):
                check()

    def _attempt(self, pending: list[BulkItem]) -> tuple[list[BulkItem], str]:
        """One request for ``pending``: the items to retry, and why."""
        versioned = self.versioned
        body = b"".join([item.lines or item.encoded(versioned) for item in pending])
        self.stats.add(requests=1, sent_bytes=len(body))
        started = self.clock.monotonic()
        retry, why = self._request(pending, body)
        if self.observe is not None:
            at = self.clock.monotonic()
            self.observe(len(pending), len(body), at - started, bool(retry), at)
        return retry, why

    def _request(self, pending: list[BulkItem], body: bytes) -> tuple[list[BulkItem], str]:
        try:
            targets = {item.index for item in pending}  # (a shaped listener's: several)
            aliased = bool(targets & self.aliases)
            # A delete with an external version makes Elasticsearch create a missing index,
            # and ``require_alias`` does not hold for deletes: a bulk of deletes alone
            # through an alias that is gone is acknowledged into a new plain index of the
            # alias's name. Such a bulk asks where each item landed. (In a bulk with any
            # other action, that action is refused as not written through an alias.)
            landed = any(target in self.watched for target in targets) or (
                aliased and all(item.op == "delete" for item in pending)
            )
            path = _BULK_PATH
            if landed:
                path = _BULK_WATCHED_PATH
            elif aliased:
                path = _BULK_ALIAS_PATH
            status, resp = self.transport.request("POST", path, body, ndjson=True)
        except EsUnavailableError as exc:
            return pending, str(exc)
        if status in RETRY_STATUSES or status >= 500:
            return pending, f"HTTP {status} {error_text(resp)}"
        if not 200 <= status < 300:
            raise request_error(status, resp, f"bulk request to {self.transport.description}")
        results = resp.get("items") if isinstance(resp, dict) else None
        if not isinstance(results, list) or len(results) != len(pending):
            raise SinkUnavailableError(
                f"bulk answer from {self.transport.description} has "
                f"{len(results) if isinstance(results, list) else 'no'} items for {len(pending)}"
            )
        if landed:
            self._check_landed(pending, results)
        if resp.get("errors") is False:  # every item written (a 404 delete too): no loop
            self.stats.add(written=len(pending))
            return [], ""
        return self._settle(pending, results)

    def _check_landed(self, pending: list[BulkItem], results: list[Any]) -> None:
        """Raise :class:`SinkLostError` if a write through an alias landed in a plain index of
        the alias's name (one Elasticsearch made for a delete), or, through a watched alias,
        outside what that alias pointed to (each item against its own alias: a shaped
        listener's bulk mixes several): the index was deleted, and maybe made anew by another
        partition, under this tenure."""
        for item, result in zip(pending, results, strict=True):
            r = next(iter(result.values())) if isinstance(result, dict) and result else {}
            landed = r.get("_index")
            st = int(r.get("status", 0) or 0)
            # (a refusal names the alias; a delete of an absent document names its index)
            written = 200 <= st < 300 or (st == 404 and item.op == "delete")
            if not written or not isinstance(landed, str):
                continue
            if landed == item.index and item.index in self.aliases:
                raise SinkLostError(
                    f"{self.transport.description}: alias {item.index} is gone, and a"
                    f" {item.op} through it made a plain index of that name (Elasticsearch"
                    " creates a missing index for a delete with an external version, whatever"
                    " require_alias says): the index was deleted under the listener"
                )
            watched = self.watched.get(item.index)
            if watched is not None and landed not in watched:
                raise SinkLostError(
                    f"{self.transport.description}: {item.index} now points to {landed}, not"
                    f" to {', '.join(sorted(watched))} as when this tenure began: the index"
                    " was replaced under the listener"
                )

    def _settle(self, pending: list[BulkItem], results: list[Any]) -> tuple[list[BulkItem], str]:
        """Count and dead-letter per-item results; return the items to retry, and why."""
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
            elif st in RETRY_STATUSES or st == 0 or st >= 500:
                retry.append(item)
                why = f"item HTTP {st} {error_text(r)}{_BLOCKED if _index_refused(r) else ''}"
            elif _index_missing(st, r):
                raise SinkLostError(
                    f"{self.transport.description}: {item.index} is gone under the listener"
                    f" (HTTP {st}): {error_text(r)}"
                )
            elif _index_refused(r):
                raise SinkUnavailableError(
                    f"{self.transport.description} refused {item.op} {item.index}/{item.doc_id}"
                    f" (HTTP {st}), a refusal every document meets, retrying: {error_text(r)}"
                )
            elif st in _SINK_REFUSALS:
                raise SinkRejectedError(
                    f"{self.transport.description} refused {item.op} {item.index}/{item.doc_id}"
                    f" (HTTP {st}), a refusal that holds for every document: {error_text(r)}"
                )
            else:
                dead.append(DeadLetter(item, st, error_text(r)))
        self.stats.add(written=written, conflicts=conflicts, dead=len(dead))
        if dead:  # one line and one store request per bulk request, however many
            shown = "; ".join(
                f"{d.item.op} {d.item.index}/{d.item.doc_id} (HTTP {d.status}): {d.reason}"
                for d in dead[:_DEAD_SHOWN]
            )
            more = len(dead) - _DEAD_SHOWN
            self.log.warning(
                "bulk: dead-lettering {} item(s): {}{}",
                len(dead),
                shown,
                f"; and {more} more" if more > 0 else "",
            )
            self.on_dead(dead)
        return retry, why


#: Dead letters of one bulk request named in its WARNING (the rest are counted).
_DEAD_SHOWN = 3


def _index_refused(result: dict[str, Any]) -> bool:
    err = result.get("error")
    if not isinstance(err, dict):
        return False
    if err.get("type") in _INDEX_REFUSALS:
        return True
    return "no write index" in str(err.get("reason", ""))


def _index_missing(status: int, result: dict[str, Any]) -> bool:
    err = result.get("error")
    missing = isinstance(err, dict) and err.get("type") == "index_not_found_exception"
    return status == 404 and missing


class BulkSession:
    """Collects items and sends them in requests flushed by count, bytes or age; at most
    ``concurrency`` requests in flight. Call :meth:`finish` to wait for all of them."""

    def __init__(self, writer: BulkWriter, check: Check, wait_fn: Wait) -> None:
        self.writer = writer
        self.check = check
        self.wait_fn = wait_fn
        self._buf: list[BulkItem] = []
        self._bytes = 0
        self._first = 0.0
        self._inflight: set[Future[None]] = set()

    def add(self, item: BulkItem) -> None:
        writer = self.writer
        if not self._buf:
            self._first = writer.clock.monotonic()
        self._buf.append(item)
        self._bytes += len(item.encoded(writer.versioned))
        if (
            len(self._buf) >= writer.limits.bulk_actions
            or self._bytes >= writer.limits.bulk_bytes
            or writer.clock.monotonic() - self._first >= writer.limits.flush_interval
        ):
            self.flush()

    def flush(self) -> None:
        if not self._buf:
            return
        chunk, self._buf, self._bytes = self._buf, [], 0
        writer = self.writer
        if writer.limits.concurrency <= 1:
            writer.send(chunk, self.check, self.wait_fn)
            return
        while len(self._inflight) >= writer.limits.concurrency:
            self._reap(FIRST_COMPLETED)
        self._inflight.add(writer.executor().submit(writer.send, chunk, self.check, self.wait_fn))

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

    def send(self, items: list[BulkItem]) -> None:
        """Send ``items`` and wait until every one is settled."""
        for item in items:
            self.add(item)
        self.finish()

    def finish(self) -> None:
        """Send what is buffered and wait until every item is settled (raises the first error)."""
        self.flush()
        while self._inflight:
            self._reap("ALL_COMPLETED")
