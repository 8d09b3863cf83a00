"""Change events over 16 MB: split fragments joined again, and events that arrive without their
document (a fragment whose siblings were in another batch, or an event the runner had to read
with its large fields projected away) completed by a lookup.

MongoDB 7.0+ splits an event that would exceed 16 MB when the pipeline ends with
``$changeStreamSplitLargeEvent``: consecutive fragments, each with ``splitEvent: {fragment, of}``
and a resume token of its own, each holding some of the top-level fields (``fullDocument`` whole,
in one of them). :func:`supports_split` detects the stage (SecantusDB and older servers refuse
it) so that :meth:`ElasticsearchSync.on_start` appends it only where it works.

A batch may end between two fragments, and the runner checkpoints after every batch, so the
fragments of one event cannot always be joined. That is fine for a mirror: every event is versioned
by its oplog position (all fragments of one event share it), and :func:`needs_lookup` events are
indexed with the document as it is *now* (or deleted if it is gone), the same thing
``fullDocument: updateLookup`` gives; a later event, with a greater version, always wins. A
fragment without ``documentKey`` is skipped: the fragment that has it is handled in its own batch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pymongo.errors import OperationFailure

from listeners.base import ChangeEvent
from listeners.stream.large_events import reduced_pipeline

SPLIT_STAGE: dict[str, Any] = {"$changeStreamSplitLargeEvent": {}}
#: Operation types whose index action needs the document.
_NEEDS_DOCUMENT = frozenset({"insert", "replace", "update"})


def supports_split(collection: Any) -> bool:
    """Whether the server accepts ``$changeStreamSplitLargeEvent`` (opens and closes a stream)."""
    try:
        with collection.watch([SPLIT_STAGE], max_await_time_ms=1) as stream:
            stream.try_next()
    except OperationFailure:
        return False
    return True


def with_split(pipeline: Sequence[Any], collection: Any, logger: Any) -> list[Any] | None:
    """``pipeline`` ending with the split stage, or ``None`` if the server has no such stage."""
    stages = list(pipeline)
    if SPLIT_STAGE in stages:
        return stages
    if not supports_split(collection):
        logger.info("elasticsearch: the server cannot split large change events (needs 7.0+)")
        return None
    return [*stages, SPLIT_STAGE]


#: Event fields the sync never reads, dropped by the server: decoding a tz-aware ``wallTime``
#: alone costs about a microsecond per event, and an update's ``updateDescription`` can be
#: larger than its document (the sync indexes ``fullDocument``). ``ns`` is the watched
#: collection, known already; ``clusterTime`` is also the first part of every resume token, read
#: from there (:func:`listeners.stream.tokens.token_clock`) without decoding a ``Timestamp`` per
#: event.
#: Decoding and freeing a small insert: 3.3 us with every field, 2.2 without the first two, 1.3
#: without all four (``python -m bench decode``).
UNUSED_FIELDS = {"$project": {"wallTime": 0, "updateDescription": 0, "ns": 0, "clusterTime": 0}}
#: And the document's own ``_id``, where no transform reads the document: the index holds it as
#: metadata (the source leaves it out) and the key is ``documentKey``'s. The per-event cost of
#: decoding it and of copying each document without it: about 2,400 of ~62,000 instructions.
UNUSED_WITH_ID = {"$project": {**UNUSED_FIELDS["$project"], "fullDocument._id": 0}}


def without_unused(pipeline: Sequence[Any], *, document_id: bool = True) -> list[Any]:
    """``pipeline`` with :data:`UNUSED_FIELDS` (once, before the split stage), or with
    :data:`UNUSED_WITH_ID` when the document's ``_id`` is not needed (``document_id``
    false)."""
    stage = UNUSED_FIELDS if document_id else UNUSED_WITH_ID
    stages = [s for s in pipeline if s != UNUSED_FIELDS and s != UNUSED_WITH_ID]
    return reduced_pipeline(stages, stage)


def join(events: Sequence[ChangeEvent]) -> Sequence[ChangeEvent]:
    """``events`` with the consecutive fragments of each split event merged into one (the last
    fragment's resume token as ``_id``); ``events`` itself when none is a fragment. Fragments
    whose siblings are not in ``events`` stay partial; :func:`needs_lookup` tells which."""
    if all("splitEvent" not in event for event in events):
        return events  # (nearly every batch: nothing to copy)
    out: list[ChangeEvent] = []
    parts: dict[str, Any] = {}
    for event in events:
        split = event.get("splitEvent")
        if split is None or (type(split) is not dict and not isinstance(split, Mapping)):
            if parts:
                out.append(parts)
                parts = {}
            out.append(event)
            continue
        fragment, of = split.get("fragment"), split.get("of")
        if fragment == 1 and parts:
            out.append(parts)
            parts = {}
        if fragment == 1 and of == 1:
            # The whole event in one fragment (servers that tag every event): a plain copy.
            whole = dict(event)
            del whole["splitEvent"]
            whole["_id"] = event["_id"]
            out.append(whole)
            continue
        parts.update({k: v for k, v in event.items() if k != "splitEvent"})
        parts["_id"] = event["_id"]
        if fragment == of:
            out.append(parts)
            parts = {}
    if parts:
        out.append(parts)
    return out


def needs_lookup(event: ChangeEvent) -> bool:
    """An event that names its document but does not carry it (as opposed to
    ``fullDocument: None``, which means "deleted later, the delete follows")."""
    op = event.get("operationType")
    missing = "fullDocument" not in event
    return "documentKey" in event and (op is None or (op in _NEEDS_DOCUMENT and missing))
