"""``relate`` two levels deep, without servers: what is accepted, what a root embeds from a
related document read with its own related documents, the copy's nested ``$lookup``, and which
collections' events touch which roots (and need pre-images)."""

from __future__ import annotations

from typing import Any

import pytest

from listeners.elasticsearch.shape.collections import parse_shape
from listeners.elasticsearch.shape.relate import LOOKUP_FIELD, parse_relations
from singleton.errors import ConfigurationError

PRODUCT = {"from": "products", "local": "sku", "as": "product", "fields": ["title"]}
NOTES = {"from": "notes", "foreign": "line_id", "as": "notes", "many": True, "fields": ["text"]}
LINES = {
    "from": "lines",
    "foreign": "order_id",
    "as": "lines",
    "many": True,
    "fields": ["sku"],
    "relate": [PRODUCT, NOTES],
}


def test_a_relation_carries_its_own_relations_but_no_deeper() -> None:
    (lines,) = parse_relations("orders", [LINES])
    assert [r.into for r in lines.relations] == ["product", "notes"]
    deeper = {**LINES, "relate": [{**NOTES, "relate": [PRODUCT]}]}
    with pytest.raises(ConfigurationError, match=r"orders.relate\[0\].relate\[0\].relate: .*2 lev"):
        parse_relations("orders", [deeper])
    with pytest.raises(ConfigurationError, match="must be a list of tables"):
        parse_relations("orders", [{**LINES, "relate": {"from": "x"}}])


def test_a_related_document_embeds_its_own_related_documents_after_its_field_rules() -> None:
    (lines,) = parse_relations("orders", [LINES])
    line: dict[str, Any] = {
        "_id": 7,
        "order_id": 1,
        "sku": "p1",
        "secret": "x",
        LOOKUP_FIELD.format(0): [{"_id": "p1", "title": "Pen", "cost": 3}],
        LOOKUP_FIELD.format(1): [{"_id": 2, "text": "b"}, {"_id": 1, "text": "a"}],
    }
    assert lines.embedded(line) == {
        "sku": "p1",
        "product": {"title": "Pen"},
        "notes": [{"text": "a"}, {"text": "b"}],  # (by _id without a sort)
    }
    assert LOOKUP_FIELD.format(0) in line  # the read document is left as it was
    missing: dict[str, Any] = {"_id": 8, "sku": None, LOOKUP_FIELD.format(0): []}
    assert lines.embedded(missing) == {"sku": None, "product": None, "notes": []}


def test_the_copy_joins_the_second_level_inside_the_first_ones_lookup() -> None:
    (lines,) = parse_relations("orders", [LINES])
    stage = lines.lookup_stage(0)["$lookup"]
    assert (stage["from"], stage["localField"], stage["foreignField"]) == (
        "lines",
        "_id",
        "order_id",
    )
    inner = [s["$lookup"] for s in stage["pipeline"]]
    assert [(s["from"], s["localField"], s["foreignField"], s["as"]) for s in inner] == [
        ("products", "sku", "_id", LOOKUP_FIELD.format(0)),
        ("notes", "_id", "line_id", LOOKUP_FIELD.format(1)),
    ]
    (plain,) = parse_relations("orders", [PRODUCT])
    assert "pipeline" not in plain.lookup_stage(0)["$lookup"]


def test_second_level_collections_are_watched_and_touch_roots_through_their_parent() -> None:
    shape = parse_shape("shop", {"orders": {"relate": [LINES]}}, default_index="{collection}")
    sources = shape.sources
    assert sorted(sources) == ["lines", "notes", "products"]
    assert [(root, [r.source for r in path]) for root, path in sources["notes"]] == [
        ("orders", ["lines", "notes"])
    ]
    assert shape.watched == ["lines", "notes", "orders", "products"]
    # a note moved between lines, like a line between orders, is told by its pre-image
    assert shape.before_images == ["lines", "notes"]
    # the second level is part of the rules: changing it resyncs the index
    other = parse_shape(
        "shop",
        {"orders": {"relate": [{**LINES, "relate": [PRODUCT]}]}},
        default_index="{collection}",
    )
    assert shape.digest("orders") != other.digest("orders")
