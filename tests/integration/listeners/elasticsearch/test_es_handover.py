"""A batch that waits on Elasticsearch stops as soon as a planned handover begins, whether its
requests were pipelined or sent one batch at a time: ``handle_batch`` raises
``HandoverInterrupted`` while the sink still holds the request (the successor replays it). With
the runner's drain flag (a :class:`DrainFlag`) the drain interrupts the wait itself: the window's
polls are set to an hour here, so only the interrupt can end it in time. With a plain event the
window looks at it every ``POLL`` seconds."""

from __future__ import annotations

import threading
from typing import Any

import pymongo
import pytest

from listeners.base import DrainFlag, ListenerContext
from listeners.elasticsearch import window
from listeners.runtime.handover import HandoverInterrupted
from singleton.drivers.mongo import cluster_time
from tests.integration import es_support
from tests.integration.es_proxy import BulkHoldingProxy


@pytest.mark.parametrize("flag", [DrainFlag, threading.Event])
@pytest.mark.parametrize("pipelined", [False, True])
def test_a_batch_waiting_on_the_sink_stops_when_a_handover_begins(
    pipelined: bool,
    flag: type[threading.Event],
    client: pymongo.MongoClient[dict[str, Any]],
    es_url: str,
    docs: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if flag is DrainFlag:
        monkeypatch.setattr(window, "IDLE_POLL", 3600.0)
        monkeypatch.setattr(window, "POLL", 3600.0)
    coll = docs
    start = cluster_time(client)
    coll.insert_many([{"_id": i, "n": i} for i in range(30)])
    batch = next(es_support.events_until_marker(coll, start, batch_size=30, timeout=30))
    with BulkHoldingProxy(es_url) as proxy:
        # a full window: the batch waits for room (pipelined) or for its answer (not)
        listener, base = es_support.sync_with_tenure(
            client, coll, proxy.url, concurrency=1, bulk_actions=10, pipelined=pipelined
        )
        draining = flag()
        ctx = ListenerContext(
            base.leadership, client, base.logger, base.listener_name, draining=draining
        )
        listener.on_start(ctx)  # the runner's tenure: pipelined unless told otherwise
        raised: list[BaseException] = []

        def handle() -> None:
            try:
                listener.handle_batch(batch, ctx)
            except BaseException as exc:
                raised.append(exc)

        worker = threading.Thread(target=handle)
        worker.start()
        assert proxy.held.acquire(timeout=30)  # a bulk request is in the sink's hands
        draining.set()
        worker.join(30)
        try:
            assert not worker.is_alive() and [type(e) for e in raised] == [HandoverInterrupted]
            assert not proxy.release.is_set()  # ended while the request was still held
        finally:
            proxy.release.set()
            listener.close()
