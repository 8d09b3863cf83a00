"""Importing a user's code by name: ``use = "pkg.module:Attr"`` in a ``[[listeners]]`` or
``[[jobs]]`` table, or ``--listener pkg.module:Class``.

The app dir (``--app-dir``, default the working directory) joins ``sys.path`` first, as uvicorn
does, so a module beside ``singleton.toml`` resolves by name. singleton's own import packages
(:data:`OWN_PACKAGES`) are imported before it joins: a user's module that takes one of their
names (a ``listeners.py``) can never replace them, and both ways it can go wrong (singleton's
package found in place of the user's, or the user's in place of singleton's) end in one error
that says to rename it, instead of a missing attribute or a circular import.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from singleton.errors import ConfigurationError

#: The import packages singleton ships: a user's module of one of these names is never imported.
OWN_PACKAGES = ("singleton", "listeners")
#: Where they live: the folder holding both.
_HOME = Path(__file__).resolve().parents[2]
#: How to make a user's module importable by name.
IMPORTABLE = (
    " (make it importable: run from the folder that holds it, pass --app-dir DIR, or add DIR"
    " to PYTHONPATH)"
)


def shadowed(top: str) -> str:
    """Why a user's module named like one of :data:`OWN_PACKAGES` cannot be used, and the fix."""
    return (
        f"a module or package of yours named {top!r} is shadowed by singleton's own {top!r}"
        f" package (only one of them can be imported); rename yours (e.g. my_{top}.py) and"
        " its `use`"
    )


def own_packages_first() -> None:
    """Import :data:`OWN_PACKAGES`, refusing a user's module that would be imported in place of
    one (``python -m`` puts the working directory first on ``sys.path``). Call it before
    anything imports them."""
    for name in OWN_PACKAGES:
        spec = importlib.util.find_spec(name)
        origin = None if spec is None or spec.origin is None else Path(spec.origin).resolve()
        if origin != _HOME / name / "__init__.py":
            raise ConfigurationError(
                f"{origin or name} takes the name of singleton's own {name!r} package, and only"
                f" one of them can be imported; rename yours (e.g. my_{name}.py) and its `use`"
            )
        importlib.import_module(name)


def use_app_dir(app_dir: str) -> None:
    """:func:`own_packages_first`, then ``app_dir`` first on ``sys.path``."""
    own_packages_first()
    path = os.path.abspath(app_dir)
    if path not in sys.path:
        sys.path.insert(0, path)


def resolve(spec: str, aliases: Mapping[str, Any], what: str) -> Any:
    """An alias, or ``"pkg.module:Attr"`` -> the object it names; a :class:`ConfigurationError`
    that says how to fix it (a near miss, how to make the module importable, a shadowed name)."""
    if spec in aliases:
        return aliases[spec]
    if ":" not in spec:
        near = difflib.get_close_matches(spec, list(aliases), n=1, cutoff=0.5)
        hint = f"; did you mean {near[0]!r}?" if near else ""
        known = ", ".join(sorted(aliases))
        raise ConfigurationError(
            f"unknown {what} {spec!r}: use an alias ({known}) or 'pkg.module:Class'{hint}"
        )
    module_name, _, attr = spec.partition(":")
    top = module_name.partition(".")[0]
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        missing = exc.name if isinstance(exc, ModuleNotFoundError) else None
        named = missing is not None and (module_name + ".").startswith(missing + ".")
        if named and top in OWN_PACKAGES:
            raise ConfigurationError(f"cannot import {what} {spec!r}: {shadowed(top)}") from exc
        hint = IMPORTABLE if named else ""
        raise ConfigurationError(f"cannot import {what} {spec!r}: {exc}{hint}") from exc
    try:
        return getattr(module, attr)
    except AttributeError:
        near = difflib.get_close_matches(attr, dir(module), n=1)
        hint = f"; did you mean {module_name}:{near[0]}?" if near else ""
        if top in OWN_PACKAGES:
            raise ConfigurationError(
                f"{what} {spec!r}: singleton's own module {module_name!r} has no attribute"
                f" {attr!r}{hint}; if you meant a {top!r} of your own: {shadowed(top)}"
            ) from None
        raise ConfigurationError(
            f"{what} {spec!r}: module {module_name!r} has no attribute {attr!r}{hint}"
        ) from None
