"""A partitioned ``ElasticsearchSync`` (``partitions = K``): K leaders share one index.

Each partition mirrors only its own documents (:mod:`listeners.stream.partition`), so an initial
sync or
a resync of one partition must not rebuild the index behind the alias the way an unpartitioned
listener does: that would drop the other partitions' documents. A partition therefore copies its
documents **in place**, into the live index, with the copy's external versions (which never
regress a newer document), and replays only its own events of the copy window. Partition 0
creates the index (behind the alias) when there is none; the others wait for it, retrying as
for an unavailable sink.

The price of copying in place: a document of that partition deleted while its history was lost
(the case a resync exists for) stays in the index. ``singleton verify --repair`` removes it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from listeners.stream.partition import Partition
from singleton.errors import SinkUnavailableError

if TYPE_CHECKING:
    from listeners.base import ChangeEvent, ListenerContext
    from listeners.elasticsearch.index import IndexKeeper


#: Seconds a partition's copy waits for partition 0 to create a missing index before it
#: fails (retried as a sink that is unavailable). A resync after the index was deleted meets
#: this: partition 0 recreates it once its own writes or idle check find it gone.
CREATE_WAIT = 30.0


def live_index(index: IndexKeeper, alias: str, part: Partition, ctx: ListenerContext) -> str:
    """The index a partition copies into: the alias, created (by partition 0) if missing; the
    other partitions wait up to :data:`CREATE_WAIT` seconds for it. What it points to now is
    what this partition's writes must land in from here on."""
    index.forget(alias)
    deadline = ctx.clock.monotonic() + CREATE_WAIT
    while not index.watch_alias(alias):
        if index.exists(alias):
            # A plain index of an earlier version, or the alias another partition created
            # just now (after the look above): then what it points to is the reference too.
            index.watch_alias(alias)
            break
        if part.index == 0:
            index.fresh(alias, ctx, with_alias=True)
            index.watch_alias(alias)
            break
        left = deadline - ctx.clock.monotonic()
        if left <= 0:
            raise SinkUnavailableError(
                f"index {alias} does not exist yet: partition {part.index} of {part.count} waits"
                " for partition 0 to create it"
            )
        if ctx.leadership.wait_lost(min(0.25, left)):
            ctx.check()
    return alias


#: The copy-progress key under which a partition's copy names what it copies into.
INTO = "into"


def resumable(index: IndexKeeper, aliases: Sequence[str], ctx: ListenerContext) -> dict[str, Any]:
    """What a partition's copy goes into, to keep in its progress (``{INTO: ...}``): each
    alias's physical indexes by ``index.uuid``. Progress saved for other indexes (an earlier
    tenure's copy into an index since deleted and recreated by another partition: the
    documents it counts as copied are not in these) is dropped, and the copy starts over."""
    into = {alias: index.uuids(alias) for alias in sorted(aliases)}
    saved = ctx.load_progress()
    if saved and saved.get(INTO) != into:
        ctx.save_progress(None)
    return {INTO: into}


def owner(part: Partition | None) -> Callable[[Any], bool]:
    """Whether a document ``_id`` is this partition's (always, unpartitioned)."""
    if part is None:
        return lambda _key: True
    return lambda key: part.owns({"documentKey": {"_id": key}})


def only(part: Partition | None, events: Sequence[ChangeEvent]) -> Sequence[ChangeEvent]:
    """This partition's events (all of them, unpartitioned)."""
    return events if part is None else [e for e in events if part.owns(e)]


@dataclass(frozen=True)
class SharedSources(Partition):
    """A shaped listener's partition when it relates documents (:mod:`.shape.relate`): the
    events of the related collections reach *every* partition, each rebuilding only its own
    roots among those they touch (and indexing the related document only if it is its own)."""

    sources: frozenset[str] = frozenset()

    def owns(self, event: Mapping[str, Any]) -> bool:
        if (event.get("ns") or {}).get("coll") in self.sources:
            return True
        return super().owns(event)
