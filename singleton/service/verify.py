"""``singleton verify [--repair]``: does each Elasticsearch index equal its collection?

It compares with the listener's own mapping (ids, transform, JSON encoding) and prints the
``missing``, ``stale`` and ``extra`` ids. ``--repair`` fixes them with *versioned* writes, so a
repair can never regress a document, whoever leads meanwhile:

* the cluster time ``T`` is read **before** the collection is scanned, and every repair write
  carries the external version of ``T`` (position 0);
* a document the stream already wrote from an event after ``T`` has a higher version: the repair
  is refused (409) and the newer content stays;
* a document whose last event is older than ``T`` is replaced by what the scan read, which is at
  least as new as ``T``; a later event (version above ``T``) still overwrites it;
* an extra id (in the index, not in the collection) is deleted with version ``T``: a document
  inserted after ``T`` and already indexed is kept.

So ``--repair`` needs no lease and cannot race the running leader into an older state.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from listeners.elasticsearch import Diff, ElasticsearchSync, compare
from listeners.elasticsearch import sample as sampling
from listeners.elasticsearch.documents import doc_id, source_of
from listeners.elasticsearch.shape.collections import Shape, write_version
from listeners.elasticsearch.shape.items import lines as shaped_lines
from listeners.elasticsearch.shape.verify import (
    Expected,
    ShapedDiff,
    compare_alias,
    expected_documents,
)
from listeners.elasticsearch.transport import Transport, make_transport, path_index
from listeners.elasticsearch.versioning import timestamp_version
from singleton.drivers import mongo
from singleton.errors import ConfigurationError, SinkError
from singleton.redact import redact
from singleton.service.assembly import build_listener, lease_names, listener_name
from singleton.service.config import Config
from singleton.service.registry import listener_kind

#: Bulk actions per repair request.
REPAIR_BATCH = 1000


@dataclass
class Report:
    """One listener's comparison (and repair)."""

    listener: str
    index: str
    missing: list[str] = field(default_factory=list)
    stale: list[str] = field(default_factory=list)
    extra: list[str] = field(default_factory=list)
    documents: int = 0
    indexed: int = 0
    repaired: int = 0
    refused_as_newer: int = 0

    @property
    def ok(self) -> bool:
        return not (self.missing or self.stale or self.extra)

    def as_dict(self) -> dict[str, Any]:
        return {
            "listener": self.listener,
            "index": self.index,
            "ok": self.ok,
            "documents": self.documents,
            "indexed": self.indexed,
            "missing": self.missing,
            "stale": self.stale,
            "extra": self.extra,
            "repaired": self.repaired,
            "refused_as_newer": self.refused_as_newer,
        }


def es_listeners(config: Config, name: str | None) -> list[ElasticsearchSync]:
    """The configured ElasticsearchSync listeners (only ``name`` when given); a partitioned
    one once, whole (its partitions share one index). No other listener is built."""
    lease_names(config)  # unique, as a replica requires
    found: list[ElasticsearchSync] = []
    for lc in config.listeners:
        if issubclass(listener_kind(lc.use).cls, ElasticsearchSync) and name in (
            None,
            listener_name(lc),
        ):
            listener = build_listener(lc, config)
            assert isinstance(listener, ElasticsearchSync)  # its kind's class, just checked
            found.append(listener)
    if not found:
        what = f"named {name!r}" if name else "at all"
        raise ConfigurationError(f"no elasticsearch listener {what} in the configuration")
    return found


def verify(
    config: Config,
    name: str | None = None,
    *,
    repair: bool = False,
    sample: int | None = None,
) -> list[Report]:
    """Compare (and with ``repair``, fix) every configured ElasticsearchSync listener; with
    ``sample``, only that many random documents of each collection (``extra`` ids cannot be
    judged from a sample and are not looked for)."""
    if sample is not None and sample < 1:
        raise ConfigurationError(f"--sample must be >= 1, got {sample}")
    listeners = es_listeners(config, name)
    client, _ = mongo.client(config.mongo_url, mongo.Timeouts.BULK_READ)
    try:
        reports = []
        for listener in listeners:
            # an unreachable MongoDB is a failed verdict (exit 1), said in one line
            with mongo.translate(
                f"verify {listener.lease_name}: MongoDB {redact(config.mongo_url)}"
            ):
                if listener.shape is not None:
                    reports += _verify_shaped(listener, listener.shape, client, repair, sample)
                else:
                    reports.append(_verify_one(listener, client, repair, sample))
        return reports
    finally:
        client.close()


def _verify_one(
    listener: ElasticsearchSync, client: Any, repair: bool, sample: int | None
) -> Report:
    collection = client[str(listener.database)][str(listener.collection)]
    transport, owned = make_transport(
        listener.es,
        api_key=listener.api_key,
        ca_certs=listener.ca_certs,
        request_timeout=listener.request_timeout,
    )
    try:
        at = mongo.cluster_time(client)  # before the scan: see the module docstring
        transform: Any = listener.transform
        if sample is not None:
            view = sampling.mirror_view(collection.name, listener.index_name, transform)
            [(diff, _)] = sampling.compare_sample(
                collection.database, transport, [view], sample
            ).values()
        else:
            diff = compare(collection, transport, listener.index_name, transform)
        report = Report(
            listener.lease_name,
            listener.index_name,
            sorted(diff.missing),
            sorted(diff.stale),
            sorted(diff.extra),
            diff.mongo_count,
            diff.es_count,
        )
        if repair and not report.ok:
            _repair(report, collection, transport, timestamp_version(at), transform)
        return report
    finally:
        if owned:
            transport.close()


def _verify_shaped(
    listener: ElasticsearchSync, shape: Shape, client: Any, repair: bool, sample: int | None
) -> list[Report]:
    """One report per alias of a shaped listener: the index against the shaped view of every
    collection that feeds it (filter, field rules, ids, routing); ``repair`` writes under the
    same versions as for a mirror (``2 v + 1`` of ``T``, :mod:`..shape.collections`); with
    ``sample``, that many random documents of each collection (its filter applied)."""
    transport, owned = make_transport(
        listener.es,
        api_key=listener.api_key,
        ca_certs=listener.ca_certs,
        request_timeout=listener.request_timeout,
    )
    try:
        at = mongo.cluster_time(client)  # before the scan: see the module docstring
        reports = []
        sampled: dict[str, tuple[Diff, dict[str, sampling.Expected]]] = {}
        view: tuple[dict[str, Expected], list[str]]
        if sample is not None:
            database = client[shape.database]
            views = sampling.shaped_views(shape, database)
            sampled = sampling.compare_sample(database, transport, views, sample)
        for alias in sorted(shape.indexes):
            if sample is not None:
                found, wanted = sampled[alias]
                diff = ShapedDiff(
                    found.missing, found.stale, [], [], found.mongo_count, found.es_count
                )
                view = (
                    {
                        k: Expected(e.collection, e.key, e.source, e.routing)
                        for k, e in wanted.items()
                    },
                    [],
                )
            else:
                view = expected_documents(client, shape, alias)
                diff = compare_alias(client, transport, shape, alias, view)
            report = Report(
                listener.lease_name,
                alias,
                sorted(diff.missing),
                sorted(diff.stale),
                sorted(diff.extra),
                diff.mongo_count,
                diff.es_count,
            )
            if repair and not report.ok:
                version = write_version(timestamp_version(at))
                _repair_shaped(report, diff, view[0], transport, version)
            reports.append(report)
        return reports
    finally:
        if owned:
            transport.close()


def _repair_shaped(
    report: Report, diff: ShapedDiff, expected: Mapping[str, Expected], transport: Any, version: int
) -> None:
    actions: list[bytes] = []
    for key in sorted(set(diff.missing) | set(diff.stale)):
        want = expected[key]
        source = source_of(want.source)
        assert source is not None  # (a shaped document that the view holds)
        actions.append(shaped_lines("index", report.index, key, version, want.routing, source))
    for key, routing in diff.extra_at:  # (under 2 T: on the shard of a repaired copy, it loses)
        actions.append(shaped_lines("delete", report.index, key, version - 1, routing, None))
    for start in range(0, len(actions), REPAIR_BATCH):
        _bulk(report, transport, [a.rstrip(b"\n") for a in actions[start : start + REPAIR_BATCH]])


def _repair(report: Report, collection: Any, transport: Any, version: int, transform: Any) -> None:
    wanted = set(report.missing) | set(report.stale)
    meta = {"_index": report.index, "version": version, "version_type": "external"}
    actions: list[bytes] = []  # one bulk action each (action line, and source for an index)
    for doc in collection.find({}):
        try:
            key = doc_id(doc["_id"])
            source = source_of(doc, transform) if key in wanted else None
        except ValueError:  # unindexable id or non-finite number: a dead letter, not a repair
            continue
        if source is not None:
            actions.append(json.dumps({"index": {**meta, "_id": key}}).encode() + b"\n" + source)
    actions += [json.dumps({"delete": {**meta, "_id": key}}).encode() for key in report.extra]
    for start in range(0, len(actions), REPAIR_BATCH):
        _bulk(report, transport, actions[start : start + REPAIR_BATCH])


def _bulk(report: Report, transport: Transport, actions: list[bytes]) -> None:
    body = b"\n".join(actions) + b"\n"
    path = f"/{path_index(report.index)}/_bulk?refresh=true"
    status, reply = transport.request("POST", path, body, ndjson=True)
    if status != 200 or not isinstance(reply, dict):
        raise SinkError(f"repair of {report.index}: HTTP {status}")
    for item in reply.get("items", []):
        op, result = next(iter(item.items()))
        code = int(result.get("status", 0))
        if code in (200, 201) or (code == 404 and op == "delete"):
            report.repaired += 1
        elif code == 409:  # the stream wrote something newer meanwhile: it stays
            report.refused_as_newer += 1
        else:
            raise SinkError(f"repair of {report.index}: item {result.get('_id')}: HTTP {code}")
