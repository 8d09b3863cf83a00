"""A sink that refuses a whole batch document by document (a mass mapping conflict) dead-letters
it in one request to the store per bulk request, not one per document: 300 refusals, one
``update`` command to SecantusDB, 300 records, and one WARNING naming the first of them."""

from __future__ import annotations

import json
from typing import Any

import pymongo
from pymongo import monitoring

from listeners.deadletters import DeadLetterStore
from listeners.elasticsearch.bulk import BulkItem, BulkLimits, BulkWriter
from listeners.elasticsearch.deadletters import EsDeadLetters
from tests.integration.es_support import Tenures
from tests.integration.listener_support import LogCapture


class Updates(monitoring.CommandListener):
    def __init__(self) -> None:
        self.updates = 0

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        self.updates += event.command_name == "update"

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        pass

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        pass


class Refusing:
    """Answers every bulk request: each item refused, ``mapper_parsing_exception``."""

    description = "http://refusing:9200"

    def request(
        self, method: str, path: str, body: bytes | None = None, *, ndjson: bool = False
    ) -> tuple[int, Any]:
        lines = [json.loads(x) for x in (body or b"").splitlines()]
        n = len([x for x in lines if "index" in x or "delete" in x])
        error = {"type": "mapper_parsing_exception", "reason": "failed to parse field [n]"}
        return 200, {"errors": True, "items": [{"index": {"status": 400, "error": error}}] * n}

    def close(self) -> None:
        pass


def test_a_mass_refusal_is_dead_lettered_in_one_store_request(mongo_url: str, unique: str) -> None:
    updates = Updates()
    client: pymongo.MongoClient[dict[str, Any]] = pymongo.MongoClient(
        mongo_url, event_listeners=[updates]
    )
    store = DeadLetterStore(client, database=f"dl{unique}")
    ctx = Tenures(f"orders{unique}").next(client)
    dead = EsDeadLetters(store)
    limits = BulkLimits(1000, 10**7, 1.0, 1, 0.001, 0.002, retry_timeout=0.05)
    writer = BulkWriter(Refusing(), limits, on_dead=lambda letters: dead.put(letters, ctx))
    batch = [BulkItem("index", "orders", str(k), 1, b'{"n":"x"}') for k in range(300)]
    try:
        with LogCapture("WARNING") as logs:
            before = updates.updates
            writer.send(batch, lambda: None, lambda seconds: False)
            assert updates.updates - before == 1
        assert len(store.letters(ctx.listener_name)) == 300
        said = [m for m in logs.errors if "dead-lettering" in m]
        assert len(said) == 1 and said[0].startswith("bulk: dead-lettering 300 item(s)"), said
        assert "and 297 more" in said[0]
    finally:
        client.close()
