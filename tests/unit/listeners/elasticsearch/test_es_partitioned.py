"""Which index a partition copies into (:func:`listeners.elasticsearch.partitioned.live_index`),
and that what the alias points to then is the reference its copy records."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from listeners.elasticsearch.partitioned import live_index
from listeners.stream.partition import Partition
from singleton.testing import FakeClock


class _Keeper:
    """An index keeper whose alias partition 0 creates right after this partition first looked
    for it, before its look for a plain index of that name."""

    def __init__(self) -> None:
        self.alias_exists = False
        self.watched: list[str] = []
        self.created = 0

    def forget(self, name: str) -> None:
        pass

    def watch_alias(self, alias: str) -> bool:
        if self.alias_exists:
            self.watched.append(alias)
            return True
        self.alias_exists = True  # partition 0 creates it now
        return False

    def exists(self, name: str) -> bool:
        return self.alias_exists  # an alias answers to its name too

    def fresh(self, alias: str, ctx: Any, *, with_alias: bool = False) -> str:
        self.created += 1
        self.alias_exists = True
        return f"{alias}-1"


def _ctx() -> Any:
    return SimpleNamespace(
        clock=FakeClock(), check=lambda: None, leadership=SimpleNamespace(wait_lost=lambda t: False)
    )


def test_an_alias_created_by_another_partition_meanwhile_is_watched() -> None:
    keeper = _Keeper()
    assert live_index(keeper, "docs", Partition(1, 2), _ctx()) == "docs"  # type: ignore[arg-type]
    # What the alias points to is what this partition's copy goes into and records: without
    # the watch it would record nothing, and a later tenure could not tell the index replaced.
    assert keeper.watched == ["docs"] and keeper.created == 0


class _Empty(_Keeper):
    """No index at all until this partition creates one."""

    def watch_alias(self, alias: str) -> bool:
        self.watched.append(alias)
        return self.created > 0

    def exists(self, name: str) -> bool:
        return False


def test_partition_0_creates_a_missing_index_and_watches_it() -> None:
    keeper = _Empty()
    assert live_index(keeper, "docs", Partition(0, 2), _ctx()) == "docs"  # type: ignore[arg-type]
    assert keeper.created == 1 and keeper.watched == ["docs", "docs"]


class _PlainIndex(_Keeper):
    """A plain index of the alias's name, with ``docs`` documents; ``swap`` puts an alias in
    its place."""

    def __init__(self, docs: int) -> None:
        super().__init__()
        self.docs = docs
        self.swapped: list[tuple[str, str]] = []

    def watch_alias(self, alias: str) -> bool:
        self.watched.append(alias)
        return bool(self.swapped)

    def exists(self, name: str) -> bool:
        return True

    def empty(self, name: str) -> bool:
        return self.docs == 0

    def swap(self, alias: str, target: str, ctx: Any) -> None:
        self.swapped.append((alias, target))


def test_an_empty_plain_index_in_the_alias_place_is_replaced_by_partition_0() -> None:
    """Made by a delete through the alias once it was gone: not an index to copy into."""
    keeper = _PlainIndex(docs=0)
    assert live_index(keeper, "docs", Partition(0, 2), _ctx()) == "docs"  # type: ignore[arg-type]
    assert keeper.swapped == [("docs", "docs-1")] and keeper.created == 1


def test_the_other_partitions_wait_for_partition_0_to_replace_an_empty_plain_index() -> None:
    keeper = _PlainIndex(docs=0)
    ctx = _ctx()
    waits: list[float] = []

    def wait_lost(seconds: float) -> bool:
        waits.append(seconds)
        keeper.swapped.append(("docs", "docs-1"))  # partition 0 did it meanwhile
        return False

    ctx.leadership.wait_lost = wait_lost
    assert live_index(keeper, "docs", Partition(1, 2), ctx) == "docs"  # type: ignore[arg-type]
    assert len(waits) == 1 and keeper.created == 0


def test_a_plain_index_that_holds_documents_is_copied_into_as_it_is() -> None:
    keeper = _PlainIndex(docs=5)  # of an earlier version of the listener
    assert live_index(keeper, "docs", Partition(0, 2), _ctx()) == "docs"  # type: ignore[arg-type]
    assert keeper.swapped == [] and keeper.created == 0
