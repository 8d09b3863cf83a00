"""A window wired to the tenure's drain flag (``on_handover``) waits on its requests alone: the
drain interrupts a wait for room at once, even one that was just about to start, and the window
looks at ``stop()`` again. ``IDLE_POLL`` is set to an hour here, so a wait that the drain did not
interrupt would outlast every bound below (``WAIT``) and fail the test instead of passing late.
And :class:`DrainFlag` itself: hooks run once as it is set, late ones at once, a raising hook
stops neither the drain nor the other hooks."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from listeners.base import DrainFlag, ListenerContext
from listeners.elasticsearch import window as window_module
from listeners.elasticsearch.bulk import BulkWriter
from listeners.elasticsearch.window import BulkWindow
from listeners.runtime.handover import HandoverInterrupted
from tests.unit.listeners.elasticsearch.test_es_clock import WAIT, Answering, _items, _limits


@pytest.fixture(autouse=True)
def _no_ceiling(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(window_module, "IDLE_POLL", 3600.0)


def _full_window(drain: DrainFlag) -> tuple[BulkWindow, Answering, BulkWriter]:
    """A window of one request, that request held by the sink."""
    transport = Answering()
    writer = BulkWriter(transport, _limits(), on_dead=lambda _d: None)
    window = BulkWindow(writer, max_requests=1, max_bytes=10**6, on_handover=drain.when_set)
    transport.hold.clear()
    window.open()
    window.submit(_items(2), lambda: None, lambda _s: False)
    assert transport.held.wait(WAIT)
    return window, transport, writer


def _waiting_for_room(
    window: BulkWindow, stop: Callable[[], bool]
) -> tuple[threading.Thread, list[BaseException]]:
    raised: list[BaseException] = []

    def submit() -> None:
        try:
            window.submit(_items(2), lambda: None, lambda _s: False, stop)
        except BaseException as exc:
            raised.append(exc)

    worker = threading.Thread(target=submit)
    worker.start()
    return worker, raised


def test_the_drain_interrupts_a_wait_for_room_at_once() -> None:
    drain = DrainFlag()
    window, transport, writer = _full_window(drain)
    looked = threading.Event()

    def stop() -> bool:
        looked.set()
        return drain.is_set()

    try:
        worker, raised = _waiting_for_room(window, stop)
        assert looked.wait(WAIT)  # it looked once, found no drain, and waits for room
        drain.set()
        worker.join(WAIT)
        assert not worker.is_alive(), "the drain did not interrupt the wait for room"
        assert [type(e) for e in raised] == [HandoverInterrupted]
        assert transport.requests == 1  # the waiting batch never went out
    finally:
        transport.hold.set()
        window.end()
        writer.close()


def test_a_drain_that_begins_just_before_the_wait_is_not_missed() -> None:
    """The drain sets the flag (and interrupts) right after the loop looked at ``stop()`` and
    before the wait starts: the wait looks at ``stop()`` again after arming itself."""
    drain = DrainFlag()
    window, transport, writer = _full_window(drain)
    calls = 0

    def stop() -> bool:
        nonlocal calls
        calls += 1
        if calls == 1:
            drain.set()  # between the loop's look and the wait
            return False
        return drain.is_set()

    try:
        worker, raised = _waiting_for_room(window, stop)
        worker.join(WAIT)
        assert not worker.is_alive(), "a drain that began before the wait was missed"
        assert [type(e) for e in raised] == [HandoverInterrupted]
    finally:
        transport.hold.set()
        window.end()
        writer.close()


def test_an_ended_window_is_no_longer_interrupted() -> None:
    drain = DrainFlag()
    interrupts: list[int] = []
    window = BulkWindow(
        BulkWriter(Answering(), _limits(), on_dead=lambda _d: None),
        max_requests=1,
        max_bytes=10**6,
        on_handover=drain.when_set,
    )
    window.interrupt = lambda: interrupts.append(1)  # type: ignore[method-assign]
    window.end()
    drain.set()
    assert interrupts == []


def test_drain_flag_hooks_run_once_late_ones_at_once_and_a_raising_one_stops_nothing() -> None:
    drain = DrainFlag()
    calls: list[str] = []

    def boom() -> None:
        calls.append("boom")
        raise RuntimeError("a broken hook")

    drain.when_set(boom)
    drain.when_set(lambda: calls.append("second"))
    removed = drain.when_set(lambda: calls.append("removed"))
    removed()
    drain.set()
    assert drain.is_set() and calls == ["boom", "second"]
    drain.when_set(lambda: calls.append("late"))
    assert calls == ["boom", "second", "late"]


def test_a_context_with_a_plain_event_cannot_notify_and_says_so() -> None:
    ctx = ListenerContext.__new__(ListenerContext)
    ctx.draining = threading.Event()
    assert ctx.on_handover(lambda: None) is None
    ctx.draining = DrainFlag()
    assert ctx.on_handover(lambda: None) is not None
