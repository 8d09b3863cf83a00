"""ElasticsearchSync: mirror one MongoDB collection into one Elasticsearch index.

Failure model. Events may be delivered more than once (resumes, retried batches) and a deposed
leader may still write for a while after its successor started. Every write therefore carries an
external version derived from the event's oplog position (:mod:`.versioning`), and
Elasticsearch refuses (409) anything not newer than what it holds: replays and late writes are
harmless and the index never goes back in time. Inserts, replaces and updates index the *whole*
document (``fullDocument``; the update API has no external versioning); an update whose lookup
found nothing is skipped because the delete that removed the document follows in the stream.

A delete's version is kept by Elasticsearch only for ``index.gc_deletes``. After that a late
stale index request could resurrect the document, so the index is created (or updated) with::

    gc_deletes = max(60 s, ceil(gc_safety_factor * (ttl + request_timeout)))

``ttl`` is the lease TTL: a deposed leader stops writing at its renew deadline (< ttl after its
last renewal, before a successor can be elected); ``request_timeout`` bounds a request that was
sent just before that. The safety factor covers clock-rate drift and slow servers. A process that
is frozen *between* ``ctx.check()`` and the send for longer than ``gc_deletes`` is not covered.

Options arrive as keyword arguments (``singleton.toml`` ``[[listeners]]`` tables)::

    ElasticsearchSync(database="shop", collection="orders", es="https://es:9200",
                      api_key="...", index="{database}.{collection}", concurrency=2)
"""

from __future__ import annotations

import importlib
import math
import re
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

from bson import json_util
from bson.timestamp import Timestamp

from listeners.base import ChangeEvent, ChangeStreamListener, ListenerContext
from listeners.deadletter import DeadLetterStore
from listeners.elasticsearch.bulk import BulkItem, BulkWriter, DeadLetter
from listeners.elasticsearch.deadletters import EsDeadLetters
from listeners.elasticsearch.documents import (
    DEFAULT_INDEX_TEMPLATE,
    Transform,
    doc_id,
    index_name,
    source_of,
)
from listeners.elasticsearch.transport import Transport, error_text, make_transport, path_index
from listeners.elasticsearch.versioning import EventVersioner, first_seq_at, timestamp_version
from singleton.errors import ConfigurationError, SinkError

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 0.001}


def parse_duration(value: Any) -> float | None:
    """Seconds of an Elasticsearch time value (``"60s"``, ``"5m"``; bare numbers are ms)."""
    match = _DURATION.match(str(value)) if value is not None else None
    return None if match is None else float(match.group(1)) * _UNITS[match.group(2)]


def _resolve(spec: Any) -> Any:
    """``"pkg.mod:attr"`` (from a TOML file) to the object; callables pass through."""
    if spec is None or callable(spec):
        return spec
    module, _, attr = str(spec).partition(":")
    if not attr:
        raise ConfigurationError(f"transform must be a callable or 'module:function', got {spec!r}")
    return getattr(importlib.import_module(module), attr)


class ElasticsearchSync(ChangeStreamListener):
    """Keeps an index equal to ``database.collection``; see the module docstring."""

    #: Elasticsearch URL, or an ``elasticsearch.Elasticsearch`` client (which stays yours).
    es: Any = None
    api_key: str | tuple[str, str] | None = None
    basic_auth: tuple[str, str] | None = None
    ca_certs: str | None = None
    request_timeout: float = 30.0
    #: Index name template with ``{database}`` and ``{collection}``; lower-cased and sanitized.
    index: str = DEFAULT_INDEX_TEMPLATE
    transform: Transform | str | None = None
    mappings: Mapping[str, Any] | None = None
    settings: Mapping[str, Any] | None = None
    on_drop: str = "keep"
    bulk_actions: int = 1000
    bulk_bytes: int = 5 * 1024 * 1024
    flush_interval: float = 1.0
    concurrency: int = 1
    backoff_base: float = 0.05
    backoff_max: float = 5.0
    #: Give up on a failing item after this long (the runner then retries the batch).
    retry_timeout: float = 300.0
    ttl: float = 15.0
    gc_safety_factor: float = 4.0
    #: A :class:`~listeners.deadletter.DeadLetterStore` (default: ``singleton.dead_letters`` on
    #: the listener's client), or anything with ``put(letters, ctx)``.
    dead_letters: Any = None
    copy_batch_size: int = 2000

    extra_options: ClassVar[frozenset[str]] = frozenset(
        {
            "es",
            "api_key",
            "basic_auth",
            "ca_certs",
            "request_timeout",
            "index",
            "transform",
            "mappings",
            "settings",
            "on_drop",
            "bulk_actions",
            "bulk_bytes",
            "flush_interval",
            "concurrency",
            "backoff_base",
            "backoff_max",
            "retry_timeout",
            "ttl",
            "gc_safety_factor",
            "dead_letters",
            "copy_batch_size",
        }
    )

    def __init__(self, **options: Any) -> None:
        options.setdefault("full_document", "updateLookup")
        super().__init__(**options)
        self._transport: Transport | None = None
        self._owned = False
        self._writer: BulkWriter | None = None
        self._versioner: EventVersioner | None = None
        self._ready: set[str] = set()
        self._dead_store: Any = None
        self._ctx: ListenerContext | None = None

    def _validate(self) -> None:
        super()._validate()
        cls = type(self).__name__
        if not self.collection:
            raise ConfigurationError(f"{cls} mirrors one collection: set collection")
        if self.es is None:
            raise ConfigurationError(f"{cls} needs es= (an Elasticsearch URL or client)")
        if self.on_drop not in ("delete_index", "keep"):
            raise ConfigurationError(
                f"{cls}.on_drop must be delete_index or keep, got {self.on_drop!r}"
            )
        if self.full_document not in ("updateLookup", "whenAvailable", "required"):
            raise ConfigurationError(
                f"{cls} indexes whole documents: full_document must be updateLookup, got "
                f"{self.full_document!r}"
            )
        for opt in ("bulk_actions", "bulk_bytes", "concurrency", "copy_batch_size"):
            value = getattr(self, opt)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigurationError(f"{cls}.{opt} must be an integer >= 1, got {value!r}")
        for opt in ("request_timeout", "ttl", "gc_safety_factor", "retry_timeout"):
            value = getattr(self, opt)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise ConfigurationError(f"{cls}.{opt} must be a number > 0, got {value!r}")
        if self.gc_safety_factor < 1:
            raise ConfigurationError(
                f"{cls}.gc_safety_factor must be >= 1, got {self.gc_safety_factor!r}"
            )
        self.transform = _resolve(self.transform)
        index_name(self.index, str(self.database), str(self.collection))  # validates the template

    # -- resources ------------------------------------------------------------------------------
    @property
    def gc_deletes_seconds(self) -> int:
        """See the module docstring for the formula."""
        return max(60, math.ceil(self.gc_safety_factor * (self.ttl + self.request_timeout)))

    @property
    def index_name(self) -> str:
        return index_name(self.index, str(self.database), str(self.collection))

    def _setup(self, ctx: ListenerContext) -> BulkWriter:
        self._ctx = ctx
        if self._transport is None:
            self._transport, self._owned = make_transport(
                self.es,
                api_key=self.api_key,
                basic_auth=tuple(self.basic_auth) if self.basic_auth else None,  # type: ignore[arg-type]
                ca_certs=self.ca_certs,
                request_timeout=self.request_timeout,
                maxsize=self.concurrency + 2,
            )
        if self._writer is None:
            self._writer = BulkWriter(
                self._transport,
                on_dead=self._dead,
                max_actions=self.bulk_actions,
                max_bytes=self.bulk_bytes,
                flush_interval=self.flush_interval,
                concurrency=self.concurrency,
                backoff_base=self.backoff_base,
                backoff_max=self.backoff_max,
                retry_timeout=self.retry_timeout,
                logger=ctx.logger,
                versioned=ctx.leadership.fenced,
            )
        client = ctx.client
        self._versioner = self._versioner or EventVersioner(lambda ts: first_seq_at(client, ts))
        if self._dead_store is None:
            store = self.dead_letters
            if store is None:
                store = DeadLetterStore(client)
            self._dead_store = EsDeadLetters(store) if isinstance(store, DeadLetterStore) else store
        return self._writer

    def _dead(self, letters: list[DeadLetter]) -> None:
        ctx = self._ctx
        assert ctx is not None
        self._dead_store.put(letters, ctx)

    def close(self) -> None:
        """Release what this listener created (never a client it was given)."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        if self._transport is not None and self._owned:
            self._transport.close()
        self._transport = None

    def on_start(self, ctx: ListenerContext) -> None:
        self._setup(ctx)
        self._ready.clear()  # another leader may have dropped or recreated the index meanwhile

    def _request(self, method: str, path: str, body: bytes | None = None) -> tuple[int, Any]:
        assert self._transport is not None
        return self._transport.request(method, path, body)

    def ensure_index(self, name: str, ctx: ListenerContext) -> None:
        """Create ``name`` if missing (user settings and mappings, raised ``gc_deletes``), or
        raise ``gc_deletes`` on an existing index whose setting is lower."""
        if name in self._ready:
            return
        ctx.check()
        gc = f"{self.gc_deletes_seconds}s"
        settings = {**dict(self.settings or {}), "index.gc_deletes": gc}
        body: dict[str, Any] = {"settings": settings}
        if self.mappings:
            body["mappings"] = dict(self.mappings)
        status, resp = self._request("PUT", f"/{path_index(name)}", json_util.dumps(body).encode())
        if status == 200:
            ctx.logger.info("elasticsearch: created index {} (gc_deletes {})", name, gc)
        elif status == 400 and "already_exists" in error_text(resp):
            self._raise_gc_deletes(name, ctx)
        else:
            raise SinkError(f"cannot create index {name}: HTTP {status} {error_text(resp)}")
        self._ready.add(name)

    def _raise_gc_deletes(self, name: str, ctx: ListenerContext) -> None:
        status, resp = self._request("GET", f"/{path_index(name)}/_settings")
        if status != 200 or not isinstance(resp, dict):
            raise SinkError(f"cannot read settings of {name}: HTTP {status} {error_text(resp)}")
        current = None
        for idx in resp.values():
            current = parse_duration(idx.get("settings", {}).get("index", {}).get("gc_deletes"))
        if current is None:
            current = 60.0  # Elasticsearch's default
        if current < self.gc_deletes_seconds:
            ctx.check()
            body = {"index": {"gc_deletes": f"{self.gc_deletes_seconds}s"}}
            path = f"/{path_index(name)}/_settings"
            status, resp = self._request("PUT", path, json_util.dumps(body).encode())
            if status != 200:
                raise SinkError(f"cannot raise gc_deletes on {name}: HTTP {status}")
            ctx.logger.info(
                "elasticsearch: raised gc_deletes of {} from {} s to {} s",
                name,
                current,
                self.gc_deletes_seconds,
            )

    # -- streaming --------------------------------------------------------------------------------
    def _wait(self, ctx: ListenerContext) -> Callable[[float], bool]:
        return lambda seconds: ctx.leadership.lost.wait(seconds)

    def item_for(
        self, doc: Mapping[str, Any], key: Any, version: int, origin: dict[str, Any]
    ) -> BulkItem:
        """The bulk action that makes the index hold ``doc`` (a delete if ``transform`` drops
        it) at ``version``. A document that cannot be serialized raises ``ValueError``."""
        source = source_of(doc, self.transform)  # type: ignore[arg-type]
        op = "delete" if source is None else "index"
        return BulkItem(op, self.index_name, doc_id(key), version, source, origin)

    def handle_batch(self, events: Sequence[ChangeEvent], ctx: ListenerContext) -> None:
        """Apply ``events``; returns once each write succeeded, was already superseded (409) or
        was dead-lettered. Within a batch only the last write per document is sent: the later
        version would supersede the earlier ones anyway."""
        writer = self._setup(ctx)
        versioner = self._versioner
        assert versioner is not None
        pending: dict[str, BulkItem] = {}
        for event in events:
            op = event.get("operationType")
            if op in ("insert", "replace", "update", "delete"):
                key = event["documentKey"]["_id"]
                origin = {
                    "op": op,
                    "token": event.get("_id"),
                    "cluster_time": event.get("clusterTime"),
                }
                version = versioner.version(event)
                if op == "delete":
                    item = BulkItem("delete", self.index_name, doc_id(key), version, None, origin)
                else:
                    doc = event.get("fullDocument")
                    if doc is None:
                        continue  # looked up after a later delete: that delete follows
                    try:
                        item = self.item_for(doc, key, version, origin)
                    except (ValueError, TypeError) as exc:
                        bad = BulkItem("index", self.index_name, doc_id(key), version, None, origin)
                        self._dead([DeadLetter(bad, 0, f"cannot serialize: {exc}")])
                        continue
                pending[item.doc_id] = item
            elif op in ("drop", "dropDatabase", "rename"):
                self._send(list(pending.values()), ctx, writer)
                pending.clear()
                self._dropped(event, ctx)
        self._send(list(pending.values()), ctx, writer)

    def _send(self, items: list[BulkItem], ctx: ListenerContext, writer: BulkWriter) -> None:
        if not items:
            return
        self.ensure_index(self.index_name, ctx)
        session = writer.session(ctx.check, self._wait(ctx))
        for item in items:
            session.add(item)
        session.finish()

    def _dropped(self, event: ChangeEvent, ctx: ListenerContext) -> None:
        name = self.index_name
        ctx.logger.info(
            "elasticsearch: {} of {} seen; on_drop={} for index {}",
            event.get("operationType"),
            event.get("ns"),
            self.on_drop,
            name,
        )
        if self.on_drop == "delete_index":
            ctx.check()
            status, resp = self._request("DELETE", f"/{path_index(name)}")
            if status not in (200, 404):
                raise SinkError(f"cannot delete index {name}: HTTP {status} {error_text(resp)}")
            self._ready.discard(name)

    # -- initial sync ---------------------------------------------------------------------------
    def initial_sync(self, ctx: ListenerContext) -> None:
        """Copy the collection in ``_id`` order, resumably (see :mod:`.copy`)."""
        from listeners.elasticsearch.copy import copy_collection

        writer = self._setup(ctx)
        self.ensure_index(self.index_name, ctx)
        copy_collection(self, ctx, writer)

    @staticmethod
    def cluster_time(ctx: ListenerContext) -> Timestamp:
        reply = ctx.client.admin.command("ping")
        ct = (reply.get("$clusterTime") or {}).get("clusterTime") or reply.get("operationTime")
        if not isinstance(ct, Timestamp):
            raise SinkError("the server reported no cluster time (is it a replica set?)")
        return ct

    def copy_version(self, ts: Timestamp) -> int:
        """Version of documents copied after cluster time ``ts``: any event after ``ts`` wins."""
        return timestamp_version(ts, 0)

    @staticmethod
    def _now() -> float:
        return time.monotonic()
