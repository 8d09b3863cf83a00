"""Does an index equal its collection? Every id, every field, with the listener's own mapping
(:func:`.documents.source_of`), so tests and the failover drill share one verdict.

    diff = compare(client.shop.orders, "http://localhost:9200", "shop.orders")
    assert diff.ok, diff
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from listeners.elasticsearch.documents import Transform, doc_id, source_of
from listeners.elasticsearch.transport import make_transport, path_index
from singleton.errors import SinkError, UnindexableError


@dataclass
class Diff:
    """Ids in the collection but not the index (``missing``), in both with other content
    (``stale``), in the index only (``extra``); ``unindexable`` documents (an id over 512
    bytes, a non-finite number: the listener dead-letters them) are listed apart, not errors.
    Ids are Elasticsearch ids; :func:`.ids.bson_id_of` maps them back."""

    missing: list[str] = field(default_factory=list)
    stale: list[str] = field(default_factory=list)
    extra: list[str] = field(default_factory=list)
    unindexable: list[str] = field(default_factory=list)
    mongo_count: int = 0
    es_count: int = 0

    @property
    def ok(self) -> bool:
        return not (self.missing or self.stale or self.extra)

    def __str__(self) -> str:
        if self.ok:
            return f"index equals collection ({self.mongo_count} documents)"
        return (
            f"{len(self.missing)} missing, {len(self.stale)} stale, {len(self.extra)} extra "
            f"(collection {self.mongo_count}, index {self.es_count}); first missing "
            f"{self.missing[:5]}, stale {self.stale[:5]}, extra {self.extra[:5]}"
        )


def es_documents(es: Any, index: str, page: int = 1000) -> dict[str, Any]:
    """Every document of ``index`` as ``{_id: _source}`` (refreshes first; scroll API)."""
    return {es_id: source for es_id, _routing, source in es_hits(es, index, page)}


def es_hits(es: Any, index: str, page: int = 1000) -> list[tuple[str, str | None, Any]]:
    """Every copy ``index`` holds, as ``(_id, _routing, _source)`` (refreshes first; scroll
    API): one id may be held twice, under two routings (a shaped index, :mod:`.shape.verify`)."""
    transport, owned = make_transport(es)
    try:
        name = path_index(index)
        status, body = transport.request("POST", f"/{name}/_refresh")
        if status == 404:
            return []
        query = json.dumps({"size": page, "query": {"match_all": {}}, "sort": ["_doc"]}).encode()
        status, body = transport.request("POST", f"/{name}/_search?scroll=2m", query)
        hits: list[tuple[str, str | None, Any]] = []
        while True:
            if status != 200 or not isinstance(body, dict):
                raise SinkError(f"scrolling {index}: HTTP {status}")
            page_hits = body["hits"]["hits"]
            hits += [(h["_id"], h.get("_routing"), h.get("_source")) for h in page_hits]
            scroll_id = body.get("_scroll_id")
            if not page_hits or not scroll_id:
                break
            req = json.dumps({"scroll": "2m", "scroll_id": scroll_id}).encode()
            status, body = transport.request("POST", "/_search/scroll", req)
        return hits
    finally:
        if owned:
            transport.close()


def compare(collection: Any, es: Any, index: str, transform: Transform | None = None) -> Diff:
    """Compare a pymongo ``collection`` with ``index`` (``es``: URL, client or transport)."""
    actual = es_documents(es, index)
    diff = Diff(es_count=len(actual))
    seen: set[str] = set()
    for doc in collection.find({}):
        try:
            key = doc_id(doc["_id"])
            expected_raw = source_of(doc, transform)
        except (UnindexableError, ValueError) as exc:
            diff.unindexable.append(f"{str(doc['_id'])[:80]}: {exc}")
            continue
        if expected_raw is None:
            continue
        diff.mongo_count += 1
        seen.add(key)
        if key not in actual:
            diff.missing.append(key)
        elif json.loads(expected_raw) != actual[key]:
            diff.stale.append(key)
    diff.extra = sorted(set(actual) - seen)
    return diff
