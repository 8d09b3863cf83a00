"""One listener's change stream split into ``K`` partitions, each its own lease and checkpoint.

A document belongs to partition ``blake2b(BSON of documentKey._id) mod K``: stable across
processes, machines, versions of Python and restarts, and type-exact (the string ``"1"`` and the
integer ``1`` are different documents, and usually land in different partitions). Every event of
one document therefore goes to one partition, in oplog order; events without a document
(``drop``, ``rename``, ``dropDatabase``, ``invalidate``) go to every partition.

The filter runs in the replica, not in the server: MongoDB can hash a value only with
``$toHashedIndexKey`` (not in every server this project supports), and a pipeline that hashed
differently from this module would move documents between partitions on a server upgrade. So
each partition reads the whole stream and drops what is not its own: K partitions cost K reads
of the stream (and K ``updateLookup`` s per event) on the server, and split the sink work K ways.

Partition lease and checkpoint names are ``<name>.<i>-of-<K>`` (``orders.0-of-4``). Changing
``K`` (stop every replica, start them with the new ``K``): the new partitions, finding no
checkpoint of their own, all start from the oldest checkpoint of the previous layout
(:func:`listeners.stream.partition_seed.seed_partitions`); events between that and each old
partition's own position are replayed, which a sink with external versions ignores.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import bson

from singleton.errors import ConfigurationError

#: The most partitions one listener may have.
MAX_PARTITIONS = 1024


def partition_of(key: Any, count: int) -> int:
    """The partition (``0 <= p < count``) of the document whose ``_id`` is ``key``."""
    digest = hashlib.blake2b(bson.encode({"": key}), digest_size=8).digest()
    return int.from_bytes(digest, "big") % count


@dataclass(frozen=True)
class Partition:
    """Partition ``index`` of ``count``."""

    index: int
    count: int

    def __post_init__(self) -> None:
        if isinstance(self.count, bool) or not isinstance(self.count, int):
            raise ConfigurationError(f"partitions must be an integer, got {self.count!r}")
        if not 1 <= self.count <= MAX_PARTITIONS:
            raise ConfigurationError(
                f"partitions must be between 1 and {MAX_PARTITIONS}, got {self.count!r}"
            )
        if not 0 <= self.index < self.count:
            raise ConfigurationError(
                f"partition index must be in [0, {self.count}), got {self.index!r}"
            )

    def lease_name(self, name: str) -> str:
        """``orders`` -> ``orders.2-of-4``."""
        return f"{name}.{self.index}-of-{self.count}"

    def owns(self, event: Mapping[str, Any]) -> bool:
        """Whether ``event`` is this partition's (events without a document: every one's)."""
        key = event.get("documentKey")
        if not isinstance(key, Mapping) or "_id" not in key:
            return True
        return partition_of(key["_id"], self.count) == self.index


def layout_names(name: str, count: int) -> list[str]:
    """The lease names of ``name`` split in ``count`` (``[name]`` for 1)."""
    if count == 1:
        return [name]
    return [Partition(i, count).lease_name(name) for i in range(count)]
