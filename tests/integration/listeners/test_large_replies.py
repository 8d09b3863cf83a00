"""Events each under 16 MB that together overflow one ``getMore`` reply (SecantusDB packs up to
``batchSize`` of them: 6 x 12 MB is 75 MB, over pymongo's 48 MB message limit, a
``ProtocolError`` that retrying the same read only repeats): the tenure halves its ``getMore``
batch size until the reply fits, says so once per halving, and delivers every event, in order,
without spending its failure budget."""

from __future__ import annotations

from typing import Any

import pymongo

from singleton.service.dev.embedded import MongoServer, wait_until
from singleton.testing import MemoryLeaseBackend
from tests.integration.listener_support import LogCapture, Recorder, make_runner, wait_state

BLOB = 12 * 1024 * 1024


def test_a_reply_over_the_message_limit_halves_the_getmore_batch(
    faulty_mongo: MongoServer, unique: str
) -> None:
    # A SecantusDB of this module's own: 72 MB of events in the shared one's oplog would slow
    # every later change stream opened on it.
    mongo_url, db = faulty_mongo.url, f"big{unique}"
    client: pymongo.MongoClient[dict[str, Any]] = pymongo.MongoClient(mongo_url)
    listener = Recorder(database=db, collection="blobs", failure_budget=5.0)
    listener.batch_size = 8
    runner = make_runner(mongo_url, db, MemoryLeaseBackend(), listener, "r")
    with LogCapture("WARNING") as logs:
        runner.start()
        try:
            wait_state(runner, "streaming", timeout=30)
            listener.gate.clear()  # the sink holds the first batch: no getMore meanwhile
            client[db].blobs.insert_one({"_id": -1})
            assert listener.blocked.wait(30)
            for i in range(6):  # the backlog the next getMore returns at once
                client[db].blobs.insert_one({"_id": i, "blob": "x" * BLOB})
            listener.gate.set()
            wait_until(lambda: len(listener.handled) >= 7, 120, what="every large event")
            assert runner.status().ready and runner.status().failed_tenures == 0
        finally:
            runner.stop()
            client.close()
    ids = [e["documentKey"]["_id"] for _, _, e in listener.handled]
    assert ids == list(range(-1, 6)), ids
    halved = [m for m in logs.errors if "over the driver's message limit" in m]
    assert halved and "batches of 4 events (was 8)" in halved[0], logs.errors
