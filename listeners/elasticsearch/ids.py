"""BSON ``_id`` <-> Elasticsearch ``_id``: injective, reversible, readable where that is safe.

Elasticsearch ids are strings of at most 512 UTF-8 bytes; MongoDB ``_id`` values are any BSON
value but an array or a regex. The mapping (:func:`doc_id`, inverse :func:`bson_id_of`)::

    ObjectId('65a0...e1')        -> 65a0...e1              24 lower-case hex digits
    "order-17"                   -> order-17               a string, unless it could be mistaken:
    "" / "~x" / "65a0...e1"      -> ~s: / ~s:~x / ~s:65a0...e1   (empty, leading "~", ObjectId-like)
    1 (int32)                    -> ~i:1
    Int64(1)                     -> ~l:1
    True / False                 -> ~b:true / ~b:false
    None                         -> ~n
    anything else                -> ~j:<canonical extended JSON>   {"b": 2, "a": 1} keeps its order

A plain id (no leading ``~``) is an ObjectId if it is 24 lower-case hex digits and a string
otherwise; every other id starts with ``~`` and a one-letter type tag. So int ``1`` and ``"1"``,
``None`` and ``"null"``, ``True`` and ``"true"`` never share an id, and neither do documents whose
fields differ only in order (MongoDB tells them apart too). Canonical extended JSON is lossless
for every BSON type (int32/int64/double/decimal kept apart, ``-0.0`` kept), so the mapping is
injective over BSON values and :func:`bson_id_of` gives the value back (``tests/unit``
proves both with Hypothesis).

Ids longer than :data:`MAX_ID_BYTES` cannot be indexed: :func:`doc_id` raises
:class:`UnindexableIdError` and the listener dead-letters that document (copy and stream alike).

Changing this mapping changes the ids of documents already indexed: an index written by an
older version (where ``1`` and ``"1"`` shared an id, other types used sorted-key JSON) must be
rebuilt by a resync (docs/how-to/upgrading.md).
"""

from __future__ import annotations

import re
from typing import Any

from bson import ObjectId, json_util
from bson.int64 import Int64

from singleton.errors import UnindexableIdError

#: Elasticsearch's limit on ``_id``, in UTF-8 bytes.
MAX_ID_BYTES = 512
TAG = "~"
_OBJECT_ID = re.compile(r"^[0-9a-f]{24}$")
_INT32 = (-(2**31), 2**31 - 1)
_INT64 = (-(2**63), 2**63 - 1)
_EJSON = json_util.CANONICAL_JSON_OPTIONS


def _tagged(value: Any) -> str:
    if isinstance(value, str):
        return f"{TAG}s:{value}"
    if isinstance(value, bool):
        return f"{TAG}b:{'true' if value else 'false'}"
    if value is None:
        return f"{TAG}n"
    # (Comparisons, not ``in range(...)``: that scans the range for int subclasses like Int64.)
    if isinstance(value, Int64) or (isinstance(value, int) and not _INT32[0] <= value <= _INT32[1]):
        if not _INT64[0] <= value <= _INT64[1]:
            raise UnindexableIdError(f"integer _id {value} does not fit BSON int64")
        return f"{TAG}l:{int(value)}"
    if isinstance(value, int):
        return f"{TAG}i:{value}"
    if isinstance(value, (list, tuple)):
        raise UnindexableIdError("an array cannot be a _id")
    return f"{TAG}j:{json_util.dumps(value, json_options=_EJSON)}"


def doc_id(value: Any) -> str:
    """The Elasticsearch ``_id`` of the BSON ``_id`` ``value`` (see the module docstring);
    raises :class:`UnindexableIdError` when it is longer than :data:`MAX_ID_BYTES`."""
    if type(value) is int and _INT32[0] <= value <= _INT32[1]:
        return f"{TAG}i:{value}"  # the commonest non-ObjectId id, short by construction
    if isinstance(value, ObjectId):
        out = str(value)
    elif isinstance(value, str) and value and not value.startswith(TAG):
        out = _tagged(value) if _OBJECT_ID.match(value) else value
    else:
        out = _tagged(value)
    size = len(out.encode("utf-8", "surrogatepass"))
    if size > MAX_ID_BYTES:
        raise UnindexableIdError(
            f"_id maps to {size} bytes, over Elasticsearch's limit of {MAX_ID_BYTES}"
        )
    return out


def bson_id_of(es_id: str) -> Any:
    """The BSON ``_id`` whose :func:`doc_id` is ``es_id`` (its inverse)."""
    if not es_id.startswith(TAG):
        return ObjectId(es_id) if _OBJECT_ID.match(es_id) else es_id
    tag, payload = es_id[1:2], es_id[3:]
    if tag == "s":
        return payload
    if tag == "n" and es_id == f"{TAG}n":
        return None
    if tag == "b" and payload in ("true", "false"):
        return payload == "true"
    if tag == "i":
        return int(payload)
    if tag == "l":
        return Int64(int(payload))
    if tag == "j":
        return json_util.loads(payload, json_options=_EJSON)
    raise ValueError(f"not an id made by doc_id: {es_id[:80]!r}")
