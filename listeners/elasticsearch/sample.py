"""A sampled check of the index against its collections, while the stream is idle.

The writes check themselves as they go (``require_alias``, where a delete landed: :mod:`.bulk`)
and an idle stream checks its alias (``target_check_interval``). What neither can see is the
index changed by someone else: documents deleted or overwritten through the API, a snapshot
restored over it. A sample sees it. Every ``sample_interval`` seconds of an idle stream,
``sample_size`` random documents of each collection (its filter applied; a partition keeps its
own) are read from MongoDB and fetched from the index (one ``_mget`` per alias, each with its
routing), and compared as ``singleton verify`` compares them.

A document the index refused (a dead letter of the listener) is not a divergence. A document
that differs is only a *suspect*: a write may have come between the two reads, or
its event may not be applied yet. At the next sample, the stream having been idle again, the
suspect is read again from both sides; if MongoDB still gives the same expected document and
the index still differs, the index has diverged, and the tenure raises :class:`SinkLostError`
(one ERROR line naming the documents, a resync, ``sink_lost``). A document in the index that
the collection no longer holds is not sampled (the sample is drawn from MongoDB).

A comparison that cannot hold for an index (its mapping leaves fields out of ``_source``, an
ingest pipeline rewrites documents) would find it differing after every resync, too. So a
divergence confirmed again before any sample came out clean since the last one turns the check
off for the listener, with one ERROR line that says why, instead of resyncing in a loop.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from listeners.elasticsearch.documents import source_of
from listeners.elasticsearch.ids import doc_id
from listeners.elasticsearch.shape.paths import MISSING
from listeners.elasticsearch.shape.relate import Joiner, key_of
from listeners.elasticsearch.transport import Transport, path_index
from listeners.elasticsearch.verify import Diff
from singleton.errors import SingletonError, SinkError, SinkLostError

if TYPE_CHECKING:
    from listeners.base import ListenerContext
    from listeners.elasticsearch.documents import Transform
    from listeners.elasticsearch.shape.collections import Shape

#: The ``ctx.state`` key of a tenure's sample state (:class:`Sampled`).
STATE = "index_sample"
#: Documents named in the ERROR line of a confirmed divergence.
SHOWN = 5
#: What :func:`_fetch` returns for a document held under a routing other than its own.
ELSEWHERE = object()


@dataclass(frozen=True)
class Expected:
    """What the index should hold for one sampled document (``source`` ``None``: nothing,
    the filter or the transform keeps it out)."""

    collection: str
    key: Any
    alias: str
    es_id: str
    routing: str | None
    source: Any


@dataclass(frozen=True)
class View:
    """How one collection is expected in the index (its ``alias``): its filter, and
    ``expect(collection, keys)`` (the documents of ``keys`` as they are now, :class:`Expected`
    each)."""

    collection: str
    alias: str
    query: Mapping[str, Any]
    expect: Callable[[Any, Sequence[Any]], list[Expected]]


@dataclass
class Sampled:
    """A tenure's sample state: when the next sample is due, and the suspects of the last."""

    due: float = 0.0
    suspects: dict[tuple[str, str], Expected] = field(default_factory=dict)
    samples: int = 0


def mirror_view(collection: str, alias: str, transform: Transform | None) -> View:
    """The view of a mirrored collection (``doc_id`` ids, no routing, ``transform``)."""

    def expect(coll: Any, keys: Sequence[Any]) -> list[Expected]:
        out = []
        for doc in coll.find({"_id": {"$in": list(keys)}}):
            try:
                raw = source_of(doc, transform)
                es_id = doc_id(doc["_id"])
            except Exception:  # (a transform's error too) dead-lettered by the stream
                continue
            source = None if raw is None else json.loads(raw)
            out.append(Expected(collection, doc["_id"], alias, es_id, None, source))
        return out

    return View(collection, alias, {}, expect)


def shaped_views(shape: Shape, database: Any) -> list[View]:
    """The views of a shaped listener's collections (their filters, ids, routing, rules and
    related documents, as :mod:`.shape.verify` reads them)."""
    joiner = Joiner(database)
    views = []
    for name in shape.names:
        rules = shape.collections[name]

        def expect(coll: Any, keys: Sequence[Any], rules: Any = rules) -> list[Expected]:
            if rules.relations:
                docs = list(joiner.roots(rules.name, rules.relations, keys).values())
            else:
                docs = list(coll.find({"_id": {"$in": list(keys)}}))
            out = []
            for doc in docs:
                try:
                    es_id, routing = rules.es_id(doc["_id"]), rules.routing_of(doc)
                    body = rules.shaped(doc)
                    raw = None if body is None else source_of(body)
                except Exception:  # (a transform's error too) dead-lettered by the stream
                    continue
                source = None if raw is None else json.loads(raw)
                out.append(Expected(rules.name, doc["_id"], rules.index, es_id, routing, source))
            return out

        query = dict(rules.filter.query) if rules.filter is not None else {}
        views.append(View(name, rules.index, query, expect))
    return views


class SampledCheck:
    """A listener's sampled check across its tenures: the first sample an ``interval`` into a
    tenure, and the guard against a resync loop (see the module docstring)."""

    def __init__(self) -> None:
        #: It resynced, and no sample came out clean since.
        self.resynced = False
        #: It found the index differing again before one did: it cannot judge this index.
        self.off = False

    def run(
        self,
        ctx: ListenerContext,
        transport: Transport,
        database: Any,
        views: Callable[[], Sequence[View]],
        **options: Any,
    ) -> None:
        """:func:`check` (``options``: its keyword arguments) when a sample is due, over
        ``views()``, unless turned off; a failed read costs that sample only. (Called at every
        idle poll: nothing is built before a sample is due.)"""
        state = ctx.state.get(STATE)
        now = ctx.clock.monotonic()
        if self.off or (isinstance(state, Sampled) and now < state.due):
            return
        if state is None:  # (the copy, if any, is the next samples' and verify's)
            ctx.state[STATE] = Sampled(now + options["interval"])
            return
        try:
            suspects = check(ctx, transport, database, views(), **options)
        except SinkLostError as exc:
            if not self.resynced:
                self.resynced = True  # until a sample comes out clean
                raise
            self.off = True
            ctx.logger.error(
                "sampled check turned off for {}: it found the index differing again before"
                " any clean sample since its last resync, so the comparison cannot hold for"
                " this index (a mapping that leaves fields out of _source, or an ingest"
                " pipeline?); set sample_interval = 0 to say so: {}",
                ctx.listener_name,
                exc,
            )
            return
        except SingletonError:
            raise  # (the lease in doubt: the tenure ends)
        except Exception as exc:  # an auxiliary check: a failed read costs this sample only
            ctx.logger.warning("sampled check of {} skipped: {!r}", ctx.listener_name, exc)
            return
        if suspects == 0:
            self.resynced = False


def check(
    ctx: ListenerContext,
    transport: Transport,
    database: Any,
    views: Sequence[View],
    *,
    size: int,
    interval: float,
    mine: Callable[[Any], bool],
    dead_lettered: Callable[[Sequence[Any]], set[bytes]] = lambda keys: set(),
) -> int | None:
    """While idle, every ``interval`` seconds: confirm the last sample's suspects (raise
    :class:`SinkLostError` for the ones still differing), then draw a new sample; the number
    of its suspects (``None``: no sample was due, or the index did not answer)."""
    state = ctx.state.setdefault(STATE, Sampled())
    assert isinstance(state, Sampled)
    now = ctx.clock.monotonic()
    if now < state.due:
        return None
    state.due = now + interval
    by_name = {v.collection: v for v in views}
    if state.suspects:
        again = _expected(database, by_name, _keys_of(state.suspects.values()))
        still = [
            want
            for want in again
            if (want.alias, want.es_id) in state.suspects
            and state.suspects[(want.alias, want.es_id)].source == want.source
        ]
        diverged = _differing(transport, still) if still else []
        if diverged:  # (a document the index refused is a dead letter, not a divergence)
            dead = dead_lettered([e.key for e in diverged])
            diverged = [e for e in diverged if key_of(e.key) not in dead]
        if diverged:
            shown = ", ".join(f"{e.alias}/{e.es_id}" for e in diverged[:SHOWN])
            raise SinkLostError(
                f"a sampled check found {len(diverged)} document(s) of the index differing from"
                f" the collection twice, the stream idle in between (first: {shown}): the"
                " index was changed under the listener; only a copy makes it equal again"
            )
    ctx.check()
    sample: list[Expected] = []
    for view in views:
        keys = [k for k in _draw(database[view.collection], view.query, size) if mine(k)]
        if keys:
            sample += view.expect(database[view.collection], keys)
    state.samples += 1
    differing = _differing(transport, sample) if sample else []
    if differing is None:  # the index did not answer: no sample, not a clean one
        state.suspects = {}
        return None
    state.suspects = {(e.alias, e.es_id): e for e in differing}
    if state.suspects:
        ctx.logger.info(
            "sampled check: {} of {} documents differ from the index; checking them again at"
            " the next idle sample",
            len(state.suspects),
            len(sample),
        )
    return len(state.suspects)


def _draw(coll: Any, query: Mapping[str, Any], size: int) -> list[Any]:
    """``size`` random ``_id`` s of ``coll`` among those matching ``query``."""
    stages = [{"$match": dict(query)}, {"$sample": {"size": size}}, {"$project": {"_id": 1}}]
    return [doc["_id"] for doc in coll.aggregate(stages)]


def _keys_of(entries: Iterable[Expected]) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for e in entries:
        out.setdefault(e.collection, []).append(e.key)
    return out


def _expected(
    database: Any, views: Mapping[str, View], keys: Mapping[str, list[Any]]
) -> list[Expected]:
    """The documents ``keys`` as they are expected now (one deleted since is left out: its
    own event takes it out of the index)."""
    out: list[Expected] = []
    for name, wanted in keys.items():
        view = views.get(name)
        if view is not None:
            out += view.expect(database[name], wanted)
    return out


def _fetch(transport: Transport, alias: str, wanted: Sequence[Expected]) -> list[Any] | None:
    """What ``alias`` holds of each of ``wanted`` (its ``_source``, ``MISSING`` when absent),
    in one ``_mget`` with each document's routing; ``None`` if the index did not answer. A
    copy held under another routing (found anyway: one shard, or the same one) is returned as
    :data:`ELSEWHERE`, which equals no source."""
    docs = [
        {"_id": e.es_id, **({"routing": e.routing} if e.routing is not None else {})}
        for e in wanted
    ]
    body = json.dumps({"docs": docs}).encode()
    status, resp = transport.request("POST", f"/{path_index(alias)}/_mget", body)
    if status != 200 or not isinstance(resp, dict) or len(resp.get("docs") or []) != len(docs):
        return None
    return [
        MISSING
        if not got.get("found")
        else got.get("_source")
        if got.get("_routing") == want.routing
        else ELSEWHERE
        for want, got in zip(wanted, resp["docs"], strict=True)
    ]


def _by_alias(expected: Iterable[Expected]) -> dict[str, list[Expected]]:
    out: dict[str, list[Expected]] = {}
    for e in expected:
        out.setdefault(e.alias, []).append(e)
    return out


def _differing(transport: Transport, expected: Sequence[Expected]) -> list[Expected] | None:
    """The ``expected`` documents that the index does not hold as expected (those a rule
    keeps out must be absent); ``None`` if the index did not answer (the writes and the
    alias check deal with a sink that is down or gone)."""
    out: list[Expected] = []
    for alias, wanted in sorted(_by_alias(expected).items()):
        held = _fetch(transport, alias, wanted)
        if held is None:
            return None
        for want, got in zip(wanted, held, strict=True):
            if (None if got is MISSING else got) != want.source:
                out.append(want)
    return out


def compare_sample(
    database: Any, transport: Transport, views: Sequence[View], size: int
) -> dict[str, tuple[Diff, dict[str, Expected]]]:
    """``singleton verify --sample``: per alias, ``size`` random documents of each collection
    that feeds it against the index (``missing`` and ``stale``; an ``extra`` id cannot be
    judged from a sample of the collection), and what each was expected as."""
    drawn: list[Expected] = []
    for view in views:
        coll = database[view.collection]
        drawn += view.expect(coll, _draw(coll, view.query, size))
    out: dict[str, tuple[Diff, dict[str, Expected]]] = {}
    for alias in sorted({v.alias for v in views}):
        wanted = [e for e in drawn if e.alias == alias and e.source is not None]
        diff = Diff(mongo_count=len(wanted))
        held = _fetch(transport, alias, wanted) if wanted else []
        if held is None:
            raise SinkError(f"sampling {alias}: the index did not answer its _mget")
        for want, got in zip(wanted, held, strict=True):
            if got is MISSING:
                diff.missing.append(want.es_id)
            elif got != want.source:
                diff.stale.append(want.es_id)
        diff.es_count = sum(got is not MISSING for got in held)
        out[alias] = (diff, {e.es_id: e for e in wanted})
    return out
