"""Bulk items Elasticsearch will never accept (mapping errors, other 4xx), recorded in the shared
dead-letter store (:class:`listeners.deadletter.DeadLetterStore`, ``singleton.dead_letters``) so
that the stream never blocks on them. One record per item; the ``event`` field holds what an
operator needs to replay it once the mapping is fixed: index, ``_id``, version, source, reason.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from listeners.elasticsearch.bulk import DeadLetter
from singleton.errors import SinkError

if TYPE_CHECKING:
    from listeners.base import ListenerContext
    from listeners.deadletter import DeadLetterStore


class ItemRejectedError(SinkError):
    """Elasticsearch refused one bulk item for good (the ``status`` says why)."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


def letter_record(letter: DeadLetter) -> dict[str, Any]:
    item = letter.item
    return {
        "operationType": item.origin.get("op", item.op),
        "documentKey": {"_id": item.doc_id},
        "clusterTime": item.origin.get("cluster_time"),
        "resumeToken": item.origin.get("token"),
        "sink": "elasticsearch",
        "action": item.op,
        "index": item.index,
        "version": item.version,
        "status": letter.status,
        "source": None if item.source is None else item.source.decode(),
    }


class EsDeadLetters:
    """Adapts item-level dead letters to the event-level :class:`DeadLetterStore`."""

    def __init__(self, store: DeadLetterStore) -> None:
        self.store = store

    def put(self, letters: Sequence[DeadLetter], ctx: ListenerContext) -> None:
        for letter in letters:
            error = ItemRejectedError(letter.reason, letter.status)
            self.store.put(letter_record(letter), error, 1, ctx)
