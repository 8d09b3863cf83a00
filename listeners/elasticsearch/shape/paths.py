"""Dotted paths into documents: the plain lookup (through sub-documents only, never into arrays)
that routing and renames use, and the check every configured path passes first."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from singleton.errors import ConfigurationError


class _Missing:
    """The value of a path that leads nowhere (distinct from a field holding ``None``)."""

    _instance: _Missing | None = None

    def __new__(cls) -> _Missing:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "MISSING"

    def __bool__(self) -> bool:
        return False

    def __reduce__(self) -> str:
        return "MISSING"


#: What :func:`get_path` returns for an absent field.
MISSING: Final = _Missing()


def get_path(doc: Mapping[str, Any], path: str) -> Any:
    """The value at ``path`` (``"a.b"``: field ``b`` of sub-document ``a``), or :data:`MISSING`
    when a part is absent or a part before the last is no sub-document (an array included:
    this lookup never traverses arrays)."""
    value: Any = doc
    for part in path.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return MISSING
        value = value[part]
    return value


def check_path(path: str, *, option: str) -> str:
    """``path`` if it is a dotted path (non-empty field names joined by dots, none starting
    with ``$``, no NUL); else :class:`~singleton.errors.ConfigurationError` naming ``option``."""
    if not isinstance(path, str):
        raise ConfigurationError(
            f"{option}: {path!r} is no dotted path; write field names joined by dots, like "
            f"'address.city'"
        )
    problem = None
    if not path:
        problem = "it is empty"
    elif "\0" in path:
        problem = "it holds a NUL character"
    elif any(not part for part in path.split(".")):
        problem = "it has an empty field name (a leading, trailing or doubled dot)"
    elif any(part.startswith("$") for part in path.split(".")):
        problem = "a field name starts with '$'"
    if problem is not None:
        raise ConfigurationError(
            f"{option}: {path!r} is no dotted path ({problem}); write field names joined by "
            f"dots, like 'address.city'"
        )
    return path
