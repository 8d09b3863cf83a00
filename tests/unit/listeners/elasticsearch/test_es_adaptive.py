"""ElasticsearchSync's batch size adapts to its bulk requests: halved (once per request latency)
when a request is slow or pushed back, grown back in steps while they answer in time, never above
``batch_size`` nor below the floor, and capped so that a batch fits ``bulk_bytes``."""

from __future__ import annotations

import pytest

from listeners.elasticsearch import ElasticsearchSync
from listeners.elasticsearch.adaptive import FLOOR, BatchSizer
from singleton.errors import ConfigurationError
from singleton.testing import FakeClock


def _sizer(ceiling: int = 1000, max_bytes: int = 10_000_000) -> tuple[BatchSizer, FakeClock]:
    """A sizer, and the clock its requests are answered on (each observe says when)."""
    return BatchSizer(ceiling, target=1.0, max_bytes=max_bytes), FakeClock()


def test_a_healthy_sink_keeps_the_configured_size() -> None:
    sizer, clock = _sizer()
    for _ in range(50):
        sizer.observe(1000, 100_000, 0.1, False, clock.monotonic())
        clock.advance(0.1)
    assert sizer.size == 1000 and sizer.cuts == 0


def test_a_slow_or_pushing_back_sink_halves_the_size_once_per_latency_then_it_grows_back() -> None:
    sizer, clock = _sizer()
    sizer.observe(1000, 100_000, 2.5, False, clock.monotonic())  # slower than the 1 s target
    assert sizer.size == 500
    # in flight before the cut: no second cut
    sizer.observe(1000, 100_000, 2.5, False, clock.monotonic())
    assert sizer.size == 500
    clock.advance(2.6)
    sizer.observe(500, 50_000, 0.2, True, clock.monotonic())  # a 429, after one latency: cut again
    assert sizer.size == 250 and sizer.cuts == 2
    for _ in range(200):  # answered in time and at least half full: +1/20 of the ceiling each
        clock.advance(0.2)
        sizer.observe(sizer.size, sizer.size * 100, 0.2, False, clock.monotonic())
    assert sizer.size == 1000


def test_the_size_never_goes_below_the_floor_and_small_requests_do_not_grow_it() -> None:
    sizer, clock = _sizer()
    for _ in range(30):
        clock.advance(10)
        sizer.observe(10, 1_000, 30.0, True, clock.monotonic())
    assert sizer.size == FLOOR
    for _ in range(30):  # an idle stream's requests of 3 items say nothing about 1000
        sizer.observe(3, 300, 0.01, False, clock.monotonic())
    assert sizer.size == FLOOR
    tiny, tiny_clock = _sizer(ceiling=10)
    tiny.observe(10, 1_000, 30.0, True, tiny_clock.monotonic())
    assert tiny.size == tiny.floor == 10  # a batch_size below the floor is never cut


def test_a_batch_of_large_documents_fits_one_request() -> None:
    sizer, clock = _sizer(ceiling=1000, max_bytes=1_000_000)
    sizer.observe(
        100, 100 * 20_000, 0.3, False, clock.monotonic()
    )  # 20 KB per item: 50 fit in 1 MB
    assert sizer.size == 50


def test_the_listener_asks_its_sizer_and_the_options_are_checked() -> None:
    listener = ElasticsearchSync(database="d", collection="c", es="http://es:9200", batch_size=300)
    assert listener.next_batch_size() == 300  # before its first tenure, and when healthy
    fixed = ElasticsearchSync(
        database="d", collection="c", es="http://es:9200", adaptive_batch=False
    )
    assert fixed.next_batch_size() == fixed.batch_size
    with pytest.raises(ConfigurationError, match="target_bulk_seconds must be a number > 0, got 0"):
        ElasticsearchSync(database="d", collection="c", es="http://es:9200", target_bulk_seconds=0)
    with pytest.raises(ConfigurationError, match="adaptive_batch must be true or false, got 'no'"):
        ElasticsearchSync(database="d", collection="c", es="http://es:9200", adaptive_batch="no")
