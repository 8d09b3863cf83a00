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
one atomic ``_aliases`` call and drops the old index, so nothing deleted meanwhile survives (a
partition copies in place: :mod:`.partitioned`). ``on_history_lost`` is therefore ``"resync"``
by default: a mirror can always be rebuilt.

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
import time
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from listeners.base import (
    Acknowledged,
    ChangeEvent,
    ChangeStreamListener,
    ListenerContext,
    StopReason,
)
from listeners.deadletters import DeadLetterStore
from listeners.elasticsearch import fragments, partitioned
from listeners.elasticsearch.adaptive import BatchSizer, sizer_for
from listeners.elasticsearch.bulk import BulkItem, BulkLimits, BulkStats, BulkWriter, DeadLetter
from listeners.elasticsearch.copy import InitialCopy
from listeners.elasticsearch.deadletters import EsDeadLetters
from listeners.elasticsearch.documents import (
    DEFAULT_INDEX_TEMPLATE,
    Transform,
    resolve_transform,
)
from listeners.elasticsearch.documents import index_name as make_index_name
from listeners.elasticsearch.index import IndexKeeper
from listeners.elasticsearch.items import ItemMaker
from listeners.elasticsearch.options import check_numbers
from listeners.elasticsearch.transport import Transport, describe, listener_transport
from listeners.elasticsearch.versioning import EventVersioner, first_seq_at
from listeners.elasticsearch.window import BulkWindow
from singleton.drivers import mongo
from singleton.errors import ConfigurationError

_WRITES = frozenset({"insert", "replace", "update", "delete"})
#: The collection is gone (or renamed away): what ``on_drop`` applies to.
_DROPS = frozenset({"drop", "dropDatabase", "rename"})
#: The origin of copied documents, for their dead-letter records.
_COPIED = {"op": "initial_sync"}


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
    #: Events per stream batch: one batch fills one bulk request (``bulk_actions``); measured
    #: 0.62 -> 1.0 of the sink's raw rate on small documents against the base class's 500.
    batch_size: int = 1000
    #: Adapt the batch size (<= ``batch_size``) to the bulk requests' latency and bytes.
    adaptive_batch: bool = True
    target_bulk_seconds: float = 5.0
    #: A bulk request goes out at this many items, this many bytes, or this age.
    bulk_actions: int = 1000
    bulk_bytes: int = 5 * 1024 * 1024
    flush_interval: float = 1.0
    #: Bulk requests in flight at once (also while the next batch is read: :mod:`.window`),
    #: and at most this many bytes of them.
    concurrency: int = 2
    window_bytes: int = 32 * 1024 * 1024
    #: Keep requests in flight after handle_batch returned (False: one batch at a time).
    pipelined: bool = True
    #: A planned handover waits at most this long for requests in flight (the successor
    #: replays what they carried): the lease moves in about this time even on a slow sink.
    handover_wait: float = 0.05
    backoff_base: float = 0.05
    backoff_max: float = 5.0
    #: Give up on a failing item after this long (the runner then retries the batch).
    retry_timeout: float = 300.0
    #: The lease TTL and a safety factor, for ``gc_deletes`` (see the module docstring).
    ttl: float = 15.0
    gc_safety_factor: float = 4.0
    #: A :class:`~listeners.deadletters.DeadLetterStore` (default: the runner's,
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
        | {"split_large_events", "sink_name", "window_bytes", "pipelined", "handover_wait"}
        | {"adaptive_batch", "target_bulk_seconds"}
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
        self._window: BulkWindow | None = None
        self._items: ItemMaker | None = None
        #: The runner acknowledged the last batch: the next one may stay in flight.
        self._armed = False
        self._dead_store: Any = None
        self._ctx: ListenerContext | None = None
        self._sizer: BatchSizer | None = None

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
        check_numbers(self, cls)
        self.transform = resolve_transform(self.transform)
        self._index_name = make_index_name(self.index, str(self.database), str(self.collection))

    @property  # -- resources ------------------------------------------------------------------
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
            transport, owned = listener_transport(self)
            self._owned_transport = transport if owned else None
            limits = {f.name: getattr(self, f.name) for f in dataclasses.fields(BulkLimits)}
            self._sizer = sizer_for(self, time.monotonic) if self.adaptive_batch else None
            self._writer = BulkWriter(
                transport,
                BulkLimits(**limits),
                on_dead=self._dead,
                logger=ctx.logger,
                versioned=ctx.leadership.fenced,
                observe=None if self._sizer is None else self._sizer.observe,
            )
            self._window = BulkWindow(
                self._writer, max_requests=self.concurrency, max_bytes=self.window_bytes
            )
            self._index = IndexKeeper(
                transport,
                gc_deletes=self.gc_deletes_seconds,
                seconds=lambda c: mongo.cluster_time(c.client).time,
                settings=self.settings,
                mappings=self.mappings,
            )
        client = ctx.client
        self._items = self._items or ItemMaker(
            self.transform,  # type: ignore[arg-type]
            self._dead,
            lambda key: self._collection(self._ctx_or_fail()).find_one({"_id": key}),
        )
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
        if self._window is not None:
            self._window.abandon()
        if self._writer is not None:
            self._writer.close()
        if self._owned_transport is not None:
            self._owned_transport.close()
        self._writer = self._index = self._owned_transport = self._window = None

    def on_start(self, ctx: ListenerContext) -> None:
        _, index = self._setup(ctx)
        index.forget()  # another leader may have dropped or recreated the index meanwhile
        if self.split_large_events:
            stages = fragments.with_split(self.pipeline, self._collection(ctx), ctx.logger)
            self.split_large_events = stages is not None  # detected once per listener
            self.pipeline = stages or self.pipeline
        self.pipeline = fragments.without_unused(self.pipeline)

    def _collection(self, ctx: ListenerContext) -> Any:
        return ctx.client[str(self.database)][str(self.collection)]

    def ensure_index(self, name: str, ctx: ListenerContext) -> None:
        """Create ``name`` if missing, or raise its ``gc_deletes`` (see :mod:`.index`)."""
        self._setup(ctx)[1].ensure(name, ctx)

    # -- streaming --------------------------------------------------------------------------------
    def handle_batch(self, events: Sequence[ChangeEvent], ctx: ListenerContext) -> None:
        """Apply ``events``: each write succeeds, is already superseded (409) or is
        dead-lettered. Within a batch only the last write per document is sent: the later
        version would supersede the earlier ones anyway. On the runner's stream (after an
        :meth:`acknowledged`) the requests may still be in flight when this returns (see
        :mod:`.window`); called any other way it returns once they all finished."""
        pipelined, self._armed = self._armed and self.pipelined, False
        self._apply(events, ctx, self._index_name, pipelined=pipelined)

    def next_batch_size(self) -> int:
        """``batch_size``, or less while the sink is slow (``adaptive_batch``)."""
        return self.batch_size if self._sizer is None else self._sizer.size

    def acknowledged(self, token: Any, batch: Sequence[ChangeEvent]) -> Acknowledged | None:
        self._armed = True  # the runner follows the protocol: the next batch may pipeline
        if self._window is None:
            return token, batch
        self._window.mark((token, batch[-1:]))
        return self._window.acknowledged()

    def flush(self, ctx: ListenerContext) -> Acknowledged | None:
        self._armed = False  # what comes next (a dead-letter replay) is sent synchronously
        return None if self._window is None else self._window.flush(stop=ctx.handing_over)

    def flush_for_handover(self, ctx: ListenerContext, timeout: float) -> Acknowledged | None:
        self._armed = False
        wait = min(timeout, self.handover_wait)
        return None if self._window is None else self._window.flush(wait)

    def on_stop(self, ctx: ListenerContext, reason: StopReason) -> None:
        if self._window is not None:  # a tenure that ended unflushed: its successor replays
            self._window.abandon()
        self._armed = False

    def _apply(
        self,
        events: Sequence[ChangeEvent],
        ctx: ListenerContext,
        index_name: str,
        *,
        pipelined: bool = False,
    ) -> None:
        """:meth:`handle_batch` into ``index_name`` (the alias, or an index being rebuilt)."""
        index = self._setup(ctx)[1]
        window, items, versioner = self._window, self._items, self._versioner
        assert window is not None and items is not None and versioner is not None
        if not pipelined:
            window.wait(stop=ctx.handing_over)  # what was in flight comes first
        window.open()
        pending: dict[str, BulkItem] = {}
        for event in fragments.join(events):
            op = event.get("operationType")
            if op in _WRITES or fragments.needs_lookup(event):
                item = items.event_item(event, versioner, index_name)
                if item is not None:
                    pending[item.doc_id] = item
            elif op in _DROPS:
                self._send(list(pending.values()), ctx, index_name)
                pending.clear()
                window.wait()
                self._dropped(event, ctx, index, index_name)
        if pending:
            index.ensure(index_name, ctx)
            window.submit(
                list(pending.values()), ctx.check, ctx.leadership.wait_lost, ctx.handing_over
            )
        if not pipelined:  # one batch at a time, but a handover stops the wait (as in flight)
            window.wait(stop=ctx.handing_over)

    def _send(self, items: list[BulkItem], ctx: ListenerContext, name: str) -> None:
        if items:
            self._setup(ctx)[1].ensure(name, ctx)
            self._setup(ctx)[0].session(ctx.check, ctx.leadership.wait_lost).send(items)

    def _dropped(
        self, event: ChangeEvent, ctx: ListenerContext, index: IndexKeeper, name: str
    ) -> None:
        ctx.logger.info(
            "elasticsearch: {} of {} seen; on_drop={} for index {}",
            event.get("operationType"),
            f"{self.database}.{self.collection}",  # (the stream leaves ``ns`` out)
            self.on_drop,
            name,
        )
        if self.on_drop == "delete_index":
            index.delete(name, ctx)

    # -- initial sync ---------------------------------------------------------------------------
    def initial_sync(self, ctx: ListenerContext) -> None:
        """Copy the collection into a fresh physical index (resumably, see :mod:`.copy`),
        replay what happened since the copy began, then move the alias onto it atomically and
        drop the old index (see :mod:`.index`). Used for the first sync and every resync. A
        partition copies its own documents in place instead (:mod:`.partitioned`)."""
        writer, index = self._setup(ctx)
        items, part, alias = self._items, self.partition, self._index_name
        assert items is not None
        saved = ctx.load_progress() or {}
        target = saved.get("target")
        if part is not None:
            target = partitioned.live_index(index, alias, part, ctx)
        elif not isinstance(target, str) or not index.exists(target):
            if saved:
                ctx.save_progress(None)  # a copy into an index that is gone, or pre-alias
            target = index.fresh(alias, ctx)
        ctx.logger.info("initial sync of {}: copying into {} (alias {})", self.name, target, alias)
        mine = partitioned.owner(part)
        copy = InitialCopy(
            name=self.lease_name,
            make_item=lambda doc, version: (
                items.item(doc, doc["_id"], version, _COPIED, target) if mine(doc["_id"]) else None
            ),
            replay=lambda events, c: self._apply(partitioned.only(part, events), c, target),
            batch_size=self.copy_batch_size,
            replay_batch=self.batch_size,
            progress_extra={"target": target},
        )
        copy.run(ctx, self._collection(ctx), writer)
        if part is None:
            index.swap(alias, target, ctx)
        ctx.save_progress(None)
