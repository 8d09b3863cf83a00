"""An index deleted under a leader whose stream is idle (SecantusDB, osmem-server): no write
finds out, so the idle stream checks its aliases (``target_check_interval``). A lone listener
finds its alias gone and resyncs; of two partitions sharing an index, the one that writes
recreates it and copies its share, and the idle one finds the index behind the alias replaced
and copies its own share in place. Either way the index equals the collection again."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import Any

import pymongo

from listeners.checkpoints.stores import MongoCheckpointStore
from listeners.deadletters import DeadLetterStore
from listeners.elasticsearch import ElasticsearchSync
from listeners.elasticsearch.transport import connect
from listeners.elasticsearch.verify import compare
from listeners.runtime.runner import ListenerRunner
from listeners.stream.partition import Partition, partition_of
from singleton.service.dev.embedded import wait_until
from singleton.testing import MemoryLeaseBackend
from tests.integration.listener_support import LogCapture, make_runner


def _sync(db: str, es_url: str, part: Partition | None = None) -> ElasticsearchSync:
    listener = ElasticsearchSync(
        database=db, collection="docs", es=es_url, ttl=1.0, target_check_interval=0.5
    )
    listener.partition = part
    return listener


def _delete_behind(es_url: str, alias: str) -> None:
    """What an operator's ``DELETE /<physical index>`` does: the alias goes with it."""
    http = connect(es_url)
    try:
        status, body = http.request("GET", f"/_alias/{alias}")
        assert status == 200, body
        for physical in body:
            assert http.request("DELETE", f"/{physical}")[0] == 200
        assert http.request("GET", f"/_alias/{alias}")[0] == 404
    finally:
        http.close()


def _equal_within(coll: Any, es_url: str, alias: str, seconds: float) -> None:
    def equal() -> bool:
        try:
            return compare(coll, es_url, alias).ok
        except Exception:  # (the index is being recreated)
            return False

    try:
        wait_until(equal, seconds, interval=0.25, what="the index equal to the collection")
    except Exception:
        raise AssertionError(str(compare(coll, es_url, alias))) from None


def _run(
    mongo_url: str, db: str, listeners: list[ElasticsearchSync], body: Callable[[], None]
) -> list[ListenerRunner]:
    client: pymongo.MongoClient[dict[str, Any]] = pymongo.MongoClient(mongo_url)
    store = MongoCheckpointStore(client, database=db)
    backend = MemoryLeaseBackend()
    runners = [
        make_runner(mongo_url, db, backend, lst, f"r{n}", store).start()
        for n, lst in enumerate(listeners)
    ]
    try:
        for runner in runners:
            wait_until(lambda r=runner: r.status()["state"] == "streaming", 60, what="streaming")
        body()
    finally:
        for runner in runners:
            runner.stop()
        for lst in listeners:
            lst.close()
        client.close()
    return runners


def test_an_idle_leader_resyncs_an_index_deleted_under_it(
    mongo_url: str, es_url: str, docs: Any
) -> None:
    coll, db = docs, docs.database.name
    coll.insert_many([{"_id": i, "n": i} for i in range(300)])
    listener = _sync(db, es_url)
    alias = listener.index_name

    def body() -> None:
        _equal_within(coll, es_url, alias, 60)
        _delete_behind(es_url, alias)  # no write follows: only the idle check can see it
        _equal_within(coll, es_url, alias, 60)

    [runner] = _run(mongo_url, db, [listener], body)
    assert runner.status()["sink_lost"] == 1


def test_an_idle_partition_copies_its_share_again_when_another_recreated_the_index(
    mongo_url: str, es_url: str, docs: Any
) -> None:
    coll, db = docs, docs.database.name
    ids = list(range(400))
    coll.insert_many([{"_id": i, "n": i} for i in ids])
    listeners = [_sync(db, es_url, Partition(p, 2)) for p in range(2)]
    alias = listeners[0].index_name
    of_0 = next(f"w{n}" for n in range(1000) if partition_of(f"w{n}", 2) == 0)

    def body() -> None:
        _equal_within(coll, es_url, alias, 60)
        assert {partition_of(i, 2) for i in ids} == {0, 1}
        _delete_behind(es_url, alias)
        coll.insert_one({"_id": of_0, "n": -1})  # partition 0 writes, finds out, recreates
        _equal_within(coll, es_url, alias, 90)  # and partition 1, idle, copies its share

    runners = _run(mongo_url, db, listeners, body)
    assert [r.status()["sink_lost"] for r in runners] == [1, 1]


def test_a_partition_that_was_away_while_another_recreated_the_index_copies_its_share(
    mongo_url: str, es_url: str, docs: Any
) -> None:
    """Partition 1 does not run while its index is deleted and partition 0 recreates it: no
    write or idle check of its own saw the loss. Its next tenure finds the index behind the
    alias is not the one its copy went into (kept beside the checkpoint, by index.uuid)."""
    coll, db = docs, docs.database.name
    ids = list(range(400))
    coll.insert_many([{"_id": i, "n": i} for i in ids])
    alias = _sync(db, es_url).index_name
    of_0 = next(f"w{n}" for n in range(1000) if partition_of(f"w{n}", 2) == 0)
    zero = _sync(db, es_url, Partition(0, 2))
    client: pymongo.MongoClient[dict[str, Any]] = pymongo.MongoClient(mongo_url)
    store = MongoCheckpointStore(client, database=db)
    backend = MemoryLeaseBackend()
    first_one = _sync(db, es_url, Partition(1, 2))
    runners = [
        make_runner(mongo_url, db, backend, lst, f"r{n}", store).start()
        for n, lst in enumerate([zero, first_one])
    ]
    try:
        _equal_within(coll, es_url, alias, 60)
        # its copy checkpointed (a copy cut short is the other test's: it starts over)
        wait_until(lambda: store.load(first_one.lease_name) is not None, 60, what="1's checkpoint")
        runners[1].stop()  # partition 1 is away
        first_one.close()
        _delete_behind(es_url, alias)
        coll.insert_one({"_id": of_0, "n": -1})  # partition 0 writes, finds out, recreates
        wait_until(lambda: runners[0].status()["sink_lost"] == 1, 60, what="partition 0 resync")
        wait_until(
            lambda: runners[0].status()["state"] == "streaming", 60, what="partition 0 streaming"
        )
        assert not compare(coll, es_url, alias).ok  # partition 1's share is missing
        again = _sync(db, es_url, Partition(1, 2))
        runners[1] = make_runner(mongo_url, db, backend, again, "r1b", store).start()
        _equal_within(coll, es_url, alias, 90)
        assert runners[1].status()["sink_lost"] == 1
    finally:
        for runner in runners:
            runner.stop()
        zero.close()
        client.close()


def test_a_partition_copy_cut_short_resumes_only_into_the_index_it_began(
    mongo_url: str, es_url: str, docs: Any
) -> None:
    """Partition 1's copy is cut short (its tenure ends while a document of its share is being
    made: no checkpoint yet, only copy progress up to some ``_id``); then its index is deleted
    and partition 0 recreates it. Partition 1's next copy must not resume after that ``_id``:
    the documents before it went into the deleted index. It starts over, by index.uuid."""
    coll, db = docs, docs.database.name
    coll.insert_many([{"_id": i, "n": i} for i in range(400)])
    alias = _sync(db, es_url).index_name
    of_0 = next(f"w{n}" for n in range(1000) if partition_of(f"w{n}", 2) == 0)
    of_1 = sorted(i for i in range(400) if partition_of(i, 2) == 1)
    reached, unblock = threading.Event(), threading.Event()

    def hold_the_copy(doc: dict[str, Any]) -> dict[str, Any]:
        if doc["_id"] == of_1[120]:  # (well after the first settled batches)
            reached.set()
            unblock.wait(60)
        return doc

    zero = _sync(db, es_url, Partition(0, 2))
    first_one = ElasticsearchSync(
        database=db,
        collection="docs",
        es=es_url,
        ttl=1.0,
        target_check_interval=0.5,
        transform=hold_the_copy,
        copy_batch_size=20,
    )
    first_one.partition = Partition(1, 2)
    client: pymongo.MongoClient[dict[str, Any]] = pymongo.MongoClient(mongo_url)
    store = MongoCheckpointStore(client, database=db)
    backend = MemoryLeaseBackend()
    runners = [
        make_runner(mongo_url, db, backend, lst, f"r{n}", store).start()
        for n, lst in enumerate([zero, first_one])
    ]
    try:
        assert reached.wait(60), "partition 1's copy never reached the held document"
        progress = store.load_progress(first_one.lease_name) or {}
        assert "last_id" in progress, progress  # some of its copy is recorded as done
        stopping = threading.Thread(target=runners[1].stop)
        stopping.start()  # the drain waits for the held copy, then lets the lease go
        wait_until(lambda: not runners[1].elector.is_leader, 30, what="partition 1 released")
        unblock.set()
        stopping.join(30)
        assert store.load(first_one.lease_name) is None  # no checkpoint: the copy is unfinished
        first_one.close()
        wait_until(lambda: runners[0].status()["state"] == "streaming", 60, what="0 streaming")
        _delete_behind(es_url, alias)
        coll.insert_one({"_id": of_0, "n": -1})  # partition 0 writes, finds out, recreates
        wait_until(lambda: runners[0].status()["sink_lost"] == 1, 60, what="partition 0 resync")
        wait_until(lambda: runners[0].status()["state"] == "streaming", 60, what="0 streaming")
        again = _sync(db, es_url, Partition(1, 2))
        runners[1] = make_runner(mongo_url, db, backend, again, "r1b", store).start()
        _equal_within(coll, es_url, alias, 90)
    finally:
        unblock.set()
        for runner in runners:
            runner.stop()
        zero.close()
        client.close()


class _CheckedOnce(ElasticsearchSync):
    """A listener whose idle check of its alias has run (``checked``): with a long
    ``target_check_interval`` it does not run again, so only a write can find the loss."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs, target_check_interval=3600)
        self.checked = threading.Event()

    def on_idle(self, ctx: Any) -> None:
        super().on_idle(ctx)
        self.checked.set()


def _is_alias(es_url: str, alias: str) -> bool:
    http = connect(es_url)
    try:
        return http.request("GET", f"/_alias/{alias}")[0] == 200
    finally:
        http.close()


def test_deletes_alone_through_a_deleted_alias_are_not_acknowledged_into_a_new_plain_index(
    mongo_url: str, es_url: str, docs: Any
) -> None:
    """Elasticsearch creates a missing index for a delete with an external version, whatever
    ``require_alias`` says: once the index behind the alias is deleted, a bulk of deletes
    alone would be acknowledged into a new, plain index of the alias's name (and the rest of
    the documents lost from view, nothing said). The bulk asks where its deletes landed, and
    the listener resyncs: the alias is back and the index equals the collection."""
    coll, db = docs, docs.database.name
    coll.insert_many([{"_id": i, "n": i} for i in range(300)])
    listener = _CheckedOnce(database=db, collection="docs", es=es_url, ttl=1.0)
    alias = listener.index_name

    def body() -> None:
        _equal_within(coll, es_url, alias, 60)
        assert listener.checked.wait(30)
        _delete_behind(es_url, alias)
        for i in range(5):  # one at a time: each its own bulk of one delete
            coll.delete_one({"_id": i})
        _equal_within(coll, es_url, alias, 60)
        assert _is_alias(es_url, alias)  # not a plain index in its place

    with LogCapture() as logs:
        [runner] = _run(mongo_url, db, [listener], body)
    assert runner.status()["sink_lost"] == 1
    # said once, at ERROR, naming the alias and what happened to it
    lost = [m for m in logs.errors if "the sink lost what it held" in m]
    assert len(lost) == 1 and f"alias {alias} is gone" in lost[0], logs.errors


def test_deletes_alone_of_two_partitions_through_a_deleted_alias_put_the_alias_back(
    mongo_url: str, es_url: str, docs: Any
) -> None:
    """The same with two partitions sharing the index: the first delete makes the plain index,
    and the partitions' copies find it empty, so partition 0 puts the alias in its place (they
    would otherwise copy into the plain index and leave it there)."""
    coll, db = docs, docs.database.name
    ids = list(range(400))
    coll.insert_many([{"_id": i, "n": i} for i in ids])
    listeners = [_CheckedOnce(database=db, collection="docs", es=es_url, ttl=1.0) for _ in range(2)]
    for p, lst in enumerate(listeners):
        lst.partition = Partition(p, 2)
    alias = listeners[0].index_name
    gone = [next(i for i in ids if partition_of(i, 2) == p) for p in (0, 1)]

    def body() -> None:
        _equal_within(coll, es_url, alias, 60)
        assert all(lst.checked.wait(30) for lst in listeners)
        _delete_behind(es_url, alias)
        for i in gone:  # a delete of each partition's share
            coll.delete_one({"_id": i})
        _equal_within(coll, es_url, alias, 90)
        assert _is_alias(es_url, alias)

    runners = _run(mongo_url, db, listeners, body)
    assert [r.status()["sink_lost"] for r in runners] == [1, 1]


def test_a_resumed_tenure_does_not_take_an_empty_plain_index_for_its_alias(
    mongo_url: str, es_url: str, docs: Any
) -> None:
    """The listener is stopped, its index deleted, and a delete makes a plain index of the
    alias's name (what Elasticsearch does for a delete with an external version). The next
    tenure resumes from the checkpoint: an empty plain index where it wrote through an alias
    is not one of an earlier version to use as it is, and it resyncs."""
    coll, db = docs, docs.database.name
    coll.insert_many([{"_id": i, "n": i} for i in range(300)])
    first = _sync(db, es_url)
    alias = first.index_name
    _run(mongo_url, db, [first], lambda: _equal_within(coll, es_url, alias, 60))
    _delete_behind(es_url, alias)
    http = connect(es_url)
    try:
        line = {"delete": {"_index": alias, "_id": "1", "version": 9, "version_type": "external"}}
        status, _ = http.request(
            "POST", "/_bulk?require_alias=true", json.dumps(line).encode() + b"\n", ndjson=True
        )
        assert status == 200 and http.request("GET", f"/{alias}/_count")[1]["count"] == 0
    finally:
        http.close()
    assert not _is_alias(es_url, alias)  # a plain index now

    again = _sync(db, es_url)
    [runner] = _run(mongo_url, db, [again], lambda: _equal_within(coll, es_url, alias, 60))
    assert runner.status()["sink_lost"] == 1 and _is_alias(es_url, alias)


def test_a_closed_index_is_the_sink_s_failure_never_a_dead_letter_per_document(
    mongo_url: str, es_url: str, docs: Any
) -> None:
    """An operator closes the index behind the alias for a while under a streaming leader: every
    write meets ``index_closed_exception``. That is the sink's failure, retried (the issue saw
    400 dead letters and 200 missing documents); once it is open again the index equals the
    collection, and not one document was dead-lettered."""
    coll, db = docs, docs.database.name
    coll.insert_many([{"_id": i, "n": i} for i in range(200)])
    listener = _sync(db, es_url)
    alias = listener.index_name
    client: pymongo.MongoClient[dict[str, Any]] = pymongo.MongoClient(mongo_url)
    runner = make_runner(mongo_url, db, MemoryLeaseBackend(), listener, "r").start()
    http = connect(es_url)
    with LogCapture("WARNING") as logs:
        try:
            wait_until(lambda: runner.status()["state"] == "streaming", 60, what="streaming")
            _equal_within(coll, es_url, alias, 60)
            (physical,) = http.request("GET", f"/_alias/{alias}")[1]
            assert http.request("POST", f"/{physical}/_close")[0] == 200
            coll.insert_many([{"_id": 1000 + i, "n": i} for i in range(50)])
            coll.update_many({"_id": {"$lt": 50}}, {"$inc": {"n": 1000}})
            refused = "index_closed_exception"
            wait_until(lambda: any(refused in m for m in logs.errors), 30, what="writes refused")
            assert http.request("POST", f"/{physical}/_open")[0] == 200
            _equal_within(coll, es_url, alias, 90)
            assert DeadLetterStore(client, database=db).letters(listener.lease_name) == []
        finally:
            http.close()
            runner.stop()
            listener.close()
            client.close()
    retried = [m for m in logs.errors if refused in m]
    assert all("delivering to the listener failed" in m for m in retried), retried[:3]
