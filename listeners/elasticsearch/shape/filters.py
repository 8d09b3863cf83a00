"""A MongoDB query filter evaluated here, on one document, as the server's ``find`` would.

A shaped index keeps a document iff it matches its collection's filter *now*, and the sink
decides that on the change event's full document, without asking the server. So the answer
must be the server's, for every document: the query is compiled once (anything this module
cannot evaluate exactly is refused then, never approximated) and evaluated with MongoDB's
rules, which ``tests/integration/listeners/elasticsearch/shape/test_filter_parity.py`` checks
against a real server:

- a dotted path yields every value it reaches: ``a.b`` on ``a: [{b: 1}, {b: 2}]`` yields 1 and
  2, a sub-document lacking ``b`` yields *missing*, a number part also indexes an array, a path
  ending at an array yields its elements and then the array itself; a condition holds if any
  value satisfies it (``$ne``, ``$nin``, ``$not`` and ``$exists: false`` negate that);
- comparisons hold only within one type bracket (all numbers are one: int, long, double and
  decimal compare by value), NaN equals NaN and is neither less nor greater than anything;
- ``null`` equality (``$eq``, ``$in``, ``$gte``, ``$lte``) also matches a missing field;
- embedded documents compare field by field, in order.

Regular expressions run on Python's ``re``, whose syntax and semantics match PCRE's for
ordinary patterns (literals, classes, anchors, quantifiers, groups) but not for every
construct: a pattern using PCRE-only syntax may be refused here or match differently.
"""

from __future__ import annotations

import datetime
import decimal
import hashlib
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from bson import json_util
from bson.code import Code
from bson.json_util import CANONICAL_JSON_OPTIONS
from bson.max_key import MaxKey
from bson.min_key import MinKey
from bson.objectid import ObjectId
from bson.regex import Regex

from listeners.elasticsearch.shape.paths import MISSING, check_path
from listeners.elasticsearch.shape.values import (
    as_decimal,
    bracket_of,
    bson_type,
    compare,
    path_values,
    pattern_and_flags,
)
from singleton.errors import ConfigurationError

#: The operators a filter may use, as the refusals list them.
LOGICAL_OPERATORS = ("$and", "$or", "$nor")
FIELD_OPERATORS = (
    "$eq", "$ne", "$gt", "$gte", "$lt", "$lte", "$in", "$nin", "$exists", "$not", "$type",
    "$size", "$all", "$elemMatch", "$regex", "$options",
)  # fmt: skip
_SUPPORTED = f"supported: {', '.join(LOGICAL_OPERATORS + FIELD_OPERATORS)}"

#: ``$type`` aliases and the BSON type numbers they name (``number`` is four of them).
TYPE_ALIASES: Mapping[str, tuple[int, ...]] = {
    "double": (1,), "string": (2,), "object": (3,), "array": (4,), "binData": (5,),
    "undefined": (6,), "objectId": (7,), "bool": (8,), "date": (9,), "null": (10,),
    "regex": (11,), "dbPointer": (12,), "javascript": (13,), "symbol": (14,),
    "javascriptWithScope": (15,), "int": (16,), "timestamp": (17,), "long": (18,),
    "decimal": (19,), "minKey": (-1,), "maxKey": (127,), "number": (1, 16, 18, 19),
}  # fmt: skip
_TYPE_CODES = frozenset(code for codes in TYPE_ALIASES.values() for code in codes)

_REGEX_FLAGS = {"i": re.IGNORECASE, "m": re.MULTILINE, "s": re.DOTALL, "x": re.VERBOSE}
_INT32 = 2**31
_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)
_DECIMAL34 = decimal.Context(prec=34, rounding=decimal.ROUND_HALF_EVEN)

Predicate = Callable[[Any], bool]


# -- compiled conditions ----------------------------------------------------------------------


@dataclass(frozen=True)
class _Leaf:
    """One operator on one path: holds if any value the path reaches satisfies ``test``."""

    test: Predicate
    leaf_arrays: bool = True

    def on_doc(self, doc: Mapping[str, Any], parts: Sequence[str]) -> bool:
        return any(self.test(v) for v in path_values(doc, parts, self.leaf_arrays))

    def on_value(self, value: Any) -> bool:
        return self.test(value)


@dataclass(frozen=True)
class _Not:
    """The negation of all of ``conditions`` on the same path (``$ne``, ``$nin``, ``$not``)."""

    conditions: tuple[_Leaf | _Not | _All, ...]

    def on_doc(self, doc: Mapping[str, Any], parts: Sequence[str]) -> bool:
        return not all(c.on_doc(doc, parts) for c in self.conditions)

    def on_value(self, value: Any) -> bool:
        return not all(c.on_value(value) for c in self.conditions)


@dataclass(frozen=True)
class _All:
    """Every one of ``conditions`` on the same path, each on its own (``$all``)."""

    conditions: tuple[_Leaf, ...]

    def on_doc(self, doc: Mapping[str, Any], parts: Sequence[str]) -> bool:
        return all(c.on_doc(doc, parts) for c in self.conditions)

    def on_value(self, value: Any) -> bool:
        return all(c.on_value(value) for c in self.conditions)


Condition = _Leaf | _Not | _All
Matcher = Callable[[Mapping[str, Any]], bool]


#: Types whose values equal a value of the same type iff ``==`` says so.
_PLAIN_TYPES = (str, bool, int, ObjectId)


def _equals(expected: Any) -> Predicate:
    if expected is None:
        return lambda v: v is MISSING or v is None
    bracket = bracket_of(expected)
    plain = type(expected) in _PLAIN_TYPES

    def equals(value: Any) -> bool:
        if plain and type(value) is type(expected):
            return bool(value == expected)
        return (
            value is not MISSING and bracket_of(value) == bracket and compare(value, expected) == 0
        )

    return equals


_ORDER_TESTS: Mapping[str, Callable[[int], bool]] = {
    "$gt": lambda order: order > 0,
    "$gte": lambda order: order >= 0,
    "$lt": lambda order: order < 0,
    "$lte": lambda order: order <= 0,
}


def _ordered(op: str, bound: Any) -> Predicate:
    if bound is None:  # null is alone in its bracket: >= and <= are equality, > and < nothing
        return _equals(None) if op in ("$gte", "$lte") else (lambda v: False)
    test = _ORDER_TESTS[op]
    bracket = bracket_of(bound)
    bound_nan = bracket == 10 and as_decimal(bound).is_nan()

    def ordered(value: Any) -> bool:
        if value is MISSING or bracket_of(value) != bracket:
            return False
        if bracket == 10 and (bound_nan or as_decimal(value).is_nan()):
            return op in ("$gte", "$lte") and bound_nan and as_decimal(value).is_nan()
        return test(compare(value, bound))

    return ordered


def _regex_test(pattern: re.Pattern[str], native: tuple[str, str]) -> Predicate:
    def test(value: Any) -> bool:
        if isinstance(value, str) and not isinstance(value, Code):
            return pattern.search(value) is not None
        if isinstance(value, Regex | re.Pattern):
            return pattern_and_flags(value) == native
        return False

    return test


class _Compiler:
    """Turns a query into a matcher, raising :class:`ConfigurationError` for what it refuses."""

    def __init__(self, option: str) -> None:
        self.option = option

    def refuse(self, what: str) -> ConfigurationError:
        return ConfigurationError(f"{self.option}: {what}")

    def query(self, query: Any, where: str) -> Matcher:
        if not isinstance(query, Mapping):
            raise self.refuse(f"{where} must be a query document, got {query!r}")
        parts: list[Matcher] = []
        for key, value in query.items():
            if not isinstance(key, str):
                raise self.refuse(f"{key!r} in {where} is no field name")
            if key in LOGICAL_OPERATORS:
                parts.append(self.logical(key, value))
            elif key.startswith("$"):
                raise self.refuse(f"{key} is not supported in a filter ({_SUPPORTED})")
            else:
                parts.append(self.field(key, value))
        return _all_of(parts)

    def logical(self, op: str, clauses: Any) -> Matcher:
        if not isinstance(clauses, list | tuple) or not clauses:
            raise self.refuse(f"{op} takes a non-empty list of queries, got {clauses!r}")
        matchers = [self.query(c, f"an element of {op}") for c in clauses]
        if op == "$and":
            return _all_of(matchers)
        if op == "$or":
            return lambda doc: any(m(doc) for m in matchers)
        return lambda doc: not any(m(doc) for m in matchers)

    def field(self, path: str, condition: Any) -> Matcher:
        parts = tuple(check_path(path, option=f"{self.option} field").split("."))
        conditions = self.conditions(path, condition)
        return lambda doc: all(c.on_doc(doc, parts) for c in conditions)

    def conditions(self, path: str, condition: Any) -> tuple[Condition, ...]:
        """The conditions a field's value (or operator document) puts on ``path``."""
        if isinstance(condition, re.Pattern | Regex):
            return (self.regex(path, condition, None),)
        if not _is_operator_document(condition):
            if isinstance(condition, Mapping):
                self.check_plain(path, condition)
            return (_Leaf(_equals(self.value(path, "$eq", condition))),)
        if not all(isinstance(k, str) and k.startswith("$") for k in condition):
            self.check_plain(path, condition)
        out: list[Condition] = []
        for op, arg in condition.items():
            if op == "$options":
                if "$regex" not in condition:
                    raise self.refuse(f"$options on {path} needs a $regex next to it")
                continue
            out.append(self.operator(path, op, arg, condition))
        return tuple(out)

    def check_plain(self, path: str, document: Mapping[str, Any]) -> None:
        operators = [k for k in document if isinstance(k, str) and k.startswith("$")]
        if operators:
            raise self.refuse(
                f"the condition on {path} mixes operators ({', '.join(operators)}) and plain "
                f"fields; write either an operator document or a document to equal"
            )

    def operator(self, path: str, op: str, arg: Any, siblings: Mapping[str, Any]) -> Condition:
        if op in ("$eq", "$ne", "$in", "$nin") or op in _ORDER_TESTS:
            return self.comparison(path, op, arg)
        if op == "$exists":
            if not isinstance(arg, bool | int | float):
                raise self.refuse(f"$exists on {path} takes true or false, got {arg!r}")
            leaf = _Leaf(lambda v: v is not MISSING)
            return leaf if arg else _Not((leaf,))
        if op == "$not":
            return self.negation(path, arg)
        if op == "$type":
            codes = self.types(path, arg)
            return _Leaf(lambda v: v is not MISSING and bson_type(v) in codes)
        if op == "$size":
            size = self.size(path, arg)
            return _Leaf(lambda v: isinstance(v, list | tuple) and len(v) == size, False)
        if op == "$all":
            return self.all_of(path, arg)
        if op == "$elemMatch":
            return _Leaf(self.elem_match(path, arg), False)
        if op == "$regex":
            return self.regex(path, arg, siblings.get("$options"))
        raise self.refuse(f"{op} (on {path}) is not supported in a filter ({_SUPPORTED})")

    def comparison(self, path: str, op: str, arg: Any) -> Condition:
        if op in ("$eq", "$ne"):
            if op == "$ne" and isinstance(arg, re.Pattern | Regex):
                raise self.refuse(f"$ne on {path} cannot take a regular expression; use $not")
            leaf = _Leaf(_equals(self.value(path, op, arg)))
            return leaf if op == "$eq" else _Not((leaf,))
        if op in _ORDER_TESTS:
            if isinstance(arg, re.Pattern | Regex):
                raise self.refuse(f"{op} on {path} cannot take a regular expression")
            return _Leaf(_ordered(op, self.value(path, op, arg)))
        leaf = _Leaf(self.any_of(path, op, arg))  # $in, $nin
        return leaf if op == "$in" else _Not((leaf,))

    def value(self, path: str, op: str, value: Any) -> Any:
        """``value`` if it is a BSON value this module can compare."""
        if isinstance(value, MinKey | MaxKey) or bson_type(value) in (0, 6, 12, 14):
            raise self.refuse(f"{op} on {path}: {value!r} is no value a filter here can compare")
        if isinstance(value, Mapping):
            for item in value.values():
                self.value(path, op, item)
        elif isinstance(value, list | tuple):
            for item in value:
                self.value(path, op, item)
        return value

    def any_of(self, path: str, op: str, values: Any) -> Predicate:
        if not isinstance(values, list | tuple):
            raise self.refuse(f"{op} on {path} takes a list, got {values!r}")
        tests: list[Predicate] = []
        for value in values:
            if isinstance(value, re.Pattern | Regex):
                tests.append(self.regex(path, value, None).test)
            elif _is_operator_document(value):
                raise self.refuse(f"{op} on {path} cannot hold an operator, got {value!r}")
            else:
                tests.append(_equals(self.value(path, op, value)))
        return lambda v: any(t(v) for t in tests)

    def negation(self, path: str, arg: Any) -> Condition:
        if isinstance(arg, re.Pattern | Regex):
            return _Not((self.regex(path, arg, None),))
        if not _is_operator_document(arg):
            raise self.refuse(
                f"$not on {path} takes an operator document or a regular expression, got {arg!r}"
            )
        return _Not(self.conditions(path, arg))

    def types(self, path: str, arg: Any) -> frozenset[int]:
        items = list(arg) if isinstance(arg, list | tuple) else [arg]
        codes: set[int] = set()
        for item in items:
            if isinstance(item, str) and item in TYPE_ALIASES:
                codes.update(TYPE_ALIASES[item])
            elif _is_integral(item) and int(item) in _TYPE_CODES:
                codes.add(int(item))
            else:
                raise self.refuse(
                    f"$type on {path}: {item!r} is no BSON type; use a type number or one of "
                    f"{', '.join(TYPE_ALIASES)}"
                )
        if not codes:
            raise self.refuse(f"$type on {path} needs at least one type")
        return frozenset(codes)

    def size(self, path: str, arg: Any) -> int:
        if not _is_integral(arg) or int(arg) < 0:
            raise self.refuse(f"$size on {path} takes a whole number >= 0, got {arg!r}")
        return int(arg)

    def all_of(self, path: str, arg: Any) -> Condition:
        if not isinstance(arg, list | tuple):
            raise self.refuse(f"$all on {path} takes a list, got {arg!r}")
        if not arg:
            return _Leaf(lambda v: False)
        tests: list[Predicate] = []
        matches_elements = [_is_elem_match(item) for item in arg]
        if any(matches_elements) and not all(matches_elements):
            raise self.refuse(f"$all on {path} mixes $elemMatch and values")
        for item in arg:
            if _is_elem_match(item):
                tests.append(self.elem_match(path, item["$elemMatch"]))
            elif isinstance(item, re.Pattern | Regex):
                tests.append(self.regex(path, item, None).test)
            elif _is_operator_document(item):
                raise self.refuse(f"$all on {path} cannot hold an operator, got {item!r}")
            else:
                tests.append(_equals(self.value(path, "$all", item)))
        return _All(tuple(_Leaf(t, not all(matches_elements)) for t in tests))

    def elem_match(self, path: str, arg: Any) -> Predicate:
        if not isinstance(arg, Mapping) or not arg:
            raise self.refuse(f"$elemMatch on {path} takes a non-empty document, got {arg!r}")
        first = next(iter(arg))
        if isinstance(first, str) and first.startswith("$") and first not in LOGICAL_OPERATORS:
            conditions = self.conditions(path, arg)  # on each element's value
            return lambda v: (
                isinstance(v, list | tuple)
                and any(all(c.on_value(e) for c in conditions) for e in v)
            )
        matcher = self.query(arg, f"$elemMatch on {path}")  # on each element as a document
        return lambda v: (
            isinstance(v, list | tuple)
            and any(isinstance(e, Mapping | list | tuple) and matcher(_document_of(e)) for e in v)
        )

    def regex(self, path: str, arg: Any, options: Any) -> _Leaf:
        if isinstance(arg, re.Pattern | Regex):
            source, flags = pattern_and_flags(arg)
            if options is not None and flags.replace("u", ""):
                raise self.refuse(f"$regex on {path} has options both in the pattern and $options")
        elif isinstance(arg, str):
            source, flags = arg, ""
        else:
            raise self.refuse(f"$regex on {path} takes a string or a pattern, got {arg!r}")
        if options is not None:
            if not isinstance(options, str):
                raise self.refuse(f"$options on {path} takes a string, got {options!r}")
            flags = options
        unknown = sorted(set(flags) - set(_REGEX_FLAGS) - {"u"})
        if unknown:
            raise self.refuse(
                f"regular expression on {path}: option {''.join(unknown)!r} is not supported "
                f"(supported: i, m, s, x)"
            )
        bits = 0
        for flag in flags:
            bits |= _REGEX_FLAGS.get(flag, 0)
        try:
            pattern = re.compile(source, bits)
        except re.error as exc:
            raise self.refuse(
                f"regular expression {source!r} on {path} is invalid: {exc}"
            ) from None
        return _Leaf(_regex_test(pattern, (source, "".join(sorted(flags)))))


def _all_of(matchers: Sequence[Matcher]) -> Matcher:
    if len(matchers) == 1:
        return matchers[0]
    return lambda doc: all(m(doc) for m in matchers)


def _is_operator_document(value: Any) -> bool:
    if not isinstance(value, Mapping) or not value:
        return False
    first = next(iter(value))
    return isinstance(first, str) and first.startswith("$")


def _is_elem_match(value: Any) -> bool:
    return isinstance(value, Mapping) and len(value) == 1 and "$elemMatch" in value


def _is_integral(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return True
    return isinstance(value, float) and value.is_integer()


def _document_of(element: Any) -> Mapping[str, Any]:
    if isinstance(element, Mapping):
        return element
    return {str(i): v for i, v in enumerate(element)}


class Filter:
    """A MongoDB query filter evaluated here, on a document, exactly as the server's ``find()``
    would (for the supported operators; the others are refused when it is built)."""

    def __init__(self, query: Mapping[str, Any], *, option: str = "filter") -> None:
        self.query = query
        self.option = option
        self._matcher = _Compiler(option).query(query, "the filter")

    def matches(self, doc: Mapping[str, Any]) -> bool:
        """Whether ``find(query)`` would return ``doc``."""
        return self._matcher(doc)

    def digest(self) -> str:
        """A name for the query, stable across processes (its canonical extended JSON)."""
        return digest_of(self.query)

    def __repr__(self) -> str:
        return f"Filter({self.query!r})"


def digest_of(value: Any) -> str:
    """sha256 (16 hex digits) of ``value``'s canonical extended JSON, keys in their order."""
    text = json_util.dumps(value, json_options=CANONICAL_JSON_OPTIONS, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]
