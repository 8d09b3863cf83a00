"""How a MongoDB document becomes an Elasticsearch document: its ``_id``, its JSON source and its
index name. The listener and the verifier (:mod:`.verify`) share these functions, so
"the index equals the collection" is checked with exactly the mapping the listener applies.
"""

from __future__ import annotations

import base64
import datetime
import json
import re
import uuid
from collections.abc import Callable, Mapping
from decimal import Decimal
from typing import Any

from bson import ObjectId, json_util
from bson.binary import Binary
from bson.decimal128 import Decimal128
from bson.int64 import Int64
from bson.regex import Regex
from bson.timestamp import Timestamp

from singleton.errors import ConfigurationError

#: ``transform(doc) -> dict | None``: the document to index, or ``None`` to keep it out.
Transform = Callable[[dict[str, Any]], "dict[str, Any] | None"]

DEFAULT_INDEX_TEMPLATE = "{database}.{collection}"
_INVALID = re.compile(r'[\\/*?"<>| ,#:A-Z]')
_MAX_INDEX_BYTES = 255


def index_name(template: str, database: str, collection: str) -> str:
    """Fill ``template`` and sanitize the result into a valid index name: lower case, each
    character Elasticsearch forbids (``\\ / * ? " < > | space , # :``) replaced by ``_``, no
    leading ``- _ + .``, at most 255 bytes. ``{database}.{collection}`` is the default."""
    try:
        raw = template.format(database=database, collection=collection)
    except (KeyError, IndexError, ValueError) as exc:
        raise ConfigurationError(
            f"index template {template!r} may use only {{database}} and {{collection}}"
        ) from exc
    name = _INVALID.sub("_", raw.lower())
    name = name.lstrip("-_+.") or "index"
    while len(name.encode()) > _MAX_INDEX_BYTES:
        name = name[:-1]
    if name in (".", ".."):
        raise ConfigurationError(f"index template {template!r} gives no usable name")
    return name


def doc_id(value: Any) -> str:
    """The Elasticsearch ``_id`` of a MongoDB ``_id``: strings as they are, ObjectIds as hex,
    integers in decimal, anything else as canonical extended JSON. (A string ``"1"`` and the
    integer ``1`` therefore share an ``_id``; collections that mix both are not supported.)"""
    if isinstance(value, str):
        return value
    if isinstance(value, ObjectId):
        return str(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return str(int(value))
    return json_util.dumps(value, json_options=json_util.CANONICAL_JSON_OPTIONS, sort_keys=True)


def _default(value: Any) -> Any:
    if isinstance(value, ObjectId):
        return str(value)
    if isinstance(value, datetime.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=datetime.timezone.utc)
        return value.isoformat().replace("+00:00", "Z")
    if isinstance(value, Decimal128):
        return str(value.to_decimal())
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, Binary) and value.subtype in (3, 4):
        return str(value.as_uuid(value.subtype))
    if isinstance(value, (bytes, Binary)):
        return base64.b64encode(bytes(value)).decode()
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, Timestamp):
        return {"t": value.time, "i": value.inc}
    if isinstance(value, Regex):
        return value.pattern
    if isinstance(value, datetime.date):
        return value.isoformat()
    return json.loads(json_util.dumps(value))


def _clean(value: Any) -> Any:
    # Int64 is an int subclass json handles; float NaN/inf are not valid JSON for Elasticsearch.
    if isinstance(value, float) and (value != value or value in (float("inf"), float("-inf"))):
        return None
    if isinstance(value, Int64):
        return int(value)
    return value


def source_of(doc: Mapping[str, Any], transform: Transform | None = None) -> bytes | None:
    """The JSON source to index for ``doc`` (``_id`` removed: it is metadata in Elasticsearch),
    or ``None`` when ``transform`` drops the document."""
    body: Mapping[str, Any] | None = transform(dict(doc)) if transform is not None else doc
    if body is None:
        return None
    clean = {k: _clean(v) for k, v in body.items() if k != "_id"}
    return json.dumps(clean, default=_default, separators=(",", ":"), allow_nan=False).encode()
