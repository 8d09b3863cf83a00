"""Bulk items Elasticsearch will never accept (mapping errors, other 4xx), recorded in the shared
dead-letter store (:class:`listeners.deadletters.DeadLetterStore`, ``singleton.dead_letters``) so
that the stream never blocks on them. One record per item (a replayable change event without its
document, when it came from the stream; copy rejections have no event to replay); the ``event``
field holds what an operator needs to replay it once the mapping is fixed: index, ``_id``, version,
reason, and the document's source only with the listener's ``dead_letter_source = true`` (by
default no dead letter holds what the documents hold).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from listeners.elasticsearch.bulk import BulkItem, DeadLetter
from listeners.elasticsearch.ids import bson_id_of
from listeners.stream.tokens import token_time
from singleton.errors import ItemRejectedError

if TYPE_CHECKING:
    from listeners.base import DeadLetterSink, ListenerContext


def _bson_key(item: BulkItem) -> Any:
    """The document's MongoDB ``_id``: kept by the listener for items it could not even build,
    else mapped back from the index id (:func:`.ids.bson_id_of`)."""
    if "key" in item.origin:
        return item.origin["key"]
    try:
        return bson_id_of(item.doc_id)
    except ValueError:
        return item.doc_id


def letter_record(letter: DeadLetter, keep_source: bool = False) -> dict[str, Any]:
    """The dead-letter record of ``letter``; its ``source`` is ``None`` unless ``keep_source``."""
    item = letter.item
    record: dict[str, Any] = {}
    token = item.event_token()
    if token is not None:
        # A change event again: ``singleton dead-letters replay`` re-delivers it through
        # handle_batch, which looks the document up (no fullDocument) under this event's version.
        record["_id"] = token
    if "collection" in item.origin:  # a shaped listener's: the event names its collection
        record["ns"] = {"coll": item.origin["collection"]}
    return record | {
        "operationType": item.origin.get("op", item.op),
        "documentKey": {"_id": _bson_key(item)},
        "clusterTime": token_time(token),
        "resumeToken": token,
        "sink": "elasticsearch",
        "action": item.op,
        "index": item.index,
        "doc_id": item.doc_id,
        "version": item.version,
        "status": letter.status,
        "source": (
            None if not keep_source or (source := item.source_json()) is None else source.decode()
        ),
    }


class EsDeadLetters:
    """Adapts item-level dead letters to an event-level store (``DeadLetterStore``)."""

    def __init__(self, store: DeadLetterSink, keep_source: bool = False) -> None:
        self.store, self.keep_source = store, keep_source

    def put(self, letters: Sequence[DeadLetter], ctx: ListenerContext) -> None:
        """Record ``letters``: in one request when the store can (``put_many``:
        :class:`~listeners.deadletters.DeadLetterStore`), else one by one."""
        records = [
            (
                letter_record(letter, self.keep_source),
                ItemRejectedError(letter.reason, letter.status),
                1,
            )
            for letter in letters
        ]
        many = getattr(self.store, "put_many", None)
        if callable(many):
            many(records, ctx)
            return
        for record, error, attempts in records:
            self.store.put(record, error, attempts, ctx)
