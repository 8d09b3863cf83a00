"""ElasticsearchSync's window of bulk requests in flight (:mod:`listeners.elasticsearch.window`)
against SecantusDB and osmem-server, with one bulk request held (and then answered, or failed)
by a gate in front of the transport: what ``handle_batch`` and ``flush`` acknowledge never passes
a request still in flight or failed, whatever completed after it. Synchronised on events, never
on time."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pymongo
import pytest

from listeners.elasticsearch import ElasticsearchSync
from listeners.elasticsearch.transport import connect
from listeners.elasticsearch.verify import compare
from singleton.drivers.mongo import cluster_time
from singleton.errors import SinkRejectedError
from tests.integration import es_support

WAIT = 60.0  # bounds every wait on an event: a hang fails the test instead of blocking it


class GatedTransport:
    """A transport that numbers the bulk requests, holds the ones in ``hold`` until their
    ``release`` event is set (answering 403 for those in ``fail``), and says when each bulk
    started and finished."""

    def __init__(self, es_url: str, hold: set[int], fail: set[int] = frozenset()) -> None:  # type: ignore[assignment]
        self._es = connect(es_url, maxsize=8)
        self.description = self._es.description
        self.hold, self.fail = hold, fail
        self._lock = threading.Lock()
        self._n = 0
        self.started = {i: threading.Event() for i in range(64)}
        self.finished = {i: threading.Event() for i in range(64)}
        self.release = {i: threading.Event() for i in range(64)}

    def request(
        self, method: str, path: str, body: bytes | None = None, *, ndjson: bool = False
    ) -> tuple[int, Any]:
        if not path.split("?")[0].endswith("/_bulk"):
            return self._es.request(method, path, body, ndjson=ndjson)
        with self._lock:
            n, self._n = self._n, self._n + 1
        self.started[n].set()
        try:
            if n in self.hold:
                assert self.release[n].wait(WAIT), f"bulk {n} never released"
            if n in self.fail:
                return 403, {"error": {"type": "security_exception", "reason": "gate"}}
            return self._es.request(method, path, body, ndjson=ndjson)
        finally:
            self.finished[n].set()

    def close(self) -> None:
        self._es.close()


@pytest.fixture(scope="module")
def client() -> Iterator[pymongo.MongoClient[dict[str, Any]]]:
    with es_support.own_client() as c:
        yield c


def _three_batches(coll: Any, client: Any) -> list[list[dict[str, Any]]]:
    start = cluster_time(client)
    coll.insert_many([{"_id": i, "n": i} for i in range(30)])
    es_support.put_marker(coll)
    events = [e for batch in es_support.events_until_marker(coll, start) for e in batch]
    return [events[:10], events[10:20], events[20:]]


def _listener(db: str, gate: GatedTransport) -> ElasticsearchSync:
    return ElasticsearchSync(database=db, collection="docs", es=gate, concurrency=2)


def test_what_is_acknowledged_waits_for_a_bulk_still_in_flight(
    client: pymongo.MongoClient[dict[str, Any]], es_url: str, docs: Any
) -> None:
    gate = GatedTransport(es_url, hold={1})
    listener = _listener(docs.database.name, gate)
    ctx = es_support.Tenures(listener.lease_name).next(client)
    b1, b2, b3 = _three_batches(docs, client)
    listener.on_start(ctx)  # a tenure the runner drives: requests stay in flight
    acked = listener.handle_batch(b1, ctx)  # bulk 0
    assert acked is not None
    assert gate.finished[0].wait(WAIT)
    acked += listener.handle_batch(b2, ctx) or 0  # bulk 1: held by the gate, in flight
    assert gate.started[1].wait(WAIT)
    acked += listener.handle_batch(b3, ctx) or 0  # bulk 2 completes while bulk 1 is held
    assert gate.finished[2].wait(WAIT)
    assert not gate.finished[1].is_set()
    acked += listener.flush(ctx.clock.monotonic(), ctx) or 0  # what is done by now
    assert acked <= len(b1), acked  # more would count bulk 2's events past bulk 1's
    gate.release[1].set()
    assert acked + (listener.flush(None, ctx) or 0) == len(b1) + len(b2) + len(b3)
    assert compare(docs, es_url, listener.index_name).ok
    listener.close()
    gate.close()


def test_a_failed_bulk_in_the_window_is_never_acknowledged(
    client: pymongo.MongoClient[dict[str, Any]], es_url: str, docs: Any
) -> None:
    gate = GatedTransport(es_url, hold={1}, fail={1})
    listener = _listener(docs.database.name, gate)
    ctx = es_support.Tenures(listener.lease_name).next(client)
    b1, b2, b3 = _three_batches(docs, client)
    listener.on_start(ctx)
    acked = listener.handle_batch(b1, ctx) or 0
    assert gate.finished[0].wait(WAIT)
    acked += listener.handle_batch(b2, ctx) or 0  # bulk 1: held, then refused
    assert gate.started[1].wait(WAIT)
    acked += listener.handle_batch(b3, ctx) or 0  # bulk 2 succeeds
    assert gate.finished[2].wait(WAIT)
    assert acked <= len(b1), acked
    gate.release[1].set()
    with pytest.raises(SinkRejectedError):
        listener.flush(None, ctx)
    # The window was dropped with the error: nothing after b1 is ever acknowledged from it.
    assert listener.flush(None, ctx) == 0
    listener.close()
    gate.close()
