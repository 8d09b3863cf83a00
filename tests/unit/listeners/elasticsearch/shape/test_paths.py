"""Dotted paths: the plain lookup (no array traversal) and the configuration check."""

from __future__ import annotations

import pickle
from typing import Any

import pytest

from listeners.elasticsearch.shape.paths import MISSING, check_path, get_path
from singleton.errors import ConfigurationError

DOC: dict[str, Any] = {"a": {"b": {"c": 1}, "n": None}, "list": [{"x": 1}], "s": "text"}


@pytest.mark.parametrize(
    ("path", "value"),
    [
        ("a.b.c", 1),
        ("a.b", {"c": 1}),
        ("a.n", None),
        ("s", "text"),
        ("a.missing", MISSING),
        ("nothing", MISSING),
        ("s.x", MISSING),  # through a string
        ("list.x", MISSING),  # through an array: never traversed here
        ("list.0", MISSING),  # not even by index
        ("a.n.x", MISSING),  # through null
    ],
)
def test_get_path(path: str, value: Any) -> None:
    assert get_path(DOC, path) == value if value is not MISSING else get_path(DOC, path) is MISSING


def test_missing_is_one_falsy_value_distinct_from_none() -> None:
    assert MISSING is not None and not MISSING
    assert repr(MISSING) == "MISSING"
    assert pickle.loads(pickle.dumps(MISSING)) is MISSING
    assert type(MISSING)() is MISSING


@pytest.mark.parametrize("path", ["a", "a.b", "address.city", "_id", "x1.y_2.z-3", "a.0.b"])
def test_check_path_accepts_dotted_paths(path: str) -> None:
    assert check_path(path, option="routing") == path


@pytest.mark.parametrize(
    ("path", "why"),
    [
        ("", "it is empty"),
        (".a", "empty field name"),
        ("a.", "empty field name"),
        ("a..b", "empty field name"),
        ("$a", "starts with '\\$'"),
        ("a.$b", "starts with '\\$'"),
        ("a\0b", "NUL"),
        (3, "is no dotted path"),
        (None, "is no dotted path"),
    ],
)
def test_check_path_refuses_naming_option_value_and_fix(path: Any, why: str) -> None:
    with pytest.raises(ConfigurationError, match=why) as caught:
        check_path(path, option="collections.orders.routing")
    message = str(caught.value)
    assert message.startswith("collections.orders.routing: ")
    assert repr(path) in message
    assert "like 'address.city'" in message
