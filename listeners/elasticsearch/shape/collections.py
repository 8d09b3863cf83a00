"""Which collections feed which indexes, and how each document is shaped on its way there.

A ``collections`` option (``[listeners.collections.<name>]`` tables in ``singleton.toml``) turns
an :class:`~listeners.elasticsearch.ElasticsearchSync` from a mirror of one collection into a
*shaped* index: every listed collection of the listener's database is read by one change stream
(one lease, one checkpoint, one order), and each has its own rules::

    index      the alias its documents go to (a template with {database} and {collection};
               default: the listener's ``index``); several collections may share one
    filter     a MongoDB query: a document is in the index iff it matches it *now*
    routing    a dotted path: the document's Elasticsearch routing
    include    dotted paths: only these fields (the document keeps its id)
    exclude    dotted paths, applied after include
    rename     {dotted source: dotted target}, applied last
    transform  "module:function", called on the shaped document (``None``: keep it out)

Ids. A collection alone in its index keeps the mirror's ids (:func:`.ids.doc_id`); in an index
fed by several, its documents' ids are ``<collection>$<id>``: ``1`` in ``orders`` and ``1`` in
``legacy_orders`` are two documents, and the id still says where it came from (a collection
name never holds ``$``), :meth:`Shape.source_of_id` reverses it.

Versions. A document whose routing changes moves to another shard: the copy under the old
routing is deleted by the same event that writes the new one. Both may land on the same shard
(two routing values hash alike) where they are the same document, so the delete must lose to the
write whatever their order: a shaped index's versions are ``2 v + 1`` for an event's write and
``2 v`` for its delete under the old routing (``v``: :mod:`..versioning`'s oplog version), which
keeps every other ordering (``2 v + 1 < 2 w`` for ``v < w``).

:meth:`Shape.digest` names what built an index (its collections and their rules): it is kept
in the index's ``_meta``, and a tenure that finds another digest there resyncs (a changed
``filter`` or field rule is never applied silently to half the index).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from bson import ObjectId
from bson.int64 import Int64

from listeners.elasticsearch.documents import Transform, index_name, resolve_transform
from listeners.elasticsearch.ids import MAX_ID_BYTES, bson_id_of, doc_id
from listeners.elasticsearch.shape.fields import FieldRules
from listeners.elasticsearch.shape.filters import Filter
from listeners.elasticsearch.shape.paths import MISSING, check_path, get_path
from listeners.elasticsearch.shape.relate import (
    Relation,
    parse_relations,
    set_path,
    strip_lookups,
)
from listeners.elasticsearch.versioning import MAX_VERSION
from singleton.errors import (
    ConfigurationError,
    UnindexableError,
    UnindexableIdError,
    VersionOverflowError,
)

#: The keys of a ``[listeners.collections.<name>]`` table.
COLLECTION_KEYS = (
    "index", "filter", "routing", "include", "exclude", "rename", "transform", "relate",
)  # fmt: skip
#: Separates the collection from the id in an index fed by several collections.
ID_SEPARATOR = "$"


class RoutingValueError(UnindexableError):
    """A routing field holds a value that is no routing (an array, a document, a float...)."""


def write_version(version: int) -> int:
    """A shaped index's version of an event's write (see the module docstring)."""
    out = 2 * version + 1
    if out > MAX_VERSION:
        raise VersionOverflowError(f"version {version} does not fit a shaped index's versions")
    return out


def moved_version(version: int) -> int:
    """The version of the delete, under the old routing, of a document the event moved."""
    return 2 * version


def routing_value(value: Any, path: str) -> str | None:
    """The routing string of a field's value: strings as they are, integers and ObjectIds as
    their text; ``None`` for a missing or null field (the document is then routed by its id).
    Anything else raises :class:`RoutingValueError` (the document is dead-lettered)."""
    if value is MISSING or value is None:
        return None
    if isinstance(value, str):
        if not value:
            raise RoutingValueError(f"routing field {path} is an empty string")
        return value
    if isinstance(value, (int, Int64)) and not isinstance(value, bool):
        return str(int(value))
    if isinstance(value, ObjectId):
        return str(value)
    raise RoutingValueError(
        f"routing field {path} holds a {type(value).__name__}; a routing is a string, an "
        f"integer or an ObjectId"
    )


@dataclass(frozen=True)
class CollectionShape:
    """One collection's rules (see the module docstring). ``prefix`` is ``"<name>$"`` when its
    index is shared, else empty."""

    name: str
    index: str
    filter: Filter | None
    routing: str | None
    fields: FieldRules
    transform: Transform | None
    transform_name: str | None
    prefix: str = ""
    #: Related documents embedded (:mod:`.relate`).
    relations: tuple[Relation, ...] = ()
    #: No field rule: the document as it is (no walk through the rules).
    plain: bool = dataclasses.field(init=False, default=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "plain", self.fields.identity())

    def es_id(self, key: Any) -> str:
        """The Elasticsearch id of the document whose ``_id`` is ``key``."""
        plain = doc_id(key)
        if not self.prefix:
            return plain
        out = self.prefix + plain
        size = len(out.encode("utf-8", "surrogatepass"))
        if size > MAX_ID_BYTES:
            raise UnindexableIdError(
                f"_id maps to {size} bytes with its collection, over Elasticsearch's limit of "
                f"{MAX_ID_BYTES}"
            )
        return out

    def matches(self, doc: Mapping[str, Any]) -> bool:
        return self.filter is None or self.filter.matches(doc)

    def shaped(self, doc: Mapping[str, Any]) -> dict[str, Any] | None:
        """What the index holds for ``doc``: ``None`` when the filter or the transform keeps it
        out, else the document after the field rules (and the transform). Its ``_id`` may
        stay in it: the source leaves it out (:func:`..documents.source_of`)."""
        related: list[Any] = []
        if self.relations:  # (a root read with its related documents: relate.Joiner, a copy)
            doc = dict(doc)
            related = strip_lookups(doc, len(self.relations))
        if not self.matches(doc):
            return None
        body = dict(doc) if self.plain else self.fields.apply(doc)
        for rel, found in zip(self.relations, related, strict=True):
            set_path(body, rel.into, rel.value_for(doc, found))
        if self.transform is not None:
            return self.transform(body)
        return body

    def routing_of(self, doc: Mapping[str, Any] | None) -> str | None:
        """``doc``'s routing (``None``: not routed, or routed by its id)."""
        if self.routing is None or doc is None:
            return None
        return routing_value(get_path(doc, self.routing), self.routing)

    def describe(self) -> dict[str, Any]:
        """The rules, as :meth:`Shape.digest` reads them."""
        return {
            "collection": self.name,
            "filter": self.filter.digest() if self.filter is not None else None,
            "fields": None if self.fields.identity() else self.fields.digest(),
            "routing": self.routing,
            "transform": self.transform_name,
            "prefix": self.prefix,
            "relate": [repr(r) for r in self.relations],
        }


@dataclass(frozen=True)
class Shape:
    """The collections of one listener and the indexes (aliases) they feed."""

    database: str
    collections: Mapping[str, CollectionShape]

    def of(self, collection: str | None) -> CollectionShape | None:
        return None if collection is None else self.collections.get(collection)

    @property
    def names(self) -> list[str]:
        """The collections, sorted (the copy's order)."""
        return sorted(self.collections)

    @property
    def indexes(self) -> dict[str, list[str]]:
        """alias -> the collections that feed it (sorted)."""
        out: dict[str, list[str]] = {}
        for name in self.names:
            out.setdefault(self.collections[name].index, []).append(name)
        return out

    @property
    def sources(self) -> dict[str, list[tuple[str, tuple[Relation, ...]]]]:
        """related collection -> the ``(root, path)`` pairs that embed its documents: ``path``
        is ``(relation,)``, or ``(relation, its relation)`` for a second-level document."""
        out: dict[str, list[tuple[str, tuple[Relation, ...]]]] = {}
        for name in self.names:
            for rel in self.collections[name].relations:
                out.setdefault(rel.source, []).append((name, (rel,)))
                for nested in rel.relations:
                    out.setdefault(nested.source, []).append((name, (rel, nested)))
        return out

    @property
    def watched(self) -> list[str]:
        """Every collection the stream reads: the indexed ones and the related ones."""
        return sorted(set(self.names) | set(self.sources))

    @property
    def before_images(self) -> list[str]:
        """The collections whose events need their pre-image: the routed ones (where the old
        copy is) and the sources of ``foreign`` relations (which root a line left)."""
        foreign = {
            path[-1].source
            for pairs in self.sources.values()
            for _, path in pairs
            if path[-1].foreign
        }
        return sorted(set(self.routed) | foreign)

    @property
    def routed(self) -> list[str]:
        return [n for n in self.names if self.collections[n].routing is not None]

    def digest(self, alias: str) -> str:
        """What builds ``alias``: its collections and their rules (see the module docstring)."""
        rules = [self.collections[n].describe() for n in self.indexes.get(alias, [])]
        text = json.dumps({"database": self.database, "collections": rules}, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def source_of_id(self, alias: str, es_id: str) -> tuple[str, Any]:
        """The collection and BSON ``_id`` of the document ``es_id`` of ``alias``."""
        feeding = self.indexes.get(alias, [])
        if len(feeding) == 1:
            return feeding[0], bson_id_of(es_id)
        name, sep, rest = es_id.partition(ID_SEPARATOR)
        if not sep or name not in feeding:
            raise ValueError(f"id {es_id[:80]!r} names no collection of index {alias}")
        return name, bson_id_of(rest)

    def describe(self) -> str:
        """``shop.{customers,orders}``: the namespaces, for the deployment record."""
        return f"{self.database}.{{{','.join(self.names)}}}"


def parse_shape(
    database: str,
    tables: Any,
    *,
    default_index: str,
    transform: Transform | str | None = None,
) -> Shape:
    """Check the ``collections`` option and build its :class:`Shape`; ``default_index`` is the
    listener's ``index`` template, ``transform`` its own (a collection's replaces it)."""
    if not isinstance(tables, Mapping) or not tables:
        raise ConfigurationError(
            "collections must be a table of collection tables "
            f"([listeners.collections.<name>]), got {tables!r}"
        )
    made: dict[str, CollectionShape] = {}
    for name, table in tables.items():
        made[name] = _collection(database, name, table, default_index, transform)
    feeding: dict[str, int] = {}
    for shape in made.values():
        feeding[shape.index] = feeding.get(shape.index, 0) + 1
    shared = {
        name: dataclasses.replace(shape, prefix=f"{name}{ID_SEPARATOR}")
        for name, shape in made.items()
        if feeding[shape.index] > 1
    }
    return Shape(database, {**made, **shared})


def _collection(
    database: str, name: Any, table: Any, default_index: str, transform: Any
) -> CollectionShape:
    where = f"collections.{name}"
    if not isinstance(name, str) or not name or ID_SEPARATOR in name or "\0" in name:
        raise ConfigurationError(f"collections: {name!r} is no collection name")
    if not isinstance(table, Mapping):
        raise ConfigurationError(f"{where} must be a table, got {table!r}")
    unknown = sorted(set(table) - set(COLLECTION_KEYS))
    if unknown:
        raise ConfigurationError(
            f"unknown key{'s' if len(unknown) > 1 else ''} {', '.join(unknown)} in {where}; "
            f"known keys: {', '.join(COLLECTION_KEYS)}"
        )
    template = table.get("index", default_index)
    if not isinstance(template, str) or not template:
        raise ConfigurationError(f"{where}.index must be an index name or template, got "
                                 f"{template!r}")  # fmt: skip
    query = table.get("filter")
    if query is not None and not isinstance(query, Mapping):
        raise ConfigurationError(f"{where}.filter must be a MongoDB query (a table), got "
                                 f"{query!r}")  # fmt: skip
    routing = table.get("routing")
    if routing is not None:
        if not isinstance(routing, str):
            raise ConfigurationError(f"{where}.routing must be a dotted path, got {routing!r}")
        routing = check_path(routing, option=f"{where}.routing")
    spec = table.get("transform", transform)
    hook = resolve_transform(spec)
    return CollectionShape(
        name=name,
        index=index_name(template, database, name),
        filter=Filter(query, option=f"{where}.filter") if query else None,
        routing=routing,
        fields=_fields(where, table),
        transform=hook,
        transform_name=_hook_name(spec, hook),
        relations=tuple(parse_relations(where, table["relate"])) if "relate" in table else (),
    )


def _fields(where: str, table: Mapping[str, Any]) -> FieldRules:
    try:
        return FieldRules(table.get("include"), table.get("exclude"), table.get("rename"))
    except ConfigurationError as exc:
        raise ConfigurationError(f"{where}: {exc}") from None


def _hook_name(spec: Any, hook: Any) -> str | None:
    if hook is None:
        return None
    if isinstance(spec, str):
        return spec
    return f"{getattr(hook, '__module__', '?')}:{getattr(hook, '__qualname__', repr(hook))}"
