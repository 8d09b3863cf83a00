"""BSON values as MongoDB's queries see them: each value's type and comparison bracket, the
order of values within a bracket (:func:`compare`), and every value a dotted path reaches through
arrays (:func:`path_values`). :mod:`.filters` evaluates queries with these; :mod:`.relate` sorts
related documents with :func:`compare`."""

from __future__ import annotations

import datetime
import decimal
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from bson.binary import Binary
from bson.code import Code
from bson.datetime_ms import DatetimeMS
from bson.dbref import DBRef
from bson.decimal128 import Decimal128
from bson.int64 import Int64
from bson.max_key import MaxKey
from bson.min_key import MinKey
from bson.objectid import ObjectId
from bson.regex import Regex
from bson.timestamp import Timestamp

from listeners.elasticsearch.shape.paths import MISSING

_INT32 = 2**31
_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)
_DECIMAL34 = decimal.Context(prec=34, rounding=decimal.ROUND_HALF_EVEN)


# -- BSON values: type, bracket and order ---------------------------------------------------


def bson_type(value: Any) -> int:
    """The BSON type number ``value`` is stored as (what ``$type`` tests)."""
    if value is None:
        return 10
    if type(value) is str:
        return 2
    if isinstance(value, bool):
        return 8
    if isinstance(value, Int64):
        return 18
    if isinstance(value, int):
        return 16 if -_INT32 <= value < _INT32 else 18
    if isinstance(value, float):
        return 1
    if isinstance(value, Code):
        return 13 if value.scope is None else 15
    for kind, code in _TYPE_NUMBERS:
        if isinstance(value, kind):
            return code
    return 0


_TYPE_NUMBERS: tuple[tuple[Any, int], ...] = (
    (str, 2), (Mapping, 3), (DBRef, 3), (list, 4), (tuple, 4), (bytes, 5), (ObjectId, 7),
    (datetime.datetime, 9), (DatetimeMS, 9), (re.Pattern, 11), (Regex, 11), (Timestamp, 17),
    (Decimal128, 19), (MinKey, -1), (MaxKey, 127),
)  # fmt: skip

#: BSON type number -> its place in MongoDB's comparison order (numbers share one bracket).
_BRACKETS = {
    -1: 1, 10: 5, 6: 5, 1: 10, 16: 10, 18: 10, 19: 10, 2: 15, 14: 15, 3: 20, 4: 25, 5: 30,
    7: 35, 8: 40, 9: 45, 17: 47, 11: 50, 12: 55, 13: 60, 15: 65, 127: 127,
}  # fmt: skip


def bracket_of(value: Any) -> int:
    return _BRACKETS.get(bson_type(value), 1000)


def as_decimal(value: Any) -> decimal.Decimal:
    if isinstance(value, Decimal128):
        return value.to_decimal()
    return decimal.Decimal(value)


def _compare_numbers(a: Any, b: Any) -> int:
    x, y = as_decimal(a), as_decimal(b)
    if x.is_nan() or y.is_nan():  # NaN sorts first and equals NaN
        return int(y.is_nan()) - int(x.is_nan())
    if isinstance(a, Decimal128) != isinstance(b, Decimal128):  # a double meets a decimal
        if isinstance(a, float):
            x = _DECIMAL34.plus(x)
        if isinstance(b, float):
            y = _DECIMAL34.plus(y)
    return (x > y) - (x < y)


def _millis(value: Any) -> int:
    if isinstance(value, DatetimeMS):
        return int(value)
    dt: datetime.datetime = value
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=datetime.timezone.utc)
    delta = dt - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1000 + delta.microseconds // 1000


def pattern_and_flags(value: Any) -> tuple[str, str]:
    regex = Regex.from_native(value) if isinstance(value, re.Pattern) else value
    flags = regex.flags
    if isinstance(flags, int):
        flags = "".join(
            c for c, bit in zip("ilmsux", (2, 4, 8, 16, 32, 64), strict=True) if flags & bit
        )
    return str(regex.pattern), "".join(sorted(flags))


def _sign(x: Any, y: Any) -> int:
    return int(x > y) - int(x < y)


def _compare_sequences(a: Sequence[tuple[str, Any]], b: Sequence[tuple[str, Any]]) -> int:
    for (ka, va), (kb, vb) in zip(a, b, strict=False):  # then the shorter is smaller
        order = _sign(bracket_of(va), bracket_of(vb)) or _sign(ka, kb) or compare(va, vb)
        if order:
            return order
    return _sign(len(a), len(b))


def compare(a: Any, b: Any) -> int:
    """MongoDB's order of two BSON values: -1, 0 or 1 (brackets first, then values)."""
    order = _sign(bracket_of(a), bracket_of(b))
    if order:
        return order
    bracket = bracket_of(a)
    if bracket == 10:
        return _compare_numbers(a, b)
    if bracket == 20:
        return _compare_sequences(list(_as_mapping(a).items()), list(_as_mapping(b).items()))
    if bracket == 25:
        return _compare_sequences([(str(i), v) for i, v in enumerate(a)],
                                  [(str(i), v) for i, v in enumerate(b)])  # fmt: skip
    if bracket == 30:
        return _sign(_binary_key(a), _binary_key(b))
    if bracket == 35:
        return _sign(a.binary, b.binary)
    if bracket == 45:
        return _sign(_millis(a), _millis(b))
    if bracket == 47:
        return _sign((a.time, a.inc), (b.time, b.inc))
    if bracket == 50:
        return _sign(pattern_and_flags(a), pattern_and_flags(b))
    if bracket in (15, 40, 60):
        return _sign(str(a), str(b)) if bracket == 60 else _sign(a, b)
    if bracket == 1000:
        return 0 if a == b else _sign(repr(a), repr(b))
    return 0  # null, MinKey, MaxKey: one value each


def _binary_key(value: bytes) -> tuple[int, int, bytes]:
    return len(value), value.subtype if isinstance(value, Binary) else 0, bytes(value)


def _as_mapping(value: Any) -> Mapping[str, Any]:
    if isinstance(value, DBRef):
        return value.as_doc()
    mapping: Mapping[str, Any] = value
    return mapping


# -- paths: every value a dotted path reaches -----------------------------------------------


def path_values(doc: Mapping[str, Any], parts: Sequence[str], leaf_arrays: bool) -> Iterator[Any]:
    """What ``doc`` holds at ``parts``, as MongoDB's matcher sees it: every value reached (an
    array met on the way is traversed), :data:`MISSING` for a branch that ends early; a path
    ending at an array yields its elements (when ``leaf_arrays``) and then the array."""
    value: Any = doc
    for i, part in enumerate(parts):
        if isinstance(value, list | tuple):
            yield from _array_values(value, parts[i:], leaf_arrays)
            return
        if not isinstance(value, Mapping) or part not in value:
            yield MISSING
            return
        value = value[part]
    if isinstance(value, list | tuple) and leaf_arrays:
        yield from value
    yield value


def _array_values(array: Sequence[Any], rest: Sequence[str], leaf_arrays: bool) -> Iterator[Any]:
    """The values of ``rest`` (non-empty) under ``array``: under each of its sub-documents,
    and, when the next part is a number, under the element at that index (*missing* when there
    is none, or when the path goes on from a value that is no document or array)."""
    for element in array:
        if isinstance(element, Mapping):
            yield from path_values(element, rest, leaf_arrays)
    index = _index(rest[0])
    if index is None:
        return
    if index >= len(array):
        yield MISSING
        return
    element = array[index]
    if len(rest) == 1:
        yield element
    elif isinstance(element, list | tuple):
        yield from _array_values(element, rest[1:], leaf_arrays)
    elif isinstance(element, Mapping):
        yield from path_values(element, rest[1:], leaf_arrays)
    else:
        yield MISSING


def _index(part: str) -> int | None:
    if part.isascii() and part.isdigit() and (part == "0" or not part.startswith("0")):
        return int(part)
    return None
