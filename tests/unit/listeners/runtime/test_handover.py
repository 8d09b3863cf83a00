"""The handover gate: a drain waits for the act in hand, never for a read, and the acknowledged
position is saved exactly once, on whichever thread gets there first."""

from __future__ import annotations

import threading
from contextlib import nullcontext
from typing import Any

import pytest
from bson.timestamp import Timestamp
from loguru import logger

from listeners.base import ListenerContext
from listeners.checkpoints.marker import CheckpointMarker
from listeners.checkpoints.policy import CheckpointPolicy, CheckpointSettings, LastSeen
from listeners.checkpoints.stores import Checkpoint, CheckpointStore
from listeners.runtime.handover import Drained, HandoverGate
from listeners.runtime.status import StatusBoard
from singleton.election.leadership import Leadership
from singleton.errors import LeaseLostError
from singleton.lease.contract import Lease
from singleton.testing import FakeClock, MemoryLeaseBackend


def test_a_drain_does_not_wait_for_a_read_and_the_read_is_dropped() -> None:
    drain, reading, read = threading.Event(), threading.Event(), threading.Event()
    gate = HandoverGate(drain)
    saves: list[str] = []
    outcome: list[str] = []

    def run() -> None:  # a tenure whose read (a getMore) returns only when ``read`` is set
        try:
            with gate.acting(lambda _left: saves.append(threading.current_thread().name)):
                with gate.waiting():
                    reading.set()
                    read.wait(30)
                outcome.append("acted on what it read")
        except Drained:
            outcome.append("drained")

    worker = threading.Thread(target=run, name="worker", daemon=True)
    worker.start()
    assert reading.wait(10)
    drain.set()
    assert gate.close(timeout=30) is True  # returns while the read still blocks
    assert not read.is_set()
    assert saves == [threading.current_thread().name]  # saved by the drain, once
    read.set()  # the read returns with events: they are the successor's
    worker.join(10)
    assert outcome == ["drained"]
    assert saves == [threading.current_thread().name]


def test_a_drain_waits_for_the_act_in_hand_at_most_its_bound() -> None:
    drain = threading.Event()
    gate = HandoverGate(drain)
    saves: list[str] = []
    acting, finish = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def final(_left: float) -> None:
        saves.append("worker")
        raise LeaseLostError("demoted: the bound passed and the lease was released")

    def run() -> None:
        try:
            with gate.acting(final):
                acting.set()
                finish.wait(30)  # handle_batch, slower than the bound
                gate.check()
        except BaseException as exc:
            errors.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    assert acting.wait(10)
    drain.set()
    assert gate.close(timeout=0.01) is False  # the act outlasts the bound
    where = gate.where_acting()  # what the warning names: the act, innermost first
    assert where.startswith("threading.py:"), where  # blocked in Event.wait
    assert any(f.startswith("test_handover.py:") and f.endswith(" run") for f in where.split(" < "))
    finish.set()
    t.join(10)
    # The late act's own save is tried once and refused (the tenure was demoted): not drained.
    assert saves == ["worker"]
    assert [type(e) for e in errors] == [LeaseLostError]


def test_a_late_drain_after_the_tenure_ended_saves_nothing() -> None:
    drain = threading.Event()
    gate = HandoverGate(drain)
    saves: list[str] = []
    with gate.acting(lambda _left: saves.append("x")):
        pass
    drain.set()
    assert gate.close(timeout=1) is True
    assert saves == []
    with pytest.raises(Drained), gate.acting(lambda _left: saves.append("y")):
        pass  # a worker that starts after the drain does nothing
    assert saves == []


def test_an_act_cut_short_by_the_drain_saves_what_came_before_it_within_the_budget() -> None:
    from listeners.runtime.handover import HandoverInterrupted

    drain = threading.Event()
    gate = HandoverGate(drain, budget=0.25)
    lefts: list[float] = []
    drain.set()  # the drain began while the act waited on its sink
    with pytest.raises(Drained), gate.acting(lefts.append):
        raise HandoverInterrupted("a batch waited for room")
    assert len(lefts) == 1 and 0 <= lefts[0] <= 0.25  # saved once, with what is left
    assert gate.close(timeout=1) is True  # nothing more to do
    assert len(lefts) == 1


def test_a_handover_checkpoint_the_store_does_not_answer_still_ends_as_a_handover() -> None:
    """A save that times out at a handover is a warning (the successor replays more), not a
    failed tenure: on the worker's thread the tenure still ends in ``Drained``."""
    from listeners.runtime.handover import HandoverInterrupted
    from singleton.errors import BackendUnavailableError

    drain = threading.Event()
    gate = HandoverGate(drain, budget=0.25)
    tried: list[float] = []

    def final(left: float) -> None:
        tried.append(left)
        raise BackendUnavailableError("save checkpoint: timed out")

    drain.set()
    with pytest.raises(Drained), gate.acting(final):
        raise HandoverInterrupted("a batch waited for room")
    assert len(tried) == 1


class SlowStore(CheckpointStore):
    """The first save blocks until ``answer`` is set; every save is kept."""

    def __init__(self) -> None:
        self.saved: list[tuple[str, Timestamp]] = []
        self.writing, self.answer = threading.Event(), threading.Event()

    def load(self, name: str) -> Checkpoint | None:
        return None

    def claim(self, name: str, fencing_token: int, holder: str, deployment: Any) -> Any:
        return None

    def save(self, checkpoint: Checkpoint) -> None:
        if not self.writing.is_set():
            self.writing.set()
            assert self.answer.wait(30)
        self.saved.append((threading.current_thread().name, checkpoint.cluster_time))

    def load_progress(self, name: str) -> dict[str, Any] | None:
        return None

    def save_progress(self, name: str, data: Any, leadership: Any) -> None:
        return None


def at(t: int) -> tuple[dict[str, str], list[dict[str, Any]]]:
    token = {"_data": f"82{t:08x}{0:08x}"}
    return token, [{"_id": token, "clusterTime": Timestamp(t, 0)}]


@pytest.mark.parametrize("newer", [False, True])
def test_a_drain_does_not_wait_for_a_routine_checkpoint_write(newer: bool) -> None:
    """The worker is inside a periodic save the store does not answer: the drain takes the gate
    anyway. It writes nothing older than or equal to that save's position (which lands or is
    refused; either way nothing acknowledged is lost), but a newer acknowledged position it
    writes itself. The worker, when its write returns, ends."""
    clock = FakeClock()
    ld = Leadership(Lease("n", "me/1", 7, 10.0), "me", clock.monotonic() + 100, clock)
    ctx = ListenerContext(leadership=ld, client=None, logger=logger, listener_name="n", clock=clock)  # type: ignore[arg-type]
    store = SlowStore()
    drain = threading.Event()
    gate = HandoverGate(drain, budget=30)
    policy = CheckpointPolicy(
        CheckpointSettings(store, interval=0.0, idle_interval=5.0, last_seen=LastSeen()),
        ctx,
        bounded=nullcontext,
        routine=gate.waiting,
        marker=CheckpointMarker(MemoryLeaseBackend(clock), "n", nullcontext),
        board=StatusBoard("n"),
    )
    ended: list[BaseException] = []

    def release(left: float) -> None:  # the tenure's final act at a handover
        with policy.within(left):
            policy.release()

    def worker() -> None:
        try:
            with gate.acting(release):
                policy.handed(1, None)  # the sink acknowledged the batch as it returned
                policy.delivered(*at(5))
                policy.after_batch()  # blocks in the store
        except BaseException as exc:
            ended.append(exc)

    t = threading.Thread(target=worker, name="worker")
    t.start()
    assert store.writing.wait(30)
    if newer:  # a batch a pipelining sink still held, acknowledged by its flush at the drain
        policy.handed(1, 0)
        policy.delivered(*at(6))
        policy.flushed(None)
    drain.set()
    assert gate.close(timeout=30) is True  # while the worker's write still hangs
    assert store.saved == ([("MainThread", Timestamp(6, 0))] if newer else [])
    store.answer.set()
    t.join(30)
    assert len(ended) == 1 and isinstance(ended[0], Drained), ended
    assert store.saved[-1] == ("worker", Timestamp(5, 0))
