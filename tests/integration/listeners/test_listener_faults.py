"""Faults on the stream itself (SecantusDB fail points): dropped connections and resumable errors
on getMore lose, skip and repeat nothing; a permission error fails fast with a clear message."""

from __future__ import annotations

import pytest

from singleton.service.dev.embedded import MongoServer, wait_until
from tests.integration.listener_support import (
    Scene,
    Writer,
    assert_monotonic,
    finish_writes,
    now,
    set_fail_point,
    wait_state,
)

FAULTS = {
    "close_connection": {"closeConnection": True},
    "resumable_error": {"errorCode": 91, "errorLabels": ["ResumableChangeStreamError"]},
    "cursor_not_found": {"errorCode": 43},
}


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_stream_faults_lose_nothing(fault: str, faulty_mongo: MongoServer, unique: str) -> None:
    scene = Scene.on(faulty_mongo.url, unique)
    listener = scene.listener("c")
    runner = scene.runner(listener).start()
    since = now(scene.client)
    writer = Writer(scene.coll("c"))
    try:
        wait_state(runner, "streaming")
        writer.start()
        for _ in range(3):  # three bursts of getMore failures, each more than pymongo's one retry
            seen = len(listener.keys())
            wait_until(lambda s=seen: len(listener.keys()) >= s + 30, 20, what="progress")
            data = {**FAULTS[fault], "failCommands": ["getMore", "aggregate"]}
            set_fail_point(scene.client, {"times": 3}, **data)
        wait_until(lambda: runner.status().reconnects >= 1, 20, what="a reconnect")
        set_fail_point(scene.client, "off")
        expected = finish_writes(writer, since, listener)
    finally:
        writer.stop_event.set()
        set_fail_point(scene.client, "off")
        runner.stop()
    keys = listener.keys()
    assert not set(expected) - set(keys), "events lost"
    # No event skipped: the handled sequence, duplicates removed, is the stream's order.
    first_seen = list(dict.fromkeys(k for k in keys if k in set(expected)))
    assert first_seen == expected
    # A reconnect resumes after the last batch this tenure delivered: it replays none of them.
    assert len(keys) == len(set(keys)), "a reconnect replayed events the tenure had delivered"
    assert_monotonic(scene.store.accepted)
    status = runner.status()
    assert status.state == "stopped"
    assert status.events_handled >= len(expected) and status.sink_errors == 0


def test_permission_error_fails_fast(faulty_mongo: MongoServer, unique: str) -> None:
    scene = Scene.on(faulty_mongo.url, unique)
    runner = scene.runner(scene.listener("c"))
    set_fail_point(scene.client, "alwaysOn", failCommands=["aggregate"], errorCode=13)
    try:
        runner.start()
        wait_state(runner, "failed")
        wait_until(lambda: not runner.elector.is_leader, 5, what="the lease resigned")
    finally:
        set_fail_point(scene.client, "off")
        runner.stop()
    status = runner.status()
    assert not status.ready and status.failure is not None and "changeStream" in status.failure
    assert status.last_error is not None
    assert "PermissionDeniedError" in status.last_error
    assert "changeStream" in status.last_error
    assert status.reconnects == 0
    assert status.last_outcome is not None
    assert (status.last_outcome.kind, status.last_outcome.retryable) == ("failed", False)


def test_a_server_slower_than_the_read_bound_is_read_with_a_longer_one(
    faulty_mongo: MongoServer, unique: str
) -> None:
    """Every getMore takes longer than the read bound (half the renew deadline): each timed-out
    read doubles the bound (up to ``open_timeout``), so the stream reads on instead of retrying
    the same read until the failure budget ends the tenure."""
    scene = Scene.on(faulty_mongo.url, unique)
    listener = scene.listener("c")
    runner = scene.runner(listener).start()
    try:
        wait_state(runner, "streaming")
        slow = 2.5 * runner.elector.renew_deadline / 2  # past the bound, within two doublings
        block = {"blockConnection": True, "blockTimeMS": int(slow * 1000)}
        set_fail_point(scene.client, "alwaysOn", failCommands=["getMore"], **block)
        scene.coll("c").insert_many([{"_id": i} for i in range(20)])
        wait_until(lambda: runner.status().reconnects >= 1, 20, what="a read that timed out")
        wait_until(lambda: len(set(listener.keys())) >= 20, 30, what="the events, read slowly")
    finally:
        set_fail_point(scene.client, "off")
        runner.stop()
    assert runner.status().state == "stopped"
