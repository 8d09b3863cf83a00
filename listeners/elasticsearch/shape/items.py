"""From a change event of a shaped listener to the bulk actions that keep its index exact.

One event gives one write (the index action of the shaped document, or a delete when the
document no longer matches its filter, its transform keeps it out, or it is gone) and, for a
routed collection whose event moved the document to another routing, a delete under each
routing it was indexed with before (:mod:`.collections` on the versions that make this safe on
one shard or two).

Where a document was indexed before comes from MongoDB where it can: the event's pre-image
(``fullDocumentBeforeChange``: the listener asks for it on routed collections, see
docs/how-to/shaped-index.md),
else an update's ``updateDescription`` that leaves the routing field alone. Otherwise (no
pre-image: pre-images were off when the event was written, or expired) the index is asked: once
the requests in flight have landed, a refresh and an ``ids`` search give every routing the
document is held under (:class:`RouteFinder`). Slow, and only on that path.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from json.encoder import encode_basestring_ascii as _string
from typing import Any

from listeners.base import ChangeEvent
from listeners.elasticsearch import fragments
from listeners.elasticsearch.bulk import BulkItem, DeadLetter
from listeners.elasticsearch.documents import source_of
from listeners.elasticsearch.items import DROPS, WHOLE, WRITES
from listeners.elasticsearch.shape.collections import (
    CollectionShape,
    Shape,
    moved_version,
    write_version,
)
from listeners.elasticsearch.shape.relate import CHUNK, Joiner, key_of
from listeners.elasticsearch.versioning import EventVersioner
from singleton.errors import UnindexableError

#: ``lookup(collection, key)``: the document as it is now (for split events).
Lookup = Callable[[str, Any], "Mapping[str, Any] | None"]
#: ``routes(index, es_id)``: every routing ``es_id`` is held under in ``index`` now (``None``
#: for a document indexed without one).
Routes = Callable[[str, str], "set[str | None]"]


def lines(
    op: str, index: str, es_id: str, version: int, routing: str | None, source: bytes | None,
    *, versioned: bool = True,
) -> bytes:  # fmt: skip
    """A bulk action (and the source line of an ``index``), with its routing."""
    head = f'{{"{op}":{{"_index":{_string(index)},"_id":{_string(es_id)}'
    if routing is not None:
        head += f',"routing":{_string(routing)}'
    if versioned:
        head += f',"version":{int(version)},"version_type":"external"'
    out = (head + "}}\n").encode()
    if op == "index":
        out += (source or b"{}") + b"\n"
    return out


def pending_key(index: str, es_id: str, routing: str | None) -> str:
    """Where an action waits in a batch: the last one per document *and routing* wins."""
    return f"{index}\0{'' if routing is None else routing}\0{es_id}"


def touches(update: Mapping[str, Any], path: str) -> bool:
    """Whether an ``updateDescription`` may have changed the field at ``path``."""
    changed: list[str] = [
        *(update.get("updatedFields") or {}),
        *(update.get("removedFields") or []),
    ]
    changed += [t.get("field", "") for t in update.get("truncatedArrays") or []]
    for key in changed:
        if key == path or key.startswith(path + ".") or path.startswith(key + "."):
            return True
    return False


class CollectionCounts:
    """Events and dead letters per collection (the ``collection`` label of the metrics), read
    at scrape time from another thread."""

    def __init__(self) -> None:
        self._counts: dict[str, dict[str, int]] = {}
        self._lock = threading.Lock()

    def add(self, collection: str, kind: str, n: int = 1) -> None:
        with self._lock:
            by_kind = self._counts.setdefault(collection, {"events": 0, "dead_letters": 0})
            by_kind[kind] = by_kind.get(kind, 0) + n

    def set(self, collection: str, kind: str, n: int) -> None:
        """A gauge (``pending_rebuilds``)."""
        with self._lock:
            self._counts.setdefault(collection, {"events": 0, "dead_letters": 0})[kind] = n

    def snapshot(self) -> dict[str, dict[str, int]]:
        with self._lock:
            return {name: dict(kinds) for name, kinds in self._counts.items()}


class ShapedItems:
    """Builds a shaped listener's bulk actions; rejected documents go to ``dead``."""

    def __init__(
        self,
        shape: Shape,
        dead: Callable[[list[DeadLetter]], None],
        lookup: Lookup,
        routes: Routes,
        *,
        versioned: bool = True,
        counts: CollectionCounts | None = None,
        joiner: Joiner | None = None,
        mine: Callable[[Any], bool] | None = None,
    ) -> None:
        self.shape, self._dead, self._lookup, self.routes = shape, dead, lookup, routes
        self.versioned = versioned
        self.counts = counts or CollectionCounts()
        #: Reads roots with their related documents (``None``: the shape relates nothing).
        self.joiner = joiner
        #: Sends what ``pending`` holds and empties it (a fan-out's chunks); ``None``: kept.
        self.spill: Callable[[dict[str, BulkItem]], None] | None = None
        self._sources = shape.sources
        #: Whether a document ``_id`` is this partition's (always, unpartitioned).
        self.mine = mine or (lambda _key: True)
        self._rebuilds: dict[str, dict[bytes, tuple[Any, int]]] = {}

    # -- one document ---------------------------------------------------------------------
    def copied(
        self, shape: CollectionShape, doc: Mapping[str, Any], version: int, target: str
    ) -> BulkItem | None:
        """The initial copy's action for ``doc`` (found by the copy's own filtered query) into
        the physical index ``target``; ``None`` if it cannot be indexed (dead-lettered)."""
        origin = {"op": "initial_sync", "collection": shape.name, "key": doc["_id"]}
        made = self._write(shape, doc, doc["_id"], write_version(version), origin, target)
        return made[1] if made is not None else None

    def _write(
        self,
        shape: CollectionShape,
        doc: Mapping[str, Any],
        key: Any,
        version: int,
        origin: Mapping[str, Any],
        index: str,
    ) -> tuple[str | None, BulkItem] | None:
        """``(routing, action)`` making ``index`` hold what ``doc`` is now (a delete when it is
        kept out); ``None`` when it cannot be indexed."""
        try:
            es_id = shape.es_id(key)
            routing = shape.routing_of(doc)
            body = shape.shaped(doc)
            source = None if body is None else source_of(body)
        except (UnindexableError, ValueError, TypeError) as exc:
            self.reject(shape, "index", key, version, origin, index, exc)
            return None
        op = "index" if source is not None else "delete"
        made = lines(op, index, es_id, version, routing, source, versioned=self.versioned)
        return routing, BulkItem(op, index, es_id, version, None, origin, made)

    def _delete(
        self, index: str, es_id: str, version: int, routing: str | None, origin: Mapping[str, Any]
    ) -> BulkItem:
        made = lines("delete", index, es_id, version, routing, None, versioned=self.versioned)
        return BulkItem("delete", index, es_id, version, None, origin, made)

    def reject(
        self,
        shape: CollectionShape,
        op: str,
        key: Any,
        version: int,
        origin: Mapping[str, Any],
        index: str,
        exc: Exception,
    ) -> None:
        """Dead-letter what cannot be indexed, with its reason."""
        try:
            es_id = shape.es_id(key)
        except UnindexableError:
            es_id = repr(key)[:200]
        bad = BulkItem(op, index, es_id, version, None, {**origin, "key": key})
        self._dead([DeadLetter(bad, 0, f"cannot index: {exc}")])

    # -- one event ------------------------------------------------------------------------
    def event_items(
        self,
        event: ChangeEvent,
        versioner: EventVersioner,
        pending: Mapping[str, BulkItem],
        targets: Mapping[str, str],
    ) -> list[tuple[str | None, BulkItem]]:
        """``(routing, action)`` for each action ``event`` needs (see the module docstring),
        into its collection's alias or that alias's physical ``targets`` entry (a copy's)."""
        shape = self.shape.of((event.get("ns") or {}).get("coll"))
        if shape is None or "documentKey" not in event:
            return []  # another collection, or a fragment without its key
        key = event["documentKey"]["_id"]
        if not self.mine(key):
            return []  # a related document of another partition: its roots may be ours
        op = event.get("operationType")
        # (the key and collection: a dead letter's replayable event names them, see .deadletters)
        origin = {"op": op, "token": event.get("_id"), "collection": shape.name, "key": key}
        version = versioner.version(event)
        doc = event.get("fullDocument")
        if op != "delete" and doc is None:
            if not fragments.needs_lookup(event):
                return []  # looked up after a later delete: that delete follows
            doc = self._lookup(shape.name, key)
            op = "delete" if doc is None else op
        index = targets.get(shape.index, shape.index)
        try:
            es_id = shape.es_id(key)
        except UnindexableError as exc:
            self.reject(shape, str(op), key, version, origin, index, exc)
            return []
        out: list[tuple[str | None, BulkItem]] = []
        new: str | None = None
        if op != "delete" and doc is not None:
            made = self._now(shape, doc, key, version, origin, index)
            if made is None:
                return []
            new, item = made
            if item is not None:
                out.append((new, item))
        before = self._before(shape, event, op, index, es_id, pending)
        if op == "delete":
            for routing in before or {None}:
                out.append((routing, self._delete(index, es_id, write_version(version),
                                                  routing, origin)))  # fmt: skip
        else:
            for routing in before - {new}:
                out.append(
                    (routing, self._delete(index, es_id, moved_version(version), routing, origin))
                )
        return out

    def _now(
        self,
        shape: CollectionShape,
        doc: Mapping[str, Any],
        key: Any,
        version: int,
        origin: Mapping[str, Any],
        index: str,
    ) -> tuple[str | None, BulkItem | None] | None:
        """The document's routing now and its action (``None``: a root rebuilt at the end of
        the batch, see .relate); ``None`` if it cannot be indexed (dead-lettered)."""
        if not shape.relations:
            return self._write(shape, doc, key, write_version(version), origin, index)
        self.queue_rebuild(shape.name, key, version)  # once per batch, with its related docs
        try:
            return shape.routing_of(doc), None
        except UnindexableError:
            return None, None

    def _before(
        self,
        shape: CollectionShape,
        event: ChangeEvent,
        op: Any,
        index: str,
        es_id: str,
        pending: Mapping[str, BulkItem],
    ) -> set[str | None]:
        """The routings the document may be held under before ``event``."""
        if shape.routing is None:
            return {None} if op == "delete" else set()
        pre = event.get("fullDocumentBeforeChange")
        if pre is not None:
            try:
                return {shape.routing_of(pre)}
            except UnindexableError:
                return set()  # never indexed under it: it had no valid routing
        if op == "insert":
            return set()
        update = event.get("updateDescription")
        if op == "update" and update is not None and not touches(update, shape.routing):
            return set()
        return self.routes(index, es_id) | set(_pending_routings(pending, index, es_id))

    def collect(
        self,
        events: Sequence[ChangeEvent],
        start: int,
        versioner: EventVersioner,
        pending: dict[str, BulkItem],
        targets: Mapping[str, str],
    ) -> int:
        """:meth:`.items.ItemMaker.collect` for a shaped listener: the actions of
        ``events[start:]`` into ``pending`` (by :func:`pending_key`), up to the first drop,
        rename, dropDatabase or fragment of a split event; its position, or ``len(events)``."""
        seen: dict[str, int] = {}
        try:
            at = self._collect(events, start, versioner, pending, targets, seen)
            self.flush_rebuilds(pending, targets)
            return at
        finally:
            for name, n in seen.items():
                self.counts.add(name, "events", n)

    def _collect(
        self,
        events: Sequence[ChangeEvent],
        start: int,
        versioner: EventVersioner,
        pending: dict[str, BulkItem],
        targets: Mapping[str, str],
        seen: dict[str, int],
    ) -> int:
        for at in range(start, len(events)):
            event = events[at]
            split = event.get("splitEvent")
            if event.get("operationType") in DROPS or not (split is None or split == WHOLE):
                return at
            if event.get("operationType") in WRITES or fragments.needs_lookup(event):
                name = (event.get("ns") or {}).get("coll")
                if isinstance(name, str) and name in self.shape.collections:
                    seen[name] = seen.get(name, 0) + 1
                for routing, item in self.event_items(event, versioner, pending, targets):
                    pending[pending_key(item.index, item.doc_id, routing)] = item
                if name in self._sources:
                    self._triggered(event, versioner, pending, targets)
        return len(events)

    # -- related documents (see .relate) ----------------------------------------------------
    def queue_rebuild(self, root: str, key: Any, version: int) -> None:
        """Rebuild root ``key`` of ``root`` at the end of the batch, under ``version`` (the
        greatest of the events that touched it)."""
        queued = self._rebuilds.setdefault(root, {})
        k = key_of(key)
        if k not in queued or queued[k][1] < version:
            queued[k] = (key, version)
            self.counts.set(root, "pending_rebuilds", len(queued))

    def _triggered(
        self,
        event: ChangeEvent,
        versioner: EventVersioner,
        pending: dict[str, BulkItem],
        targets: Mapping[str, str],
    ) -> None:
        """Queue the roots a related document's event touches (chunk by chunk: a fan-out of
        any size rebuilds :data:`.relate.CHUNK` roots at a time)."""
        if "documentKey" not in event or self.joiner is None:
            return
        version = versioner.version(event)
        name = (event.get("ns") or {}).get("coll")
        for root, path in self._sources.get(str(name), []):
            for chunk in self.joiner.affected_through(root, path, event):
                for key in chunk:
                    if self.mine(key):
                        self.queue_rebuild(root, key, version)
                if sum(len(q) for q in self._rebuilds.values()) >= CHUNK:
                    self.flush_rebuilds(pending, targets)

    def flush_rebuilds(self, pending: dict[str, BulkItem], targets: Mapping[str, str]) -> None:
        """Read the queued roots as they are now, with their related documents, and put their
        actions into ``pending`` (handing ``pending`` to ``spill`` every :data:`CHUNK`)."""
        if not self._rebuilds or self.joiner is None:
            return
        for root, queued in sorted(self._rebuilds.items()):
            shape = self.shape.collections[root]
            index = targets.get(shape.index, shape.index)
            entries = list(queued.values())
            for start in range(0, len(entries), CHUNK):
                chunk = entries[start : start + CHUNK]
                docs = self.joiner.roots(root, shape.relations, [k for k, _ in chunk])
                for key, version in chunk:
                    doc = docs.get(key_of(key))
                    if doc is None:
                        continue  # gone now: its delete event deletes it
                    origin = {"op": "rebuild", "collection": root, "key": key}
                    made = self._write(shape, doc, key, write_version(version), origin, index)
                    if made is not None:
                        routing, item = made
                        pending[pending_key(item.index, item.doc_id, routing)] = item
                self.counts.add(root, "rebuilds", len(chunk))
                self.counts.set(root, "pending_rebuilds", max(0, len(queued) - start - CHUNK))
                if self.spill is not None and len(pending) >= CHUNK:
                    self.spill(pending)
        self._rebuilds.clear()


def _pending_routings(
    pending: Mapping[str, BulkItem], index: str, es_id: str
) -> Iterable[str | None]:
    """The routings of the index actions for ``es_id`` waiting in this batch."""
    for key, item in pending.items():
        if item.op == "index" and item.index == index and item.doc_id == es_id:
            routing = key.split("\0", 2)[1]
            yield routing or None
