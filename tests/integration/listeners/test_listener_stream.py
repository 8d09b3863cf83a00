"""Stream edge cases against SecantusDB: an idle collection still advances the checkpoint, a
dropped collection invalidates and the stream continues with start_after, followers report
standby readiness, and the first start saves its position before handling anything."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from singleton.service.dev.embedded import MongoServer, wait_until
from tests.integration.listener_support import Scene, wait_state


@pytest.fixture(scope="module")
def heartbeat_mongo() -> Iterator[MongoServer]:
    """SecantusDB with periodic no-op oplog entries, as mongod writes every 10 s."""
    with MongoServer(extra_args=["--noop-heartbeat-seconds", "0.2"]) as server:
        yield server


def test_idle_stream_advances_checkpoint(heartbeat_mongo: MongoServer, unique: str) -> None:
    scene = Scene.on(heartbeat_mongo.url, unique)
    store = scene.store
    scene.coll("quiet").insert_one({"_id": 0})  # the collection exists but stays quiet
    listener = scene.listener("quiet")
    runner = scene.runner(listener).start()
    try:
        wait_until(lambda: len(store.accepted) >= 1, 10, what="first checkpoint")
        first = store.accepted[0]
        wait_until(
            lambda: (
                len({str(cp.resume_token) for cp in store.accepted}) >= 3
                and store.accepted[-1].cluster_time > first.cluster_time
            ),
            10,
            what="idle checkpoints advance",
        )
    finally:
        runner.stop()
    assert listener.keys() == [], "no events were written, none may be handled"
    status = runner.status()
    assert status.last_checkpoint_cluster_time is not None
    assert status.last_checkpoint_cluster_time > first.cluster_time
    assert status.events_handled == 0
    # The age compares cluster times only: an idle stream's checkpoint keeps up with it.
    assert status.checkpoint_age_seconds is not None and status.checkpoint_age_seconds <= 1
    assert status.as_dict()["last_checkpoint_cluster_time"] == [
        status.last_checkpoint_cluster_time.time,
        status.last_checkpoint_cluster_time.inc,
    ]


def test_first_start_saves_position_before_handling(mongo_url: str, unique: str) -> None:
    scene = Scene.on(mongo_url, unique)
    listener = scene.listener("c")
    listener.gate.clear()  # handle_batch blocks: the start position must be saved already
    runner = scene.runner(listener).start()
    try:
        wait_state(runner, "streaming")
        scene.coll("c").insert_one({"_id": 1})
        wait_until(listener.blocked.is_set, 10, what="handle_batch called")
        accepted = scene.store.accepted
        assert len(accepted) == 1 and accepted[0].resume_token is not None
    finally:
        listener.gate.set()
        runner.stop()
    assert listener.keys(), "the insert was handled"


def test_drop_invalidates_and_continues_with_start_after(mongo_url: str, unique: str) -> None:
    scene = Scene.on(mongo_url, unique)
    coll, store = scene.coll("doomed"), scene.store
    listener = scene.listener("doomed")
    runner = scene.runner(listener).start()
    try:
        wait_state(runner, "streaming")
        coll.insert_many([{"_id": i} for i in range(3)])
        wait_until(lambda: len(listener.keys()) == 3, 10, what="3 inserts handled")
        coll.drop()
        wait_until(lambda: len(listener.invalidated) == 1, 10, what="on_invalidate")
        wait_until(lambda: any(cp.start_after for cp in store.accepted), 10, what="saved")
        coll.insert_many([{"_id": i} for i in range(3, 6)])
        wait_until(
            lambda: sum(e["operationType"] == "insert" for _k, _t, e in listener.handled) == 6,
            10,
            what="inserts after the drop handled",
        )
    finally:
        runner.stop()
    ops = [e["operationType"] for _k, _t, e in listener.handled]
    assert ops.count("insert") == 6 and "invalidate" not in ops
    assert runner.status().state == "stopped"
    # The invalidate token was saved with start_after, and later positions moved on from it.
    marks = [i for i, cp in enumerate(store.accepted) if cp.start_after]
    assert marks and marks[0] < len(store.accepted) - 1
    assert not store.accepted[-1].start_after


def test_follower_reports_standby_readiness(mongo_url: str, unique: str) -> None:
    scene = Scene.on(mongo_url, unique)
    leader = scene.runner(scene.listener("s"), "a").start()
    wait_until(lambda: leader.status().last_checkpoint_cluster_time is not None, 10, what="cp")
    follower = scene.runner(scene.listener("s"), "b", standby_interval=0.2).start()
    try:
        wait_until(lambda: follower.status().standby.get("resumable") is True, 10, what="ready")
        standby = follower.status().standby
        assert standby["oplog_window_seconds"] is not None
        assert standby["oplog_headroom_seconds"] >= 0
        assert leader.status().standby == {"checked_at": None}  # the leader does not check
    finally:
        follower.stop()
        leader.stop()
