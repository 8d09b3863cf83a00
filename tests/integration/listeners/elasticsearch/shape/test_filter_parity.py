"""The filter, evaluated here, against a real server's ``find``: Hypothesis draws documents
(nested documents, arrays, every number type with NaN and -0.0, strings, null, booleans,
ObjectIds, dates, missing fields) and queries from the supported grammar, stores the
documents in SecantusDB and asserts that ``Filter(q).matches`` picks exactly the documents
``find(q)`` returns. The field rules are checked the same way against an aggregation
(``$project``, ``$unset``, ``$set``) computing the same shape."""

from __future__ import annotations

import datetime
import functools
from collections.abc import Iterator
from typing import Any

import pymongo.errors
import pytest
from bson import ObjectId
from bson.decimal128 import Decimal128
from bson.int64 import Int64
from hypothesis import HealthCheck, assume, given, reject, settings
from hypothesis import strategies as st

from listeners.elasticsearch.shape.fields import FieldRules
from listeners.elasticsearch.shape.filters import Filter
from listeners.elasticsearch.shape.paths import MISSING, get_path
from singleton.errors import ConfigurationError

PARITY = settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.filter_too_much,
    ],
)
FIELDS = settings(PARITY, max_examples=100)

NAMES = ("a", "b", "c")
OIDS = [ObjectId(f"{i:024x}") for i in (1, 2, 3)]
DATES = [datetime.datetime(2024, 1, 1, 0, 0, s, ms * 1000) for s, ms in ((0, 0), (0, 1), (7, 0))]

#: The scalars documents and queries are made of: every number type (NaN, -0.0, infinities,
#: equal values in several types), strings, null, booleans, ObjectIds, dates. The first row is
#: drawn three times as often, so that queries meet the documents' values.
HOT = [1, 1.0, Int64(1), Decimal128("1"), 2.5, "a", None, True, DATES[0], float("nan")]
SCALARS = HOT * 3 + [
    -1, 0, 2, Int64(0), Int64(2**40), 2**40, 2**31, 0.0, -0.0, 1.5, 2.0, float("inf"),
    float("-inf"), Decimal128("0"), Decimal128("-0"), Decimal128("2.5"), Decimal128("NaN"),
    Decimal128("-Infinity"), "", "A", "ab", "b\n", "é", "aé", False, *OIDS, *DATES[1:],
]  # fmt: skip
scalars = st.sampled_from(SCALARS)
names = st.sampled_from(NAMES)
paths = st.builds(
    lambda first, rest: ".".join([first, *rest]),
    names,
    st.one_of(
        st.just([]), st.just([]), st.lists(st.sampled_from(("a", "b", "0", "1")), max_size=2)
    ),
)
patterns = st.sampled_from(["a", "^a", "b$", "A", "a.b", "^$", "[ab]", "^a.*b$", "\\n", "é", "a$"])
options = st.text(alphabet="imsx", max_size=2)
TYPES = [
    "double",
    "string",
    "object",
    "array",
    "null",
    "bool",
    "int",
    "long",
    "decimal",
    "number",
    "date",
    "objectId",
    1,
    2,
    4,
    16,
    18,
    19,
]


def _all_operand(value: Any) -> bool:
    return value is not None and value != []


class Grammar:
    """Documents and queries over :data:`SCALARS`."""

    def __init__(self) -> None:
        self.scalars = scalars
        nested = st.recursive(
            self.scalars,
            lambda inner: st.one_of(st.lists(inner, max_size=3), self.document(inner)),
            max_leaves=5,
        )
        self.values = st.one_of(self.scalars, nested)
        self.documents = st.lists(self.document(self.values), min_size=4, max_size=12)
        #: What queries compare with: mostly scalars.
        self.operands = st.one_of(self.scalars, self.scalars, self.values)
        self.queries: st.SearchStrategy[dict[str, Any]] = self.query(2)

    @staticmethod
    def document(values: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
        return st.fixed_dictionaries({}, optional=dict.fromkeys(NAMES, values))

    @functools.cache  # noqa: B019 (one grammar, kept for the session)
    def operators(self, depth: int) -> st.SearchStrategy[dict[str, Any]]:
        """One field's operator document."""
        operands = self.operands
        single: list[st.SearchStrategy[dict[str, Any]]] = [
            st.builds(lambda op, v: {op: v}, st.sampled_from(["$eq", "$ne"]), operands),
            st.builds(
                lambda op, v: {op: v}, st.sampled_from(["$gt", "$gte", "$lt", "$lte"]), operands
            ),
            st.builds(
                lambda op, v: {op: v},
                st.sampled_from(["$in", "$nin"]),
                st.lists(operands, max_size=3),
            ),
            st.builds(lambda v: {"$exists": v}, st.booleans()),
            st.builds(
                lambda v: {"$type": v},
                st.one_of(
                    st.sampled_from(TYPES), st.lists(st.sampled_from(TYPES), min_size=1, max_size=2)
                ),
            ),
            st.builds(lambda v: {"$size": v}, st.integers(0, 2)),
            # no null and no empty array, where SecantusDB parts from MongoDB's manual: "$all
            # is equivalent to an $and of the values", so {$all: [null]} matches a missing
            # field as {$eq: null} does, and {$all: [[]]} matches a field equal to [] (the
            # manual's "Nested Array" note); SecantusDB matches neither (the filter here does)
            st.builds(lambda v: {"$all": v}, st.lists(operands.filter(_all_operand), max_size=2)),
            st.builds(
                lambda p, o: {"$regex": p, "$options": o} if o else {"$regex": p}, patterns, options
            ),
        ]
        if depth > 0:
            inner = self.operators(depth - 1)
            single += [
                st.builds(lambda v: {"$not": v}, inner),
                # a logical operator only after a field: SecantusDB refuses one first in an
                # $elemMatch ("unknown operator: $or"), which MongoDB parses as any query
                # (and so does the filter here)
                st.builds(
                    lambda v: {"$elemMatch": v},
                    st.one_of(
                        inner,
                        self.fields(depth - 1),
                        st.builds(
                            lambda f, g: {**f, **g}, self.fields(depth - 1), self.logical(depth - 1)
                        ),
                    ),
                ),
                st.builds(lambda v: {"$all": [{"$elemMatch": v}]}, self.fields(depth - 1)),
            ]
        one = st.one_of(single)
        return st.one_of(one, one, st.builds(lambda a, b: {**a, **b}, one, one))

    @functools.cache  # noqa: B019 (one grammar, kept for the session)
    def condition(self, depth: int) -> st.SearchStrategy[Any]:
        return st.one_of(
            self.operands.filter(lambda v: not (isinstance(v, dict) and not v)),
            self.operators(depth),
            st.builds(lambda p: {"$not": {"$regex": p}}, patterns),
        )

    @functools.cache  # noqa: B019 (one grammar, kept for the session)
    def fields(self, depth: int) -> st.SearchStrategy[dict[str, Any]]:
        one = st.builds(lambda p, c: {p: c}, paths, self.condition(depth))
        return st.one_of(one, one, st.builds(lambda a, b: {**a, **b}, one, one))

    @functools.cache  # noqa: B019 (one grammar, kept for the session)
    def logical(self, depth: int) -> st.SearchStrategy[dict[str, Any]]:
        return st.builds(
            lambda op, qs: {op: qs},
            st.sampled_from(["$and", "$or", "$nor"]),
            st.lists(self.query(depth), min_size=1, max_size=2),
        )

    @functools.cache  # noqa: B019 (one grammar, kept for the session)
    def query(self, depth: int) -> st.SearchStrategy[dict[str, Any]]:
        fields = self.fields(depth)
        if depth == 0:
            return fields
        logical = self.logical(depth - 1)
        merged = st.builds(lambda f, g: {**f, **g}, fields, logical)
        return st.one_of(fields, fields, logical, merged)


GRAMMAR = Grammar()


@pytest.fixture
def collection(client: Any, unique: str) -> Iterator[Any]:
    coll = client[f"parity{unique}"]["docs"]
    yield coll
    client.drop_database(f"parity{unique}")


def _store(collection: Any, docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    collection.delete_many({})
    stored = [{"_id": i, **doc} for i, doc in enumerate(docs)]
    collection.insert_many(stored)
    return stored


@PARITY
@given(docs=GRAMMAR.documents, queries=st.lists(GRAMMAR.queries, min_size=1, max_size=4))
def test_filter_matches_what_find_returns(
    collection: Any, docs: list[dict[str, Any]], queries: list[dict[str, Any]]
) -> None:
    stored = _store(collection, docs)
    read_back = list(collection.find())
    nested = any(_nested_arrays(d) for d in stored)
    for q in queries:
        if nested and _elem_match_on_documents(q):
            # An object $elemMatch tests an array's arrays too, as documents (MongoDB's
            # ElemMatchObjectMatchExpression takes every element that "isABSONObj"; so does
            # the filter here); SecantusDB skips them.
            continue
        expected = _found(collection, q)
        mine = {d["_id"] for d in stored if Filter(q).matches(d)}
        assert mine == expected, (q, [d for d in stored if d["_id"] in mine ^ expected])
        assert {d["_id"] for d in read_back if Filter(q).matches(d)} == expected


def _found(collection: Any, query: dict[str, Any]) -> set[Any]:
    try:
        return {d["_id"] for d in collection.find(query)}
    except pymongo.errors.OperationFailure as exc:
        raise AssertionError(f"the server refused {query!r}: {exc}") from None


def _nested_arrays(value: Any, in_array: bool = False) -> bool:
    if isinstance(value, list):
        return in_array or any(_nested_arrays(v, True) for v in value)
    if isinstance(value, dict):
        return any(_nested_arrays(v) for v in value.values())
    return False


def _elem_match_on_documents(query: Any) -> bool:
    if isinstance(query, list):
        return any(_elem_match_on_documents(q) for q in query)
    if not isinstance(query, dict):
        return False
    inner = query.get("$elemMatch")
    if isinstance(inner, dict) and inner:
        first = next(iter(inner))
        if not first.startswith("$") or first in ("$and", "$or", "$nor"):
            return True
    return any(_elem_match_on_documents(v) for v in query.values())


#: The corners, each on every one of :data:`CORNER_DOCS`: arrays met on the way and at the
#: end, number parts past an array's end, NaN, null against missing, brackets.
CORNER_DOCS: list[dict[str, Any]] = [
    {"a": [1]}, {"a": [{"c": 1}]}, {"a": [[1, 2]]}, {"a": [{"b": 3}, 5]}, {"a": [4, {"b": 3}]},
    {"a": [{"0": 7}]}, {"a": float("nan")}, {"a": {"x": 1}}, {"a": {"x": 1.0}}, {"a": []}, {},
    {"a": None}, {"a": [[{"b": 9}]]}, {"a": Decimal128("NaN")}, {"a": [1, [2]]}, {"a": [None]},
    {"a": {"b": [1]}}, {"a": [[]]}, {"a": [{"b": []}]}, {"a": [[1, 2], [3]]}, {"a": -0.0},
    {"a": Int64(2**40)}, {"a": Decimal128("1E+1")}, {"a": True}, {"a": "b"}, {"a": OIDS[0]},
    {"a": DATES[1]}, {"a": [float("nan"), 3]}, {"a": {"x": 1, "y": 2}}, {"a": {"y": 2, "x": 1}},
]  # fmt: skip
NAN = float("nan")
CORNER_QUERIES: list[dict[str, Any]] = [
    {"a.b": None}, {"a.b": {"$exists": False}}, {"a.b": {"$ne": None}}, {"a.0": 1},
    {"a.0": [1, 2]}, {"a.1.b": 3}, {"a.0.b": 3}, {"a.0": 7}, {"a.0": {"0": 7}}, {"a.1": None},
    {"a.0": None}, {"a.1": {"$exists": False}}, {"a.1.b": None}, {"a.b.1": None},
    {"a.0.1": None}, {"a.0.b": 9}, {"a.0.0": 1}, {"a.1.1": None}, {"a": {"$lt": 5}},
    {"a": {"$gt": -1}}, {"a": {"$gte": NAN}}, {"a": {"$lte": NAN}}, {"a": {"$lt": NAN}},
    {"a": NAN}, {"a": {"$ne": NAN}}, {"a": {"$lt": float("inf")}}, {"a": 0}, {"a": 10},
    {"a": {"$gt": Int64(2**39)}}, {"a": {"$gte": Decimal128("10")}}, {"a": {"x": 1}},
    {"a": {"x": 1, "y": 2}}, {"a": None}, {"a": {"$gte": None}}, {"a": {"$gt": None}},
    {"a": {"$in": [None]}}, {"a": {"$nin": [None, 1]}}, {"a": {"$size": 1}}, {"a": {"$size": 0}},
    {"a": [2]}, {"a": {"$type": "array"}}, {"a": {"$type": "number"}}, {"a": {"$type": 16}},
    {"a": {"$type": ["null", "bool"]}}, {"a": {"$gt": [1]}}, {"a": {"$elemMatch": {"$gt": 0}}},
    {"a": {"$elemMatch": {"b": {"$exists": True}}}}, {"a": {"$all": []}}, {"a": {"$all": [1]}},
    {"a": {"$all": [{"$elemMatch": {"b": 3}}]}}, {"a": {"$not": {"$size": 1}}},
    {"a": {"$not": {"$gt": 2}}}, {"a": {"$gt": "a"}}, {"a": {"$lt": True}},
    {"a": {"$gt": OIDS[1]}}, {"a": {"$lt": DATES[2]}}, {"a": {"$regex": "^b"}},
    {"a": {"$not": {"$regex": "B", "$options": "i"}}}, {"a": {"$exists": True, "$ne": 1}},
    {"$or": [{"a": 1}, {"a.b": 3}]}, {"$nor": [{"a": {"$type": "array"}}, {"a": None}]},
]  # fmt: skip


def test_filter_matches_find_on_the_corners(collection: Any) -> None:
    stored = _store(collection, CORNER_DOCS)
    wrong = {}
    for q in CORNER_QUERIES:
        expected = sorted(d["_id"] for d in collection.find(q))
        mine = sorted(d["_id"] for d in stored if Filter(q).matches(d))
        if mine != expected:
            wrong[repr(q)] = (mine, expected)
    assert not wrong


# -- field rules against an aggregation -------------------------------------------------------

field_scalars = st.sampled_from([1, 2.5, "a", None, True, OIDS[0]])
PATHS = ["a", "b", "c", "a.b", "a.c", "b.a", "b.c", "a.b.c"]
TARGETS = ["x", "a.x", "b.x", "x.y", "c", "a.b", "b.a.x"]


def _field_docs(arrays: bool) -> st.SearchStrategy[list[dict[str, Any]]]:
    def nest(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
        doc = st.fixed_dictionaries({}, optional=dict.fromkeys(NAMES, inner))
        return st.one_of(doc, st.lists(inner, max_size=3)) if arrays else doc

    values = st.recursive(field_scalars, nest, max_leaves=6)
    return st.lists(
        st.fixed_dictionaries({}, optional=dict.fromkeys(NAMES, values)), min_size=1, max_size=6
    )


def _ordered(value: Any) -> Any:
    """``value`` with its field order made visible to ``==``."""
    if isinstance(value, dict):
        return [(k, _ordered(v)) for k, v in value.items()]
    if isinstance(value, list):
        return [_ordered(v) for v in value]
    return value


def _pipeline(rules: FieldRules) -> list[dict[str, Any]]:
    """The aggregation computing what ``rules.apply`` does (renames read before they write)."""
    stages: list[dict[str, Any]] = []
    if rules.include:
        stages.append({"$project": {"_id": 1, **dict.fromkeys(rules.include, 1)}})
    if rules.exclude:
        stages.append({"$project": dict.fromkeys(rules.exclude, 0)})
    if rules.rename:
        moves = list(rules.rename.items())
        stages += [
            {"$set": {"__moved": {str(i): f"${s}" for i, (s, _) in enumerate(moves)}}},
            {"$unset": [s for s, _ in moves]},
            {"$set": {t: _moved(i, t) for i, (_, t) in enumerate(moves)}},
            {"$unset": "__moved"},
        ]
    return stages


def _moved(index: int, target: str) -> dict[str, Any]:
    """The moved value, or the target as it is when the source was missing ($set would
    remove it)."""
    moved = f"$__moved.{index}"
    return {"$cond": [{"$eq": [{"$type": moved}, "missing"]}, f"${target}", moved]}


def _rules(include: list[str], exclude: list[str], rename: dict[str, str]) -> FieldRules:
    try:
        return FieldRules(include or None, exclude or None, rename or None)
    except ConfigurationError:
        reject()


@FIELDS
@given(
    docs=_field_docs(arrays=True),
    include=st.lists(st.sampled_from(PATHS), min_size=1, max_size=3, unique=True),
)
def test_include_equals_project(
    collection: Any, docs: list[dict[str, Any]], include: list[str]
) -> None:
    # Exclusions are checked without arrays (below): SecantusDB's $project and $unset leave a
    # field of the sub-documents in an array alone, where MongoDB removes it from each of them
    # (the $unset documentation's "copies.warehouse" example), as FieldRules does.
    rules = _rules(include, [], {})
    _store(collection, docs)
    stored = list(collection.find(sort=[("_id", 1)]))
    shaped = list(collection.aggregate([*_pipeline(rules), {"$sort": {"_id": 1}}]))
    assert [_ordered(rules.apply(d)) for d in stored] == [_ordered(d) for d in shaped]


def _writable(doc: dict[str, Any], target: str) -> bool:
    """Whether every field on the way to ``target`` is missing or a sub-document (where one is
    a scalar, SecantusDB's $set leaves the document alone; FieldRules, like MongoDB's
    $addFields, replaces it by a sub-document)."""
    parts = target.split(".")
    return all(
        get_path(doc, ".".join(parts[:i])) is MISSING
        or isinstance(get_path(doc, ".".join(parts[:i])), dict)
        for i in range(1, len(parts))
    )


@FIELDS
@given(
    docs=_field_docs(arrays=False),
    include=st.lists(st.sampled_from(PATHS), max_size=3, unique=True),
    exclude=st.lists(st.sampled_from(PATHS), max_size=1, unique=True),
    rename=st.dictionaries(
        st.sampled_from(PATHS), st.sampled_from(TARGETS), min_size=1, max_size=2
    ),
)
def test_renames_equal_set_and_unset(
    collection: Any,
    docs: list[dict[str, Any]],
    include: list[str],
    exclude: list[str],
    rename: dict[str, str],
) -> None:
    rules = _rules(include, exclude, rename)
    _store(collection, docs)
    stored = list(collection.find(sort=[("_id", 1)]))
    before_renames = FieldRules(rules.include or None, rules.exclude or None)
    assume(all(_writable(before_renames.apply(d), t) for d in stored for t in rename.values()))
    shaped = list(collection.aggregate([*_pipeline(rules), {"$sort": {"_id": 1}}]))
    assert [_ordered(rules.apply(d)) for d in stored] == [_ordered(d) for d in shaped]
