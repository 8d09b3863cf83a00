"""ElasticsearchSync: mirror one MongoDB collection into one Elasticsearch index, or shape an
index from several collections (``collections``: filters, field rules, routing, related documents
embedded; :mod:`.shape`), exact through every failover either way.

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

Tenures. A session (:class:`_Session`: transport, index keeper, bulk writer and its window, item
maker, versioner) is built when a tenure starts (:meth:`ElasticsearchSync.on_start`) and closed
when it stops. In such a tenure ``handle_batch`` leaves its requests in flight (``pipelined``,
:mod:`.window`) and answers how many events are acknowledged; the runner checkpoints only past
those. Called on its own (tests, tools), ``handle_batch`` builds a session for that context and
returns once every write finished. Every deadline is read from the tenure's clock
(``ctx.clock``).

Options arrive as keyword arguments (``singleton.toml`` ``[[listeners]]`` tables)::

    ElasticsearchSync(database="shop", collection="orders", es="https://es:9200",
                      api_key="...", index="{database}.{collection}", concurrency=2)
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from bson.timestamp import Timestamp

from listeners.base import ChangeEvent, ChangeStreamListener, ListenerContext, StopReason
from listeners.deadletters import DeadLetterStore
from listeners.elasticsearch import fragments, partitioned, sample
from listeners.elasticsearch.adaptive import BatchSizer
from listeners.elasticsearch.bulk import BulkItem, BulkLimits, BulkStats, BulkWriter, DeadLetter
from listeners.elasticsearch.copy import InitialCopy
from listeners.elasticsearch.deadletters import EsDeadLetters
from listeners.elasticsearch.documents import (
    DEFAULT_INDEX_TEMPLATE,
    Transform,
    resolve_transform,
)
from listeners.elasticsearch.documents import index_name as make_index_name
from listeners.elasticsearch.ids import bson_id_of
from listeners.elasticsearch.index import IndexKeeper
from listeners.elasticsearch.items import ItemMaker
from listeners.elasticsearch.shape import stream as shaped_stream
from listeners.elasticsearch.shape.collections import Shape, moved_version, parse_shape
from listeners.elasticsearch.shape.copy import ShapedCopy
from listeners.elasticsearch.shape.items import CollectionCounts, ShapedItems
from listeners.elasticsearch.shape.items import lines as shaped_lines
from listeners.elasticsearch.shape.relate import Joiner, key_of
from listeners.elasticsearch.transport import Transport, describe, make_transport
from listeners.elasticsearch.versioning import EventVersioner, first_seqs
from listeners.elasticsearch.window import BulkWindow
from singleton.drivers import mongo
from singleton.errors import ConfigurationError, SinkLostError
from singleton.retry import Backoff

#: The origin of copied documents, for their dead-letter records.
_COPIED = {"op": "initial_sync"}
_POSITIVE_INTEGERS = (
    "bulk_actions",
    "bulk_bytes",
    "concurrency",
    "copy_batch_size",
    "window_bytes",
    "sample_size",
)
_POSITIVE_NUMBERS = (
    "request_timeout",
    "ttl",
    "gc_safety_factor",
    "retry_timeout",
    "target_bulk_seconds",
)


@dataclass(frozen=True)
class _Session:
    """One tenure of the sink, built when it starts (see the module docstring). ``pipelined``:
    the runner drives it, so a batch's requests may be in flight when ``handle_batch``
    returns."""

    ctx: ListenerContext
    transport: Transport
    #: The transport was built here (from URLs) and is closed with the session.
    owns_transport: bool
    index: IndexKeeper
    writer: BulkWriter
    window: BulkWindow
    items: ItemMaker
    versioner: EventVersioner
    pipelined: bool
    #: A shaped listener's item maker (``collections``), else ``None``.
    shaped: ShapedItems | None = None

    def close(self) -> None:
        """Wait for the requests in flight (unacknowledged: the successor replays them), then
        release what the session created."""
        self.window.end()
        self.writer.close()
        if self.owns_transport:
            self.transport.close()


#: Where a batch's writes go: a mirror's index name, or a shaped listener's physical copy
#: targets by alias (``{}``: each collection's alias itself).
_Where = str | Mapping[str, str]


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
    #: While the stream is idle, check this often (seconds) that the index is still behind
    #: the alias (and, for a partition, the same one): a missing one is resynced (the writes
    #: of a busy stream find out on their own, see ``require_alias``).
    target_check_interval: float = 5.0
    #: While the stream is idle, compare this many random documents of each collection with
    #: the index this often (seconds; 0: never), and resync if one still differs at the next
    #: sample (:mod:`.sample`): an index changed by someone else.
    sample_interval: float = 60.0
    sample_size: int = 100
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
    #: Several collections, each with its own rules, instead of ``collection``: a shaped index
    #: (:mod:`.shape.collections`; ``[listeners.collections.<name>]`` tables).
    collections: Mapping[str, Any] | None = None

    extra_options: ClassVar[frozenset[str]] = (
        frozenset({"es", "api_key", "basic_auth", "ca_certs", "client_cert", "client_key"})
        | {"http_compress", "request_timeout", "index", "transform", "mappings", "settings"}
        | {"on_drop", "ttl", "gc_safety_factor", "dead_letters", "copy_batch_size"}
        | {"split_large_events", "sink_name", "window_bytes", "pipelined", "handover_wait"}
        | {"adaptive_batch", "target_bulk_seconds", "collections", "target_check_interval"}
        | {"sample_interval", "sample_size"}
        | {f.name for f in dataclasses.fields(BulkLimits)}  # the bulk writer's options
    )

    def __init__(self, **options: Any) -> None:
        options.setdefault("full_document", "updateLookup")
        super().__init__(**options)
        #: What the bulk writers of every tenure did (items written, refused as older,
        #: retried, dead-lettered; the metrics read it).
        self.stats = BulkStats()
        #: A shaped listener's events and dead letters per collection (the metrics' label).
        self.by_collection = CollectionCounts()
        #: Drops and renames of a watched collection (or its database) seen, every tenure:
        #: ``singleton_collection_drops_total`` (``on_drop`` decides what follows).
        self.drops_seen = 0
        self._sizer = BatchSizer(
            self.batch_size,
            target=self.target_bulk_seconds,
            max_bytes=self.bulk_bytes,
            name=self._index_name,
        )
        #: The tenure in progress (``None`` between tenures).
        self._session: _Session | None = None
        #: The sampled check across tenures (:mod:`.sample`).
        self._sampled = sample.SampledCheck()

    def _validate(self) -> None:
        super()._validate()
        cls = type(self).__name__
        if self.collections is not None and self.collection:
            raise ConfigurationError(
                f"{cls}: set collection (one collection, mirrored) or collections (several, "
                f"shaped), not both; got collection={self.collection!r}"
            )
        if not self.collection and self.collections is None:
            raise ConfigurationError(
                f"{cls} needs collection (the one to mirror) or collections "
                f"([listeners.collections.<name>] tables)"
            )
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
        self._check_numbers(cls)
        self._transform: Transform | None = resolve_transform(self.transform)
        self.transform = self._transform
        self._shape: Shape | None = None
        if self.collections is not None:
            self._shape = parse_shape(
                str(self.database),
                self.collections,
                default_index=self.index,
                transform=self._transform,
            )
            self._user_pipeline = list(self.pipeline)
            if self._shape.before_images and self.full_document_before_change is None:
                self.full_document_before_change = "whenAvailable"
            self._index_name = ",".join(sorted(self._shape.indexes))
            self._pre_images_checked = False
        else:
            self._index_name = make_index_name(self.index, str(self.database), str(self.collection))

    def _check_numbers(self, cls: str) -> None:
        """Raise :class:`ConfigurationError` naming the first bad numeric option."""
        for opt in _POSITIVE_INTEGERS:
            value = getattr(self, opt)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigurationError(f"{cls}.{opt} must be an integer >= 1, got {value!r}")
        for opt in _POSITIVE_NUMBERS:
            value = getattr(self, opt)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise ConfigurationError(f"{cls}.{opt} must be a number > 0, got {value!r}")
        for opt in ("pipelined", "adaptive_batch"):
            if not isinstance(getattr(self, opt), bool):
                raise ConfigurationError(
                    f"{cls}.{opt} must be true or false, got {getattr(self, opt)!r}"
                )
        wait = self.handover_wait
        if isinstance(wait, bool) or not isinstance(wait, (int, float)) or not 0 <= wait < 1e9:
            raise ConfigurationError(f"{cls}.handover_wait must be a number >= 0, got {wait!r}")
        every = self.target_check_interval
        if isinstance(every, bool) or not isinstance(every, (int, float)) or not 0 < every < 1e9:
            raise ConfigurationError(
                f"{cls}.target_check_interval must be seconds > 0, got {every!r}"
            )
        every = self.sample_interval
        if isinstance(every, bool) or not isinstance(every, (int, float)) or not 0 <= every < 1e9:
            raise ConfigurationError(
                f"{cls}.sample_interval must be seconds >= 0 (0: no sampled check), got {every!r}"
            )
        if self.gc_safety_factor < 1:
            raise ConfigurationError(
                f"{cls}.gc_safety_factor must be >= 1, got {self.gc_safety_factor!r}"
            )
        try:
            Backoff(self.backoff_base, self.backoff_max)
        except ConfigurationError as exc:
            raise ConfigurationError(f"{cls}.backoff_base / backoff_max: {exc}") from exc

    @property
    def gc_deletes_seconds(self) -> int:
        """See the module docstring for the formula."""
        return max(60, math.ceil(self.gc_safety_factor * (self.ttl + self.request_timeout)))

    @property
    def index_name(self) -> str:
        """The alias it writes to (a shaped listener's, comma-separated)."""
        return self._index_name

    @property
    def shape(self) -> Shape | None:
        """The collections and their rules (``collections``), or ``None`` for a mirror."""
        return self._shape

    def sink_identity(self) -> str:
        """``elasticsearch <nodes>/<index>``, e.g. ``elasticsearch http://es:9200/shop.orders``
        (addresses without credentials), or ``elasticsearch <sink_name>/<index>``."""
        where = self._index_name if self._shape is None else f"shaped:{self.name}"
        return f"elasticsearch {self.sink_name or describe(self.es)}/{where}"

    # -- tenures ----------------------------------------------------------------------------
    def _transport(self) -> tuple[Transport, bool]:
        """The session's transport to ``es``, and whether it was built here (from URLs)."""
        auth = self.basic_auth
        return make_transport(
            self.es,
            api_key=self.api_key,
            basic_auth=tuple(auth) if auth else None,
            ca_certs=self.ca_certs,
            client_cert=self.client_cert,
            client_key=self.client_key,
            http_compress=self.http_compress,
            request_timeout=self.request_timeout,
            maxsize=self.concurrency + 2,  # the index calls need one besides the bulk requests
        )

    def _open_session(self, ctx: ListenerContext, *, pipelined: bool) -> _Session:
        """Build the session of the tenure ``ctx`` (closing an earlier one's)."""
        self.close()
        transport, owned = self._transport()
        on_dead = self._on_dead(ctx)
        limits = {f.name: getattr(self, f.name) for f in dataclasses.fields(BulkLimits)}

        writer = BulkWriter(
            transport,
            BulkLimits(**limits),
            on_dead=on_dead,
            logger=ctx.logger,
            versioned=ctx.leadership.fenced,
            observe=self._sizer.observe if self.adaptive_batch else None,
            clock=ctx.clock,
            stats=self.stats,
        )
        client, coll = ctx.client, self._collection(ctx)
        keeper = IndexKeeper(
            transport,
            gc_deletes=self.gc_deletes_seconds,
            seconds=lambda c: mongo.cluster_time(c.client).time,
            settings=self.settings,
            mappings=self.mappings,
        )
        writer.aliases = keeper.aliases  # one set: what the keeper found, the writer requires
        keeper.watch = self.partition is not None
        writer.watched = keeper.watched
        window = BulkWindow(
            writer,
            max_requests=self.concurrency,
            max_bytes=self.window_bytes,
            clock=ctx.clock,
            on_handover=ctx.on_handover,
        )
        self._session = _Session(
            ctx=ctx,
            transport=transport,
            owns_transport=owned,
            index=keeper,
            writer=writer,
            window=window,
            items=ItemMaker(
                self._transform,
                on_dead,
                lambda key: coll.find_one({"_id": key}),
                versioned=writer.versioned,
            ),
            versioner=EventVersioner(lambda ts, after: first_seqs(client, ts, after)),
            pipelined=pipelined,
            shaped=self._shaped_items(ctx, transport, keeper, window, on_dead, writer.versioned),
        )
        return self._session

    def _shaped_items(
        self,
        ctx: ListenerContext,
        transport: Transport,
        keeper: IndexKeeper,
        window: BulkWindow,
        on_dead: Any,
        versioned: bool,
    ) -> ShapedItems | None:
        """A shaped listener's item maker (and its indexes named in their ``_meta``)."""
        shape = self._shape
        if shape is None:
            return None
        keeper.meta = {a: {shaped_stream.META_KEY: shape.digest(a)} for a in shape.indexes}
        database = ctx.client[shape.database]
        items = ShapedItems(
            shape,
            on_dead,
            lambda name, key: database[name].find_one({"_id": key}),
            shaped_stream.RouteFinder(transport, lambda: window.wait()),
            versioned=versioned,
            counts=self.by_collection,
            joiner=Joiner(database) if shape.sources else None,
            mine=partitioned.owner(self.partition),
        )

        def spill(pending: dict[str, BulkItem]) -> None:  # a fan-out's chunk, sent now
            for name in sorted({item.index for item in pending.values()}):
                keeper.ensure(name, ctx)
            window.submit(
                list(pending.values()), ctx.check, ctx.leadership.wait_lost, ctx.handing_over
            )
            pending.clear()

        items.spill = spill
        return items

    def _on_dead(self, ctx: ListenerContext) -> Callable[[list[DeadLetter]], None]:
        """Where the tenure's item rejections go (counted per collection when shaped)."""
        dead = self._dead_letters(ctx)

        def on_dead(letters: list[DeadLetter]) -> None:
            for letter in letters:
                name = letter.item.origin.get("collection")
                if isinstance(name, str):
                    self.by_collection.add(name, "dead_letters")
            dead.put(letters, ctx)

        return on_dead

    def _session_for(self, ctx: ListenerContext) -> _Session:
        """The session of the tenure ``ctx``; a caller that is no runner (it never called
        :meth:`on_start` for ``ctx``) gets one that writes one batch at a time."""
        session = self._session
        if session is not None and session.ctx is ctx:
            return session
        return self._open_session(ctx, pipelined=False)

    def _dead_letters(self, ctx: ListenerContext) -> Any:
        """Where item rejections go: ``dead_letters``, else the runner's store (event-level
        stores get one record per item)."""
        store = self.dead_letters
        if store is None or isinstance(store, DeadLetterStore):
            sink = store or ctx.dead_letters or DeadLetterStore(ctx.client)
            return EsDeadLetters(sink, keep_source=self.dead_letter_source)
        return store

    def close(self) -> None:
        """Release what this listener created (never a client it was given)."""
        session, self._session = self._session, None
        if session is not None:
            session.close()

    def on_start(self, ctx: ListenerContext) -> None:
        self._open_session(ctx, pipelined=self.pipelined)
        if self._shape is not None:
            self._start_shaped(ctx, self._shape)
            return
        if self.split_large_events:
            stages = fragments.with_split(self.pipeline, self._collection(ctx), ctx.logger)
            self.split_large_events = stages is not None  # detected once per listener
            self.pipeline = stages or self.pipeline
        self.pipeline = fragments.without_unused(
            self.pipeline, document_id=self._transform is not None
        )

    def _start_shaped(self, ctx: ListenerContext, shape: Shape) -> None:
        """A shaped tenure's stream: its collections, the pre-images of the routed ones."""
        if shape.before_images and not self._pre_images_checked:
            database = ctx.client[shape.database]
            shaped_stream.ensure_pre_images(database, shape.before_images, ctx.logger)
            self._pre_images_checked = True
        part = self.partition
        if part is not None and shape.sources and not isinstance(part, partitioned.SharedSources):
            # related documents' events reach every partition (see .partitioned.SharedSources)
            self.partition = partitioned.SharedSources(
                part.index, part.count, frozenset(shape.sources)
            )
        stages: list[Any] = shaped_stream.stream_pipeline(shape, self._user_pipeline)
        if self.split_large_events:
            first = ctx.client[shape.database][shape.names[0]]
            split = fragments.with_split(stages, first, ctx.logger)
            self.split_large_events = split is not None
            stages = split or stages
        self.pipeline = stages

    def stale_sink(self, ctx: ListenerContext) -> str | None:
        """Why a resumed tenure must rebuild the index first: a shaped index built by other
        rules (its ``_meta`` names another shape, see :mod:`.shape.collections`), or, for a
        partition, its share copied into a replaced index or by other rules
        (:func:`.partitioned.stale_share`)."""
        shape, session = self._shape, self._session_for(ctx)
        if self.partition is not None:
            return partitioned.stale_share(session.index, shape, ctx, self.lease_name)
        if shape is None:
            return None
        for alias in sorted(shape.indexes):
            if not session.index.targets(alias):
                continue  # gone: the first write tells (SinkLostError)
            built = shaped_stream.built_by(session.transport, alias)
            if built != shape.digest(alias):
                return (
                    f"index {alias} was built by {'another shape' if built else 'no shape'} "
                    f"({built or 'no _meta'}; now {shape.digest(alias)}): the collections, "
                    f"filters or field rules that feed it changed"
                )
        return None

    def on_stop(self, ctx: ListenerContext, reason: StopReason) -> None:
        self.close()  # what is still in flight is unacknowledged: the successor replays it

    def _collection(self, ctx: ListenerContext) -> Any:
        return ctx.client[str(self.database)][str(self.collection)]

    def ensure_index(self, name: str, ctx: ListenerContext) -> None:
        """Create ``name`` if missing, or raise its ``gc_deletes`` (see :mod:`.index`)."""
        self._session_for(ctx).index.ensure(name, ctx)

    # -- streaming ----------------------------------------------------------------------------
    def handle_batch(self, events: Sequence[ChangeEvent], ctx: ListenerContext) -> int | None:
        """Apply ``events``: each write succeeds, is already superseded (409) or is
        dead-lettered. Within a batch only the last write per document is sent: the later
        version would supersede the earlier ones anyway. In a pipelined tenure the requests may
        still be in flight when this returns: the answer is how many events the window has
        acknowledged (:mod:`.window`); otherwise it returns once they all finished."""
        session = self._session_for(ctx)
        window = session.window
        where: _Where = self._index_name if session.shaped is None else {}  # (shaped: aliases)
        if not session.pipelined:
            self._apply(session, events, where)
            window.acknowledged()  # drop the finished entries: they were waited for
            return None
        window.open()
        self._write(session, events, where)
        window.close(len(events))
        return window.acknowledged()

    def on_idle(self, ctx: ListenerContext) -> None:
        """Every ``target_check_interval`` seconds of an idle stream: raise
        :class:`SinkLostError` (the tenure resyncs) if the index behind an alias this tenure
        writes to is gone or, for a partition, was replaced (:meth:`.IndexKeeper.lost`); and
        every ``sample_interval`` seconds, the sampled check of :mod:`.sample`."""
        session = self._session
        if session is None or session.ctx is not ctx:
            return
        now = ctx.clock.monotonic()
        if now >= ctx.state.get("next_target_check", 0.0):
            ctx.state["next_target_check"] = now + self.target_check_interval
            names = [self._index_name] if self._shape is None else sorted(self._shape.indexes)
            for name in names:  # (once per tenure: what a first write would check)
                session.index.ensure(name, ctx)
            why = session.index.lost()
            if why is not None:
                raise SinkLostError(f"{why}; found while the stream was idle")
        if self.sample_interval:
            self._sample(session, ctx)

    def _sample(self, session: _Session, ctx: ListenerContext) -> None:
        """The sampled check of :mod:`.sample`, over this listener's collections."""
        database = ctx.client[str(self.database)]

        def views() -> list[sample.View]:
            if self._shape is not None:
                return sample.shaped_views(self._shape, database)
            return [sample.mirror_view(str(self.collection), self._index_name, self._transform)]

        self._sampled.run(
            ctx,
            session.transport,
            database,
            views,
            size=self.sample_size,
            interval=self.sample_interval,
            mine=partitioned.owner(self.partition),
            dead_lettered=lambda keys: self._dead_lettered(ctx, keys),
        )

    def _dead_lettered(self, ctx: ListenerContext, keys: Sequence[Any]) -> set[bytes]:
        """Which of the document ``keys`` this listener dead-lettered (``key_of`` each), where
        its dead letters are a :class:`DeadLetterStore` (else none are known)."""
        store = self.dead_letters or ctx.dead_letters or DeadLetterStore(ctx.client)
        if not isinstance(store, DeadLetterStore):
            return set()
        found = store.dead_letters.find(
            {"_id.listener": ctx.listener_name, "_id.key": {"$in": list(keys)}}, {"_id": 1}
        )
        return {key_of(doc["_id"]["key"]) for doc in found}

    def flush(self, deadline: float | None, ctx: ListenerContext) -> int | None:
        """Wait for the window; with a ``deadline`` (a planned handover) at most
        ``handover_wait`` seconds, so that the lease moves in about that time even on a slow
        sink (the successor replays what is still in flight)."""
        session = self._session
        if session is None or session.ctx is not ctx:
            return 0  # closed meanwhile: nothing it held is acknowledged
        if deadline is None:
            return session.window.flush(stop=ctx.handing_over)
        return session.window.flush(min(deadline, ctx.clock.monotonic() + self.handover_wait))

    def next_batch_size(self) -> int:
        """``batch_size``, or less while the sink is slow (``adaptive_batch``)."""
        return self._sizer.size if self.adaptive_batch else self.batch_size

    def _apply(self, session: _Session, events: Sequence[ChangeEvent], where: _Where) -> None:
        """Write ``events`` into ``where`` one batch at a time: after what was in flight, and
        wait for their requests (a handover stops either wait, as in flight)."""
        stop = session.ctx.handing_over
        session.window.wait(stop=stop)
        session.window.open()
        self._write(session, events, where)
        session.window.wait(stop=stop)

    def _write(self, session: _Session, events: Sequence[ChangeEvent], where: _Where) -> None:
        """Send the bulk items of ``events`` into ``where`` through the window."""
        ctx, window = session.ctx, session.window
        pending: dict[str, BulkItem] = {}
        joined, at = events, 0
        while True:
            at = self._collect(session, joined, at, pending, where)
            if at >= len(joined):
                break
            if "splitEvent" in joined[at]:  # (rare: the fragments from here on are joined first)
                joined = [*joined[:at], *fragments.join(joined[at:])]
                continue
            if pending:  # what came before the drop goes first
                self._ensure_targets(session, pending, where)
                writes = session.writer.session(ctx.check, ctx.leadership.wait_lost)
                writes.send(list(pending.values()))
                pending.clear()
            window.wait()
            if isinstance(where, str):
                self._dropped(joined[at], session, where)
            else:
                self._dropped_shaped(joined[at], session)
            at += 1
        if pending:
            self._ensure_targets(session, pending, where)
            window.submit(
                list(pending.values()), ctx.check, ctx.leadership.wait_lost, ctx.handing_over
            )

    @staticmethod
    def _collect(
        session: _Session,
        events: Sequence[ChangeEvent],
        at: int,
        pending: dict[str, BulkItem],
        where: _Where,
    ) -> int:
        """The item maker's ``collect``: the mirror's into the index ``where``, a shaped
        listener's into each collection's alias, or that alias's copy target in ``where``."""
        if session.shaped is None:
            assert isinstance(where, str)
            return session.items.collect(events, at, session.versioner, where, pending)
        assert not isinstance(where, str)
        return session.shaped.collect(events, at, session.versioner, pending, where)

    @staticmethod
    def _ensure_targets(session: _Session, pending: Mapping[str, BulkItem], where: _Where) -> None:
        """Make the indexes ``pending`` writes to (a mirror's: ``where`` alone)."""
        names = [where] if isinstance(where, str) else {item.index for item in pending.values()}
        for name in sorted(names):
            session.index.ensure(name, session.ctx)

    def _dropped(self, event: ChangeEvent, session: _Session, name: str) -> None:
        """The collection dropped or renamed away: ``keep`` leaves its documents in the index
        (a WARNING says so: they are no longer in MongoDB), ``delete_index`` deletes it (what
        is written next builds it anew)."""
        self.drops_seen += 1
        session.ctx.logger.warning(
            "elasticsearch: {} of {} seen; on_drop={} for index {}{}",
            event.get("operationType"),
            f"{self.database}.{self.collection}",  # (the stream leaves ``ns`` out)
            self.on_drop,
            name,
            ": its documents stay in the index" if self.on_drop == "keep" else "",
        )
        if self.on_drop == "delete_index":
            session.index.delete(name, session.ctx)

    # -- a shaped listener ----------------------------------------------------------------
    def _dropped_shaped(self, event: ChangeEvent, session: _Session) -> None:
        """A collection of the shape dropped or renamed away (or the database dropped): with
        ``on_drop = "delete_index"`` its documents leave the index by a resync of every
        collection (the index then equals what is left); ``keep`` keeps them."""
        op, where = event.get("operationType"), event.get("ns") or {}
        name = f"{self.database}.{where.get('coll') or '*'}"
        self.drops_seen += 1
        session.ctx.logger.warning(
            "elasticsearch: {} of {} seen; on_drop={} for {}", op, name, self.on_drop, self.name
        )
        if self.on_drop == "delete_index":
            raise SinkLostError(
                f"{op} of {name}: its documents leave index {self._index_name} by a resync "
                f"(on_drop = delete_index)"
            )

    # -- initial sync ---------------------------------------------------------------------------
    def initial_sync(self, ctx: ListenerContext) -> None:
        """Copy the collection into a fresh physical index (resumably, see :mod:`.copy`),
        replay what happened since the copy began, then move the alias onto it atomically and
        drop the old index (see :mod:`.index`). Used for the first sync and every resync. A
        partition copies its own documents in place instead (:mod:`.partitioned`)."""
        session = self._session_for(ctx)
        bound = None if self.partition is None else partitioned.sweep_bound(ctx)
        if session.shaped is not None:
            assert self._shape is not None
            ShapedCopy(
                name=self.lease_name,
                shape=self._shape,
                items=session.shaped,
                replay=lambda events, targets: self._apply(
                    session, partitioned.only(self.partition, events), targets
                ),
                batch_size=self.copy_batch_size,
                replay_batch=self.batch_size,
                part=self.partition,
                before_change=self.full_document_before_change,
            ).run(ctx, session.index, session.writer)
            self._copied(session, ctx, bound)
            return
        index, items, part, alias = session.index, session.items, self.partition, self._index_name
        saved = ctx.load_progress() or {}
        target, extra = saved.get("target"), {}
        if part is not None:
            target = partitioned.live_index(index, alias, part, ctx)
            extra = partitioned.resumable(index, [alias], ctx)
        elif not isinstance(target, str) or not index.exists(target):
            if saved:
                ctx.save_progress(None)  # a copy into an index that is gone, or pre-alias
            target = index.fresh(alias, ctx)
            # Kept at once: a copy that fails before its first batch is settled (its first
            # read timed out) resumes into this index, replaying from this cluster time,
            # instead of making another on every retry.
            ts = mongo.cluster_time(ctx.client)
            ctx.save_progress({"target": target, "start_time": [ts.time, ts.inc]})
        ctx.logger.info("initial sync of {}: copying into {} (alias {})", self.name, target, alias)
        mine = partitioned.owner(part)
        copy = InitialCopy(
            name=self.lease_name,
            make_item=lambda doc, version: (
                items.item(doc, doc["_id"], version, _COPIED, target) if mine(doc["_id"]) else None
            ),
            replay=lambda events, _ctx: self._apply(
                session, partitioned.only(part, events), target
            ),
            batch_size=self.copy_batch_size,
            replay_batch=self.batch_size,
            progress_extra={"target": target, **extra},
        )
        copy.run(ctx, self._collection(ctx), session.writer)
        if part is None:
            index.swap(alias, target, ctx)
        ctx.save_progress(None)
        self._copied(session, ctx, bound)

    def _copied(self, session: _Session, ctx: ListenerContext, bound: Timestamp | None) -> None:
        """A partition's copy (begun at or after ``bound``) is done: delete what it left behind
        (:func:`.partitioned.sweep`), and keep, beside the checkpoint, which physical indexes
        it copied into and by which rules (:func:`.partitioned.record_copy`)."""
        if self.partition is None or bound is None:
            return
        shape, versioned = self._shape, session.writer.versioned
        if versioned:  # (unversioned, the drill's unsafe mode: no version tells what is old)
            share = partitioned.Share(
                sorted(shape.indexes) if shape is not None else [self._index_name],
                self._key_of,
                lambda index, es_id, version, routing: shaped_lines(
                    "delete", index, es_id, version, routing, None
                ),
                moved_version if shape is not None else partitioned.Share.index_version,
            )
            partitioned.sweep(ctx, session.transport, session.writer, self.partition, bound, share)
        partitioned.record_copy(session.index, shape, ctx, self.lease_name)

    def _key_of(self, alias: str, es_id: str) -> Any:
        """The MongoDB ``_id`` of document ``es_id`` of ``alias`` (``ValueError``: none)."""
        if self._shape is not None:
            return self._shape.source_of_id(alias, es_id)[1]
        try:
            return bson_id_of(es_id)
        except Exception as exc:  # (an id no listener of this kind wrote)
            raise ValueError(f"not a document id of this listener: {es_id[:80]!r}") from exc
