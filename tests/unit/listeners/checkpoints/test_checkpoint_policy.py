"""The checkpoint policy on a fake clock: when it saves, which position, and that a position is
saved only once the sink acknowledged every event before it (:class:`InFlight`), whatever the
sink keeps in flight."""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any

import pytest
from bson.timestamp import Timestamp
from loguru import logger

from listeners.base import ListenerContext
from listeners.checkpoints.marker import CheckpointMarker
from listeners.checkpoints.policy import CheckpointPolicy, CheckpointSettings, InFlight, LastSeen
from listeners.checkpoints.stores import Checkpoint, CheckpointStore
from listeners.runtime.status import StatusBoard
from singleton.election.leadership import Leadership
from singleton.errors import LeaseLostError, SingletonError, SinkUnavailableError
from singleton.lease.contract import Lease
from singleton.testing import FakeClock, MemoryLeaseBackend


class _ListStore(CheckpointStore):
    """Keeps every save; fencing and ordering are the real stores' business."""

    def __init__(self) -> None:
        self.saved: list[Checkpoint] = []

    def load(self, name: str) -> Checkpoint | None:
        return self.saved[-1] if self.saved else None

    def claim(self, name: str, fencing_token: int, holder: str, deployment: Any) -> Any:
        return self.load(name)

    def save(self, checkpoint: Checkpoint) -> None:
        self.saved.append(checkpoint)

    def load_progress(self, name: str) -> dict[str, Any] | None:
        return None

    def save_progress(self, name: str, data: Any, leadership: Any) -> None:
        return None


def _token(t: int, i: int = 0) -> dict[str, str]:
    return {"_data": f"82{t:08x}{i:08x}"}


def _events(t: int, n: int = 1) -> list[dict[str, Any]]:
    return [{"_id": _token(t, i), "clusterTime": Timestamp(t, i)} for i in range(n)]


class _Scene:
    """A policy on a fake clock, its store, lease, status board and the runner's memory."""

    def __init__(self, interval: float = 1.0, idle: float = 5.0) -> None:
        self.clock = FakeClock()
        self.ld = Leadership(
            Lease("n", "me/1", 7, 10.0), "me", self.clock.monotonic() + 100, self.clock
        )
        ctx = ListenerContext(self.ld, None, logger, "n", clock=self.clock)  # type: ignore[arg-type]
        self.store = _ListStore()
        self.board = StatusBoard("n")
        self.last_seen = LastSeen()
        self.policy = CheckpointPolicy(
            CheckpointSettings(self.store, interval, idle, self.last_seen),
            ctx,
            bounded=nullcontext,
            routine=nullcontext,
            marker=CheckpointMarker(MemoryLeaseBackend(self.clock), "n", nullcontext),
            board=self.board,
        )

    def batch(self, t: int, answer: int | None = None, n: int = 1) -> None:
        """One batch at time ``t`` of ``n`` events, handed in one call answering ``answer``."""
        events = _events(t, n)
        self.policy.handed(len(events), answer)
        self.policy.delivered(_token(t, n), events)

    def times(self) -> list[int]:
        return [cp.cluster_time.time for cp in self.store.saved]


def test_policy_saves_under_load_at_most_every_interval() -> None:
    scene = _Scene(interval=1.0)
    scene.policy.opened(_token(10), None)
    for t in range(11, 16):  # five batches in 0.4 s: no save yet
        scene.batch(t)
        scene.policy.after_batch()
        scene.clock.advance(0.1)
    assert scene.store.saved == []
    scene.clock.advance(0.6)
    scene.batch(16)
    scene.policy.after_batch()
    assert scene.times() == [16]


def test_policy_saves_when_caught_up_and_idle_advances_only_when_due() -> None:
    scene = _Scene(idle=5.0)
    policy = scene.policy
    policy.opened(_token(10), Timestamp(10, 0))  # a fresh stream saves its start at once
    scene.batch(11)
    policy.caught_up(_token(12))  # what was acknowledged is saved as soon as the stream is idle
    policy.caught_up(_token(13))  # an idle advance waits for idle_interval
    scene.clock.advance(5.0)
    policy.caught_up(_token(13))
    policy.caught_up(_token(13))  # and is not repeated for the same token
    assert scene.times() == [10, 12, 13]
    # Every accepted save is told to the runner's memory and to the status.
    assert scene.last_seen.checkpoint is scene.store.saved[-1]
    assert scene.board.snapshot().last_checkpoint_cluster_time == Timestamp(13, 0)


def test_policy_saves_past_everything_only_when_acknowledged_and_never_moves_back() -> None:
    scene = _Scene(interval=60.0)
    policy = scene.policy
    policy.opened(_token(20), Timestamp(20, 0))
    policy.passed(_token(20))  # nothing new: nothing to save
    policy.handed(1, None)
    policy.delivered({"_data": "opaque"}, _events(25))
    policy.passed({"_data": "opaque"})  # no time in the token: the batch's time is used
    policy.save({"_data": "older"}, Timestamp(3, 0))  # a stale fallback: the position holds
    assert [cp.cluster_time for cp in scene.store.saved] == [Timestamp(20, 0)] + [
        Timestamp(25, 0)
    ] * 2
    policy.handed(1, 0)  # the sink holds this one: nothing may be saved past it
    policy.delivered(_token(30), _events(30))
    with pytest.raises(SinkUnavailableError, match="1 events not acknowledged"):
        policy.passed(_token(31))


def test_policy_checks_the_lease_before_every_save() -> None:
    scene = _Scene()
    scene.ld._end("lost")
    with pytest.raises(LeaseLostError):
        scene.policy.save(_token(5), None)
    assert scene.store.saved == []


def test_a_pipelined_sink_moves_the_position_only_past_what_it_acknowledged() -> None:
    scene = _Scene(interval=0.0)
    policy = scene.policy
    policy.opened(_token(40), None)
    scene.batch(41, answer=0, n=3)  # in flight
    scene.batch(42, answer=0, n=2)  # in flight
    policy.after_batch()
    assert scene.store.saved == []
    scene.batch(43, answer=4, n=2)  # the first batch and one event of the second: batch 41
    policy.after_batch()
    assert [cp.resume_token for cp in scene.store.saved] == [_token(41, 3)]
    policy.caught_up(_token(50))  # idle, but the sink still holds 3 events: not past them
    assert scene.times() == [41]
    policy.flushed(None)  # the flush acknowledged the rest
    policy.caught_up(_token(50))
    assert [cp.resume_token for cp in scene.store.saved][-1] == _token(50)


def test_in_flight_counts_per_call_and_never_acknowledges_more_than_was_handed() -> None:
    ledger = InFlight()
    # A batch the poison handler split in two halves (one event dead-lettered in between).
    assert ledger.handed(2, 0) is None
    assert ledger.handed(1, 0) is None
    assert ledger.delivered(("t1", None)) is None
    assert ledger.handed(2, 3) == ("t1", None)  # the first batch's calls, not yet the next
    assert ledger.delivered(("t2", None)) is None
    assert ledger.answered(1) is None
    assert ledger.answered(1) == ("t2", None)
    assert ledger.events == 0
    assert ledger.handed(1, None) is None  # None: all of it, the position follows
    assert ledger.delivered(("t3", None)) == ("t3", None)
    ledger.handed(1, 0)
    with pytest.raises(SingletonError, match="acknowledged 2 events, but only 1"):
        ledger.answered(2)


def test_a_reopened_stream_that_fails_before_its_first_batch_resumes_where_it_opened() -> None:
    """A stream reopened after the last acknowledged (unsaved) position fails again before it
    delivers anything: the next reopen starts there too, not at the older saved checkpoint
    (that would replay every event acknowledged since the last save)."""
    scene = _Scene(interval=60.0)
    policy = scene.policy
    policy.opened(_token(10), Timestamp(10, 0))  # saved: the checkpoint stays at 10
    for t in range(11, 20):
        scene.batch(t)
        policy.after_batch()
    assert scene.times() == [10]
    at = policy.resume_position(None)  # type: ignore[arg-type]  # the first failure
    assert at.resume_after == _token(19, 1)
    policy.reload()
    policy.opened(_token(19, 1), None)  # reopened there; it fails before its first batch
    policy.reload()
    assert policy.resume_position(None).resume_after == _token(19, 1)  # type: ignore[arg-type]
    scene.batch(20)  # and it goes on from there
    assert policy.resume_position(None).resume_after == _token(20, 1)  # type: ignore[arg-type]
    policy.salvage()
    assert scene.times() == [10, 20]


def test_a_stream_moved_elsewhere_never_reopens_at_what_was_acknowledged_before() -> None:
    """After a copy, a skip past lost history or an invalidate, the stream goes on from the new
    place: a reopen before its first batch starts there, never at the earlier acknowledged
    position (for lost history, that position is gone; for a copy, it is behind it)."""
    scene = _Scene(interval=60.0)
    policy = scene.policy
    policy.opened(_token(10), Timestamp(10, 0))
    scene.batch(11)
    policy.moved(None, Timestamp(30, 0))  # e.g. a resync that copied up to 30
    policy.opened(None, None)
    policy.reload()
    assert policy.resume_position(None).at_time == Timestamp(30, 0)  # type: ignore[arg-type]
    assert scene.times() == [10, 30]


def test_a_token_replaces_a_bare_cluster_time_at_once() -> None:
    """Right after a copy the saved position is a cluster time alone; the first resume token
    replaces it without waiting for either interval (then the intervals hold again)."""
    scene = _Scene(interval=60.0, idle=60.0)
    policy = scene.policy
    policy.moved(None, Timestamp(10, 0))  # the copy's end: no token yet
    assert scene.store.saved[-1].resume_token is None
    policy.caught_up(_token(11))  # an idle stream's first token
    assert scene.store.saved[-1].resume_token == _token(11)
    policy.caught_up(_token(12))  # not bare any more: the idle interval holds
    assert len(scene.store.saved) == 2
    # under load too
    policy.moved(None, Timestamp(20, 0))
    scene.batch(21)
    policy.after_batch()
    assert scene.store.saved[-1].resume_token == _token(21, 1)
    scene.batch(22)
    policy.after_batch()
    assert len(scene.store.saved) == 4
