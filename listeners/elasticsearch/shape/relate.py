"""Related documents embedded in a root's index document (``relate``), kept exact when either
side changes.

```toml
[listeners.collections.orders]
relate = [
  { from = "customers", local = "customer_id", as = "customer", fields = ["name"] },
  { from = "order_lines", foreign = "order_id", as = "lines", many = true, sort = { sku = 1 } },
]
```

``local``: the root's field holds the related document's ``_id`` (many-to-one; a missing one
embeds ``null``). ``foreign``: the related documents' field holds the root's ``_id`` (one-to-many
with ``many = true``, an array, ``[]`` when there is none; else the first by ``sort``). ``fields``:
dotted paths kept of each related document (default: all of it), never its ``_id``. The
related collection is read by the listener's one stream whether or not it is indexed itself.

Why reading the current state converges. A root is never built from an event's own document:
every event that can change what a root's index document holds (the root's own, or a related
document's) names the roots it touches, and those roots are *rebuilt*: read as they are now,
with their related documents as they are now, and written under the version of the event
(``2 v + 1``, :mod:`.collections`). A rebuild reads after its event happened, so what it writes
is at least as new as that event; a later event (a greater version) rebuilds again and wins; a
replayed or late rebuild carries an older version and is refused. The last event touching a root
therefore writes it last, with a read made after every change that came before it.

Which roots an event touches: a root's own event, that root; a related document's event, for a
``local`` relation, every root whose field holds its ``_id`` (a query, worked through in chunks of
:data:`CHUNK` roots: memory stays bounded whatever the fan-out); for a ``foreign`` relation, the
root its field names now and the one it named before (from the pre-image, which the listener
turns on for such collections: without it, a line moved or deleted stays in its old root's array
until the sampled check (:mod:`..sample`) or ``singleton verify --repair`` finds it).

Depth 2: a relation may carry its own ``relate`` (a line embeds its product), whose related
documents are embedded in each related document as the root's are in the root; no deeper (a
configuration error). A change of a second-level document touches the related documents that
embed it (found as a root's are), and through them their roots (a ``local`` relation: the roots
whose field holds one of their ``_id`` s; a ``foreign`` one: the roots their field names).

The copy (and every resync, and ``verify``) joins on the server: one ``$lookup`` per relation
in the copy's aggregation (a second level: a ``$lookup`` in the first one's pipeline), never one
query per root.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import bson

from listeners.elasticsearch.shape.fields import FieldRules
from listeners.elasticsearch.shape.paths import MISSING, check_path, get_path
from listeners.elasticsearch.shape.values import compare
from singleton.errors import ConfigurationError

#: Roots rebuilt per chunk (and per bulk submission) of one fan-out.
CHUNK = 1000
#: Values per ``$in`` query: a server that tests each document against the list (SecantusDB:
#: 1,000 ids cost 3 s against 10,000 documents, 100 ids 0.05 s) stays fast; MongoDB looks each
#: one up in an index either way.
IN_CHUNK = 100
RELATE_KEYS = ("from", "local", "foreign", "as", "many", "fields", "sort", "relate")
#: How deep relations go: a related document's own ``relate`` is followed, not its related
#: documents' ``relate``.
MAX_DEPTH = 2
#: The copy's ``$lookup`` output field of relation ``i`` (removed before the rules apply).
LOOKUP_FIELD = "__singleton_relate_{}"


@dataclass(frozen=True)
class Relation:
    """One ``relate`` entry of a root collection."""

    source: str
    local: str | None
    foreign: str | None
    into: str
    many: bool
    fields: FieldRules | None
    sort: tuple[tuple[str, int], ...]
    #: The related document's own relations (depth 2; they have none).
    relations: tuple[Relation, ...] = ()

    def embedded(self, doc: Mapping[str, Any]) -> dict[str, Any]:
        """What the root holds of the related document ``doc`` (read with its own related
        documents under :data:`LOOKUP_FIELD` s when this relation has relations)."""
        nested: list[list[Mapping[str, Any]]] = []
        if self.relations:
            doc = dict(doc)
            nested = strip_lookups(doc, len(self.relations))
        out = self.fields.apply(doc) if self.fields is not None else dict(doc)
        out.pop("_id", None)
        for rel, found in zip(self.relations, nested, strict=True):
            set_path(out, rel.into, rel.value_for(doc, found))
        return out

    def ordered(self, docs: list[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
        """``docs`` by ``sort`` (then by ``_id``: one order on every replica)."""

        def cmp(a: Mapping[str, Any], b: Mapping[str, Any]) -> int:
            for path, direction in (*self.sort, ("_id", 1)):
                c = compare(_value(a, path), _value(b, path))
                if c:
                    return c * direction
            return 0

        return sorted(docs, key=functools.cmp_to_key(cmp))

    def lookup_stage(self, i: int) -> dict[str, Any]:
        """The copy's ``$lookup`` of this relation."""
        local, foreign = (self.local, "_id") if self.local else ("_id", self.foreign)
        stage: dict[str, Any] = {
            "from": self.source,
            "localField": local,
            "foreignField": foreign,
            "as": LOOKUP_FIELD.format(i),
        }
        if self.relations:  # (MongoDB 5.0: the fields and a pipeline together)
            stage["pipeline"] = [r.lookup_stage(j) for j, r in enumerate(self.relations)]
        return {"$lookup": stage}

    def value_for(self, root: Mapping[str, Any], found: list[Mapping[str, Any]]) -> Any:
        """The embedded value of ``root`` given its related documents ``found``."""
        if self.local is not None and get_path(root, self.local) in (MISSING, None):
            found = []
        docs = [self.embedded(d) for d in self.ordered(found)]
        if self.many:
            return docs
        return docs[0] if docs else None


def _value(doc: Mapping[str, Any], path: str) -> Any:
    value = get_path(doc, path)
    return None if value is MISSING else value


def key_of(value: Any) -> bytes:
    """A hashable, type-exact key of a BSON value (``1`` and ``"1"`` differ)."""
    return bson.encode({"": value})


def set_path(doc: dict[str, Any], path: str, value: Any) -> None:
    """Put ``value`` at the dotted ``path`` of ``doc``, creating sub-documents."""
    parts = path.split(".")
    cur = doc
    for part in parts[:-1]:
        nxt = cur.get(part)
        if not isinstance(nxt, dict):
            nxt = cur[part] = {}
        cur = nxt
    cur[parts[-1]] = value


def parse_relations(where: str, value: Any, depth: int = 1) -> list[Relation]:
    """Check a collection's ``relate`` list (``depth`` 2: a relation's own)."""
    if not isinstance(value, list) or not all(isinstance(v, Mapping) for v in value):
        raise ConfigurationError(f"{where}.relate must be a list of tables, got {value!r}")
    out: list[Relation] = []
    for n, table in enumerate(value):
        out.append(_relation(f"{where}.relate[{n}]", table, depth))
    targets = [r.into for r in out]
    if len(set(targets)) != len(targets):
        raise ConfigurationError(f"{where}.relate: two relations embed into one field: {targets}")
    return out


def _relation(where: str, table: Mapping[str, Any], depth: int) -> Relation:
    unknown = sorted(set(table) - set(RELATE_KEYS))
    if unknown:
        raise ConfigurationError(
            f"unknown key {', '.join(unknown)} in {where}; known keys: {', '.join(RELATE_KEYS)}"
        )
    source = table.get("from")
    if not isinstance(source, str) or not source or "$" in source:
        raise ConfigurationError(f"{where}.from must name a collection, got {source!r}")
    local, foreign = table.get("local"), table.get("foreign")
    if (local is None) == (foreign is None):
        raise ConfigurationError(
            f"{where} needs exactly one of local (the root holds the related _id) or foreign "
            f"(the related document holds the root's _id), got local={local!r} "
            f"foreign={foreign!r}"
        )
    if local is not None:
        local = check_path(str(local), option=f"{where}.local")
    if foreign is not None:
        foreign = check_path(str(foreign), option=f"{where}.foreign")
    into = table.get("as")
    if not isinstance(into, str):
        raise ConfigurationError(f"{where}.as must be a dotted path, got {into!r}")
    into = check_path(into, option=f"{where}.as")
    many = table.get("many", False)
    if not isinstance(many, bool) or (many and local is not None):
        raise ConfigurationError(
            f"{where}.many must be true or false, and only with foreign, got {many!r}"
        )
    fields = table.get("fields")
    rules = FieldRules(include=fields) if fields is not None else None
    nested: list[Relation] = []
    if "relate" in table:
        if depth >= MAX_DEPTH:
            raise ConfigurationError(
                f"{where}.relate: relations go {MAX_DEPTH} levels deep at most (a related"
                " document's related documents cannot embed their own): embed what you need"
                f" from {source!r} at this level, or remove this relate"
            )
        nested = parse_relations(where, table["relate"], depth + 1)
    return Relation(
        str(source), local, foreign, into, many, rules, _sort(where, table), tuple(nested)
    )


def _sort(where: str, table: Mapping[str, Any]) -> tuple[tuple[str, int], ...]:
    sort = table.get("sort", {})
    if not isinstance(sort, Mapping) or not all(v in (1, -1) for v in sort.values()):
        raise ConfigurationError(f"{where}.sort must be a table of path = 1 or -1, got {sort!r}")
    return tuple((check_path(str(k), option=f"{where}.sort"), int(v)) for k, v in sort.items())


class Joiner:
    """Reads roots as they are now, with their related documents (batched queries)."""

    def __init__(self, database: Any) -> None:
        self.database = database

    def roots(
        self, collection: str, relations: Sequence[Relation], keys: Sequence[Any]
    ) -> dict[bytes, dict[str, Any]]:
        """``key_of(_id)`` -> the root with a :data:`LOOKUP_FIELD` list per relation (as the
        copy's ``$lookup`` gives them), for the roots among ``keys`` that exist now."""
        docs = list(_find_in(self.database[collection], "_id", keys))
        self._attach(relations, docs)
        return {key_of(d["_id"]): d for d in docs}

    def _attach(self, relations: Sequence[Relation], docs: Sequence[dict[str, Any]]) -> None:
        """Put each relation's related documents under its :data:`LOOKUP_FIELD` of each of
        ``docs``, and theirs under theirs (one related document read once, whatever number
        of ``docs`` embed it)."""
        for i, rel in enumerate(relations):
            field = LOOKUP_FIELD.format(i)
            found = list(self._related(rel, docs))
            if rel.relations:
                unique = {id(r): r for group in found for r in group}
                self._attach(rel.relations, list(unique.values()))
            for doc, group in zip(docs, found, strict=True):
                doc[field] = group

    def _related(
        self, rel: Relation, docs: Sequence[Mapping[str, Any]]
    ) -> Iterator[list[dict[str, Any]]]:
        coll = self.database[rel.source]
        if rel.local is not None:
            wanted = [v for d in docs if (v := get_path(d, rel.local)) not in (MISSING, None)]
            by_id = {key_of(r["_id"]): r for r in _find_in(coll, "_id", wanted)}
            for d in docs:
                value = get_path(d, rel.local)
                hit = None if value in (MISSING, None) else by_id.get(key_of(value))
                yield [hit] if hit is not None else []
            return
        assert rel.foreign is not None
        groups: dict[bytes, list[dict[str, Any]]] = {}
        for r in _find_in(coll, rel.foreign, [d["_id"] for d in docs]):
            groups.setdefault(key_of(get_path(r, rel.foreign)), []).append(r)
        for d in docs:
            yield groups.get(key_of(d["_id"]), [])

    def affected(
        self, collection: str, rel: Relation, event: Mapping[str, Any]
    ) -> Iterator[list[Any]]:
        """The ``_id`` s of the roots of ``collection`` that a change of ``rel``'s source
        (``event``) touches, in chunks of :data:`CHUNK`."""
        if rel.local is not None:
            key = (event.get("documentKey") or {}).get("_id")
            cursor = self.database[collection].find({rel.local: key}, {"_id": 1})
            chunk: list[Any] = []
            for doc in cursor:
                chunk.append(doc["_id"])
                if len(chunk) >= CHUNK:
                    yield chunk
                    chunk = []
            if chunk:
                yield chunk
            return
        assert rel.foreign is not None
        roots: dict[bytes, Any] = {}
        for side in ("fullDocument", "fullDocumentBeforeChange"):
            doc = event.get(side)
            value = MISSING if not isinstance(doc, Mapping) else get_path(doc, rel.foreign)
            if value not in (MISSING, None):
                roots[key_of(value)] = value
        if roots:
            yield list(roots.values())

    def affected_through(
        self, collection: str, path: Sequence[Relation], event: Mapping[str, Any]
    ) -> Iterator[list[Any]]:
        """:meth:`affected` along ``path``: ``(relation,)`` for a related document's event,
        ``(relation, its relation)`` for a second-level one, whose touched related documents
        are mapped to their roots (chunks of :data:`CHUNK` roots either way)."""
        if len(path) == 1:
            yield from self.affected(collection, path[0], event)
            return
        rel, nested = path
        for middle in self.affected(rel.source, nested, event):
            yield from self._roots_of(collection, rel, middle)

    def _roots_of(self, collection: str, rel: Relation, keys: Sequence[Any]) -> Iterator[list[Any]]:
        """The ``_id`` s of the roots of ``collection`` that embed, by ``rel``, one of the
        related documents ``keys``, in chunks of :data:`CHUNK`."""
        if rel.local is not None:
            found = _find_in(self.database[collection], rel.local, keys, {"_id": 1})
            roots = (doc["_id"] for doc in found)
        else:
            assert rel.foreign is not None
            foreign = rel.foreign
            related = _find_in(self.database[rel.source], "_id", keys, {foreign: 1})
            values = (get_path(doc, foreign) for doc in related)
            roots = (v for v in values if v not in (MISSING, None))
        chunk: list[Any] = []
        for root in roots:
            chunk.append(root)
            if len(chunk) >= CHUNK:
                yield chunk
                chunk = []
        if chunk:
            yield chunk


def _find_in(
    coll: Any, path: str, values: Sequence[Any], projection: Mapping[str, Any] | None = None
) -> Iterator[dict[str, Any]]:
    """The documents whose ``path`` is one of ``values``, :data:`IN_CHUNK` values a query."""
    unique = list({key_of(v): v for v in values}.values())
    for start in range(0, len(unique), IN_CHUNK):
        yield from coll.find({path: {"$in": unique[start : start + IN_CHUNK]}}, projection)


def strip_lookups(doc: dict[str, Any], count: int) -> list[list[Mapping[str, Any]]]:
    """Take the copy's :data:`LOOKUP_FIELD` lists out of ``doc``."""
    return [doc.pop(LOOKUP_FIELD.format(i), []) for i in range(count)]
