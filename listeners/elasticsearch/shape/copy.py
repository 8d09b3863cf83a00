"""The initial copy (and every resync) of a shaped listener: each collection, through its own
filter and rules, into a fresh physical index per alias; the aliases move only once every
collection that feeds them is copied and the stream caught up.

Resumable across tenures like a mirror's copy (:mod:`..copy`): the progress record holds the
physical ``targets``, the collections already ``done``, the cluster time of the first attempt
(``start_time``, saved before anything is copied) and, for the collection in hand, the last
``_id`` settled. A successor skips what is done, resumes the collection in hand after its last
``_id``, and replays every collection's events since ``start_time`` (one stream over all of
them) before the aliases move: a change made between attempts to a document an earlier
attempt copied is never missed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from bson.timestamp import Timestamp

from listeners.elasticsearch import partitioned
from listeners.elasticsearch.copy import InitialCopy
from listeners.elasticsearch.shape.collections import Shape
from listeners.elasticsearch.shape.items import ShapedItems
from listeners.elasticsearch.shape.stream import stream_pipeline
from singleton.drivers import mongo

if TYPE_CHECKING:
    from listeners.base import ChangeEvent, ListenerContext
    from listeners.elasticsearch.bulk import BulkWriter
    from listeners.elasticsearch.index import IndexKeeper
    from listeners.stream.partition import Partition

#: Applies events into the physical ``targets`` (alias -> index), as the stream would.
Replay = Callable[["Sequence[ChangeEvent]", "Mapping[str, str]"], None]


class ShapedCopy:
    """Copies every collection of ``shape`` (see the module docstring)."""

    def __init__(
        self,
        *,
        name: str,
        shape: Shape,
        items: ShapedItems,
        replay: Replay,
        batch_size: int,
        replay_batch: int,
        part: Partition | None,
        before_change: str | None,
    ) -> None:
        self.name, self.shape, self.items, self.replay = name, shape, items, replay
        self.batch_size, self.replay_batch, self.part = batch_size, replay_batch, part
        self.before_change = before_change
        self._into: dict[str, Any] = {}  # a partition's: what it copies into (its progress)

    def targets(self, index: IndexKeeper, ctx: ListenerContext) -> dict[str, str]:
        """The physical index of each alias: the saved ones if they all still exist, else
        fresh ones (a partition copies into what its alias points to now)."""
        saved = ctx.load_progress() or {}
        aliases = sorted(self.shape.indexes)
        if self.part is not None:
            live = {a: partitioned.live_index(index, a, self.part, ctx) for a in aliases}
            self._into = partitioned.resumable(index, aliases, ctx)
            return live
        found = saved.get("targets")
        if (
            isinstance(found, dict)
            and sorted(found) == aliases
            and all(isinstance(t, str) and index.exists(t) for t in found.values())
        ):
            return dict(found)
        if saved:
            ctx.save_progress(None)  # a copy into indexes that are gone, or another shape's
        return {a: index.fresh(a, ctx) for a in aliases}

    def run(self, ctx: ListenerContext, index: IndexKeeper, writer: BulkWriter) -> None:
        """Copy what is left; then move every alias onto its copy (not for a partition)."""
        targets = self.targets(index, ctx)
        saved = ctx.load_progress() or {}
        done: list[str] = list(saved.get("done") or [])
        start = saved.get("start_time")
        if start is None:
            ts = mongo.cluster_time(ctx.client)
            start = [ts.time, ts.inc]
            ctx.save_progress({**self._into, "targets": targets, "done": done, "start_time": start})
        ctx.logger.info(
            "initial sync of {}: copying {} into {}",
            self.name,
            ", ".join(self.shape.names),
            ", ".join(f"{t} (alias {a})" for a, t in sorted(targets.items())),
        )
        mine = partitioned.owner(self.part)
        database = ctx.client[self.shape.database]
        todo = [n for n in self.shape.names if n not in done]
        for n, name in enumerate(todo):
            shape = self.shape.collections[name]
            target = targets[shape.index]
            here = {
                **self._into,
                "targets": targets,
                "done": done,
                "start_time": start,
                "collection": name,
            }
            if (ctx.load_progress() or {}).get("collection") != name:
                ctx.save_progress(here)  # (no last_id: another collection's is not ours)

            def make(doc: Mapping[str, Any], version: int, s: Any = shape, t: str = target) -> Any:
                return self.items.copied(s, doc, version, t) if mine(doc["_id"]) else None

            InitialCopy(
                name=f"{self.name} ({name})",
                make_item=make,
                replay=lambda events, _ctx: self.replay(events, targets),
                batch_size=self.batch_size,
                replay_batch=self.replay_batch,
                progress_extra=here,
                query=shape.filter.query if shape.filter is not None else None,
                watch=self._watch(ctx, database),
                catch_up=n == len(todo) - 1,
                lookups=[r.lookup_stage(i) for i, r in enumerate(shape.relations)],
            ).run(ctx, database[name], writer)
            done = [*done, name]
            ctx.save_progress({**self._into, "targets": targets, "done": done, "start_time": start})
        if not todo:  # (a successor found every collection copied: replay, as the last would)
            InitialCopy(
                name=self.name,
                make_item=lambda doc, version: None,
                replay=lambda events, _ctx: self.replay(events, targets),
                batch_size=self.batch_size,
                replay_batch=self.replay_batch,
                watch=self._watch(ctx, database),
            ).catch_up_since(ctx, Timestamp(*start))
        if self.part is None:
            for alias, target in sorted(targets.items()):
                index.swap(alias, target, ctx)
        ctx.save_progress(None)

    def _watch(self, ctx: ListenerContext, database: Any) -> Callable[[Timestamp], Any]:
        """The catch-up's stream: every collection of the shape, as the tenure reads them."""

        def watch(since: Timestamp) -> Any:
            extra = {} if self.before_change is None else {
                "full_document_before_change": self.before_change
            }  # fmt: skip
            return database.watch(
                stream_pipeline(self.shape, []),  # (its related collections too)
                start_at_operation_time=since,
                full_document="updateLookup",
                max_await_time_ms=100,
                **extra,
            )

        return watch
