"""A checkpoint lost while every replica was down (a redeploy after an operator deleted it, or a
Redis checkpoint store restarted without persistence while the leases live in MongoDB): a new
runner, knowing nothing, finds the lease store's marker, logs one ERROR naming it and applies
``on_history_lost``. Without a marker (a first deployment) it starts without a word. Writing the
marker is best effort, and once per tenure."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from bson.timestamp import Timestamp

from listeners.checkpoints.stores import CheckpointStore, RedisCheckpointStore
from singleton.errors import BackendUnavailableError
from singleton.lease.contract import LeaseBackend
from singleton.lease.mongo import MongoLeaseBackend
from singleton.lease.redis import RedisLeaseBackend
from singleton.service.dev.embedded import wait_until
from singleton.testing import MemoryLeaseBackend
from tests.integration.listener_support import (
    LogCapture,
    Recorder,
    Scene,
    make_runner,
    wait_state,
)


@pytest.fixture
def lease_store(request: pytest.FixtureRequest, unique: str) -> Iterator[Any]:
    """``lease_store(kind)``: a new lease backend object on the test's keys, as a freshly
    started process would build it (nothing shared in memory with the earlier ones)."""
    made: list[LeaseBackend] = []

    def make(kind: str) -> LeaseBackend:
        backend: LeaseBackend
        if kind == "redis":
            url = request.getfixturevalue("redis_url")
            backend = RedisLeaseBackend(url, namespace=f"t{unique}")
        else:
            url = request.getfixturevalue("mongo_url")
            backend = MongoLeaseBackend(url, database=f"t{unique}")
        made.append(backend)
        return backend

    yield make
    for b in made:
        b.close()


def _ids(listener: Recorder) -> set[Any]:
    return {e["documentKey"]["_id"] for _k, _t, e in listener.handled}


def _checkpoint_then_stop(scene: Scene, leases: LeaseBackend, store: CheckpointStore) -> int:
    """Replica A streams, handles 5 events, checkpoints and stops (releasing): its token."""
    listener = scene.listener("d")
    a = make_runner(scene.url, scene.db, leases, listener, "a", store)
    try:
        a.start()
        wait_state(a, "streaming")
        scene.coll("d").insert_many([{"_id": i} for i in range(5)])
        wait_until(lambda: len(listener.keys()) == 5, 10, what="5 handled by A")
        token = a.status().fencing_token
        assert token is not None
    finally:
        a.stop()
    assert store.load(listener.lease_name) is not None
    return token


@pytest.mark.parametrize(
    ("kind", "loss", "policy"),
    [
        ("redis", "deleted", "resume_from_now"),
        ("mongo", "deleted", "fail"),
        ("mongo", "redis restarted", "resume_from_now"),
    ],
)
def test_a_checkpoint_lost_while_every_replica_was_down_is_noticed(
    kind: str, loss: str, policy: str, lease_store: Any, redis_url: str, mongo_url: str, unique: str
) -> None:
    scene = Scene.on(mongo_url, unique)
    store: CheckpointStore = scene.store
    if loss == "redis restarted":
        store = RedisCheckpointStore(redis_url, namespace=f"c{unique}")
    a_token = _checkpoint_then_stop(scene, lease_store(kind), store)
    name = scene.listener("d").lease_name
    a_first = min(cp.cluster_time for cp in scene.store.accepted) if store is scene.store else None
    if loss == "deleted":
        store.delete(name)  # an operator removes the record
    else:
        with redis.Redis.from_url(redis_url) as r:
            r.flushall()  # Redis came back without its data
    assert store.load(name) is None
    scene.coll("d").insert_many([{"_id": i} for i in range(5, 10)])  # written in the gap

    leases = lease_store(kind)  # a new process: no memory of A's checkpoints
    marker = leases.recall(name)
    assert marker["checkpointed"] == "1" and marker["token"] == str(a_token)
    b_listener = scene.listener("d", on_history_lost=policy)
    b = make_runner(scene.url, scene.db, leases, b_listener, "b", store)
    with LogCapture() as logs:
        try:
            b.start()
            if policy == "fail":

                def resigned() -> bool:
                    return b.status().failure is not None and not b.elector.is_leader

                wait_until(resigned, 10, what="B failed and resigned")
            else:
                wait_state(b, "streaming")
                scene.coll("d").insert_one({"_id": 10})
                wait_until(lambda: 10 in _ids(b_listener), 10, what="B handles new writes")
            status = b.status()
        finally:
            b.stop()
            store.close()
    gone = f"checkpoint of {name} disappeared: the lease store ({leases.describe()}) records one"
    assert logs.errors and gone in logs.errors[0], logs.errors
    assert f"saved by token {a_token} at Timestamp(" in logs.errors[0]
    gaps = list(scene.coll("gaps").find())
    if policy == "fail":  # one ERROR per failed tenure, each naming the marker
        assert all(gone in m for m in logs.errors), logs.errors
        assert status.failure is not None and gone in status.failure
        assert status.last_outcome is not None and not status.last_outcome.retryable
        assert _ids(b_listener) == set() and gaps == []
        return
    assert len(logs.errors) == 1 and status.failure is None and status.history_lost == 1
    assert _ids(b_listener) == {10}  # 5..9 fell into the gap, which is on record:
    assert len(gaps) == 1 and gone in gaps[0]["reason"]
    assert status.fencing_token is not None and status.fencing_token > a_token
    assert gaps[0]["fencing_token"] == status.fencing_token
    since = gaps[0]["from_cluster_time"]  # the marker's time: A's first save, whole seconds
    assert since == Timestamp(int(marker["at"]), 0) and gaps[0]["to_cluster_time"] > since
    if a_first is not None:
        assert since == Timestamp(a_first.time, 0)


@pytest.mark.parametrize("kind", ["redis", "mongo"])
def test_a_first_deployment_starts_without_error_and_leaves_a_marker(
    kind: str, lease_store: Any, mongo_url: str, unique: str
) -> None:
    scene = Scene.on(mongo_url, unique)
    leases = lease_store(kind)
    listener = scene.listener("d", on_history_lost="fail")
    runner = make_runner(scene.url, scene.db, leases, listener, "a", scene.store)
    with LogCapture() as logs:
        try:
            runner.start()
            wait_state(runner, "streaming")
            scene.coll("d").insert_many([{"_id": i} for i in range(3)])
            wait_until(lambda: len(listener.keys()) == 3, 10, what="3 handled")
            wait_until(lambda: leases.recall(runner.name) != {}, 10, what="the marker")
            status = runner.status()
        finally:
            runner.stop()
    assert logs.errors == [] and status.history_lost == 0 and status.failure is None
    assert list(scene.coll("gaps").find()) == []
    marker = leases.recall(runner.name)
    first = scene.store.accepted[0]
    assert marker == {
        "checkpointed": "1",
        "token": str(status.fencing_token),
        "at": str(first.cluster_time.time),
    }


class FlakyMarkers(MemoryLeaseBackend):
    """A lease store whose ``remember`` fails (storing nothing) until ``healthy`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.healthy = threading.Event()
        self.failures = 0

    def remember(self, name: str, facts: Any) -> None:
        if not self.healthy.is_set():
            self.failures += 1
            raise BackendUnavailableError("remember: the lease store does not answer")
        super().remember(name, facts)


def test_the_marker_is_best_effort_and_written_once_per_tenure(mongo_url: str, unique: str) -> None:
    scene = Scene.on(mongo_url, unique)
    scene.backend = leases = FlakyMarkers()
    listener = scene.listener("d")
    runner = scene.runner(listener, idle_checkpoint_interval=0.05)
    coll = scene.coll("d")

    def handled_and_saved(i: int) -> None:
        """Write event ``i`` and wait for the checkpoint that follows it once caught up."""
        done = len(scene.store.accepted)
        coll.insert_one({"_id": i})
        wait_until(lambda: len(scene.store.accepted) > done, 10, what=f"a save after event {i}")

    def writes() -> int:
        return leases.calls.count(("remember", runner.name))

    with LogCapture("WARNING") as logs:
        try:
            runner.start()
            wait_state(runner, "streaming")
            for i in range(3):
                handled_and_saved(i)
            assert leases.recall(runner.name) == {}
            leases.healthy.set()
            wait_until(lambda: leases.recall(runner.name) != {}, 10, what="the marker written")
            written = writes()
            for i in range(3, 6):
                handled_and_saved(i)
            status = runner.status()
        finally:
            runner.stop()
    assert leases.failures >= 3  # retried after each save until it worked, then once:
    assert written == writes() == 1
    assert status.failure is None and status.state == "streaming" and len(listener.keys()) == 6
    warnings = [m for m in logs.errors if "checkpoint marker not recorded" in m]
    assert len(warnings) == 1, logs.errors  # the first failure; later ones at DEBUG
