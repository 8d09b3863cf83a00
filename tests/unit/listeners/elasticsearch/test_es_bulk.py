"""The bulk writer's error model on a scripted transport: whole-request failures are the sink's
(transient or permanent, never a dead letter); only document-level item rejections are."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from listeners.elasticsearch.bulk import BulkItem, BulkLimits, BulkWriter, DeadLetter
from singleton.errors import (
    EsUnavailableError,
    SinkLostError,
    SinkRejectedError,
    SinkUnavailableError,
)

Answer = Callable[[list[dict[str, Any]]], tuple[int, Any]]


class Scripted:
    """Answers each bulk request with the next function of ``script`` (the last one repeats)."""

    description = "http://scripted:9200"

    def __init__(self, *script: Answer) -> None:
        self.script = list(script)
        self.requests = 0

    def request(
        self, method: str, path: str, body: bytes | None = None, *, ndjson: bool = False
    ) -> tuple[int, Any]:
        import json

        lines = [json.loads(x) for x in (body or b"").splitlines()]
        actions = [x for x in lines if "index" in x or "delete" in x]
        answer = self.script[min(self.requests, len(self.script) - 1)]
        self.requests += 1
        return answer(actions)

    def close(self) -> None:
        pass


def items(status: int, error: str = "", reason: str = "r") -> Answer:
    def answer(actions: list[dict[str, Any]]) -> tuple[int, Any]:
        result = {"status": status, "error": {"type": error, "reason": reason}} if error else {}
        return 200, {"items": [{"index": {"status": status, **result}} for _ in actions]}

    return answer


def whole(status: int) -> Answer:
    return lambda actions: (status, {"error": {"type": "x", "reason": "y"}})


def unreachable(actions: list[dict[str, Any]]) -> tuple[int, Any]:
    raise EsUnavailableError("connection refused")


def run(transport: Scripted, n: int = 3) -> list[DeadLetter]:
    dead: list[DeadLetter] = []
    limits = BulkLimits(100, 10**6, 1.0, 1, 0.001, 0.002, retry_timeout=0.05)
    writer = BulkWriter(transport, limits, on_dead=dead.extend)
    batch = [BulkItem("index", "i", str(k), 1, b"{}") for k in range(n)]
    writer.send(batch, lambda: None, lambda seconds: False)
    return dead


@pytest.mark.parametrize("status", [400, 401, 403, 404, 413])
def test_a_refused_request_is_permanent_and_dead_letters_nothing(status: int) -> None:
    with pytest.raises(SinkRejectedError, match=f"HTTP {status}"):
        run(Scripted(whole(status)))


@pytest.mark.parametrize("answer", [whole(429), whole(503), whole(500), unreachable, items(429)])
def test_an_unavailable_sink_is_transient_after_the_retry_window(answer: Answer) -> None:
    transport = Scripted(answer)
    with pytest.raises(SinkUnavailableError):
        run(transport)
    assert transport.requests >= 2  # retried within the window first


def test_transient_failures_are_retried_until_they_pass() -> None:
    assert run(Scripted(unreachable, whole(503), items(429), items(201))) == []


def test_item_refusals_of_our_credentials_fail_the_tenure() -> None:
    with pytest.raises(SinkRejectedError):
        run(Scripted(items(403, "security_exception")))


def test_an_index_gone_under_the_listener_is_a_lost_sink_not_a_dead_letter() -> None:
    with pytest.raises(SinkLostError, match="gone under the listener"):
        run(Scripted(items(404, "index_not_found_exception")))


@pytest.mark.parametrize(
    "item",
    [
        items(400, "index_closed_exception"),
        items(403, "cluster_block_exception"),
        items(429, "cluster_block_exception"),
        items(400, "illegal_argument_exception", "no write index is defined for alias [i]"),
    ],
)
def test_refusals_every_document_meets_are_the_sink_s_failure_never_dead_letters(
    item: Answer,
) -> None:
    """A closed index, a block, an alias without a write index: retried as a sink that is down
    (the tenure's budget bounds it), never one dead letter per document."""
    with pytest.raises(SinkUnavailableError):
        run(Scripted(item))


def test_only_document_rejections_are_dead_lettered() -> None:
    dead = run(Scripted(items(400, "mapper_parsing_exception")))
    assert [(d.item.doc_id, d.status) for d in dead] == [("0", 400), ("1", 400), ("2", 400)]


def test_an_answer_without_errors_counts_every_item_and_one_with_errors_is_read_per_item() -> None:
    """``errors: false`` (what the ``filter_path`` asks for) settles the request at once; with
    ``errors: true`` each item's status decides (a 409 is a conflict, never written)."""
    observed: list[tuple[int, bool]] = []

    def writer(answer: Answer) -> BulkWriter:
        limits = BulkLimits(100, 10**6, 1.0, 1, 0.001, 0.002, retry_timeout=0.05)
        return BulkWriter(
            Scripted(answer),
            limits,
            on_dead=lambda letters: None,
            observe=lambda items, nbytes, seconds, back, at: observed.append((items, back)),
        )

    batch = [BulkItem("index", "i", str(k), 1, b"{}") for k in range(3)]

    def clean(actions: list[dict[str, Any]]) -> tuple[int, Any]:
        return 200, {"errors": False, "items": [{"index": {"status": 201}} for _ in actions]}

    ok = writer(clean)
    ok.send(batch, lambda: None, lambda seconds: False)
    assert (ok.stats.written, ok.stats.conflicts) == (3, 0)

    def one_conflict(actions: list[dict[str, Any]]) -> tuple[int, Any]:
        answers = [
            {"index": {"status": 201}},
            {"index": {"status": 409}},
            {"index": {"status": 200}},
        ]
        return 200, {"errors": True, "items": answers}

    mixed = writer(one_conflict)
    mixed.send(batch, lambda: None, lambda seconds: False)
    assert (mixed.stats.written, mixed.stats.conflicts) == (2, 1)
    assert observed == [(3, False), (3, False)]  # each request told to the batch sizer


def test_an_answer_orjson_refuses_is_still_read() -> None:
    from listeners.elasticsearch.transport import _decode

    assert _decode(b'{"a": [1, 2]}') == {"a": [1, 2]}
    odd = _decode(b'{"n": NaN, "v": 9223372036854775807}')  # orjson refuses NaN: json reads it
    assert odd["v"] == 2**63 - 1 and odd["n"] != odd["n"]
    assert _decode(b"<html>bad gateway</html>")["error"]["type"] == "unparseable_response"


def test_an_all_written_answer_is_counted_not_parsed() -> None:
    from listeners.elasticsearch.transport import _decode

    body = b'{"errors":false,"items":[' + b",".join([b'{"index":{"status":201}}'] * 3) + b"]}"
    assert _decode(body) == {"errors": False, "items": [None] * 3}
    # ... but an answer that says more (an item's physical index, a server that ignores
    # filter_path) is read whole
    landed = b'{"errors":false,"items":[{"index":{"_index":"i-1","status":201}}]}'
    assert _decode(landed) == {
        "errors": False,
        "items": [{"index": {"_index": "i-1", "status": 201}}],
    }
    assert _decode(b'{"errors":true,"items":[{"index":{"status":409}}]}')["errors"] is True


def landed(where: dict[str, str]) -> Answer:
    """Each action written into ``where[its target]`` (the physical index behind its alias)."""

    def answer(actions: list[dict[str, Any]]) -> tuple[int, Any]:
        out = []
        for action in actions:
            op, meta = next(iter(action.items()))
            out.append({op: {"status": 201, "_index": where[meta["_index"]]}})
        return 200, {"errors": False, "items": out}

    return answer


def watched_writer(transport: Scripted) -> BulkWriter:
    limits = BulkLimits(100, 10**6, 1.0, 1, 0.001, 0.002, retry_timeout=0.05)
    writer = BulkWriter(transport, limits, on_dead=lambda dead: None)
    writer.watched = {"orders": frozenset({"orders-1"}), "customers": frozenset({"customers-1"})}
    return writer


def test_a_mixed_bulk_checks_each_item_against_its_own_alias() -> None:
    """A shaped listener's bulk mixes aliases: an item landing in its own alias's index is no
    replacement, whatever alias the batch began with."""
    writer = watched_writer(Scripted(landed({"orders": "orders-1", "customers": "customers-1"})))
    batch = [BulkItem("index", alias, "1", 1, b"{}") for alias in ("orders", "customers")]
    writer.send(batch, lambda: None, lambda seconds: False)
    assert writer.stats.written == 2


def test_a_write_landing_outside_its_alias_is_a_lost_sink() -> None:
    writer = watched_writer(Scripted(landed({"orders": "orders-1", "customers": "customers-2"})))
    batch = [BulkItem("index", alias, "1", 1, b"{}") for alias in ("orders", "customers")]
    with pytest.raises(
        SinkLostError, match="customers now points to customers-2, not to customers-1"
    ):
        writer.send(batch, lambda: None, lambda seconds: False)


def test_a_block_every_document_meets_is_retried_at_warning() -> None:
    """A full disk's flood-stage block answers 429 per item: retried (it lifts once there is
    room), but each retry says so at WARNING, where an operator looks, not at INFO."""
    said: list[tuple[str, str]] = []

    class Log:
        def info(self, text: str, *args: Any) -> None:
            said.append(("INFO", text.format(*args)))

        def warning(self, text: str, *args: Any) -> None:
            said.append(("WARNING", text.format(*args)))

    limits = BulkLimits(100, 10**6, 1.0, 1, 0.001, 0.002, retry_timeout=5.0)
    blocked = items(
        429,
        "cluster_block_exception",
        "index [i] blocked by: [TOO_MANY_REQUESTS/12/disk usage exceeded flood-stage watermark]",
    )
    writer = BulkWriter(
        Scripted(blocked, items(429), items(201)), limits, on_dead=lambda d: None, logger=Log()
    )
    writer.send([BulkItem("index", "i", "1", 1, b"{}")], lambda: None, lambda seconds: False)
    assert [level for level, _ in said] == ["WARNING", "INFO"]  # then a plain 429: INFO
    assert "flood-stage" in said[0][1] and "free the disk" in said[0][1]
