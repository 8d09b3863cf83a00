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

Resync. The index name users query is an alias (:mod:`.index`): an initial sync or a resync copies
into a fresh physical index, replays what happened since the copy began, then moves the alias in
one atomic ``_aliases`` call and drops the old index, so nothing deleted meanwhile survives.
``on_history_lost`` is therefore ``"resync"`` by default: a mirror can always be rebuilt.

What is never indexed goes to the dead letters with its reason, in the copy and in the stream
alike, and the sync goes on: an ``_id`` over 512 bytes (:mod:`.ids`), a non-finite number
(:mod:`.documents`), a document Elasticsearch refuses (:mod:`.bulk`). A sink that is down or
refuses every request is never a dead letter (:mod:`.bulk`).

Options arrive as keyword arguments (``singleton.toml`` ``[[listeners]]`` tables)::

    ElasticsearchSync(database="shop", collection="orders", es="https://es:9200",
                      api_key="...", index="{database}.{collection}", concurrency=2)
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from listeners.base import ChangeEvent, ChangeStreamListener, ListenerContext
from listeners.deadletter import DeadLetterStore
from listeners.elasticsearch import fragments
from listeners.elasticsearch.bulk import BulkItem, BulkLimits, BulkStats, BulkWriter, DeadLetter
from listeners.elasticsearch.copy import InitialCopy
from listeners.elasticsearch.deadletters import EsDeadLetters
from listeners.elasticsearch.documents import (
    DEFAULT_INDEX_TEMPLATE,
    Transform,
    doc_id,
    resolve_transform,
    source_of,
)
from listeners.elasticsearch.documents import index_name as make_index_name
from listeners.elasticsearch.index import IndexKeeper
from listeners.elasticsearch.transport import Transport, describe, make_transport
from listeners.elasticsearch.versioning import EventVersioner, first_seq_at
from listeners.streams import token_time
from singleton import mongo
from singleton.errors import ConfigurationError
from singleton.retry import Backoff

_WRITES = frozenset({"insert", "replace", "update", "delete"})
#: The collection is gone (or renamed away): what ``on_drop`` applies to.
_DROPS = frozenset({"drop", "dropDatabase", "rename"})
#: The origin of copied documents, for their dead-letter records.
_COPIED = {"op": "initial_sync"}
_POSITIVE_INTEGERS = ("bulk_actions", "bulk_bytes", "concurrency", "copy_batch_size")
_POSITIVE_NUMBERS = ("request_timeout", "ttl", "gc_safety_factor", "retry_timeout")


class ElasticsearchSync(ChangeStreamListener):
    """Keeps an index equal to ``database.collection``; see the module docstring."""

    #: Elasticsearch URL (several: a list or comma-separated, one node pool), or an
    #: ``elasticsearch.Elasticsearch`` client (which stays yours).
    es: Any = None
    api_key: str | tuple[str, str] | None = None
    basic_auth: tuple[str, str] | None = None
    #: TLS: the CA bundle to trust, and a client certificate (PEM files).
    ca_certs: str | None = None
    client_cert: str | None = None
    client_key: str | None = None
    #: Names the cluster in checkpoints instead of the node addresses: set the same one on
    #: every replica when they reach one cluster by different addresses (proxies, sidecars).
    sink_name: str | None = None
    #: gzip request bodies (bulk requests compress well; costs CPU here).
    http_compress: bool = False
    request_timeout: float = 30.0
    #: Index name template with ``{database}`` and ``{collection}``; lower-cased and sanitized.
    index: str = DEFAULT_INDEX_TEMPLATE
    transform: Transform | str | None = None
    mappings: Mapping[str, Any] | None = None
    settings: Mapping[str, Any] | None = None
    #: ``keep`` the index when the collection is dropped, or ``delete_index``.
    on_drop: str = "keep"
    #: A bulk request goes out at this many items, this many bytes, or this age.
    bulk_actions: int = 1000
    bulk_bytes: int = 5 * 1024 * 1024
    flush_interval: float = 1.0
    #: Bulk requests in flight at once.
    concurrency: int = 1
    backoff_base: float = 0.05
    backoff_max: float = 5.0
    #: Give up on a failing item after this long (the runner then retries the batch).
    retry_timeout: float = 300.0
    #: The lease TTL and a safety factor, for ``gc_deletes`` (see the module docstring).
    ttl: float = 15.0
    gc_safety_factor: float = 4.0
    #: A :class:`~listeners.deadletter.DeadLetterStore` (default: the runner's,
    #: ``ctx.dead_letters``, else ``singleton.dead_letters`` on the listener's client), or
    #: anything with ``put(letters, ctx)``.
    dead_letters: Any = None
    copy_batch_size: int = 2000
    #: End the pipeline with ``$changeStreamSplitLargeEvent`` where the server supports it
    #: (MongoDB 7.0+), so that events over 16 MB arrive in fragments (:mod:`.fragments`).
    split_large_events: bool = True
    #: A mirror can always be rebuilt: a lost checkpoint means a resync (see the docstring).
    on_history_lost = "resync"

    extra_options: ClassVar[frozenset[str]] = (
        frozenset({"es", "api_key", "basic_auth", "ca_certs", "client_cert", "client_key"})
        | {"http_compress", "request_timeout", "index", "transform", "mappings", "settings"}
        | {"on_drop", "ttl", "gc_safety_factor", "dead_letters", "copy_batch_size"}
        | {"split_large_events", "sink_name"}
        | {f.name for f in dataclasses.fields(BulkLimits)}  # the bulk writer's options
    )

    def __init__(self, **options: Any) -> None:
        options.setdefault("full_document", "updateLookup")
        super().__init__(**options)
        self._writer: BulkWriter | None = None
        self._index: IndexKeeper | None = None
        #: the transport this listener built (closed by close()); None for a client it was given
        self._owned_transport: Transport | None = None
        self._versioner: EventVersioner | None = None
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
        for opt in _POSITIVE_INTEGERS:
            value = getattr(self, opt)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigurationError(f"{cls}.{opt} must be an integer >= 1, got {value!r}")
        for opt in _POSITIVE_NUMBERS:
            value = getattr(self, opt)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise ConfigurationError(f"{cls}.{opt} must be a number > 0, got {value!r}")
        if self.gc_safety_factor < 1:
            raise ConfigurationError(
                f"{cls}.gc_safety_factor must be >= 1, got {self.gc_safety_factor!r}"
            )
        try:
            Backoff(self.backoff_base, self.backoff_max)
        except ConfigurationError as exc:
            raise ConfigurationError(f"{cls}.backoff_base / backoff_max: {exc}") from exc
        self.transform = resolve_transform(self.transform)
        self._index_name = make_index_name(self.index, str(self.database), str(self.collection))

    # -- resources ------------------------------------------------------------------------------
    @property
    def gc_deletes_seconds(self) -> int:
        """See the module docstring for the formula."""
        return max(60, math.ceil(self.gc_safety_factor * (self.ttl + self.request_timeout)))

    @property
    def index_name(self) -> str:
        return self._index_name

    def sink_identity(self) -> str:
        """``elasticsearch <nodes>/<index>``, e.g. ``elasticsearch http://es:9200/shop.orders``
        (addresses without credentials), or ``elasticsearch <sink_name>/<index>``."""
        return f"elasticsearch {self.sink_name or describe(self.es)}/{self._index_name}"

    @property
    def stats(self) -> BulkStats:
        """What the bulk writer did (items written, refused as older, retried, dead-lettered)."""
        return self._writer.stats if self._writer is not None else BulkStats()

    def _setup(self, ctx: ListenerContext) -> tuple[BulkWriter, IndexKeeper]:
        self._ctx = ctx
        if self._writer is None or self._index is None:
            transport, owned = make_transport(
                self.es,
                api_key=self.api_key,
                basic_auth=tuple(self.basic_auth) if self.basic_auth else None,
                ca_certs=self.ca_certs,
                client_cert=self.client_cert,
                client_key=self.client_key,
                http_compress=self.http_compress,
                request_timeout=self.request_timeout,
                maxsize=self.concurrency + 2,
            )
            self._owned_transport = transport if owned else None
            limits = {f.name: getattr(self, f.name) for f in dataclasses.fields(BulkLimits)}
            self._writer = BulkWriter(
                transport,
                BulkLimits(**limits),
                on_dead=self._dead,
                logger=ctx.logger,
                versioned=ctx.leadership.fenced,
            )
            self._index = IndexKeeper(
                transport,
                gc_deletes=self.gc_deletes_seconds,
                seconds=lambda c: mongo.cluster_time(c.client).time,
                settings=self.settings,
                mappings=self.mappings,
            )
        client = ctx.client
        self._versioner = self._versioner or EventVersioner(lambda ts: first_seq_at(client, ts))
        if self._dead_store is None:
            store = self.dead_letters
            if store is None or isinstance(store, DeadLetterStore):
                # event-level stores get one record per item
                store = EsDeadLetters(store or ctx.dead_letters or DeadLetterStore(client))
            self._dead_store = store
        return self._writer, self._index

    def _ctx_or_fail(self) -> ListenerContext:
        assert self._ctx is not None, "used before _setup"
        return self._ctx

    def _dead(self, letters: list[DeadLetter]) -> None:
        self._dead_store.put(letters, self._ctx_or_fail())

    def close(self) -> None:
        """Release what this listener created (never a client it was given)."""
        if self._writer is not None:
            self._writer.close()
        if self._owned_transport is not None:
            self._owned_transport.close()
        self._writer = self._index = self._owned_transport = None

    def on_start(self, ctx: ListenerContext) -> None:
        _, index = self._setup(ctx)
        index.forget()  # another leader may have dropped or recreated the index meanwhile
        if self.split_large_events:
            stages = fragments.with_split(self.pipeline, self._collection(ctx), ctx.logger)
            self.split_large_events = stages is not None  # detected once per listener
            self.pipeline = stages or self.pipeline

    def _collection(self, ctx: ListenerContext) -> Any:
        return ctx.client[str(self.database)][str(self.collection)]

    def ensure_index(self, name: str, ctx: ListenerContext) -> None:
        """Create ``name`` if missing, or raise its ``gc_deletes`` (see :mod:`.index`)."""
        self._setup(ctx)[1].ensure(name, ctx)

    # -- streaming --------------------------------------------------------------------------------
    def _item(
        self, doc: Mapping[str, Any], key: Any, version: int, origin: dict[str, Any], index: str
    ) -> BulkItem | None:
        """The bulk action that makes ``index`` hold ``doc`` (a delete if ``transform`` drops
        it) at ``version``; ``None`` for a document that cannot be indexed (dead-lettered)."""
        try:
            es_id = doc_id(key)
            source = source_of(doc, self.transform)  # type: ignore[arg-type]
        except (ValueError, TypeError) as exc:
            self._reject("index", key, version, origin, index, exc)
            return None
        return BulkItem(
            "delete" if source is None else "index", index, es_id, version, source, origin
        )

    def _reject(
        self, op: str, key: Any, version: int, origin: dict[str, Any], index: str, exc: Exception
    ) -> None:
        """Dead-letter what cannot be indexed (an id too long, a non-finite number...)."""
        try:
            es_id = doc_id(key)
        except ValueError:
            es_id = repr(key)[:200]
        bad = BulkItem(op, index, es_id, version, None, {**origin, "key": key})
        self._dead([DeadLetter(bad, 0, f"cannot index: {exc}")])

    def _event_item(
        self, event: ChangeEvent, versioner: EventVersioner, index: str
    ) -> BulkItem | None:
        if "documentKey" not in event:
            return None  # a fragment: the one with the key is handled in its own batch
        key = event["documentKey"]["_id"]
        if "clusterTime" not in event:  # a fragment of a split event: the token has it
            event = {**event, "clusterTime": token_time(event.get("_id"))}
        op = event.get("operationType")
        origin = {"op": op, "token": event.get("_id"), "cluster_time": mongo.event_time(event)}
        version = versioner.version(event)
        if fragments.needs_lookup(event):
            # The document as it is now, as updateLookup would give it (see .fragments).
            found = self._collection(self._ctx_or_fail()).find_one({"_id": key})
            if found is not None:
                return self._item(found, key, version, origin, index)
            op = "delete"
        if op == "delete":
            try:
                return BulkItem("delete", index, doc_id(key), version, None, origin)
            except ValueError as exc:
                self._reject("delete", key, version, origin, index, exc)
                return None
        doc = event.get("fullDocument")
        if doc is None:
            return None  # looked up after a later delete: that delete follows
        return self._item(doc, key, version, origin, index)

    def handle_batch(self, events: Sequence[ChangeEvent], ctx: ListenerContext) -> None:
        """Apply ``events``; returns once each write succeeded, was already superseded (409) or
        was dead-lettered. Within a batch only the last write per document is sent: the later
        version would supersede the earlier ones anyway."""
        self._apply(events, ctx, self._index_name)

    def _apply(self, events: Sequence[ChangeEvent], ctx: ListenerContext, index_name: str) -> None:
        """:meth:`handle_batch` into ``index_name`` (the alias, or an index being rebuilt)."""
        writer, index = self._setup(ctx)
        versioner = self._versioner
        assert versioner is not None
        pending: dict[str, BulkItem] = {}
        for event in fragments.join(events):
            op = event.get("operationType")
            if op in _WRITES or fragments.needs_lookup(event):
                item = self._event_item(event, versioner, index_name)
                if item is not None:
                    pending[item.doc_id] = item
            elif op in _DROPS:
                self._send(list(pending.values()), ctx, writer, index, index_name)
                pending.clear()
                self._dropped(event, ctx, index, index_name)
        self._send(list(pending.values()), ctx, writer, index, index_name)

    def _send(
        self,
        items: list[BulkItem],
        ctx: ListenerContext,
        writer: BulkWriter,
        index: IndexKeeper,
        name: str,
    ) -> None:
        if not items:
            return
        index.ensure(name, ctx)
        session = writer.session(ctx.check, ctx.leadership.wait_lost)
        for item in items:
            session.add(item)
        session.finish()

    def _dropped(
        self, event: ChangeEvent, ctx: ListenerContext, index: IndexKeeper, name: str
    ) -> None:
        ctx.logger.info(
            "elasticsearch: {} of {} seen; on_drop={} for index {}",
            event.get("operationType"),
            event.get("ns"),
            self.on_drop,
            name,
        )
        if self.on_drop == "delete_index":
            index.delete(name, ctx)

    # -- initial sync ---------------------------------------------------------------------------
    def initial_sync(self, ctx: ListenerContext) -> None:
        """Copy the collection into a fresh physical index (resumably, see :mod:`.copy`),
        replay what happened since the copy began, then move the alias onto it atomically and
        drop the old index (see :mod:`.index`). Used for the first sync and every resync."""
        writer, index = self._setup(ctx)
        alias = self._index_name
        saved = ctx.load_progress() or {}
        target = saved.get("target")
        if not isinstance(target, str) or not index.exists(target):
            if saved:
                ctx.save_progress(None)  # a copy into an index that is gone, or pre-alias
            target = index.fresh(alias, ctx)
        ctx.logger.info("initial sync of {}: copying into {} (alias {})", self.name, target, alias)
        copy = InitialCopy(
            name=self.lease_name,
            make_item=lambda doc, version: self._item(doc, doc["_id"], version, _COPIED, target),
            replay=lambda events, c: self._apply(events, c, target),
            batch_size=self.copy_batch_size,
            replay_batch=self.batch_size,
            progress_extra={"target": target},
        )
        copy.run(ctx, self._collection(ctx), writer)
        index.swap(alias, target, ctx)
        ctx.save_progress(None)
