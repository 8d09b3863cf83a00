"""FieldRules: include, then exclude, then rename, on copies; every refusal names the values
(the aggregation parity test is in tests/integration/listeners/elasticsearch/shape)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from listeners.elasticsearch.shape.fields import FieldRules
from singleton.errors import ConfigurationError

DOC: dict[str, Any] = {
    "_id": 7,
    "name": "Ada",
    "email": "ada@example.com",
    "address": {"street": "1 Main", "city": "Paris", "geo": {"lat": 1, "lon": 2}},
    "tags": ["a", "b"],
    "lines": [{"sku": "x", "qty": 1}, {"sku": "y", "qty": 2}, 3],
}


def _items(value: Any) -> Any:
    """``value`` with its field order made visible to ``==``."""
    if isinstance(value, dict):
        return [(k, _items(v)) for k, v in value.items()]
    if isinstance(value, list):
        return [_items(v) for v in value]
    return value


def _check(rules: FieldRules, expected: dict[str, Any], doc: dict[str, Any] = DOC) -> None:
    before = copy.deepcopy(doc)
    out = rules.apply(doc)
    assert _items(out) == _items(expected)
    assert _items(doc) == _items(before)  # never changed


def test_no_rules_is_the_identity_and_a_copy() -> None:
    rules = FieldRules()
    assert rules.identity()
    out = rules.apply(DOC)
    assert out == DOC and out is not DOC
    assert FieldRules([], [], {}).identity()
    assert not FieldRules(include=["name"]).identity()


def test_include_keeps_the_id_and_the_document_order() -> None:
    _check(
        FieldRules(include=["email", "name", "address.city"]),
        {"_id": 7, "name": "Ada", "email": "ada@example.com", "address": {"city": "Paris"}},
    )


def test_include_through_arrays_keeps_each_sub_documents_field() -> None:
    _check(FieldRules(include=["lines.sku"]), {"_id": 7, "lines": [{"sku": "x"}, {"sku": "y"}]})
    _check(FieldRules(include=["tags.x"]), {"_id": 7, "tags": []})
    _check(FieldRules(include=["name.x"]), {"_id": 7})  # a string holds no field
    _check(FieldRules(include=["address.zip"]), {"_id": 7, "address": {}})
    _check(FieldRules(include=["nothing"]), {"_id": 7})


def test_include_id_is_harmless() -> None:
    _check(FieldRules(include=["_id", "name"]), {"_id": 7, "name": "Ada"})


def test_exclude_removes_paths_and_keeps_the_rest_in_order() -> None:
    expected = copy.deepcopy(DOC)
    del expected["email"], expected["address"]["geo"]
    _check(FieldRules(exclude=["email", "address.geo", "missing.x"]), expected)


def test_exclude_through_arrays_removes_each_sub_documents_field() -> None:
    expected = copy.deepcopy(DOC)
    expected["lines"] = [{"sku": "x"}, {"sku": "y"}, 3]
    _check(FieldRules(exclude=["lines.qty"]), expected)


def test_include_then_exclude() -> None:
    _check(
        FieldRules(include=["name", "address"], exclude=["address.geo", "address.street"]),
        {"_id": 7, "name": "Ada", "address": {"city": "Paris"}},
    )


def test_rename_moves_values_creating_sub_documents() -> None:
    rules = FieldRules(
        include=["name", "email", "address"],
        exclude=["address.geo"],
        rename={"address.city": "city", "name": "person.name", "email": "address.mail"},
    )
    _check(
        rules,
        {
            "_id": 7,
            "address": {"street": "1 Main", "mail": "ada@example.com"},
            "city": "Paris",
            "person": {"name": "Ada"},
        },
    )


def test_rename_onto_an_existing_field_replaces_it_in_place() -> None:
    doc = {"_id": 1, "a": 1, "b": 2, "c": 3}
    _check(FieldRules(rename={"c": "a"}), {"_id": 1, "a": 3, "b": 2}, doc)


def test_renames_read_before_they_write() -> None:
    doc = {"_id": 1, "a": 1, "b": {"x": 2}}
    _check(FieldRules(rename={"a": "b", "b": "a"}), {"_id": 1, "b": 1, "a": {"x": 2}}, doc)
    _check(FieldRules(rename={"b.x": "b.y.z"}), {"_id": 1, "a": 1, "b": {"y": {"z": 2}}}, doc)
    _check(FieldRules(rename={"a": "a.x"}), {"_id": 1, "b": {"x": 2}, "a": {"x": 1}}, doc)


def test_a_source_inside_another_source_reads_the_document_before_the_moves() -> None:
    doc = {"_id": 1, "a": {"a": 1, "c": 2}}
    _check(
        FieldRules(rename={"a": "x", "a.c": "a.x"}),
        {"_id": 1, "x": {"a": 1, "c": 2}, "a": {"x": 2}},
        doc,
    )


def test_rename_of_a_missing_source_does_nothing() -> None:
    doc = {"_id": 1, "a": 1, "t": 5}
    _check(FieldRules(rename={"b": "t"}), doc, doc)
    _check(FieldRules(rename={"a.b": "c"}), doc, doc)  # through a number
    in_array: dict[str, Any] = {"_id": 1, "a": [{"b": 1}]}
    _check(FieldRules(rename={"a.b": "c"}), in_array, in_array)  # plain paths only


def test_rename_target_through_a_value_that_is_no_document_replaces_it() -> None:
    doc = {"_id": 1, "a": 1, "b": 5}
    _check(FieldRules(rename={"a": "b.c"}), {"_id": 1, "b": {"c": 1}}, doc)


def test_rename_keeps_null_values() -> None:
    doc = {"_id": 1, "a": None}
    _check(FieldRules(rename={"a": "b"}), {"_id": 1, "b": None}, doc)


def test_apply_shares_nothing_it_changed_with_the_document() -> None:
    doc = {"_id": 1, "a": {"b": 1, "c": 2}}
    out = FieldRules(rename={"a.b": "a.d"}).apply(doc)
    out["a"]["e"] = 3
    assert doc == {"_id": 1, "a": {"b": 1, "c": 2}}


def test_digest_is_stable_and_changes_with_the_rules() -> None:
    a = FieldRules(["name", "address"], ["address.geo"], {"address.city": "city"})
    b = FieldRules(["name", "address"], ["address.geo"], {"address.city": "city"})
    assert a.digest() == b.digest() and len(a.digest()) == 16
    assert a.digest() != FieldRules(["name", "address"], ["address.geo"]).digest()
    assert a.digest() != FieldRules(["address", "name"], ["address.geo"],
                                    {"address.city": "city"}).digest()  # fmt: skip


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"include": "name"}, "include must be a list of dotted paths, got 'name'; write ['name']"),
        ({"exclude": {"a": 1}}, "exclude must be a list of dotted paths, got {'a': 1}"),
        ({"include": [1]}, "include: 1 is no dotted path"),
        ({"exclude": [None]}, "exclude: None is no dotted path"),
        ({"include": ["a..b"]}, "include: 'a..b' is no dotted path"),
        ({"include": ["$a"]}, "include: '$a' is no dotted path"),
        ({"exclude": [""]}, "exclude: '' is no dotted path"),
        ({"include": ["a", "a.b"]}, "include: 'a.b' and 'a' overlap"),
        ({"exclude": ["a.b", "a"]}, "exclude: 'a' and 'a.b' overlap"),
        ({"include": ["_id.x"]}, "include: '_id.x': _id is always kept whole"),
        ({"exclude": ["_id"]}, "exclude: '_id': _id cannot be excluded"),
        ({"exclude": ["_id.x"]}, "exclude: '_id.x': _id cannot be excluded"),
        ({"rename": ["a"]}, "rename must be a table of dotted source = dotted target, got ['a']"),
        ({"rename": {"a": 1}}, "rename: 1 is no dotted path"),
        ({"rename": {"a": "b."}}, "rename: 'b.' is no dotted path"),
        ({"rename": {"_id": "id"}}, "rename: '_id' -> 'id' touches _id"),
        ({"rename": {"a": "_id.x"}}, "rename: 'a' -> '_id.x' touches _id"),
        ({"rename": {"a": "a"}}, "rename: 'a' is renamed to itself"),
        ({"rename": {"a": "x", "b": "x"}}, "rename: 'a' and 'b' are both renamed to 'x'"),
        ({"rename": {"a": "x", "b": "x.y"}},
         "rename: target 'x.y' (of 'b') and target 'x' (of 'a') overlap"),
        ({"rename": {"a": "x.y", "b": "x"}},
         "rename: target 'x' (of 'b') and target 'x.y' (of 'a') overlap"),
        ({"exclude": ["a"], "rename": {"a.b": "c"}},
         "rename: source 'a.b' (renamed to 'c') is excluded by 'a'"),
        ({"exclude": ["a.b"], "rename": {"a.b": "c"}},
         "rename: source 'a.b' (renamed to 'c') is excluded by 'a.b'"),
        ({"include": ["a", "b.c"], "rename": {"d": "e"}},
         "rename: source 'd' (renamed to 'e') is not included; add it to include (a, b.c)"),
        ({"include": ["b.c"], "rename": {"b.d": "e"}}, "source 'b.d' (renamed to 'e') is not"),
    ],
)  # fmt: skip
def test_refusals_name_the_values(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        FieldRules(**kwargs)
    assert message in str(caught.value), str(caught.value)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"include": ["a.b"], "rename": {"a.b": "c"}},  # the source itself
        {"include": ["a"], "rename": {"a.b": "c"}},  # under an included field
        {"include": ["a.b"], "rename": {"a": "c"}},  # above one: moves what is left of a
        {"exclude": ["a.geo"], "rename": {"a": "c"}},  # what is left of a
        {"include": ("a",), "exclude": ("a.b",)},  # any sequence
    ],
)
def test_accepted_combinations(kwargs: dict[str, Any]) -> None:
    FieldRules(**kwargs)
