"""History lost (286) on a tiny oplog: each on_history_lost policy runs exactly once, with one
ERROR log; resync calls initial_sync, resume_from_now records a gap; and poison events."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from listeners.base import ListenerContext
from listeners.checkpoints.stores import Checkpoint
from singleton.service.dev.embedded import MongoServer, wait_until
from tests.integration.listener_support import (
    LogCapture,
    Scene,
    SyncingRecorder,
    now,
    wait_state,
)


@pytest.fixture(scope="module")
def small_oplog() -> Iterator[MongoServer]:
    with MongoServer(oplog_max_entries=50) as server:
        yield server


@pytest.mark.parametrize("policy", ["fail", "resync", "resume_from_now"])
def test_history_lost_policy_runs_once(policy: str, small_oplog: MongoServer, unique: str) -> None:
    scene = Scene.on(small_oplog.url, unique)
    coll, store = scene.coll("events"), scene.store
    first = scene.listener("events", SyncingRecorder, on_history_lost=policy)
    runner = scene.runner(first, "a").start()
    try:
        wait_state(runner, "streaming")
        coll.insert_many([{"_id": i} for i in range(5)])
        wait_until(lambda: len(first.keys()) == 5, 10, what="5 handled")
    finally:
        runner.stop()
    saved = store.load(first.lease_name)
    assert saved is not None
    for start in range(100, 2100, 500):  # 2,000 writes: the oplog prunes past the checkpoint
        coll.insert_many([{"_id": i} for i in range(start, start + 500)])

    second = scene.listener("events", SyncingRecorder, on_history_lost=policy)
    with LogCapture() as logs:
        runner = scene.runner(second, "b").start()
        try:
            if policy == "fail":
                wait_state(runner, "failed")
            else:
                wait_state(runner, "streaming")
                coll.insert_many([{"_id": i} for i in range(10_000, 10_005)])
                wait_until(lambda: len(second.keys()) == 5, 10, what="new writes handled")
        finally:
            runner.stop()
    status = runner.status()
    assert status.history_lost == 1, status
    lost_logs = [m for m in logs.errors if "history lost" in m]
    assert len(lost_logs) == 1, logs.errors
    gaps = list(scene.coll("gaps").find())
    if policy == "fail":
        assert status.last_error is not None
        assert "HistoryLostError" in status.last_error or "oplog" in status.last_error
        assert status.last_outcome is not None and not status.last_outcome.retryable
        assert second.keys() == [] and gaps == []
        after = store.load(first.lease_name)
        assert after is not None and after.cluster_time == saved.cluster_time
    elif policy == "resync":
        assert second.syncs == 1 and gaps == []
    else:
        assert second.syncs == 0
        assert len(gaps) == 1
        gap = gaps[0]
        assert gap["from_cluster_time"] == saved.cluster_time
        assert gap["to_cluster_time"] > saved.cluster_time
        assert gap["listener"] == second.lease_name
        assert gap["fencing_token"] == status.fencing_token > saved.fencing_token
        assert "history lost" in gap["reason"]


@pytest.mark.parametrize("policy", ["resync", "fail"])
def test_a_saved_cluster_time_the_oplog_rolled_past_is_history_lost(
    policy: str, small_oplog: MongoServer, unique: str
) -> None:
    """Right after an initial sync or a resync the saved position is a bare cluster time, and
    the stand-in (like any server that is not asked about a token) opens a stream there at its
    oldest entry without error 286: the tenure checks the oplog's first entry itself."""
    scene = Scene.on(small_oplog.url, unique)
    coll, store = scene.coll("events"), scene.store
    listener = scene.listener("events", SyncingRecorder, on_history_lost=policy)
    coll.insert_one({"_id": "before"})
    at = now(scene.client)
    store.save(Checkpoint(listener.lease_name, None, at, 1, "earlier/1"))  # as after a copy
    for start in range(0, 3000, 500):  # the oplog prunes past `at`: these are lost to a stream
        coll.insert_many([{"_id": i} for i in range(start, start + 500)])
    first = scene.client["local"]["oplog.rs"].find_one(sort=[("$natural", 1)])
    assert first is not None and first["ts"] > at, "the oplog did not roll past the time"
    with LogCapture() as logs:
        runner = scene.runner(listener, "b").start()
        try:
            wait_state(runner, "failed" if policy == "fail" else "streaming")
        finally:
            runner.stop()
    status = runner.status()
    assert status.history_lost == 1, status
    lost = [m for m in logs.errors if "history lost" in m and "oplog's first entry" in m]
    assert len(lost) == 1, logs.errors
    if policy == "resync":
        assert listener.syncs == 1
        saved = store.load(listener.lease_name)
        assert saved is not None and saved.cluster_time > at
    else:
        assert listener.syncs == 0 and listener.keys() == []
        assert status.last_error is not None and "HistoryLostError" in status.last_error


class OutlivedCopy(SyncingRecorder):
    """An initial sync during which the oplog rolls past its start (a long copy), the first
    time only."""

    client: Any = None

    def initial_sync(self, ctx: ListenerContext) -> None:
        super().initial_sync(ctx)
        if self.syncs == 1:
            coll = self.client[self.database][self.collection]
            for start in range(0, 3000, 500):
                coll.insert_many([{"_id": i} for i in range(start, start + 500)])


def test_a_copy_that_outlives_the_oplog_is_history_lost_and_copied_again(
    small_oplog: MongoServer, unique: str
) -> None:
    scene = Scene.on(small_oplog.url, unique)
    listener = scene.listener("events", OutlivedCopy, on_history_lost="resync")
    assert isinstance(listener, OutlivedCopy)
    listener.client = scene.client
    with LogCapture() as logs:
        runner = scene.runner(listener, "a").start()
        try:
            wait_until(lambda: listener.syncs == 2, 30, what="the copy done again")
            wait_state(runner, "streaming")
        finally:
            runner.stop()
    assert runner.status().history_lost == 1
    assert len([m for m in logs.errors if "oplog's first entry" in m]) == 1, logs.errors


@pytest.mark.parametrize("on_poison", ["dead_letter", "stop"])
def test_poison_event(on_poison: str, mongo_url: str, unique: str) -> None:
    scene = Scene.on(mongo_url, unique)
    listener = scene.listener("p", max_retries=2, on_poison=on_poison)
    calls = {"n": 0}

    def poisoned(event: Any) -> bool:
        if event["documentKey"]["_id"] == 7:
            calls["n"] += 1
            return True
        return False

    listener.fail = poisoned
    runner = scene.runner(listener).start()
    try:
        wait_state(runner, "streaming")
        scene.coll("p").insert_many([{"_id": i} for i in range(20)])
        if on_poison == "stop":
            wait_state(runner, "failed")
        else:
            wait_until(lambda: runner.status().dead_lettered == 1, 10, what="dead-lettered")
            scene.coll("p").insert_one({"_id": 20})
            wait_until(lambda: len(listener.keys()) == 20, 10, what="the rest handled")
    finally:
        runner.stop()
    letters = list(scene.coll("dead_letters").find())
    status = runner.status()
    assert status.sink_errors >= 3  # event 7 failed on every one of its 1 + max_retries tries
    if on_poison == "stop":
        assert letters == []
        assert status.last_error is not None and "PoisonEventError" in status.last_error
        assert 7 not in [e["documentKey"]["_id"] for _k, _t, e in listener.handled]
        return
    handled = sorted(e["documentKey"]["_id"] for _k, _t, e in listener.handled)
    assert handled == [i for i in range(21) if i != 7]
    assert len(letters) == 1
    letter = letters[0]
    assert letter["event"]["documentKey"]["_id"] == 7
    assert letter["attempts"] == 3  # 1 + max_retries
    assert letter["fencing_token"] == status.fencing_token and "poison" in letter["reason"]
    assert letter["_id"] == {"listener": listener.lease_name, "key": 7}
    assert letter["first_seen"] <= letter["last_seen"]
