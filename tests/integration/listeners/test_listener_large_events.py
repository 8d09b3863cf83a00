"""A change event over 16 MB (SecantusDB's ``failCommand`` fail point answering ``getMore`` with
BSONObjectTooLarge, 10334, as a real mongod does for such an event): the tenure reads on from its
checkpoint without the large fields, then with them again, and never fails on it; only when the
reduced read fails the same way does the tenure fail, saying why."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pymongo.errors import OperationFailure

from listeners.base import ChangeEvent
from listeners.stream.large_events import reduced_pipeline
from singleton.drivers.mongo import classify
from singleton.service.dev.embedded import MongoServer, wait_until
from tests.integration.listener_support import (
    LogCapture,
    Recorder,
    Scene,
    failed_lines,
    resigned,
    set_fail_point,
    wait_state,
)

TOO_LARGE = {"failCommands": ["getMore"], "errorCode": 10334}
PROJECTION = {
    "$project": {"fullDocument": 0, "fullDocumentBeforeChange": 0, "updateDescription": 0}
}


def by_document(listener: Recorder) -> dict[Any, list[ChangeEvent]]:
    """Every handled event, by the ``_id`` of its document, in handling order."""
    out: dict[Any, list[ChangeEvent]] = {}
    with listener.lock:
        for _key, _token, event in listener.handled:
            out.setdefault(event["documentKey"]["_id"], []).append(event)
    return out


def test_too_large_is_its_own_kind_and_the_projection_precedes_the_split_stage() -> None:
    assert classify(OperationFailure("BSONObjectTooLarge", 10334)) == "too_large"
    split: Mapping[str, Any] = {"$changeStreamSplitLargeEvent": {}}
    match: Mapping[str, Any] = {"$match": {"operationType": "insert"}}
    assert reduced_pipeline([match, split], PROJECTION) == [match, PROJECTION, split]
    assert reduced_pipeline([match], PROJECTION) == [match, PROJECTION]
    assert Recorder(database="d", collection="c").large_event_projection() == PROJECTION


def test_a_too_large_event_is_read_without_its_large_fields(
    faulty_mongo: MongoServer, unique: str
) -> None:
    scene = Scene.on(faulty_mongo.url, unique)
    coll = scene.coll("c")
    listener = scene.listener("c")
    runner = scene.runner(listener)
    cs = [f"c{i}" for i in range(5)]
    with LogCapture("INFO") as logs:
        try:
            runner.start()
            wait_state(runner, "streaming")
            token = runner.status().fencing_token
            coll.insert_one({"_id": "a", "v": 1})
            wait_until(lambda: "a" in by_document(listener), 10, what="a handled")
            # Hold the runner inside handle_batch("b") while the next events and the fail point
            # are put in place, so that its next getMore is the one that fails, on the c events.
            listener.gate.clear()
            coll.insert_one({"_id": "b", "v": 1})
            assert listener.blocked.wait(10)
            for doc_id in cs:
                coll.insert_one({"_id": doc_id, "v": 1})
            set_fail_point(scene.client, {"times": 1}, **TOO_LARGE)
            listener.gate.set()
            wait_until(lambda: set(cs) <= set(by_document(listener)), 10, what="c handled")
            wait_until(
                lambda: any("reading full events again" in m for m in logs.errors),
                10,
                what="reduced mode over",
            )
            coll.insert_one({"_id": "d", "v": 1})
            wait_until(lambda: "d" in by_document(listener), 10, what="d handled")
            status = runner.status()
        finally:
            set_fail_point(scene.client, "off")
            runner.stop()
    handled = by_document(listener)
    assert list(handled) == ["a", "b", *cs, "d"]  # every event, in order, none skipped
    for doc_id in ("a", "b", "d"):  # read normally: with their document
        assert handled[doc_id][0]["fullDocument"] == {"_id": doc_id, "v": 1}
    for doc_id in cs:  # the batch the server could not send: without its large fields
        assert all("fullDocument" not in e for e in handled[doc_id]), handled[doc_id]
    warnings = [m for m in logs.errors if "over 16 MB" in m]
    assert len(warnings) == 1, logs.errors
    assert f"listener={listener.lease_name} token={token} position=Timestamp(" in warnings[0]
    assert not [m for m in logs.errors if "listener failed" in m]
    # The same tenure goes on, and spent no failure budget: no retry in place, no reconnect.
    assert status.state == "streaming" and status.fencing_token == token
    assert status.failure is None and status.last_outcome is None
    assert status.reconnects == 0 and status.failed_tenures == 0


def test_a_reduced_read_that_fails_the_same_way_fails_the_tenure(
    faulty_mongo: MongoServer, unique: str
) -> None:
    scene = Scene.on(faulty_mongo.url, unique)
    runner = scene.runner(scene.listener("c"))
    with LogCapture("WARNING") as warned, resigned(scene, runner, **TOO_LARGE) as logs:
        status = runner.status()
    failed = failed_lines(logs)
    assert failed, logs.errors
    assert failed[0]["retryable"] == "False"
    assert failed[0]["reason"].startswith("EventTooLargeError: ")
    assert (
        "over 16 MB even without the fields large_event_projection() removes"
        in (failed[0]["reason"])
    )
    first_warning = next(m for m in warned.errors if "over 16 MB" in m)
    assert f"token={failed[0]['token']} " in first_warning  # reduced first, then failed
    assert status.last_outcome is not None
    assert (status.last_outcome.kind, status.last_outcome.retryable) == ("failed", False)
    assert status.failure is not None and "16 MB" in status.failure
    assert status.reconnects == 0  # never retried in place: the same read would fail again
