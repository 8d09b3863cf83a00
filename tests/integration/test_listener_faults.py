"""Faults on the stream itself (SecantusDB fail points): dropped connections and resumable errors
on getMore lose and skip nothing; a permission error fails fast with a clear message."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pymongo
import pytest

from singleton.service.embedded import MongoServer, wait_until
from singleton.testing import MemoryLeaseBackend
from tests.integration.listener_support import (
    Recorder,
    RecordingStore,
    Writer,
    assert_monotonic,
    make_runner,
    now,
    reference,
)


@pytest.fixture(scope="module")
def faulty_mongo() -> Iterator[MongoServer]:
    with MongoServer(test_commands=True) as server:
        yield server


def _fail(client: Any, mode: Any, **data: Any) -> None:
    client.admin.command(
        {"configureFailPoint": "failCommand", "mode": mode, "data": {"failCommands": [], **data}}
    )


FAULTS = {
    "close_connection": {"closeConnection": True},
    "resumable_error": {"errorCode": 91, "errorLabels": ["ResumableChangeStreamError"]},
    "cursor_not_found": {"errorCode": 43},
}


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_stream_faults_lose_nothing(fault: str, faulty_mongo: MongoServer, unique: str) -> None:
    url = faulty_mongo.url
    client: pymongo.MongoClient[dict[str, Any]] = pymongo.MongoClient(url, tz_aware=True)
    db = f"t{unique}"
    coll = client[db]["c"]
    store = RecordingStore(client, database=db)
    listener = Recorder(database=db, collection="c")
    runner = make_runner(url, db, MemoryLeaseBackend(), listener, "a", store).start()
    since = now(client)
    writer = Writer(coll)
    try:
        wait_until(lambda: runner.status()["state"] == "streaming", 10, what="streaming")
        writer.start()
        for _ in range(3):  # three bursts of getMore failures, each more than pymongo's one retry
            seen = len(listener.keys())
            wait_until(lambda s=seen: len(listener.keys()) >= s + 30, 20, what="progress")
            data = {**FAULTS[fault], "failCommands": ["getMore", "aggregate"]}
            _fail(client, {"times": 3}, **data)
        wait_until(lambda: runner.status()["reconnects"] >= 1, 20, what="a reconnect")
        writer.stop_event.set()
        writer.join(10)
        _fail(client, "off")
        expected = reference(coll, since)
        wait_until(lambda: set(expected) <= set(listener.keys()), 30, what="all handled")
    finally:
        writer.stop_event.set()
        _fail(client, "off")
        runner.stop()
    keys = listener.keys()
    assert not set(expected) - set(keys), "events lost"
    # No event skipped: the handled sequence, duplicates removed, is the stream's order.
    first_seen = list(dict.fromkeys(k for k in keys if k in set(expected)))
    assert first_seen == expected
    assert_monotonic(store.accepted)
    assert runner.status()["state"] == "stopped"


def test_permission_error_fails_fast(faulty_mongo: MongoServer, unique: str) -> None:
    url = faulty_mongo.url
    client: pymongo.MongoClient[dict[str, Any]] = pymongo.MongoClient(url, tz_aware=True)
    db = f"t{unique}"
    listener = Recorder(database=db, collection="c")
    runner = make_runner(url, db, MemoryLeaseBackend(), listener, "a")
    _fail(client, "alwaysOn", failCommands=["aggregate"], errorCode=13)
    try:
        runner.start()
        wait_until(lambda: runner.status()["state"] == "failed", 10, what="failed")
    finally:
        _fail(client, "off")
        runner.stop()
    status = runner.status()
    assert "PermissionDeniedError" in status["last_error"]
    assert "changeStream" in status["last_error"]
    assert status["reconnects"] == 0
