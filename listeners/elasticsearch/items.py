"""From a change event (or a copied document) to the one bulk action that mirrors it.

Each event is mapped once: its document id and external version are computed here and travel
with the :class:`~listeners.elasticsearch.bulk.BulkItem`, whose encoded lines are built once and
reused by every request that carries it. What cannot be indexed (an id too long, a non-finite
number, a value with no JSON form) is dead-lettered here with its reason and yields ``None``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from listeners.base import ChangeEvent
from listeners.elasticsearch import fragments
from listeners.elasticsearch.bulk import BulkItem, DeadLetter
from listeners.elasticsearch.documents import Transform, doc_id, source_of
from listeners.elasticsearch.versioning import EventVersioner
from singleton.errors import UnindexableError, UnindexableIdError

#: ``lookup(key) -> document or None``: the document as it is now (for split events).
Lookup = Callable[[Any], "Mapping[str, Any] | None"]


class ItemMaker:
    """Builds bulk actions with ``transform``; rejected documents go to ``dead``."""

    def __init__(
        self,
        transform: Transform | None,
        dead: Callable[[list[DeadLetter]], None],
        lookup: Lookup,
    ) -> None:
        self.transform, self._dead, self._lookup = transform, dead, lookup

    def item(
        self, doc: Mapping[str, Any], key: Any, version: int, origin: dict[str, Any], index: str
    ) -> BulkItem | None:
        """The bulk action that makes ``index`` hold ``doc`` (a delete if ``transform`` drops
        it) at ``version``; ``None`` for a document that cannot be indexed (dead-lettered)."""
        try:
            es_id = doc_id(key)
            source = source_of(doc, self.transform)
        except (UnindexableError, ValueError, TypeError) as exc:
            self.reject("index", key, version, origin, index, exc)
            return None
        return BulkItem(
            "delete" if source is None else "index", index, es_id, version, source, origin
        )

    def reject(
        self, op: str, key: Any, version: int, origin: dict[str, Any], index: str, exc: Exception
    ) -> None:
        """Dead-letter what cannot be indexed (an id too long, a non-finite number...)."""
        try:
            es_id = doc_id(key)
        except UnindexableIdError:
            es_id = repr(key)[:200]
        bad = BulkItem(op, index, es_id, version, None, {**origin, "key": key})
        self._dead([DeadLetter(bad, 0, f"cannot index: {exc}")])

    def event_item(
        self, event: ChangeEvent, versioner: EventVersioner, index: str
    ) -> BulkItem | None:
        """The action for a write event (insert, replace, update, delete, or a fragment that
        needs a lookup); ``None`` when there is nothing to write."""
        if "documentKey" not in event:
            return None  # a fragment: the one with the key is handled in its own batch
        key = event["documentKey"]["_id"]
        op = event.get("operationType")
        # (No cluster time here: the versioner reads it from the event, or from the resume token
        # where the stream left ``clusterTime`` out; a dead letter reads it from the token.)
        origin = {"op": op, "token": event.get("_id")}
        version = versioner.version(event)
        doc = event.get("fullDocument")
        if doc is not None and op is not None and op != "delete":
            return self.item(doc, key, version, origin, index)  # (the commonest case, first)
        if fragments.needs_lookup(event):
            # The document as it is now, as updateLookup would give it (see .fragments).
            found = self._lookup(key)
            if found is not None:
                return self.item(found, key, version, origin, index)
            op = "delete"
        if op == "delete":
            try:
                return BulkItem("delete", index, doc_id(key), version, None, origin)
            except UnindexableIdError as exc:
                self.reject("delete", key, version, origin, index, exc)
                return None
        if doc is None:
            return None  # looked up after a later delete: that delete follows
        return self.item(doc, key, version, origin, index)
