"""The initial copy of a collection into its index: ``_id`` order, batches, resumable, logged.

Every copied document gets the version of a cluster time ``T`` read *before* the copy reads
anything (:meth:`ElasticsearchSync.copy_version`). The copy sees each document as of some moment
after ``T``, so an event at or before ``T`` that is streamed later is refused (409) in favour of
the copy, and any event after ``T`` wins over it. Each attempt (also a resumed one) reads its own
``T``, which keeps that argument true for the documents it copies.

Progress (``last_id`` as extended JSON, counts, and ``start_time``: the cluster time of the first
attempt) is saved through ``ctx.save_progress`` only after the documents before it were settled,
and cleared when the copy completes. A resumed copy first replays the change stream from the
first attempt's ``start_time`` up to its own ``T`` (versions make that idempotent), because the
runner streams only from the cluster time it read before *this* attempt: without the replay, a
change made between the attempts to a document copied by the first one would be missed. If that
history is gone from the oplog, the copy starts over.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from bson import json_util
from bson.timestamp import Timestamp
from pymongo.errors import OperationFailure

#: Server codes for "that position is no longer in the oplog".
_HISTORY_LOST = frozenset({286, 280, 136})

if TYPE_CHECKING:
    from listeners.base import ListenerContext
    from listeners.elasticsearch.bulk import BulkWriter
    from listeners.elasticsearch.sync import ElasticsearchSync


def copy_collection(listener: ElasticsearchSync, ctx: ListenerContext, writer: BulkWriter) -> int:
    """Copy what is left of the collection; returns the number of documents copied now."""
    coll = ctx.client[str(listener.database)][str(listener.collection)]
    progress = ctx.load_progress() or {}
    ts = listener.cluster_time(ctx)
    version = listener.copy_version(ts)
    start_time = progress.get("start_time") or [ts.time, ts.inc]
    copied = int(progress.get("copied", 0))
    query: dict[str, Any] = {}
    if "last_id" in progress and not _catch_up(listener, ctx, Timestamp(*start_time), ts):
        progress, copied, start_time = {}, 0, [ts.time, ts.inc]
    if "last_id" in progress:
        last_id = json_util.loads(progress["last_id"])
        # $expr compares across BSON types (a plain $gt only matches _ids of last_id's type).
        query = {"$expr": {"$gt": ["$_id", {"$literal": last_id}]}}
        ctx.logger.info(
            "initial sync of {}: resuming after _id {} ({} documents already copied)",
            listener.lease_name,
            progress["last_id"],
            copied,
        )
    total = coll.estimated_document_count()
    started = time.monotonic()
    done_now = 0
    chunk = 0
    last: Any = None
    session = writer.session(ctx.check, lambda s: ctx.leadership.lost.wait(s))
    cursor = coll.find(query, sort=[("_id", 1)], batch_size=min(listener.copy_batch_size, 10_000))
    try:
        for doc in cursor:
            try:
                item = listener.item_for(doc, doc["_id"], version, {"op": "initial_sync"})
            except (ValueError, TypeError) as exc:
                from listeners.elasticsearch.bulk import BulkItem, DeadLetter

                bad = BulkItem("index", listener.index_name, str(doc["_id"]), version)
                listener._dead([DeadLetter(bad, 0, f"cannot serialize: {exc}")])
                continue
            session.add(item)
            last = doc["_id"]
            chunk += 1
            if chunk >= listener.copy_batch_size:
                session.finish()  # progress never passes an unsettled document
                done_now += chunk
                chunk = 0
                _save(ctx, last, copied + done_now, start_time)
                _log(listener, ctx, copied + done_now, done_now, total, started)
        session.finish()
    finally:
        cursor.close()
    done_now += chunk
    if last is not None:
        _save(ctx, last, copied + done_now, start_time)
    _log(listener, ctx, copied + done_now, done_now, total, started, final=True)
    ctx.save_progress(None)
    return done_now


def _catch_up(
    listener: ElasticsearchSync, ctx: ListenerContext, since: Timestamp, until: Timestamp
) -> bool:
    """Apply the collection's events in ``[since, until]``; False if that history is lost."""
    coll = ctx.client[str(listener.database)][str(listener.collection)]
    applied = 0
    try:
        with coll.watch(
            start_at_operation_time=since, full_document="updateLookup", max_await_time_ms=100
        ) as stream:
            batch: list[Any] = []
            while True:
                event = stream.try_next()
                if event is None or event.get("operationType") == "invalidate":
                    break
                ct = event.get("clusterTime")
                if isinstance(ct, Timestamp) and ct > until:
                    break
                batch.append(event)
                if len(batch) >= listener.batch_size:
                    listener.handle_batch(batch, ctx)
                    applied, batch = applied + len(batch), []
            if batch:
                listener.handle_batch(batch, ctx)
                applied += len(batch)
    except OperationFailure as exc:
        if exc.code in _HISTORY_LOST:
            ctx.logger.warning(
                "initial sync of {}: history since the first attempt is gone ({}); restarting "
                "the copy",
                listener.lease_name,
                exc.code,
            )
            return False
        raise
    ctx.logger.info(
        "initial sync of {}: replayed {} events made since the first attempt",
        listener.lease_name,
        applied,
    )
    return True


def _save(ctx: ListenerContext, last_id: Any, copied: int, start_time: Any) -> None:
    ctx.save_progress(
        {"last_id": json_util.dumps(last_id), "copied": copied, "start_time": start_time}
    )


def _log(
    listener: ElasticsearchSync,
    ctx: ListenerContext,
    copied: int,
    done_now: int,
    total: int,
    started: float,
    final: bool = False,
) -> None:
    elapsed = max(time.monotonic() - started, 1e-6)
    rate = done_now / elapsed
    left = max(total - copied, 0)
    eta = left / rate if rate > 0 else float("inf")
    ctx.logger.info(
        "initial sync of {}: {} {}/~{} documents, {:.0f} docs/s, ETA {}",
        listener.lease_name,
        "copied" if final else "at",
        copied,
        total,
        rate,
        "done" if final else f"{eta:.0f} s",
    )
