"""One rule for non-finite numbers: the document is refused with the path of the first one."""

from __future__ import annotations

from typing import Any

import pytest
from bson.decimal128 import Decimal128

from listeners.elasticsearch.documents import source_of
from singleton.errors import NonFiniteNumberError

NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize(
    ("doc", "path"),
    [
        ({"_id": 1, "x": NAN}, "x"),
        ({"_id": 1, "x": -INF}, "x"),
        ({"_id": 1, "a": {"b": INF}}, "a.b"),
        ({"_id": 1, "a": {"b": [1.0, 2.0, NAN]}}, "a.b.2"),
        ({"_id": 1, "a": [{"q": Decimal128("Infinity")}]}, "a.0.q"),
        ({"_id": 1, "d": Decimal128("NaN")}, "d"),
    ],
)
def test_non_finite_numbers_refuse_the_document_naming_the_path(
    doc: dict[str, Any], path: str
) -> None:
    with pytest.raises(NonFiniteNumberError, match=rf"^non-finite number at path {path}$"):
        source_of(doc)


def test_finite_documents_and_transforms() -> None:
    assert source_of({"_id": 1, "x": 1.5, "a": {"b": [1, 2]}}) == b'{"x":1.5,"a":{"b":[1,2]}}'
    # The rule applies to what is indexed: a transform that drops the field avoids it.
    assert source_of({"_id": 1, "x": NAN, "y": 2}, lambda d: {"y": d["y"]}) == b'{"y":2}'


def test_a_refused_document_leaves_no_trace_in_the_next_encoding() -> None:
    # The encoder is kept between documents; one that raised inside a container is not reused
    # (its circular-reference markers would still name that container).
    shared: dict[str, Any] = {"v": INF}
    with pytest.raises(NonFiniteNumberError):
        source_of({"_id": 1, "a": shared})
    shared["v"] = 2.5
    assert source_of({"_id": 2, "a": shared, "b": [shared]}) == b'{"a":{"v":2.5},"b":[{"v":2.5}]}'
