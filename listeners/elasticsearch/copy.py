"""The initial copy of a collection into its index: ``_id`` order, batches, resumable, logged.

Every copied document gets the version of a cluster time ``T`` read *before* the copy reads
anything (:func:`copy_version`). The copy sees each document as of some moment after ``T``, so an
event at or before ``T`` that is streamed later is refused (409) in favour of the copy, and any
event after ``T`` wins over it. Each attempt (also a resumed one) reads its own ``T``, which keeps
that argument true for the documents it copies.

Progress (``last_id`` as extended JSON, counts, ``start_time``: the cluster time of the first
attempt, and the caller's ``progress_extra``, such as the physical index copied into) is saved
through ``ctx.save_progress`` only after the documents before it were settled. The caller clears it
once it has used the copy (the listener: after the alias swap). A resumed copy first replays the
change stream from the first attempt's ``start_time`` up to its own ``T`` (versions make that
idempotent), because the runner streams only from the cluster time it read before *this* attempt:
without the replay, a change made between the attempts to a document copied by the first one would
be missed. If that history is gone from the oplog, the copy starts over. After the last document,
the events since the first attempt's ``start_time`` are replayed the same way, so the copy is as
recent as the stream when :meth:`InitialCopy.run` returns (the listener swaps its alias only then).

The copy knows nothing of the listener that runs it: it gets a function that turns a document
into a bulk item and one that applies change events, and the writer to send with.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from bson import json_util
from bson.timestamp import Timestamp
from pymongo.errors import OperationFailure

from listeners.elasticsearch.bulk import BulkItem, BulkWriter
from listeners.elasticsearch.versioning import timestamp_version
from listeners.stream.tokens import event_time
from singleton.drivers import mongo

if TYPE_CHECKING:
    from listeners.base import ChangeEvent, ListenerContext

#: ``make_item(doc, version)``: the bulk action for ``doc``, or ``None`` to skip it (a document
#: that cannot be serialized, already dead-lettered by whoever made the function).
MakeItem = Callable[[Mapping[str, Any], int], "BulkItem | None"]
#: Applies change events as the stream would (the listener's ``handle_batch``).
Replay = Callable[["Sequence[ChangeEvent]", "ListenerContext"], None]


def copy_version(ts: Timestamp) -> int:
    """Version of documents copied after cluster time ``ts``: any event after ``ts`` wins."""
    return timestamp_version(ts, 0)


@dataclass(frozen=True, kw_only=True)
class InitialCopy:
    """Copies one collection; ``name`` is the listener's (for logs), ``batch_size`` documents
    are settled between progress saves, ``replay_batch`` events go to each ``replay`` call."""

    name: str
    make_item: MakeItem
    replay: Replay
    batch_size: int
    replay_batch: int
    #: Saved with every progress record (and found in the one loaded by :meth:`load`).
    progress_extra: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    #: Only the documents that match it are copied (a shaped collection's ``filter``).
    query: Mapping[str, Any] | None = None
    #: ``watch(since)``: the change stream the catch-up replays (default: the collection's);
    #: a shaped listener's covers every collection it reads.
    watch: Callable[[Timestamp], Any] | None = None
    #: Replay the events since the first attempt after the last document (a copy of several
    #: collections does it once, after the last one).
    catch_up: bool = True
    #: Stages after the query and the ``_id`` sort (a shaped root's ``$lookup`` of its related
    #: documents): the copy then reads an aggregation instead of a ``find``.
    lookups: Sequence[Mapping[str, Any]] = ()

    def run(self, ctx: ListenerContext, coll: Any, writer: BulkWriter) -> int:
        """Copy what is left of ``coll``; returns the number of documents copied now."""
        ts = mongo.cluster_time(ctx.client)
        progress = self._resume_point(ctx, coll, ts)
        query: dict[str, Any] = {}
        if "last_id" in progress:
            last_id = json_util.loads(progress["last_id"])
            # $expr compares across BSON types (a plain $gt only matches _ids of last_id's type).
            query = {"$expr": {"$gt": ["$_id", {"$literal": last_id}]}}
        if self.query:
            query = {"$and": [dict(self.query), query]} if query else dict(self.query)
        tracker = _Progress(
            self.name, ctx, progress, ts, coll.estimated_document_count(), self.progress_extra
        )
        version = copy_version(ts)
        session = writer.session(ctx.check, ctx.leadership.wait_lost)
        chunk, last = 0, None
        size = min(self.batch_size, 10_000)
        cursor = (
            coll.aggregate(
                [{"$match": query}, {"$sort": {"_id": 1}}, *self.lookups], batchSize=size
            )
            if self.lookups
            else coll.find(query, sort=[("_id", 1)], batch_size=size)
        )
        try:
            for doc in cursor:
                item = self.make_item(doc, version)
                if item is None:
                    continue
                session.add(item)
                chunk, last = chunk + 1, doc["_id"]
                if chunk >= self.batch_size:
                    session.finish()  # progress never passes an unsettled document
                    tracker.settled(chunk, last)
                    chunk = 0
            session.finish()
        finally:
            cursor.close()
        tracker.settled(chunk, last, final=True)
        if self.catch_up:
            start = Timestamp(*tracker.start_time)
            self._catch_up(ctx, coll, start, mongo.cluster_time(ctx.client))
        return tracker.done_now

    def catch_up_since(self, ctx: ListenerContext, since: Timestamp) -> bool:
        """Replay the events since ``since`` up to now (what :meth:`run` does after its last
        document); False if that history is lost."""
        return self._catch_up(ctx, None, since, mongo.cluster_time(ctx.client))

    def _resume_point(self, ctx: ListenerContext, coll: Any, ts: Timestamp) -> dict[str, Any]:
        """The saved progress, once the events since the first attempt are replayed; empty
        when there is none or that history is lost (the copy then starts over)."""
        progress = ctx.load_progress() or {}
        if "last_id" not in progress:
            return progress
        since = Timestamp(*(progress.get("start_time") or [ts.time, ts.inc]))
        if not self._catch_up(ctx, coll, since, ts):
            return {}
        ctx.logger.info(
            "initial sync of {}: resuming after _id {} ({} documents already copied)",
            self.name,
            progress["last_id"],
            int(progress.get("copied", 0)),
        )
        return progress

    def _catch_up(
        self, ctx: ListenerContext, coll: Any, since: Timestamp, until: Timestamp
    ) -> bool:
        """Apply the collection's events in ``[since, until]``; False if that history is lost."""
        applied = 0
        try:
            opened = (
                self.watch(since)
                if self.watch is not None
                else coll.watch(
                    start_at_operation_time=since,
                    full_document="updateLookup",
                    max_await_time_ms=100,
                )
            )
            with opened as stream:
                batch: list[Any] = []
                while True:
                    event = stream.try_next()
                    if event is None or event.get("operationType") == "invalidate":
                        break
                    ct = event_time(event)
                    if ct is not None and ct > until:
                        break
                    batch.append(event)
                    if len(batch) >= self.replay_batch:
                        self.replay(batch, ctx)
                        applied, batch = applied + len(batch), []
                if batch:
                    self.replay(batch, ctx)
                    applied += len(batch)
        except OperationFailure as exc:
            if mongo.classify(exc) != "history_lost":
                raise
            ctx.logger.warning(
                "initial sync of {}: history since the first attempt is gone ({}); restarting "
                "the copy",
                self.name,
                exc.code,
            )
            return False
        ctx.logger.info(
            "initial sync of {}: replayed {} events made since {}", self.name, applied, since
        )
        return True


class _Progress:
    """Counts settled documents; saves and logs the copy's progress after each batch."""

    def __init__(
        self,
        name: str,
        ctx: ListenerContext,
        saved: Mapping[str, Any],
        ts: Timestamp,
        total: int,
        extra: Mapping[str, Any],
    ) -> None:
        self.name = name
        self.extra = dict(extra)
        self.ctx = ctx
        self.before = int(saved.get("copied", 0))
        self.start_time = saved.get("start_time") or [ts.time, ts.inc]
        self.total = total
        self.done_now = 0
        self.started = ctx.clock.monotonic()

    def settled(self, n: int, last_id: Any, final: bool = False) -> None:
        self.done_now += n
        copied = self.before + self.done_now
        if last_id is not None:
            self.ctx.save_progress(
                {
                    **self.extra,
                    "last_id": json_util.dumps(last_id),
                    "copied": copied,
                    "start_time": self.start_time,
                }
            )
        rate = self.done_now / max(self.ctx.clock.monotonic() - self.started, 1e-6)
        eta = max(self.total - copied, 0) / rate if rate > 0 else float("inf")
        self.ctx.logger.info(
            "initial sync of {}: {} {}/~{} documents, {:.0f} docs/s, ETA {}",
            self.name,
            "copied" if final else "at",
            copied,
            self.total,
            rate,
            "done" if final else f"{eta:.0f} s",
        )
