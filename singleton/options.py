"""Keyword options, checked where an object is built: an unknown one is a ``TypeError``, as for
any Python call, and names the nearest known option so that a typo says its own fix."""

from __future__ import annotations

import difflib
from collections.abc import Collection, Iterable


def reject_unknown(caller: str, given: Iterable[str], known: Collection[str]) -> None:
    """Raise ``TypeError`` for the first name in ``given`` that is not in ``known``."""
    for key in given:
        if key not in known:
            near = difflib.get_close_matches(key, list(known), n=1)
            hint = f" (did you mean {near[0]!r}?)" if near else ""
            raise TypeError(f"{caller}() got an unexpected keyword argument {key!r}{hint}")
