"""Changing a listener's ``partitions``: the new layout starts from the old one's oldest checkpoint.

See :mod:`listeners.stream.partition` for the layout and the procedure.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import replace

from loguru import logger

from listeners.checkpoints.stores import Checkpoint, CheckpointStore
from listeners.stream.partition import layout_names
from singleton.errors import ConfigurationError, StaleWriterError


def _other_layouts(store: CheckpointStore, name: str, count: int) -> list[Checkpoint]:
    pattern = re.compile(re.escape(name) + r"(\.(\d+)-of-(\d+))?")
    found = []
    for other in store.names(name):
        match = pattern.fullmatch(other)
        if match is None:
            continue
        k = int(match.group(3)) if match.group(3) else 1
        if k == count:
            continue
        cp = store.load(other)
        if cp is not None:
            found.append(cp)
    return found


def seed_partitions(
    store: CheckpointStore, name: str, count: int, held: Callable[[str], bool]
) -> Checkpoint | None:
    """After ``K`` changed: give every partition of the new layout the oldest checkpoint of any
    other layout of ``name`` (returned), unless the new layout already has a checkpoint.

    ``held(lease_name)`` says whether a lease is held now: a running old layout refuses the
    change (:class:`ConfigurationError`): stop every replica first.
    """
    new = layout_names(name, count)
    if any(store.load(n) is not None for n in new):
        return None
    old = _other_layouts(store, name, count)
    if not old:
        return None
    running = sorted(cp.name for cp in old if held(cp.name))
    if running:
        raise ConfigurationError(
            f"listener {name!r} now has partitions = {count}, but {', '.join(running)} of the "
            "previous layout is still running: stop every replica before changing partitions"
        )
    oldest = min(old, key=lambda cp: cp.cluster_time)
    for n in new:
        try:
            store.save(replace(oldest, name=n, holder=f"seeded from {oldest.name}"))
        except StaleWriterError:  # another replica seeded it, or a tenure already claimed it
            continue
    logger.warning(
        "listener {}: partitions changed to {}; every partition starts from {} (the oldest "
        "checkpoint of the previous layout, cluster time {}): events after it are replayed",
        name,
        count,
        oldest.name,
        oldest.cluster_time,
    )
    return oldest
