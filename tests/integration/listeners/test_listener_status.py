"""The runner's typed status and what is exported from it: every metric the service declares is
produced from a real runner's values, and ``as_dict()`` is JSON with the keys ``/status`` serves."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

from prometheus_client import CollectorRegistry

from singleton.service.dev.embedded import wait_until
from singleton.service.metrics import RUNNER_METRICS, ReplicaCollector
from singleton.service.replica import Hosted
from tests.integration.listener_support import Scene, wait_state


def test_status_feeds_every_declared_metric(mongo_url: str, unique: str) -> None:
    scene = Scene.on(mongo_url, unique)
    listener = scene.listener("m")
    runner = scene.runner(listener).start()
    registry = CollectorRegistry(auto_describe=False)
    replica: Any = SimpleNamespace(
        hosted=[Hosted(listener.lease_name, runner.elector, runner, listener)], jobs=None
    )
    registry.register(ReplicaCollector(replica))
    try:
        wait_state(runner, "streaming")
        scene.coll("m").insert_many([{"_id": i} for i in range(10)])
        wait_until(lambda: len(listener.keys()) == 10, 10, what="10 handled")
        wait_until(
            lambda: runner.status().checkpoint_age_seconds is not None, 10, what="checkpointed"
        )
        status = runner.status()
        samples = {
            s.name: s.value
            for family in registry.collect()
            for s in family.samples
            if s.labels.get("lease") == listener.lease_name
        }
    finally:
        runner.stop()
    for name, _doc, counter in RUNNER_METRICS.values():
        assert (f"{name}_total" if counter else name) in samples, f"{name} not produced"
    assert samples["singleton_events_processed_total"] == 10
    assert samples["singleton_sink_errors_total"] == 0
    assert samples["singleton_batch_latency_seconds_count"] >= 1  # a histogram of every batch
    assert samples["singleton_lag_seconds"] >= 0
    assert status.last_batch_seconds is not None and status.last_batch_seconds >= 0
    assert status.batch_size == samples["singleton_batch_size"] == listener.batch_size
    assert runner.status().batch_size is None  # the tenure ended: no reader asks
    assert status.leader and status.fencing_token is not None
    assert status.ready and status.listener_failed == 0 and status.failure is None


def test_as_dict_is_json_with_the_status_keys(mongo_url: str, unique: str) -> None:
    scene = Scene.on(mongo_url, unique)
    runner = scene.runner(scene.listener("j")).start()
    try:
        wait_until(lambda: runner.status().last_checkpoint_at is not None, 10, what="checkpoint")
    finally:
        runner.stop()
    body = json.loads(json.dumps(runner.status().as_dict()))
    keys = (
        "listener state leader fencing_token last_checkpoint_cluster_time last_checkpoint_at "
        "events_handled batches dead_lettered history_lost reconnects last_error standby "
        "last_outcome checkpoint_age_seconds ready failure failed_tenures batch_size"
    )
    for key in keys.split():
        assert key in body, key
    assert body["state"] == "stopped"
    assert body["last_outcome"] == {
        "kind": "completed",
        "reason": "released",
        "retryable": True,
        "fencing_token": body["fencing_token"],
    }
    assert body["ready"] is True and body["failure"] is None
