"""What a shaped listener reads and asks of MongoDB and Elasticsearch besides the mirror's work:
one change stream over its collections, pre-images on the routed ones, where a document is
routed now (:class:`RouteFinder`), and which shape built an index (its ``_meta``)."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from pymongo.errors import OperationFailure

from listeners.elasticsearch.shape.collections import Shape
from listeners.elasticsearch.transport import Transport, path_index, request_error

#: The key of a shaped index's ``_meta`` that names the shape that built it.
META_KEY = "singleton_shape"
#: Change events that never name a collection but end every one of them.
_DATABASE_EVENTS = ("dropDatabase",)


def stream_pipeline(shape: Shape, pipeline: Sequence[Mapping[str, Any]]) -> list[Any]:
    """The user's ``pipeline`` after a ``$match`` on the shape's namespaces (filtered on the
    server) and before a ``$project`` of what the sink never reads (``updateDescription`` is
    kept where a routing field's change must be told apart)."""
    match = {
        "$match": {
            "$or": [
                {"ns.coll": {"$in": shape.watched}},
                {"operationType": {"$in": list(_DATABASE_EVENTS)}},
            ]
        }
    }
    unused: dict[str, Any] = {"wallTime": 0}
    if not shape.routed and not shape.sources:
        unused["updateDescription"] = 0
    return [match, *pipeline, {"$project": unused}]


def ensure_pre_images(database: Any, names: Sequence[str], logger: Any) -> list[str]:
    """Turn on ``changeStreamPreAndPostImages`` for the routed collections ``names`` (MongoDB
    6.0+; it costs a write of each changed document's previous version, kept as long as the
    server's ``expireAfterSeconds`` or the oplog). Returns the collections left without them
    (the user may not run ``collMod``): their deletes and moves ask the index instead."""
    infos = {c["name"]: c for c in database.list_collections(filter={"name": {"$in": list(names)}})}
    missing: list[str] = []
    for name in names:
        options = (infos.get(name) or {}).get("options") or {}
        if (options.get("changeStreamPreAndPostImages") or {}).get("enabled"):
            continue
        try:
            if name in infos:
                database.command("collMod", name, changeStreamPreAndPostImages={"enabled": True})
            else:
                database.create_collection(name, changeStreamPreAndPostImages={"enabled": True})
            logger.warning(
                "elasticsearch: turned on changeStreamPreAndPostImages for {}.{} (a delete, a "
                "routing change or a related document that moves finds where it was from the "
                "pre-image)",
                database.name,
                name,
            )
        except OperationFailure as exc:
            missing.append(name)
            logger.warning(
                "elasticsearch: cannot turn on pre-images for {}.{} ({}); its deletes and "
                "routing changes ask the index where the document is (slower). Run "
                "db.runCommand({{collMod: {!r}, changeStreamPreAndPostImages: {{enabled: "
                "true}}}}) as an admin to avoid that",
                database.name,
                name,
                exc.details.get("errmsg") if exc.details else exc,
                name,
            )
    return missing


class RouteFinder:
    """``finder(index, es_id)``: the routings ``es_id`` is held under in ``index`` now, once
    what is in flight has landed (``settle``) and the index refreshed."""

    def __init__(self, transport: Transport, settle: Callable[[], None]) -> None:
        self.transport, self.settle = transport, settle
        self.asked = 0

    def __call__(self, index: str, es_id: str) -> set[str | None]:
        self.settle()
        self.asked += 1
        name = path_index(index)
        status, resp = self.transport.request("POST", f"/{name}/_refresh")
        if status == 404:
            return set()
        body = json.dumps(
            {"query": {"ids": {"values": [es_id]}}, "_source": False, "size": 1000}
        ).encode()
        status, resp = self.transport.request("POST", f"/{name}/_search", body)
        if status == 404:
            return set()
        if status != 200 or not isinstance(resp, dict):
            raise request_error(status, resp, f"cannot find where {es_id} is routed in {index}")
        return {hit.get("_routing") for hit in resp["hits"]["hits"]}


def built_by(transport: Transport, alias: str) -> str | None:
    """The shape digest in the ``_meta`` of the index behind ``alias`` (``None``: none, or not
    one index)."""
    status, resp = transport.request("GET", f"/{path_index(alias)}/_mapping")
    if status != 200 or not isinstance(resp, dict) or len(resp) != 1:
        return None
    (index,) = resp.values()
    meta = ((index or {}).get("mappings") or {}).get("_meta") or {}
    value = meta.get(META_KEY)
    return value if isinstance(value, str) else None
