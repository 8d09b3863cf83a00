"""A partitioned ``ElasticsearchSync`` (``partitions = K``): K leaders share one index.

Each partition mirrors only its own documents (:mod:`listeners.stream.partition`), so an initial
sync or
a resync of one partition must not rebuild the index behind the alias the way an unpartitioned
listener does: that would drop the other partitions' documents. A partition therefore copies its
documents **in place**, into the live index, with the copy's external versions (which never
regress a newer document), and replays only its own events of the copy window. Partition 0
creates the index (behind the alias) when there is none; the others wait for it, retrying as
for an unavailable sink.

Copying in place leaves behind what the copy did not write: a document of that partition
deleted while its history was lost (the case a resync exists for), or one that a changed filter
now keeps out. So after its copy a partition sweeps its share of the index (:func:`sweep`): every
one of its documents older than the copy (an external version below the copy's first cluster
time: neither the copy nor any event since wrote it) is deleted at that version, which anything
newer still beats.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from bson.timestamp import Timestamp

from listeners.elasticsearch.bulk import BulkItem, BulkWriter
from listeners.elasticsearch.copy import copy_version
from listeners.elasticsearch.transport import path_index
from listeners.stream.partition import Partition, partition_of
from singleton.drivers import mongo
from singleton.errors import SinkError, SinkUnavailableError

if TYPE_CHECKING:
    from listeners.base import ChangeEvent, ListenerContext
    from listeners.elasticsearch.index import IndexKeeper
    from listeners.elasticsearch.shape.collections import Shape
    from listeners.elasticsearch.transport import Transport


#: Seconds a partition's copy waits for partition 0 to create a missing index before it
#: fails (retried as a sink that is unavailable). A resync after the index was deleted meets
#: this: partition 0 recreates it once its own writes or idle check find it gone.
CREATE_WAIT = 30.0


def live_index(index: IndexKeeper, alias: str, part: Partition, ctx: ListenerContext) -> str:
    """The index a partition copies into: the alias, created (by partition 0) if missing; the
    other partitions wait up to :data:`CREATE_WAIT` seconds for it. What it points to now is
    what this partition's writes must land in from here on."""
    index.forget(alias)
    deadline = ctx.clock.monotonic() + CREATE_WAIT
    while not index.watch_alias(alias):
        plain = index.exists(alias)
        # A plain index of an earlier version, or the alias another partition created just
        # now (after the look above): what it points to is the reference too. But an empty
        # plain index was made by a delete through the alias once it was gone (see
        # IndexKeeper.ensure): partition 0 puts the alias in its place, and the others wait
        # for that as for a missing index.
        if plain and (index.watch_alias(alias) or not index.empty(alias)):
            break
        if part.index == 0:
            if plain:
                index.swap(alias, index.fresh(alias, ctx), ctx)
            else:
                index.fresh(alias, ctx, with_alias=True)
            index.watch_alias(alias)
            break
        left = deadline - ctx.clock.monotonic()
        if left <= 0:
            raise SinkUnavailableError(
                f"index {alias} does not exist yet: partition {part.index} of {part.count} waits"
                " for partition 0 to create it"
            )
        if ctx.leadership.wait_lost(min(0.25, left)):
            ctx.check()
    return alias


#: The copy-progress key under which a partition's copy names what it copies into.
INTO = "into"


def resumable(index: IndexKeeper, aliases: Sequence[str], ctx: ListenerContext) -> dict[str, Any]:
    """What a partition's copy goes into, to keep in its progress (``{INTO: ...}``): each
    alias's physical indexes by ``index.uuid``. Progress saved for other indexes (an earlier
    tenure's copy into an index since deleted and recreated by another partition: the
    documents it counts as copied are not in these) is dropped, and the copy starts over."""
    into = {alias: index.uuids(alias) for alias in sorted(aliases)}
    saved = ctx.load_progress()
    if saved and saved.get(INTO) != into:
        ctx.save_progress(None)
    return {INTO: into}


#: The progress key under which a partition keeps what its last copy went into (``index.uuid``
#: by physical index, per alias) ...
COPIED_INTO = "copied_into"
#: ... and the digest of the rules that built each alias (a shaped partition).
COPIED_SHAPE = "copied_shape"


def record_copy(index: IndexKeeper, shape: Shape | None, ctx: ListenerContext, name: str) -> None:
    """A partition's copy is done: keep, beside its checkpoint, which physical indexes it
    copied into and, shaped, by which rules, so that a later tenure finds out if another
    partition replaced them meanwhile or the rules changed (:func:`stale_share`)."""
    into = index.reference()
    ctx.logger.debug("elasticsearch: {} copied into {}", name, into)
    record: dict[str, Any] = {COPIED_INTO: into}
    if shape is not None:
        record[COPIED_SHAPE] = {alias: shape.digest(alias) for alias in sorted(shape.indexes)}
    ctx.save_progress(record)


def stale_share(
    index: IndexKeeper, shape: Shape | None, ctx: ListenerContext, name: str
) -> str | None:
    """A resumed partition's: why its share must be copied again, or ``None``. Either the
    indexes its last copy went into are no longer behind their aliases (another partition
    recreated a deleted index while this one did not run: its own documents are not there), or
    its copy used other rules than the configured ones (a shaped partition; its resync copies
    again in place and :func:`sweep` removes what the new rules keep out). What the copy went
    into stays the reference of this tenure's writes and idle checks (an alias gone now: the
    first of them tells)."""
    record = ctx.load_progress() or {}
    into = record.get(COPIED_INTO)
    if not isinstance(into, dict) or not into:  # (an earlier version's checkpoint)
        ctx.logger.info(
            "elasticsearch: {} resumes with no record of what its last copy went into ({!r})",
            name,
            into,
        )
        into = {}
    for alias, then in sorted(into.items()):
        index.adopt(alias, then)
        now = index.uuids(alias)
        ctx.logger.debug("elasticsearch: {} copied into {}, now {}", alias, then, now)
        if now and now != then:
            return (
                f"index {alias} points to other indexes (now {', '.join(sorted(now))}) than"
                f" this partition copied into ({', '.join(sorted(then))}, by index.uuid):"
                " it was replaced while this partition did not run"
            )
    rules = record.get(COPIED_SHAPE)
    if shape is None or not isinstance(rules, dict):
        return None  # (no rules recorded by this version: the index's _meta is not its own)
    for alias in sorted(shape.indexes):
        if rules.get(alias) != shape.digest(alias):
            return (
                f"index {alias}: this partition's documents were copied by other rules "
                f"({rules.get(alias) or 'none'}; now {shape.digest(alias)}): the collections, "
                "filters or field rules that feed it changed"
            )
    return None


def owner(part: Partition | None) -> Callable[[Any], bool]:
    """Whether a document ``_id`` is this partition's (always, unpartitioned)."""
    if part is None:
        return lambda _key: True
    return lambda key: part.owns({"documentKey": {"_id": key}})


def only(part: Partition | None, events: Sequence[ChangeEvent]) -> Sequence[ChangeEvent]:
    """This partition's events (all of them, unpartitioned)."""
    return events if part is None else [e for e in events if part.owns(e)]


@dataclass(frozen=True)
class SharedSources(Partition):
    """A shaped listener's partition when it relates documents (:mod:`.shape.relate`): the
    events of the related collections reach *every* partition, each rebuilding only its own
    roots among those they touch (and indexing the related document only if it is its own)."""

    sources: frozenset[str] = frozenset()

    def owns(self, event: Mapping[str, Any]) -> bool:
        if (event.get("ns") or {}).get("coll") in self.sources:
            return True
        return super().owns(event)


#: Documents read per scroll page, and deletes per bulk request, by :func:`sweep`.
SWEEP_PAGE = 1000


def sweep_bound(ctx: ListenerContext) -> Timestamp:
    """Before a partition's copy: a cluster time no later than the one its copy versions its
    documents with (the first attempt's, for a copy resumed; see :mod:`.copy`)."""
    now = mongo.cluster_time(ctx.client)
    start = (ctx.load_progress() or {}).get("start_time")
    if isinstance(start, list) and len(start) == 2:
        return min(now, Timestamp(*start))
    return now


def _same(version: int) -> int:
    return version


@dataclass(frozen=True)
class Share:
    """What :func:`sweep` needs of a listener: the ``aliases`` it writes; ``key_of(alias,
    es_id)``, a document's MongoDB ``_id`` (``ValueError``: not one of its documents, left
    alone); ``delete(index, es_id, version, routing)``, a delete action; ``index_version``,
    which maps a version to one below every write at or after it and above every write before
    it (a shaped index's: :func:`.shape.collections.moved_version`)."""

    aliases: Sequence[str]
    key_of: Callable[[str, str], Any]
    delete: Callable[[str, str, int, str | None], bytes]
    index_version: Callable[[int], int] = _same


def sweep(
    ctx: ListenerContext,
    transport: Transport,
    writer: BulkWriter,
    part: Partition,
    bound: Timestamp,
    share: Share,
) -> int:
    """After partition ``part``'s copy (begun at or after ``bound``): delete each of its
    documents whose version is below ``share.index_version(copy_version(bound))`` - what the
    copy left behind - at that version. Returns how many it deleted."""
    below = share.index_version(copy_version(bound))
    session = writer.session(ctx.check, ctx.leadership.wait_lost)
    swept = 0
    for alias in share.aliases:
        held = _versions(transport, alias)
        ctx.logger.debug(
            "elasticsearch: sweeping {} for partition {}: {} documents, {} below version {}",
            alias,
            part.index,
            len(held),
            sum(v < below for _, _, v in held),
            below,
        )
        for es_id, routing, version in held:
            try:
                key = share.key_of(alias, es_id)
            except ValueError:
                continue
            if version >= below or partition_of(key, part.count) != part.index:
                continue
            made = share.delete(alias, es_id, below, routing)
            session.add(BulkItem("delete", alias, es_id, below, None, {"op": "sweep"}, made))
            swept += 1
    session.finish()
    if swept:
        ctx.logger.info(
            "elasticsearch: partition {} of {} deleted {} documents its copy left behind "
            "(older than {})",
            part.index,
            part.count,
            swept,
            bound,
        )
    return swept


def _versions(transport: Transport, alias: str) -> list[tuple[str, str | None, int]]:
    """``(_id, _routing, _version)`` of every document behind ``alias`` (refreshed first)."""
    name = path_index(alias)
    status, _ = transport.request("POST", f"/{name}/_refresh")
    if status == 404:
        return []
    query = {"size": SWEEP_PAGE, "_source": False, "version": True, "sort": ["_doc"]}
    status, body = transport.request(
        "POST", f"/{name}/_search?scroll=2m", json.dumps(query).encode()
    )
    out: list[tuple[str, str | None, int]] = []
    while True:
        if status != 200 or not isinstance(body, dict):
            raise SinkError(f"scrolling {alias} for the documents a copy left: HTTP {status}")
        hits = body["hits"]["hits"]
        out += [(h["_id"], h.get("_routing"), int(h.get("_version", 0))) for h in hits]
        scroll_id = body.get("_scroll_id")
        if not hits or not scroll_id:
            return out
        more = json.dumps({"scroll": "2m", "scroll_id": scroll_id}).encode()
        status, body = transport.request("POST", "/_search/scroll", more)
