"""Fencing when a store loses its data (real servers).

The lease store wiped (Redis FLUSHALL): the deposed leader keeps acting until its next renew,
and once advanced the checkpoint after the new leader had loaded it, so the new leader stopped on
"position would move back". A tenure now *claims* the checkpoint: the deposed leader's later
writes are refused, and the new tenure is never refused for the position it found.

The checkpoint store wiped (the record deleted while replicas run): a replica that had seen the
checkpoint says so at its next claim (one ERROR) and applies ``on_history_lost`` instead of
silently starting from now.
"""

from __future__ import annotations

from typing import Any

import pymongo
import pytest
import redis
from bson.timestamp import Timestamp

from listeners import Checkpoint, CheckpointStore, MongoCheckpointStore, RedisCheckpointStore
from singleton.errors import StaleWriterError
from singleton.service.dev.embedded import wait_until
from tests.integration.listener_support import (
    LogCapture,
    Scene,
    SyncingRecorder,
    assert_monotonic,
    now,
    wait_resigned,
    wait_state,
)

DEPLOYMENT = {"listener": "tests:L", "namespace": "d.c", "sink": ""}


@pytest.fixture(params=["mongo", "redis"])
def store(request: pytest.FixtureRequest, unique: str) -> CheckpointStore:
    if request.param == "mongo":
        url = request.getfixturevalue("mongo_url")
        client: pymongo.MongoClient[dict[str, Any]] = pymongo.MongoClient(url, tz_aware=True)
        return MongoCheckpointStore(client, database=f"t{unique}")
    url = request.getfixturevalue("redis_url")
    return RedisCheckpointStore(redis.Redis.from_url(url), namespace=f"t{unique}")


def test_a_late_writer_is_refused_after_the_claim(store: CheckpointStore) -> None:
    """The FLUSHALL interleaving on each real store: A saves, B (newer) claims, A saves later
    (ahead of what B found): refused; B saving the position it found is accepted."""
    store.save(Checkpoint("n", {"_data": "a1"}, Timestamp(10, 0), 5, "a"))
    found = store.claim("n", 9, "b", DEPLOYMENT)
    assert found is not None and found.cluster_time == Timestamp(10, 0)
    with pytest.raises(StaleWriterError):
        store.save(Checkpoint("n", {"_data": "a2"}, Timestamp(12, 0), 5, "a"))
    with pytest.raises(StaleWriterError):
        store.claim("n", 5, "a", DEPLOYMENT)  # nor may it claim again
    store.save(Checkpoint("n", found.resume_token, found.cluster_time, 9, "b"))
    store.save(Checkpoint("n", {"_data": "b1"}, Timestamp(11, 0), 9, "b"))
    cp = store.load("n")
    assert cp is not None and (cp.cluster_time, cp.fencing_token) == (Timestamp(11, 0), 9)


def test_after_a_lease_store_wipe_the_deposed_leader_cannot_strand_the_new_one(
    mongo_url: str, unique: str
) -> None:
    scene = Scene.on(mongo_url, unique)
    coll = scene.coll("e")
    a_listener, b_listener = scene.listener("e"), scene.listener("e")
    a = scene.runner(a_listener, "a").start()
    b = scene.runner(b_listener, "b")
    try:
        wait_state(a, "streaming")
        coll.insert_many([{"_id": i} for i in range(5)])
        wait_until(lambda: len(a_listener.keys()) == 5, 10, what="5 handled by A")
        wait_until(lambda: a.status().checkpoint_age_seconds == 0, 10, what="A checkpointed")
        a_ld = a.elector.leadership
        assert a_ld is not None
        a_listener.gate.clear()  # A pauses inside handle_batch (a GC pause, a stalled sink)
        coll.insert_one({"_id": 5})
        assert a_listener.blocked.wait(10)
        scene.backend.reset()  # FLUSHALL: the lease and its counter are gone
        a.elector.stop(release=False, timeout=5)  # A is out of the race (it is paused anyway)
        b.start()
        wait_state(b, "streaming")  # B was elected and claimed
        b_token = b.status().fencing_token
        assert b_token is not None and b_token > a_ld.token
        # A wakes up between its lease check and its write: the write it makes is refused.
        late = Checkpoint(a.name, {"_data": "late"}, now(scene.client), a_ld.token, a_ld.holder)
        with pytest.raises(StaleWriterError):
            scene.store.save(late)
        a_listener.gate.set()
        coll.insert_many([{"_id": i} for i in range(6, 12)])
        wait_until(lambda: len(b_listener.keys()) >= 7, 10, what="B handled 5..11")
        wait_until(lambda: b.status().checkpoint_age_seconds == 0, 10, what="B checkpointed")
        status = b.status()
    finally:
        a_listener.gate.set()
        b.stop()
        a.stop()
    assert status.fencing_token == b_token, "B's tenure ended: it was refused"
    assert status.failure is None and status.last_error is None and status.state == "streaming"
    assert {e["documentKey"]["_id"] for _k, _t, e in b_listener.handled} >= set(range(5, 12))
    assert_monotonic(scene.store.accepted)
    assert all(
        cp.fencing_token == b_token for cp in scene.store.accepted if cp.holder != a_ld.holder
    )


@pytest.mark.parametrize("policy", ["resume_from_now", "resync", "fail"])
def test_a_checkpoint_that_disappears_is_noticed(policy: str, mongo_url: str, unique: str) -> None:
    scene = Scene.on(mongo_url, unique)
    coll = scene.coll("d")
    a_listener = scene.listener("d", SyncingRecorder, on_history_lost=policy)
    b_listener = scene.listener("d", SyncingRecorder, on_history_lost=policy)
    a = scene.runner(a_listener, "a").start()
    b = scene.runner(b_listener, "b", standby_interval=0.1)
    with LogCapture() as logs:
        try:
            wait_state(a, "streaming")
            b.start()
            coll.insert_many([{"_id": i} for i in range(5)])
            wait_until(lambda: len(a_listener.keys()) == 5, 10, what="5 handled by A")
            wait_until(lambda: b.last_seen.checkpoint is not None, 10, what="B saw a checkpoint")
            a.stop(release=False)  # A drains and saves; its lease runs out in ttl
            seen = b.last_seen.checkpoint
            scene.store.delete(a.name)  # the checkpoint store loses the record
            coll.insert_many([{"_id": i} for i in range(5, 10)])  # written in the gap
            if policy == "fail":
                wait_resigned(scene, b)
            else:
                wait_state(b, "streaming")
                coll.insert_one({"_id": 10})
                wait_until(lambda: 10 in _ids(b_listener), 10, what="B handles new writes")
            status = b.status()
        finally:
            b.stop()
            a.stop()
    assert seen is not None
    # B's standby check may have seen a later save of A's than ``seen``; never a later one.
    a_last = max(cp.cluster_time for cp in scene.store.accepted if cp.holder.startswith("a"))
    gone = f"checkpoint of {a.name} disappeared: last seen at Timestamp("
    gaps = list(scene.coll("gaps").find())
    if policy == "fail":
        assert status.failure is not None and gone in status.failure
        assert status.last_outcome is not None and not status.last_outcome.retryable
        assert [m for m in logs.errors if "disappeared" in m] == logs.errors[:1]
        assert b_listener.syncs == 0 and gaps == []
        return
    assert [m for m in logs.errors if gone in m] == logs.errors, logs.errors
    assert len(logs.errors) == 1 and status.failure is None and status.history_lost == 1
    if policy == "resync":
        assert b_listener.syncs == 1 and gaps == []
    else:  # the events 5..9 are not handled, but the gap that holds them is on record
        assert b_listener.syncs == 0 and len(gaps) == 1
        assert seen.cluster_time <= gaps[0]["from_cluster_time"] <= a_last
        assert gaps[0]["to_cluster_time"] > seen.cluster_time and gone in gaps[0]["reason"]
        assert gaps[0]["fencing_token"] == status.fencing_token


def _ids(listener: SyncingRecorder) -> set[Any]:
    return {e["documentKey"]["_id"] for _k, _t, e in listener.handled}
