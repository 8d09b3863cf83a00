"""Filter: every supported operator on examples whose answers are MongoDB's (the parity test
in tests/integration/listeners/elasticsearch/shape checks them against a server), and every
refusal, whose message names the value."""

from __future__ import annotations

import datetime
import itertools
import re
import subprocess
import sys
from typing import Any

import pytest
from bson import ObjectId
from bson.decimal128 import Decimal128
from bson.int64 import Int64
from bson.regex import Regex

from listeners.elasticsearch.shape.filters import Filter
from listeners.elasticsearch.shape.values import bson_type, compare
from singleton.errors import ConfigurationError


class _Opaque:
    """A value no filter can compare (a stable repr: the test ids are the same in every worker)."""

    def __repr__(self) -> str:
        return "<opaque>"


NAN = float("nan")
D1 = datetime.datetime(2024, 1, 1)
D2 = datetime.datetime(2024, 1, 2, tzinfo=datetime.timezone.utc)
O1, O2 = ObjectId("0" * 23 + "1"), ObjectId("0" * 23 + "2")

#: (query, document, matches)
CASES: list[tuple[dict[str, Any], dict[str, Any], bool]] = [
    # implicit $eq, numbers across types, -0.0, NaN
    ({}, {"a": 1}, True),
    ({"a": 1}, {"a": 1.0}, True),
    ({"a": 1}, {"a": Int64(1)}, True),
    ({"a": 1}, {"a": Decimal128("1.000")}, True),
    ({"a": 0}, {"a": -0.0}, True),
    ({"a": 0}, {"a": Decimal128("-0")}, True),
    ({"a": 1}, {"a": True}, False),  # bool is no number
    ({"a": 1}, {"a": "1"}, False),
    ({"a": NAN}, {"a": NAN}, True),
    ({"a": NAN}, {"a": Decimal128("NaN")}, True),
    ({"a": 0.1}, {"a": Decimal128("0.1")}, False),  # the double is not exactly 0.1
    ({"a": 2**53 + 1}, {"a": float(2**53)}, False),  # exact, not via a double
    ({"a": "x"}, {"a": "x"}, True),
    ({"a": O1}, {"a": O1}, True),
    ({"a": D1}, {"a": D1.replace(microsecond=999)}, True),  # BSON dates hold milliseconds
    ({"a": D1}, {"a": D1.replace(tzinfo=datetime.timezone.utc)}, True),
    # embedded documents: exact, in order; arrays: equal, or an element equal
    ({"a": {"x": 1, "y": 2}}, {"a": {"x": 1, "y": 2}}, True),
    ({"a": {"x": 1, "y": 2}}, {"a": {"y": 2, "x": 1}}, False),
    ({"a": {"x": 1}}, {"a": {"x": 1.0}}, True),
    ({"a": {"x": 1}}, {"a": {"x": 1, "y": 2}}, False),
    ({"a": {}}, {"a": {}}, True),
    ({"a": 2}, {"a": [1, 2]}, True),
    ({"a": [1, 2]}, {"a": [1, 2]}, True),
    ({"a": [1, 2]}, {"a": [[1, 2], 3]}, True),
    ({"a": [2, 1]}, {"a": [1, 2]}, False),
    ({"a": 1}, {"a": [[1]]}, False),  # one level only
    # null: missing or null
    ({"a": None}, {}, True),
    ({"a": None}, {"a": None}, True),
    ({"a": None}, {"a": [None]}, True),
    ({"a": None}, {"a": []}, False),
    ({"a": None}, {"a": 0}, False),
    ({"a.b": None}, {"a": [{"c": 1}]}, True),  # a sub-document lacking b
    ({"a.b": None}, {"a": [1]}, False),  # no sub-document: nothing to lack b
    ({"a": {"$ne": None}}, {}, False),
    ({"a": {"$ne": None}}, {"a": 0}, True),
    # dotted paths through arrays, number parts
    ({"a.b": 2}, {"a": [{"b": 1}, {"b": 2}]}, True),
    ({"a.b": 2}, {"a": [{"b": [3, 2]}]}, True),
    ({"a.b": 9}, {"a": [[{"b": 9}]]}, False),  # arrays in arrays are not entered
    ({"a.b.c": 1}, {"a": {"b": [{"c": 1}]}}, True),
    ({"a.1": 2}, {"a": [1, 2]}, True),
    ({"a.1": 2}, {"a": [1, [2]]}, False),  # the indexed element is not entered
    ({"a.0.b": 3}, {"a": [{"b": 3}, 5]}, True),
    ({"a.0.b": 9}, {"a": [[{"b": 9}]]}, True),
    ({"a.0.0": 1}, {"a": [[1, 2]]}, True),
    ({"a.0": 7}, {"a": [{"0": 7}]}, True),  # a sub-document's field "0"...
    ({"a.0": {"0": 7}}, {"a": [{"0": 7}]}, True),  # ...and the element itself
    ({"a.1": None}, {"a": [1]}, True),  # past the end: missing
    ({"a.0.1": None}, {"a": [1]}, True),  # on from a number: missing
    ({"a.1": {"$exists": True}}, {"a": [1]}, False),
    ({"a.x": 1}, {"a": 1}, False),
    # comparisons: within one bracket only
    ({"a": {"$gt": 1}}, {"a": 2}, True),
    ({"a": {"$gt": 1}}, {"a": Decimal128("1.5")}, True),
    ({"a": {"$gt": 1}}, {"a": "2"}, False),
    ({"a": {"$gt": 1}}, {"a": True}, False),
    ({"a": {"$gt": 1}}, {"a": [0, 5]}, True),
    ({"a": {"$gt": 1}}, {}, False),
    ({"a": {"$gte": 1}}, {"a": 1.0}, True),
    ({"a": {"$lt": 1}}, {"a": float("-inf")}, True),
    ({"a": {"$lt": 1}}, {"a": NAN}, False),  # NaN is not less than anything...
    ({"a": {"$gt": NAN}}, {"a": 1}, False),  # ...nor greater
    ({"a": {"$gte": NAN}}, {"a": NAN}, True),  # but equal to NaN
    ({"a": {"$lte": NAN}}, {"a": 1}, False),
    ({"a": {"$lte": 2}}, {"a": Int64(2)}, True),
    ({"a": {"$gt": "a"}}, {"a": "b"}, True),
    ({"a": {"$gt": "a"}}, {"a": "B"}, False),  # binary order
    ({"a": {"$gt": False}}, {"a": True}, True),
    ({"a": {"$gt": O1}}, {"a": O2}, True),
    ({"a": {"$lt": D2}}, {"a": D1}, True),
    ({"a": {"$gt": None}}, {"a": None}, False),
    ({"a": {"$gte": None}}, {}, True),
    ({"a": {"$lte": None}}, {"a": None}, True),
    ({"a": {"$gt": [1]}}, {"a": [2]}, True),
    ({"a": {"$gt": [1]}}, {"a": [1]}, False),
    ({"a": {"$gt": {"x": 1}}}, {"a": {"x": 2}}, True),
    ({"a": {"$gt": {"x": 1}}}, {"a": {"y": 0}}, True),  # field names before values
    ({"a": {"$gt": 1, "$lt": 3}}, {"a": [0, 5]}, True),  # each on its own element
    ({"a": {"$elemMatch": {"$gt": 1, "$lt": 3}}}, {"a": [0, 5]}, False),  # one element
    ({"a": {"$elemMatch": {"$gt": 1, "$lt": 3}}}, {"a": [0, 2]}, True),
    # $in, $nin
    ({"a": {"$in": [1, "x"]}}, {"a": "x"}, True),
    ({"a": {"$in": [1, "x"]}}, {"a": [5, 1.0]}, True),
    ({"a": {"$in": []}}, {"a": 1}, False),
    ({"a": {"$in": [None]}}, {}, True),
    ({"a": {"$in": [re.compile("^x")]}}, {"a": "xy"}, True),
    ({"a": {"$nin": [1, 2]}}, {"a": 3}, True),
    ({"a": {"$nin": [1, 2]}}, {"a": [3, 2]}, False),
    ({"a": {"$nin": [1]}}, {}, True),
    # $exists
    ({"a": {"$exists": True}}, {"a": None}, True),
    ({"a": {"$exists": True}}, {}, False),
    ({"a": {"$exists": False}}, {}, True),
    ({"a": {"$exists": 0}}, {"a": 1}, False),
    ({"a.b": {"$exists": False}}, {"a": [{"b": 1}, {"c": 1}]}, False),
    # $not
    ({"a": {"$not": {"$gt": 2}}}, {"a": 1}, True),
    ({"a": {"$not": {"$gt": 2}}}, {"a": [1, 3]}, False),
    ({"a": {"$not": {"$gt": 2}}}, {}, True),
    ({"a": {"$not": re.compile("^x")}}, {"a": "y"}, True),
    ({"a": {"$not": {"$gt": 1, "$lt": 3}}}, {"a": 5}, True),
    # $type
    ({"a": {"$type": "int"}}, {"a": 1}, True),
    ({"a": {"$type": "long"}}, {"a": 2**40}, True),
    ({"a": {"$type": "long"}}, {"a": Int64(1)}, True),
    ({"a": {"$type": "double"}}, {"a": 1.0}, True),
    ({"a": {"$type": "decimal"}}, {"a": Decimal128("1")}, True),
    ({"a": {"$type": "number"}}, {"a": True}, False),
    ({"a": {"$type": "bool"}}, {"a": False}, True),
    ({"a": {"$type": "string"}}, {"a": ["x"]}, True),
    ({"a": {"$type": "array"}}, {"a": []}, True),
    ({"a": {"$type": "array"}}, {"a": [[1]]}, True),
    ({"a": {"$type": "object"}}, {"a": {}}, True),
    ({"a": {"$type": "null"}}, {}, False),
    ({"a": {"$type": "null"}}, {"a": None}, True),
    ({"a": {"$type": "date"}}, {"a": D1}, True),
    ({"a": {"$type": "objectId"}}, {"a": O1}, True),
    ({"a": {"$type": "regex"}}, {"a": Regex("x")}, True),
    ({"a": {"$type": 2}}, {"a": "x"}, True),
    ({"a": {"$type": 16.0}}, {"a": 1}, True),
    ({"a": {"$type": ["string", 8]}}, {"a": True}, True),
    # $size: the whole array
    ({"a": {"$size": 2}}, {"a": [1, [2, 3]]}, True),
    ({"a": {"$size": 2}}, {"a": [[1, 2]]}, False),
    ({"a": {"$size": 0}}, {"a": []}, True),
    ({"a": {"$size": 0}}, {}, False),
    ({"a.b": {"$size": 1}}, {"a": [{"b": [1]}]}, True),
    # $all
    ({"a": {"$all": [1, 2]}}, {"a": [2, 3, 1]}, True),
    ({"a": {"$all": [1, 2]}}, {"a": [1]}, False),
    ({"a": {"$all": [1]}}, {"a": 1}, True),
    ({"a": {"$all": []}}, {"a": [1]}, False),
    ({"a": {"$all": [[1, 2]]}}, {"a": [[1, 2]]}, True),
    ({"a": {"$all": [None]}}, {}, True),  # an $and of {$eq: null}
    ({"a": {"$all": [[]]}}, {"a": []}, True),  # the manual's "Nested Array" note
    ({"a": {"$all": [["x"]]}}, {"a": ["x"]}, True),
    ({"a": {"$all": [["x"]]}}, {"a": [["x"], 1]}, True),
    ({"a": {"$all": [re.compile("x"), "y"]}}, {"a": ["ax", "y"]}, True),
    (
        {"a": {"$all": [{"$elemMatch": {"b": 1}}, {"$elemMatch": {"c": 1}}]}},
        {"a": [{"b": 1}, {"c": 1}]},
        True,
    ),
    # $elemMatch
    ({"a": {"$elemMatch": {"b": 1, "c": 2}}}, {"a": [{"b": 1}, {"c": 2}]}, False),
    ({"a": {"$elemMatch": {"b": 1, "c": 2}}}, {"a": [{"b": 1, "c": 2}]}, True),
    ({"a": {"$elemMatch": {"b": 1}}}, {"a": {"b": 1}}, False),  # no array
    ({"a": {"$elemMatch": {"$or": [{"b": 1}, {"c": 1}]}}}, {"a": [{"c": 1}]}, True),
    ({"a": {"$elemMatch": {"$eq": 1}}}, {"a": [[1]]}, False),
    ({"a": {"$elemMatch": {"$elemMatch": {"$eq": 1}}}}, {"a": [[1]]}, True),
    ({"a": {"$elemMatch": {"0": 1}}}, {"a": [[1]]}, True),  # an array element, as a document
    ({"a": {"$elemMatch": {"$ne": 1}}}, {"a": [1, 2]}, True),
    ({"a": {"$elemMatch": {"$type": "string"}}}, {"a": "x"}, False),
    # regular expressions
    ({"a": re.compile("^ab")}, {"a": "abc"}, True),
    ({"a": re.compile("^ab")}, {"a": ["x", "abc"]}, True),
    ({"a": re.compile("^ab")}, {"a": 1}, False),
    ({"a": re.compile("b", re.IGNORECASE)}, {"a": "AB"}, True),
    ({"a": Regex("^B", "i")}, {"a": "bc"}, True),
    ({"a": {"$regex": "^b"}}, {"a": "bc"}, True),
    ({"a": {"$regex": "^b", "$options": "i"}}, {"a": "Bc"}, True),
    ({"a": {"$regex": "^b$", "$options": "m"}}, {"a": "a\nb"}, True),
    ({"a": {"$regex": "^b$"}}, {"a": "a\nb"}, False),
    ({"a": {"$regex": "a.b", "$options": "s"}}, {"a": "a\nb"}, True),
    ({"a": {"$regex": "a.b"}}, {"a": "a\nb"}, False),
    ({"a": {"$regex": "a b # comment", "$options": "x"}}, {"a": "ab"}, True),
    ({"a": {"$regex": re.compile("x")}}, {"a": "x"}, True),
    ({"a": {"$eq": Regex("x")}}, {"a": "x"}, False),  # $eq: the regex value itself
    ({"a": {"$eq": Regex("x")}}, {"a": Regex("x")}, True),
    ({"a": Regex("x")}, {"a": Regex("x")}, True),  # a regex value equal to it
    ({"a": Regex("x")}, {"a": Regex("x", "i")}, False),
    # logical operators
    ({"$and": [{"a": 1}, {"b": 2}]}, {"a": 1, "b": 2}, True),
    ({"$and": [{"a": 1}, {"b": 2}]}, {"a": 1}, False),
    ({"$or": [{"a": 1}, {"b": 2}]}, {"b": 2}, True),
    ({"$or": [{"a": 1}, {"b": 2}]}, {}, False),
    ({"$nor": [{"a": 1}, {"b": 2}]}, {}, True),
    ({"$nor": [{"a": 1}, {"b": 2}]}, {"a": 1}, False),
    ({"a": 1, "$or": [{"b": 1}, {"c": 1}]}, {"a": 1, "c": 1}, True),
    ({"$and": [{"$or": [{"a": 1}]}, {"$nor": [{"b": 1}]}]}, {"a": 1, "b": 2}, True),
]


@pytest.mark.parametrize(("query", "doc", "expected"), CASES, ids=[repr(c[0]) for c in CASES])
def test_matches_as_mongodb_does(
    query: dict[str, Any], doc: dict[str, Any], expected: bool
) -> None:
    assert Filter(query).matches(doc) is expected


def test_every_operator_has_an_example() -> None:
    from listeners.elasticsearch.shape.filters import FIELD_OPERATORS, LOGICAL_OPERATORS

    used = repr([c[0] for c in CASES])
    assert [op for op in FIELD_OPERATORS + LOGICAL_OPERATORS if f"'{op}'" not in used] == []


#: (query, what the message must hold, besides the option)
REFUSALS: list[tuple[Any, str]] = [
    ({"$where": "this.a == 1"}, "$where is not supported"),
    ({"$expr": {"$eq": ["$a", 1]}}, "$expr is not supported"),
    ({"$text": {"$search": "x"}}, "$text is not supported"),
    ({"$jsonSchema": {}}, "$jsonSchema is not supported"),
    ({"$comment": "x"}, "$comment is not supported"),
    ({"$foo": 1}, "$foo is not supported"),
    ({"a": {"$where": "1"}}, "$where (on a) is not supported"),
    ({"loc": {"$near": [0, 0]}}, "$near (on loc) is not supported"),
    ({"loc": {"$geoWithin": {}}}, "$geoWithin (on loc) is not supported"),
    ({"a": {"$mod": [2, 0]}}, "$mod (on a) is not supported"),
    ({"a": {"$gt": 1, "b": 2}}, "mixes operators ($gt) and plain fields"),
    ({"a": {"b": 2, "$gt": 1}}, "mixes operators ($gt)"),
    ({"$and": []}, "$and takes a non-empty list of queries, got []"),
    ({"$or": {"a": 1}}, "$or takes a non-empty list of queries, got {'a': 1}"),
    ({"$nor": [1]}, "an element of $nor must be a query document, got 1"),
    ({"a": {"$in": 1}}, "$in on a takes a list, got 1"),
    ({"a": {"$nin": [{"$gt": 1}]}}, "$nin on a cannot hold an operator"),
    ({"a": {"$all": 1}}, "$all on a takes a list, got 1"),
    ({"a": {"$all": [{"$elemMatch": {"b": 1}}, 2]}}, "$all on a mixes $elemMatch and values"),
    ({"a": {"$all": [{"$gt": 1}]}}, "$all on a cannot hold an operator"),
    ({"a": {"$exists": "yes"}}, "$exists on a takes true or false, got 'yes'"),
    ({"a": {"$not": 1}}, "$not on a takes an operator document or a regular expression, got 1"),
    ({"a": {"$not": {}}}, "$not on a takes an operator document"),
    ({"a": {"$type": "str"}}, "$type on a: 'str' is no BSON type"),
    ({"a": {"$type": 99}}, "$type on a: 99 is no BSON type"),
    ({"a": {"$type": True}}, "$type on a: True is no BSON type"),
    ({"a": {"$type": []}}, "$type on a needs at least one type"),
    ({"a": {"$size": -1}}, "$size on a takes a whole number >= 0, got -1"),
    ({"a": {"$size": 1.5}}, "$size on a takes a whole number >= 0, got 1.5"),
    ({"a": {"$size": "1"}}, "$size on a takes a whole number >= 0, got '1'"),
    ({"a": {"$elemMatch": 1}}, "$elemMatch on a takes a non-empty document, got 1"),
    ({"a": {"$elemMatch": {}}}, "$elemMatch on a takes a non-empty document"),
    ({"a": {"$elemMatch": {"$foo": 1}}}, "$foo (on a) is not supported"),
    ({"a": {"$regex": 1}}, "$regex on a takes a string or a pattern, got 1"),
    ({"a": {"$regex": "("}}, "regular expression '(' on a is invalid"),
    ({"a": {"$regex": "x", "$options": "g"}}, "option 'g' is not supported (supported: i, m,"),
    ({"a": {"$regex": "x", "$options": 1}}, "$options on a takes a string, got 1"),
    ({"a": {"$regex": Regex("x", "i"), "$options": "m"}}, "both in the pattern and $options"),
    ({"a": {"$options": "i"}}, "$options on a needs a $regex next to it"),
    ({"a": {"$ne": re.compile("x")}}, "$ne on a cannot take a regular expression; use $not"),
    ({"a": {"$gt": re.compile("x")}}, "$gt on a cannot take a regular expression"),
    ({"a": {"$eq": {1, 2}}}, "$eq on a: {1, 2} is no value a filter here can compare"),
    ({"a": [_Opaque()]}, "is no value a filter here can compare"),
    ({"a..b": 1}, "'a..b' is no dotted path"),
    ({"": 1}, "'' is no dotted path"),
    ({"a.$b": 1}, "'a.$b' is no dotted path"),
    ({1: 1}, "1 in the filter is no field name"),
    ([("a", 1)], "the filter must be a query document"),
]  # fmt: skip


@pytest.mark.parametrize(("query", "message"), REFUSALS, ids=[repr(r[0]) for r in REFUSALS])
def test_refusals_name_the_value(query: Any, message: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        Filter(query, option="collections.orders.filter")
    text = str(caught.value)
    assert text.startswith("collections.orders.filter"), text
    assert message in text, text


def test_unsupported_operators_are_told_what_is_supported() -> None:
    with pytest.raises(ConfigurationError, match=r"supported: \$and, \$or, \$nor, \$eq"):
        Filter({"$where": "1"})


def test_query_is_kept_as_given() -> None:
    query = {"status": {"$in": ["paid", "sent"]}}
    assert Filter(query).query is query


def test_digest_is_stable_and_names_the_query() -> None:
    q = {"a": {"$gt": Decimal128("1.5")}, "b": O1, "d": D1, "r": re.compile("^x", re.I)}
    assert Filter(q).digest() == Filter(dict(q)).digest()
    assert len(Filter(q).digest()) == 16
    assert Filter({"a": 1}).digest() != Filter({"a": 1.0}).digest()  # canonical: types count
    assert Filter({"a": 1}).digest() != Filter({"a": Int64(1)}).digest()
    assert Filter({"a": {"x": 1, "y": 2}}).digest() != Filter({"a": {"y": 2, "x": 1}}).digest()
    script = (
        "from bson.decimal128 import Decimal128; "
        "from listeners.elasticsearch.shape.filters import Filter; "
        "print(Filter({'a': {'$gt': Decimal128('1.5')}, 'b': [1, 2.0, None]}).digest())"
    )
    other = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert other == Filter({"a": {"$gt": Decimal128("1.5")}, "b": [1, 2.0, None]}).digest()


def test_matches_does_not_change_the_document() -> None:
    doc = {"a": [{"b": [1, 2]}, {"b": None}], "c": {"d": NAN}}
    before = repr(doc)
    Filter({"a.b": {"$gt": 1}, "c.d": NAN, "$or": [{"a.1.b": None}]}).matches(doc)
    assert repr(doc) == before


@pytest.mark.parametrize(
    ("value", "code"),
    [(None, 10), (True, 8), (1, 16), (2**31, 18), (Int64(1), 18), (1.0, 1),
     (Decimal128("1"), 19), ("x", 2), ({}, 3), ([], 4), (b"x", 5), (O1, 7), (D1, 9),
     (re.compile("x"), 11), (Regex("x"), 11)],
)  # fmt: skip
def test_bson_type(value: Any, code: int) -> None:
    assert bson_type(value) == code


def test_compare_orders_brackets_then_values() -> None:
    ordered = [None, Decimal128("-Infinity"), -1, 0, 1.5, Int64(2), "", "a", "b", {},
               {"a": 1}, [], [1], b"", O1, O2, False, True, D1, D2]  # fmt: skip
    assert all(compare(x, y) < 0 for x, y in itertools.pairwise(ordered))
    # NaN sorts before every number (inside documents; the operators never order it)
    assert compare(NAN, float("-inf")) < 0 and compare(NAN, Decimal128("NaN")) == 0
