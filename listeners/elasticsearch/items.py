"""From a change event (or a copied document) to the one bulk action that mirrors it.

Each event is mapped once: its document id and external version are computed here and travel
with the :class:`~listeners.elasticsearch.bulk.BulkItem`, whose encoded lines are built once and
reused by every request that carries it. What cannot be indexed (an id too long, a non-finite
number, a value with no JSON form) is dead-lettered here with its reason and yields ``None``.

A stream batch is mapped by :meth:`ItemMaker.collect` in one loop: this is the listener's
per-event work, and in CPython every call, attribute and intermediate object of it is paid
1,000 times a batch. Its commonest event (a write that carries its whole document, no transform)
is mapped inline into an item whose two lines are its only copy of the source (the JSON orjson
wrote is freed at once, not kept for the whole batch); every other event, and any document
orjson alone cannot decide, goes through :meth:`ItemMaker.event_item`, the same result
(``tests/unit/listeners/elasticsearch/test_es_fast_items.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any

import orjson

from listeners.base import ChangeEvent
from listeners.elasticsearch import fragments
from listeners.elasticsearch.bulk import (
    INDEX_VERSIONED,
    BulkItem,
    DeadLetter,
    action_head,
    encode_lines,
    index_lines,
    new_item,
)
from listeners.elasticsearch.documents import (
    ORJSON_OPTIONS,
    Transform,
    doc_id,
    has_non_finite_float,
    json_default,
    source_of,
)
from listeners.elasticsearch.ids import TAG
from listeners.elasticsearch.versioning import EventVersioner, plain_version
from singleton.errors import UnindexableError, UnindexableIdError

#: ``lookup(key) -> document or None``: the document as it is now (for split events).
Lookup = Callable[[Any], "Mapping[str, Any] | None"]
#: Operation types that write a document (the rest of the stream's events are skipped).
WRITES = frozenset({"insert", "replace", "update", "delete"})
#: The collection is gone (or renamed away): the sink's ``on_drop`` business.
DROPS = frozenset({"drop", "dropDatabase", "rename"})
#: The ``splitEvent`` of an event in one fragment (SecantusDB tags every event of a stream with
#: the split stage so): the event itself, as :func:`.fragments.join` would make it.
WHOLE: Mapping[str, Any] = {"fragment": 1, "of": 1}  # (read-only)
#: Writes whose event carries the document to index (``fullDocument``).
_WITH_DOCUMENT = frozenset({"insert", "replace", "update"})
_INT32 = (-(2**31), 2**31 - 1)
INDEX = "index"
#: The shared origin of the commonest items, by operation type (their token is their own).
_ORIGINS: dict[str, Mapping[str, Any]] = {op: MappingProxyType({"op": op}) for op in _WITH_DOCUMENT}
#: :data:`.bulk.INDEX_VERSIONED` with the quoted id of a small integer key (``~i:<key>``, as
#: :func:`.ids.doc_id` maps it) formatted in the same pass.
_INT_KEY_LINES = INDEX_VERSIONED.replace(b"%s%s", b'%s"' + TAG.encode() + b'i:%d"', 1)


class ItemMaker:
    """Builds bulk actions with ``transform``; rejected documents go to ``dead``. ``versioned``:
    the lines carry external versions (False only for the drill's unfenced writer, see
    :func:`.bulk.encode_lines`)."""

    def __init__(
        self,
        transform: Transform | None,
        dead: Callable[[list[DeadLetter]], None],
        lookup: Lookup,
        *,
        versioned: bool = True,
    ) -> None:
        self.transform, self._dead, self._lookup = transform, dead, lookup
        self.versioned = versioned

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
        op = "delete" if source is None else "index"
        lines = encode_lines(op, index, es_id, version, source, self.versioned)
        return BulkItem(op, index, es_id, version, None, origin, lines)

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
                es_id = doc_id(key)
            except UnindexableIdError as exc:
                self.reject("delete", key, version, origin, index, exc)
                return None
            lines = encode_lines("delete", index, es_id, version, None, self.versioned)
            return BulkItem("delete", index, es_id, version, None, origin, lines)
        if doc is None:
            return None  # looked up after a later delete: that delete follows
        return self.item(doc, key, version, origin, index)

    def collect(
        self,
        events: Sequence[ChangeEvent],
        start: int,
        versioner: EventVersioner,
        index: str,
        pending: dict[str, BulkItem],
    ) -> int:
        """Put the actions of ``events[start:]`` into ``pending`` by document id (the last write
        of a document wins: its version supersedes the others anyway), up to the first drop,
        rename or dropDatabase, or fragment of a split event (but a :data:`WHOLE` one:
        :func:`.fragments.join` them first); return its position (``len(events)`` if there is
        none). Other events than writes are skipped. See the module docstring for the inline
        case."""
        head = action_head("index", index)
        inline = self.transform is None and self.versioned
        for at in range(start, len(events)):
            event = events[at]
            doc = event.get("fullDocument")
            op = event.get("operationType")
            split = event.get("splitEvent")
            whole = split is None or split == WHOLE
            if (
                inline
                and whole
                and type(doc) is dict
                and op in _WITH_DOCUMENT
                and "txnNumber" not in event
                and "clusterTime" not in event
                and "_id" not in doc  # (projected away: UNUSED_WITH_ID)
            ):
                # What plain_source and doc_id do, inlined for the commonest documents and ids:
                # a call costs ~1,300 instructions, a tenth of an event's work here.
                try:
                    token = event["_id"]
                    key = event["documentKey"]["_id"]
                    version = plain_version(token["_data"])
                    source = orjson.dumps(doc, default=json_default, option=ORJSON_OPTIONS)
                except (KeyError, TypeError, ValueError):  # (JSONEncodeError is a TypeError)
                    version = -1
                if version >= 0 and (source.find(b"null") < 0 or not has_non_finite_float(doc)):
                    if type(key) is int and _INT32[0] <= key <= _INT32[1]:
                        es_id = f"{TAG}i:{key}"  # (formatted with the lines, in one pass)
                        lines = _INT_KEY_LINES % (head, key, version, source)
                        item = (INDEX, index, es_id, version, None, _ORIGINS[op], lines, token)
                        pending[es_id] = new_item(item)
                        continue
                    made = self._plain(key, version, source, op, token, index)
                    if made is not None:
                        pending[made.doc_id] = made
                        continue
            if op in DROPS or not whole:
                return at
            self._add(event, versioner, index, pending)
        return len(events)

    def _plain(
        self, key: Any, version: int, source: bytes, op: str, token: Any, index: str
    ) -> BulkItem | None:
        """:meth:`collect`'s item for a document whose id is not a small integer (``None`` for
        an id that cannot be indexed: :meth:`event_item` dead-letters it)."""
        try:
            es_id = doc_id(key)
        except UnindexableError:
            return None
        lines = index_lines(index, es_id, version, source, True)
        return new_item((INDEX, index, es_id, version, None, _ORIGINS[op], lines, token))

    def _add(
        self,
        event: ChangeEvent,
        versioner: EventVersioner,
        index: str,
        pending: dict[str, BulkItem],
    ) -> None:
        """:meth:`collect` for an event other than the commonest (see the module docstring)."""
        if event.get("operationType") in WRITES or fragments.needs_lookup(event):
            item = self.event_item(event, versioner, index)
            if item is not None:
                pending[item.doc_id] = item
