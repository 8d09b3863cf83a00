"""One change batch walks through the real runner and enters the sink once: ``handle_batch`` gets
its event exactly once and no other call carries it again. A plain sink is never asked to flush;
a pipelined one (it acknowledges nothing until its flush) is asked once, when the stream goes
idle, and the checkpoint passes the event only after that flush acknowledged it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from bson.timestamp import Timestamp

from listeners.base import ChangeEvent, ListenerContext
from singleton.service.dev.embedded import wait_until
from tests.integration.listener_support import Recorder, Scene, wait_state


class Counting(Recorder):
    """Counts every call into the sink: (method, events it acknowledged or carried)."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.calls: list[tuple[str, int]] = []
        #: How many checkpoints the store had accepted when each flush was called.
        self.saved_at_flush: list[int] = []
        self.store: Any = None

    def handle_batch(self, events: Sequence[ChangeEvent], ctx: ListenerContext) -> int | None:
        self.calls.append(("handle_batch", len(events)))
        super().handle_batch(events, ctx)
        return None

    def flush(self, deadline: float | None, ctx: ListenerContext) -> int | None:
        self.calls.append(("flush", 0))
        self.saved_at_flush.append(len(self.store.accepted))
        return None


class PipelinedCounting(Counting):
    """Keeps every batch "in flight" until its flush: ``handle_batch`` acknowledges nothing."""

    held = 0

    def handle_batch(self, events: Sequence[ChangeEvent], ctx: ListenerContext) -> int | None:
        super().handle_batch(events, ctx)
        self.held += len(events)
        return 0

    def flush(self, deadline: float | None, ctx: ListenerContext) -> int | None:
        super().flush(deadline, ctx)
        acknowledged, self.held = self.held, 0
        self.calls[-1] = ("flush", acknowledged)
        return acknowledged


@pytest.mark.parametrize("cls", [Counting, PipelinedCounting], ids=["plain", "pipelined"])
def test_one_change_batch_enters_the_sink_once(
    cls: type[Counting], mongo_url: str, unique: str
) -> None:
    scene = Scene.on(mongo_url, unique)
    listener = scene.listener("c", cls)
    assert isinstance(listener, Counting)
    listener.store = scene.store
    runner = scene.runner(listener).start()
    try:
        wait_state(runner, "streaming")
        scene.coll("c").insert_one({"_id": 1})
        wait_until(lambda: bool(listener.keys()), 10, what="the insert handled")
        event = listener.handled[0][2]
        at = event["clusterTime"]
        assert isinstance(at, Timestamp)
        wait_until(
            lambda: any(cp.cluster_time >= at for cp in scene.store.accepted),
            10,
            what="a checkpoint past the insert",
        )
    finally:
        runner.stop()
    expected = [("handle_batch", 1)]
    if cls is PipelinedCounting:
        expected.append(("flush", 1))  # once, when the stream went idle
        # Nothing at or past the event was saved before the flush acknowledged it.
        before = scene.store.accepted[: listener.saved_at_flush[0]]
        assert all(cp.cluster_time < at for cp in before), (before, at)
    assert listener.calls == expected
    assert listener.keys() == [listener.handled[0][0]]
