"""Does a shaped index equal the shaped view of its collections? Every id, field and routing,
with the listener's own rules (:mod:`.collections`), so tests, the drill and ``singleton
verify`` share one verdict::

    diffs = compare_shaped(client, "http://localhost:9200", listener.shape)
    assert all(d.ok for d in diffs.values()), diffs

A document held under a routing other than its own is ``stale``; a second copy of one id
(under another routing: a move whose delete was lost) is ``extra`` (``extra_at`` says where).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from listeners.elasticsearch.documents import source_of
from listeners.elasticsearch.shape.collections import CollectionShape, Shape
from listeners.elasticsearch.verify import Diff, es_hits
from singleton.errors import UnindexableError


@dataclass
class Expected:
    """What the index should hold for one document."""

    collection: str
    key: Any
    source: Any
    routing: str | None


@dataclass
class ShapedDiff(Diff):
    """:class:`..verify.Diff` of one alias, with where each extra copy is held."""

    extra_at: list[tuple[str, str | None]] = field(default_factory=list)


def expected_documents(
    client: Any, shape: Shape, alias: str
) -> tuple[dict[str, Expected], list[str]]:
    """The shaped view of ``alias``: ``{es_id: Expected}``, and the documents that cannot be
    indexed (with their reason)."""
    out: dict[str, Expected] = {}
    bad: list[str] = []
    for name in shape.indexes.get(alias, []):
        rules = shape.collections[name]
        for doc in _matching(client, shape.database, rules):
            try:
                es_id = rules.es_id(doc["_id"])
                routing = rules.routing_of(doc)
                body = rules.shaped(doc)
                raw = None if body is None else source_of(body)
            except (UnindexableError, ValueError, TypeError) as exc:
                bad.append(f"{name} {str(doc['_id'])[:80]}: {exc}")
                continue
            if raw is not None:
                out[es_id] = Expected(name, doc["_id"], json.loads(raw), routing)
    return out, bad


def _matching(client: Any, database: str, rules: CollectionShape) -> Iterator[Any]:
    """The documents of ``rules``' collection that match its filter (with their related
    documents, joined on the server as the copy joins them)."""
    query = dict(rules.filter.query) if rules.filter is not None else {}
    coll = client[database][rules.name]
    if rules.relations:
        lookups = [r.lookup_stage(i) for i, r in enumerate(rules.relations)]
        yield from coll.aggregate([{"$match": query}, *lookups])
    else:
        yield from coll.find(query)


def compare_alias(
    client: Any,
    es: Any,
    shape: Shape,
    alias: str,
    view: tuple[dict[str, Expected], list[str]] | None = None,
) -> ShapedDiff:
    """Compare ``alias`` with the shaped view of the collections that feed it (``view``: that
    view, read already by :func:`expected_documents`)."""
    expected, bad = view or expected_documents(client, shape, alias)
    hits = es_hits(es, alias)
    diff = ShapedDiff(es_count=len(hits), mongo_count=len(expected), unindexable=bad)
    held: dict[str, list[tuple[str | None, Any]]] = {}
    for es_id, routing, source in hits:
        held.setdefault(es_id, []).append((routing, source))
    for es_id, want in expected.items():
        copies = held.get(es_id, [])
        if not copies:
            diff.missing.append(es_id)
            continue
        right = [c for c in copies if c[0] == want.routing]
        if not right or right[0][1] != want.source:
            diff.stale.append(es_id)
        for routing, _source in copies:
            if routing != want.routing:
                diff.extra.append(es_id)
                diff.extra_at.append((es_id, routing))
    for es_id, copies in held.items():
        if es_id not in expected:
            diff.extra.append(es_id)
            diff.extra_at += [(es_id, routing) for routing, _ in copies]
    diff.extra = sorted(set(diff.extra))
    return diff


def compare_shaped(client: Any, es: Any, shape: Shape) -> dict[str, ShapedDiff]:
    """:func:`compare_alias` for every alias of ``shape``."""
    return {alias: compare_alias(client, es, shape, alias) for alias in sorted(shape.indexes)}
