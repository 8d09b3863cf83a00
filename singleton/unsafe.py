"""The one test-only switch that turns fencing off: ``SINGLETON_UNSAFE_DISABLE_FENCING=1``.

It exists so that the failover drill can prove it catches what it claims: with fencing off a
tenure acts until it is told it lost (no local renew deadline, like the naive peers), checkpoint
stores accept writes from older tokens, and ElasticsearchSync writes without external versions.
Never set it in production. Every place that honours it calls :func:`fencing_disabled`.
"""

from __future__ import annotations

import os

ENV = "SINGLETON_UNSAFE_DISABLE_FENCING"


def fencing_disabled() -> bool:
    """True when the environment asks for the unsafe, unfenced mode (tests only)."""
    return os.environ.get(ENV, "") not in ("", "0")
