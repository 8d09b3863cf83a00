"""The sink's deadlines on the injected clock: a :class:`FakeClock` alone decides when a failing
item is given up, when a partial bulk request goes out, and when a handover stops waiting for the
window. No test here waits for real time to pass."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from listeners.elasticsearch.bulk import BulkItem, BulkLimits, BulkWriter
from listeners.elasticsearch.window import BulkWindow
from singleton.errors import SinkUnavailableError
from singleton.testing import FakeClock

WAIT = 30.0  # bounds every real wait on an event: a hang fails the test instead of blocking it


class Answering:
    """Answers each bulk request with ``status`` for every item; holds a request while
    ``hold`` is clear."""

    description = "http://fake:9200"

    def __init__(self, status: int = 201) -> None:
        self.status = status
        self.requests = 0
        self.hold = threading.Event()
        self.hold.set()
        self.held = threading.Event()

    def request(
        self, method: str, path: str, body: bytes | None = None, *, ndjson: bool = False
    ) -> tuple[int, Any]:
        self.requests += 1
        if not self.hold.is_set():
            self.held.set()
            assert self.hold.wait(WAIT), "a held request was never released"
        n = (body or b"").count(b'"_index"')
        return 200, {"errors": True, "items": [{"index": {"status": self.status}}] * n}

    def close(self) -> None:
        pass


def _items(n: int) -> list[BulkItem]:
    return [BulkItem("index", "i", str(k), 1, b"{}") for k in range(n)]


def _limits(**kw: Any) -> BulkLimits:
    values: dict[str, Any] = {
        "bulk_actions": 100,
        "bulk_bytes": 10**6,
        "flush_interval": 1.0,
        "concurrency": 2,
        "backoff_base": 0.5,
        "backoff_max": 2.0,
        "retry_timeout": 30.0,
    }
    return BulkLimits(**{**values, **kw})


def test_a_failing_item_is_given_up_when_retry_timeout_has_passed_on_the_clock() -> None:
    clock = FakeClock(start=5_000_000.0)
    transport = Answering(status=429)
    writer = BulkWriter(transport, _limits(), on_dead=lambda _d: None, clock=clock)
    waited: list[float] = []

    def wait_fn(seconds: float) -> bool:  # the backoff's wait: only the fake clock moves
        assert len(waited) < 1000, "the retry deadline never came on the fake clock"
        waited.append(seconds)
        clock.advance(seconds)
        return False

    started = clock.monotonic()
    with pytest.raises(SinkUnavailableError, match=r"still failing after 30\.0 s"):
        writer.send(_items(3), lambda: None, wait_fn)
    elapsed = clock.monotonic() - started
    # Retried until the first attempt at or after the deadline, never beyond one more backoff.
    assert elapsed - waited[-1] < 30.0 <= elapsed, (elapsed, waited)
    assert transport.requests == len(waited) + 1
    assert writer.stats.unavailable == 1


def test_a_partial_request_goes_out_once_flush_interval_has_passed_on_the_clock() -> None:
    clock = FakeClock()
    transport = Answering()
    writer = BulkWriter(
        transport, _limits(concurrency=1, flush_interval=1.0), on_dead=lambda _d: None, clock=clock
    )
    session = writer.session(lambda: None, lambda _s: False)
    first, second, third = _items(3)
    session.add(first)
    clock.advance(0.999)
    session.add(second)
    assert transport.requests == 0  # two items, younger than flush_interval: still buffered
    clock.advance(0.001)
    session.add(third)
    assert transport.requests == 1  # the buffer's first item is flush_interval old: sent


def test_a_handover_stops_waiting_for_the_window_at_its_deadline_on_the_clock() -> None:
    clock = FakeClock(start=5_000_000.0)  # far from the real monotonic clock either way
    transport = Answering()
    writer = BulkWriter(transport, _limits(), on_dead=lambda _d: None, clock=clock)
    window = BulkWindow(writer, max_requests=2, max_bytes=10**6, clock=clock)
    try:
        window.open()
        window.submit(_items(2), lambda: None, lambda _s: False)
        window.close(2)
        assert window.flush() == 2  # answered: the batch's two events are acknowledged
        transport.hold.clear()
        window.open()
        window.submit(_items(3), lambda: None, lambda _s: False)
        window.close(3)
        assert transport.held.wait(WAIT)  # the request is in the sink's hands
        deadline = clock.monotonic() + 0.25
        answers: list[int] = []
        flushing = threading.Thread(target=lambda: answers.append(window.flush(deadline)))
        flushing.start()
        clock.advance(0.25)  # the deadline passes on the injected clock only
        flushing.join(WAIT)
        assert not flushing.is_alive(), "the flush waited past its deadline"
        assert answers == [0]  # nothing past the held request is acknowledged
    finally:
        transport.hold.set()
    assert window.flush() == 3
    writer.close()
