"""Which fields of a document an index keeps, and under which names.

Three rules, applied in this order to a copy (the document itself is never changed):

include  dotted paths: only these fields stay (and ``_id``, always)
exclude  dotted paths: these fields go
rename   {dotted source: dotted target}: the source's value moves to the target

``include`` and ``exclude`` read paths as MongoDB's ``$project`` does: a path through an array
of sub-documents applies to each of them (an inclusion drops the array's other elements, an
exclusion keeps them), and an included sub-document that holds none of the paths stays, empty.
``rename`` reads plain paths through sub-documents (:func:`.paths.get_path`): a source that is
missing, or behind an array, leaves the document as it is; a target is written as ``$set``
writes it, in place when it exists, else last in its sub-document, creating sub-documents on
the way (a value on the way that is no sub-document is replaced by one). All renames read the
document before any of them writes, so ``{a: b, b: a}`` swaps.

Everything that can be wrong with the rules is refused when they are built, so ``apply``
never fails on a document.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from listeners.elasticsearch.shape.filters import digest_of
from listeners.elasticsearch.shape.paths import MISSING, check_path, get_path
from singleton.errors import ConfigurationError

#: A set of paths as a tree: field -> subtree (``None``: the whole field).
_Tree = dict[str, "_Tree | None"]


class FieldRules:
    """include (dotted paths; only these fields, the document keeps its ``_id``), then exclude
    (dotted paths), then rename (dotted source path -> dotted target path)."""

    def __init__(
        self,
        include: Sequence[str] | None = None,
        exclude: Sequence[str] | None = None,
        rename: Mapping[str, str] | None = None,
    ) -> None:
        self.include = _paths(include, "include")
        self.exclude = _paths(exclude, "exclude")
        self.rename = _renames(rename)
        for path in self.exclude:
            if _within(path, "_id"):
                raise ConfigurationError(
                    f"exclude: {path!r}: _id cannot be excluded (every document keeps it whole)"
                )
        for path in self.include:
            if path.startswith("_id."):
                raise ConfigurationError(
                    f"include: {path!r}: _id is always kept whole; leave it out of include"
                )
        self._check_sources()
        self._include = _tree(self.include) if self.include else None
        self._exclude = _tree(self.exclude) if self.exclude else None

    def _check_sources(self) -> None:
        for source, target in self.rename.items():
            excluded = next((p for p in self.exclude if _within(source, p)), None)
            if excluded is not None:
                raise ConfigurationError(
                    f"rename: source {source!r} (renamed to {target!r}) is excluded by "
                    f"{excluded!r}; drop one of the two"
                )
            if self.include and not any(
                _within(source, p) or _within(p, source) for p in self.include
            ):
                raise ConfigurationError(
                    f"rename: source {source!r} (renamed to {target!r}) is not included; add "
                    f"it to include ({', '.join(self.include)})"
                )

    def identity(self) -> bool:
        """Whether the rules keep every document as it is."""
        return not (self.include or self.exclude or self.rename)

    def apply(self, doc: Mapping[str, Any]) -> dict[str, Any]:
        """A new document shaped by the rules (``doc`` is not changed)."""
        out = dict(doc)
        if self._include is not None:
            out = _keep(doc, self._include)
            if "_id" in doc:
                out = {"_id": doc["_id"], **out}
        if self._exclude is not None:
            out = _drop(out, self._exclude)
        if self.rename:
            out = _renamed(out, self.rename)
        return out

    def digest(self) -> str:
        """A name for the rules, stable across processes."""
        return digest_of({"include": self.include, "exclude": self.exclude, "rename": self.rename})

    def __repr__(self) -> str:
        return (
            f"FieldRules(include={self.include!r}, exclude={self.exclude!r}, "
            f"rename={self.rename!r})"
        )


def _paths(paths: Any, option: str) -> list[str]:
    if paths is None:
        return []
    if isinstance(paths, str | bytes) or not isinstance(paths, Sequence):
        raise ConfigurationError(
            f"{option} must be a list of dotted paths, got {paths!r}; write [{paths!r}]"
            if isinstance(paths, str)
            else f"{option} must be a list of dotted paths, got {paths!r}"
        )
    out: list[str] = []
    for path in paths:
        if not isinstance(path, str):
            raise ConfigurationError(f"{option}: {path!r} is no dotted path (a string)")
        check_path(path, option=option)
        clash = next((p for p in out if _within(path, p) or _within(p, path)), None)
        if clash is not None:
            raise ConfigurationError(
                f"{option}: {path!r} and {clash!r} overlap; keep only one of them"
            )
        out.append(path)
    return out


def _renames(rename: Any) -> dict[str, str]:
    if rename is None:
        return {}
    if not isinstance(rename, Mapping):
        raise ConfigurationError(
            f"rename must be a table of dotted source = dotted target, got {rename!r}"
        )
    out: dict[str, str] = {}
    for source, target in rename.items():
        for path in (source, target):
            if not isinstance(path, str):
                raise ConfigurationError(f"rename: {path!r} is no dotted path (a string)")
            check_path(path, option="rename")
            if path == "_id" or path.startswith("_id."):
                raise ConfigurationError(
                    f"rename: {source!r} -> {target!r} touches _id, which every document "
                    f"keeps as it is"
                )
        if source == target:
            raise ConfigurationError(f"rename: {source!r} is renamed to itself; drop it")
        for other_source, other in out.items():
            if other == target:
                raise ConfigurationError(
                    f"rename: {other_source!r} and {source!r} are both renamed to {target!r}"
                )
            if _within(other, target) or _within(target, other):
                raise ConfigurationError(
                    f"rename: target {target!r} (of {source!r}) and target {other!r} (of "
                    f"{other_source!r}) overlap: one would overwrite the other"
                )
        out[source] = target
    return out


def _within(path: str, prefix: str) -> bool:
    """Whether ``path`` is ``prefix`` or lies under it."""
    return path == prefix or path.startswith(prefix + ".")


def _tree(paths: Sequence[str]) -> _Tree:
    tree: _Tree = {}
    for path in paths:
        *parents, last = path.split(".")
        node = tree
        for part in parents:
            child = node.setdefault(part, {})
            assert child is not None  # overlapping paths were refused
            node = child
        node[last] = None
    return tree


def _keep(doc: Mapping[str, Any], tree: _Tree) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in doc.items():
        if key not in tree:
            continue
        subtree = tree[key]
        if subtree is None:
            out[key] = value
        elif isinstance(value, Mapping):
            out[key] = _keep(value, subtree)
        elif isinstance(value, list | tuple):
            out[key] = _keep_elements(value, subtree)
    return out


def _keep_elements(array: Sequence[Any], tree: _Tree) -> list[Any]:
    out: list[Any] = []
    for element in array:
        if isinstance(element, Mapping):
            out.append(_keep(element, tree))
        elif isinstance(element, list | tuple):
            out.append(_keep_elements(element, tree))
    return out


def _drop(doc: Mapping[str, Any], tree: _Tree) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in doc.items():
        if key not in tree:
            out[key] = value
            continue
        subtree = tree[key]
        if subtree is None:
            continue
        out[key] = _drop_in(value, subtree)
    return out


def _drop_in(value: Any, tree: _Tree) -> Any:
    if isinstance(value, Mapping):
        return _drop(value, tree)
    if isinstance(value, list | tuple):
        return [_drop_in(element, tree) for element in value]
    return value


def _renamed(doc: dict[str, Any], rename: Mapping[str, str]) -> dict[str, Any]:
    moves = [(s, t, get_path(doc, s)) for s, t in rename.items()]
    moves = [(s, t, v) for s, t, v in moves if v is not MISSING]
    for source, _, _ in moves:
        doc = _without(doc, source.split("."))
    for _, target, value in moves:
        doc = _with(doc, target.split("."), value)
    return doc


def _without(doc: Mapping[str, Any], parts: Sequence[str]) -> dict[str, Any]:
    """A copy of ``doc`` without the field at ``parts`` (gone already when another source
    held it: ``{a: x, a.c: y}``)."""
    out = dict(doc)
    if len(parts) == 1:
        out.pop(parts[0], None)
    elif isinstance(out.get(parts[0]), Mapping):
        out[parts[0]] = _without(out[parts[0]], parts[1:])
    return out


def _with(doc: Mapping[str, Any], parts: Sequence[str], value: Any) -> dict[str, Any]:
    """A copy of ``doc`` holding ``value`` at ``parts``."""
    out = dict(doc)
    if len(parts) == 1:
        out[parts[0]] = value
    else:
        child = out.get(parts[0])
        out[parts[0]] = _with(child if isinstance(child, Mapping) else {}, parts[1:], value)
    return out
