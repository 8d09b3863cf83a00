"""Errors that concern the whole request are about the sink, never about the documents: a 403
to everything fails the tenure (SinkRejectedError) and a 20 s pause is retried
(SinkUnavailableError) until it ends; neither dead-letters a single event. The poison handler
here is the one the runner delivers through; the loop around it stands for the runner's retry
in place."""

from __future__ import annotations

import time
from typing import Any

import pymongo
import pytest

from listeners.deadletters import DeadLetterStore, PoisonHandler
from listeners.elasticsearch import ElasticsearchSync
from listeners.elasticsearch.verify import compare
from singleton.drivers.mongo import cluster_time
from singleton.errors import SinkRejectedError, SinkUnavailableError
from tests.integration import es_support
from tests.integration.es_proxy import FORBIDDEN
from tests.integration.proxy import TcpProxy

PAUSE = 20.0


def _batches(coll: Any, start: Any) -> list[list[dict[str, Any]]]:
    es_support.put_marker(coll)
    return [b for b in es_support.events_until_marker(coll, start, batch_size=50)]


def _setup(
    client: pymongo.MongoClient[dict[str, Any]], unique: str, proxy: TcpProxy, **kw: Any
) -> tuple[Any, ElasticsearchSync, DeadLetterStore, Any]:
    db = f"es{unique}"
    coll = client[db]["docs"]
    dead = DeadLetterStore(client, database=f"dl{unique}")
    url = f"http://127.0.0.1:{proxy.port}"
    listener = ElasticsearchSync(
        database=db, collection="docs", es=url, dead_letters=dead, bulk_actions=40, **kw
    )
    return coll, listener, dead, es_support.Tenures(listener.lease_name).next(client)


def _handler(listener: ElasticsearchSync, dead: DeadLetterStore) -> PoisonHandler:
    return PoisonHandler(
        listener.handle_batch, dead, max_retries=2, policy="dead_letter", backoff=0.01
    )


def test_403_to_every_request_fails_the_tenure_and_dead_letters_nothing(
    client: pymongo.MongoClient[dict[str, Any]], es_url: str, unique: str
) -> None:
    host, port = es_url.removeprefix("http://").split(":")
    with TcpProxy(host, int(port)) as proxy:
        coll, listener, dead, ctx = _setup(client, unique, proxy)
        start = cluster_time(client)
        coll.insert_many([{"_id": i, "n": i} for i in range(200)])
        first, *rest = _batches(coll, start)
        handler = _handler(listener, dead)
        handler.deliver(first, ctx)  # the index exists; then the credentials are revoked
        proxy.refuse(FORBIDDEN)
        with pytest.raises(SinkRejectedError, match="403"):
            handler.deliver(rest[0], ctx)  # a bulk request
        fresh = ElasticsearchSync(
            database=listener.database, collection="docs", es=f"http://127.0.0.1:{proxy.port}"
        )
        with pytest.raises(SinkRejectedError, match="403"):
            _handler(fresh, dead).deliver(rest[0], ctx)  # the index check of a new tenure
        listener.close()
        fresh.close()
    assert handler.dead_lettered == 0
    assert dead.dead_letters.count_documents({}) == 0


def test_a_20_s_pause_is_retried_until_it_ends_and_dead_letters_nothing(
    client: pymongo.MongoClient[dict[str, Any]], es_url: str, unique: str
) -> None:
    host, port = es_url.removeprefix("http://").split(":")
    with TcpProxy(host, int(port)) as proxy:
        coll, listener, dead, ctx = _setup(
            client,
            unique,
            proxy,
            request_timeout=1.0,
            retry_timeout=2.0,
            backoff_base=0.05,
            backoff_max=0.5,
        )
        start = cluster_time(client)
        es_support.random_workload(client, coll, 600, seed=5, ids=200)
        batches = _batches(coll, start)
        handler = _handler(listener, dead)
        handler.deliver(batches[0], ctx)
        proxy.blackhole()
        paused_at = time.monotonic()
        unavailable = 0
        deadline = paused_at + PAUSE + 120
        for batch in batches[1:]:
            while True:  # the runner's retry in place, from the last checkpoint
                assert time.monotonic() < deadline, "never recovered"
                try:
                    handler.deliver(batch, ctx)
                    break
                except SinkUnavailableError:
                    unavailable += 1
                    if time.monotonic() - paused_at >= PAUSE:
                        proxy.restore()  # the pause ends once it lasted PAUSE seconds
        listener.close()
    assert unavailable >= 2, unavailable
    assert handler.dead_lettered == 0
    assert dead.dead_letters.count_documents({}) == 0
    diff = compare(coll, es_url, listener.index_name)
    assert diff.ok, diff
