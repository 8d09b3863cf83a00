"""Name things by registry (kombu-style aliases), resolved lazily, with "did you mean".

``singleton`` never imports ``listeners`` at import time: the aliases are strings.
"""

from __future__ import annotations

import difflib
import importlib
from typing import Any

from singleton.errors import ConfigurationError

LISTENER_ALIASES = {
    "elasticsearch": "listeners.elasticsearch:ElasticsearchSync",
    "logging": "listeners.logging:LoggingListener",
}
RUNNER = "listeners.runner:ListenerRunner"


def resolve(spec: str, aliases: dict[str, str] | None = None, what: str = "listener") -> Any:
    """An alias (``"elasticsearch"``) or ``"pkg.module:Attr"`` -> the object it names."""
    aliases = LISTENER_ALIASES if aliases is None else aliases
    target = aliases.get(spec, spec)
    if ":" not in target:
        near = difflib.get_close_matches(spec, list(aliases), n=1, cutoff=0.5)
        hint = f"; did you mean {near[0]!r}?" if near else ""
        known = ", ".join(sorted(aliases))
        raise ConfigurationError(
            f"unknown {what} {spec!r}: use an alias ({known}) or 'pkg.module:Class'{hint}"
        )
    module_name, _, attr = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigurationError(f"cannot import {what} {spec!r}: {exc}") from exc
    try:
        return getattr(module, attr)
    except AttributeError:
        near = difflib.get_close_matches(attr, dir(module), n=1)
        hint = f"; did you mean {module_name}:{near[0]}?" if near else ""
        raise ConfigurationError(
            f"{what} {spec!r}: module {module_name!r} has no attribute {attr!r}{hint}"
        ) from None
