"""How a MongoDB document becomes an Elasticsearch document: its ``_id``, its JSON source and its
index name. The listener and the verifier (:mod:`.verify`) share these functions, so
"the index equals the collection" is checked with exactly the mapping the listener applies.

Ids: :mod:`.ids`. Non-finite numbers (``NaN``, ``Infinity``, ``-Infinity``, as a double or a
Decimal128, at any depth) have no JSON form and Elasticsearch refuses them; replacing them with
``null`` or a string would index something the collection does not hold. So a document that
holds one is not indexed: :func:`source_of` raises :class:`NonFiniteNumberError` ("non-finite
number at path a.b.2") and the listener dead-letters it with that reason, in the copy and in the
stream alike. (Its previous version, if any, stays in the index until the document changes.)

Encoding. :func:`source_of` encodes with orjson (several times faster than ``json``; UTF-8
where ``json`` writes ``\\u`` escapes: the same values to Elasticsearch). orjson writes NaN and
the infinities as ``null`` where ``json`` refuses them, refuses integers over 64 bits and
strings with lone surrogates, and formats datetimes itself (wrongly for offsets with seconds).
So datetimes and dataclasses go through :func:`json_default` as they did with ``json``, and
whenever orjson's output could mean something else (it refused the document, or wrote a
``null`` while the document holds a non-finite float), the standard encoder decides, as it
always did: the result is the same JSON value, or the same error, as ``json.dumps`` with
:func:`json_default` gives (``tests/unit/listeners/elasticsearch/test_es_encoding.py`` proves
it with Hypothesis). One difference is left: a plain ``Enum`` from a transform is written as its
value (``json`` refuses it).
"""

from __future__ import annotations

import base64
import datetime
import importlib
import json
import math
import re
import threading
import uuid
from collections.abc import Callable, Mapping
from decimal import Decimal
from json.encoder import c_make_encoder, encode_basestring_ascii  # type: ignore[attr-defined]
from typing import Any

import orjson
from bson import ObjectId, json_util
from bson.binary import Binary
from bson.decimal128 import Decimal128
from bson.int64 import Int64
from bson.regex import Regex
from bson.timestamp import Timestamp

from listeners.elasticsearch.ids import MAX_ID_BYTES, bson_id_of, doc_id
from singleton.errors import ConfigurationError, NonFiniteNumberError, UnindexableIdError

__all__ = [
    "DEFAULT_INDEX_TEMPLATE",
    "MAX_ID_BYTES",
    "ORJSON_OPTIONS",
    "NonFiniteNumberError",
    "Transform",
    "UnindexableIdError",
    "bson_id_of",
    "doc_id",
    "has_non_finite_float",
    "index_name",
    "json_default",
    "plain_source",
    "resolve_transform",
    "source_of",
]

#: ``transform(doc) -> dict | None``: the document to index, or ``None`` to keep it out.
Transform = Callable[[dict[str, Any]], "dict[str, Any] | None"]

DEFAULT_INDEX_TEMPLATE = "{database}.{collection}"
_INVALID = re.compile(r'[\\/*?"<>| ,#:A-Z]')
_MAX_INDEX_BYTES = 255


def resolve_transform(spec: Any) -> Any:
    """``"pkg.mod:attr"`` (from a TOML file) to the object; callables pass through."""
    if spec is None or callable(spec):
        return spec
    module, _, attr = str(spec).partition(":")
    if not attr:
        raise ConfigurationError(f"transform must be a callable or 'module:function', got {spec!r}")
    return getattr(importlib.import_module(module), attr)


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


def json_default(value: Any) -> Any:
    if isinstance(value, (ObjectId, Decimal, uuid.UUID)):
        return str(value)
    if isinstance(value, datetime.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=datetime.timezone.utc)
        return value.isoformat().replace("+00:00", "Z")
    if isinstance(value, Decimal128):
        if not value.to_decimal().is_finite():
            raise _NonFinite
        return str(value.to_decimal())
    if isinstance(value, Binary) and value.subtype in (3, 4):
        return str(value.as_uuid(value.subtype))
    if isinstance(value, (bytes, Binary)):
        return base64.b64encode(bytes(value)).decode()
    if isinstance(value, Timestamp):
        return {"t": value.time, "i": value.inc}
    if isinstance(value, Regex):
        return value.pattern
    if isinstance(value, datetime.date):
        return value.isoformat()
    return json.loads(json_util.dumps(value))


#: What ``json.dumps(default=json_default, separators=(",", ":"), allow_nan=False)`` builds on every
#: call, built once (it holds no state between calls: the same output, without the set-up).
_ENCODER = json.JSONEncoder(default=json_default, separators=(",", ":"), allow_nan=False)
_local = threading.local()


def _encode(body: Mapping[str, Any]) -> str:
    """``_ENCODER.encode(body)`` for a mapping, with the C encoder that ``encode`` builds on
    every call kept per thread. Its ``markers`` dict (the circular-reference check) is empty
    after every call that returned; one that raised may leave entries, so that encoder is
    dropped. Without the C encoder (another Python), ``_ENCODER.encode``."""
    if c_make_encoder is None:
        return _ENCODER.encode(body)
    encoder = getattr(_local, "encoder", None)
    if encoder is None:
        encoder = c_make_encoder(
            {}, json_default, encode_basestring_ascii, None, ":", ",", False, False, False
        )
        _local.encoder = encoder
    try:
        return "".join(encoder(body, 0))
    except BaseException:
        _local.encoder = None
        raise


class _NonFinite(ValueError):
    """Raised inside ``json.dumps`` by :func:`json_default`; :func:`_non_finite_path` says
    where."""


def _is_non_finite(value: Any) -> bool:
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, Decimal128):
        return not value.to_decimal().is_finite()
    if isinstance(value, Decimal):
        return not value.is_finite()
    return False


def _non_finite_path(value: Any, path: str = "") -> str | None:
    """The dotted path of the first non-finite number in ``value`` (list items by index)."""
    if _is_non_finite(value):
        return path or "(top)"
    if isinstance(value, Mapping):
        children: Any = ((str(k), v) for k, v in value.items())
    elif isinstance(value, (list, tuple)):
        children = ((str(i), v) for i, v in enumerate(value))
    else:
        return None
    for key, child in children:
        found = _non_finite_path(child, f"{path}.{key}" if path else key)
        if found is not None:
            return found
    return None


def source_of(doc: Mapping[str, Any], transform: Transform | None = None) -> bytes | None:
    """The JSON source to index for ``doc`` (``_id`` removed: it is metadata in Elasticsearch),
    or ``None`` when ``transform`` drops the document. Raises :class:`NonFiniteNumberError`
    for NaN or an infinity anywhere in it, ``ValueError`` / ``TypeError`` for other values
    that have no JSON form."""
    body: Mapping[str, Any] | None = transform(dict(doc)) if transform is not None else doc
    if body is None:
        return None
    out = plain_source(body)
    if out is None:  # (the same error, or what json writes, as before)
        clean = dict(body)
        clean.pop("_id", None)
        return _standard_source(clean)
    return out


def plain_source(doc: Mapping[str, Any]) -> bytes | None:
    """:func:`source_of` without a transform when orjson alone decides it, as for nearly every
    document; ``None`` where the standard encoder must (orjson refused the document, or wrote a
    ``null`` while it holds a non-finite float): ask :func:`source_of`, which may also raise."""
    if type(doc) is dict and "_id" not in doc:
        clean: dict[str, Any] = doc  # (a stream that projects ``_id`` away: no copy)
    else:
        clean = dict(doc)
        clean.pop("_id", None)
    try:
        out = orjson.dumps(clean, default=json_default, option=ORJSON_OPTIONS)
    except orjson.JSONEncodeError:
        return None
    # (find, not ``in``: bytes' ``in`` tries the operand as an int first, an exception dearer
    # than the search)
    if out.find(b"null") >= 0 and has_non_finite_float(clean):
        return None  # a null that was a NaN
    return out


#: Datetimes (and dates, times) and dataclasses go to :func:`json_default`, as with ``json``.
ORJSON_OPTIONS = orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_DATACLASS


def has_non_finite_float(value: Any) -> bool:
    """Whether a float NaN or infinity is reachable through mappings, lists and tuples (where
    orjson writes ``null`` for it). Other non-finite numbers (Decimal128) reach
    :func:`json_default`, which refuses them the same way for both encoders."""
    if type(value) is dict:
        children: Any = value.values()
    elif isinstance(value, (list, tuple)):
        children = value
    elif isinstance(value, Mapping):
        children = value.values()
    else:
        return isinstance(value, float) and not math.isfinite(value)
    for child in children:
        kind = type(child)
        if kind is float:
            if not math.isfinite(child):
                return True
        elif kind not in _SCALARS and has_non_finite_float(child):
            return True
    return False


#: Types that hold no float: the walk above skips them without a call.
_SCALARS = frozenset({str, int, bool, type(None)})


def _standard_source(clean: dict[str, Any]) -> bytes:
    """``clean`` encoded by the standard library's encoder (see the module docstring)."""
    for k, v in clean.items():
        if isinstance(v, Int64):
            clean[k] = int(v)  # (replacing a value while iterating is allowed: same keys)
    try:
        return _encode(clean).encode()
    except ValueError as exc:
        # Walk only on failure: the common document pays for one encoding, nothing more.
        path = _non_finite_path(clean)
        if path is None:
            raise
        raise NonFiniteNumberError(f"non-finite number at path {path}") from exc
