"""Poison is proven by a neighbour (``listeners.deadletters.PoisonHandler``, no backend): an event
is dead-lettered only when the listener handles the events after it right after it failed alone;
a failure that every event meets is the listener's (``ListenerFailing``, for the tenure to retry
within its budget) and dead-letters nothing; events are handled in order, each once."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest
from loguru import logger

from listeners.base import ChangeEvent, ListenerContext
from listeners.deadletters import MAX_SUSPECTS, ListenerFailing, PoisonHandler
from singleton.election.leadership import Leadership
from singleton.errors import PoisonEventError, SinkRejectedError, SinkUnavailableError
from singleton.lease.contract import Lease
from singleton.testing import FakeClock


def ev(i: int) -> ChangeEvent:
    return {"_id": {"_data": f"{i:04d}"}, "documentKey": {"_id": i}, "operationType": "insert"}


class Sink:
    """A listener's ``handle_batch``: fails a call holding a ``poison`` id, or every call while
    ``down``; ``script`` (a call's ids -> an exception or None) overrides both."""

    def __init__(self, poison: Sequence[int] = ()) -> None:
        self.poison = set(poison)
        self.down = False
        self.handled: list[int] = []
        self.calls: list[list[int]] = []
        self.script: Callable[[list[int]], Exception | None] | None = None

    def __call__(self, events: Sequence[ChangeEvent], ctx: ListenerContext) -> None:
        ids = [e["documentKey"]["_id"] for e in events]
        self.calls.append(ids)
        error = self.script(ids) if self.script is not None else None
        if error is None and self.down:
            error = RuntimeError("downstream down")
        if error is None and self.poison & set(ids):
            error = ValueError(f"poison in {ids}")
        if error is not None:
            raise error
        self.handled.extend(ids)


class Letters:
    """Stands for the dead-letter store: ``put`` records (id, tries)."""

    def __init__(self) -> None:
        self.put_: list[tuple[int, int]] = []

    def put(self, event: ChangeEvent, error: BaseException, attempts: int, ctx: Any) -> None:
        self.put_.append((event["documentKey"]["_id"], attempts))


class Retries:
    """The tenure's side, scripted: counts the retries (no wait), proofs and tracebacks."""

    def __init__(self) -> None:
        self.retried: list[str] = []
        self.progressed_ = 0
        self.raised_: list[str] = []

    def retry(self, error: Exception, what: str, ctx: ListenerContext) -> None:
        self.retried.append(what)

    def progressed(self) -> None:
        self.progressed_ += 1

    def raised(self, error: Exception, where: str) -> None:
        self.raised_.append(where)


def ctx() -> ListenerContext:
    clock = FakeClock()
    ld = Leadership(Lease("n", "me/1", 7, 10.0), "me", clock.monotonic() + 100, clock)
    client: Any = None
    return ListenerContext(
        leadership=ld, client=client, logger=logger, listener_name="n", clock=clock
    )


def handler(
    sink: Sink, *, max_retries: int = 3, policy: str = "dead_letter"
) -> tuple[PoisonHandler, Letters, Retries, list[int]]:
    letters, retries, reached = Letters(), Retries(), []
    h = PoisonHandler(
        sink,
        letters,  # type: ignore[arg-type]
        max_retries=max_retries,
        policy=policy,
        retries=retries,
        reached=lambda e: reached.append(e["documentKey"]["_id"]),
    )
    return h, letters, retries, reached


def test_a_batch_that_succeeds_is_one_call_and_reaches_nothing_itself() -> None:
    sink = Sink()
    h, letters, _retries, reached = handler(sink)
    h.deliver([ev(i) for i in range(8)], ctx())
    assert sink.calls == [list(range(8))] and letters.put_ == [] and reached == []


def test_a_poison_event_among_good_neighbours_is_dead_lettered_alone() -> None:
    sink = Sink(poison=[5])
    h, letters, retries, reached = handler(sink)
    h.deliver([ev(i) for i in range(8)], ctx())
    assert sink.handled == [0, 1, 2, 3, 4, 6, 7]  # in order, each once
    # Tried alone 1 + max_retries times: twice before its neighbours, once right after them.
    assert letters.put_ == [(5, 4)]
    assert len(retries.retried) == 2 and "alone" in retries.retried[0]
    assert retries.progressed_ == 1
    assert reached[-1] == 7 and reached == sorted(reached)
    assert [c for c in sink.calls if c == [5]] == [[5]] * 4


def test_an_outage_dead_letters_nothing_and_says_it_is_the_listener() -> None:
    sink = Sink()
    sink.down = True
    h, letters, retries, reached = handler(sink)
    with pytest.raises(ListenerFailing, match="downstream down") as failing:
        h.deliver([ev(i) for i in range(64)], ctx())
    assert isinstance(failing.value.error, RuntimeError)
    assert letters.put_ == [] and sink.handled == [] and reached == []
    # Bounded: the split to the first event, its retries, then a few more events alone.
    assert len(sink.calls) <= 7 + 2 + 2 * MAX_SUSPECTS
    assert retries.progressed_ == 0 and retries.raised_


def test_an_outage_that_starts_mid_batch_dead_letters_nothing() -> None:
    sink = Sink()
    h, letters, _retries, reached = handler(sink)
    sink.script = lambda ids: RuntimeError("down from 20") if max(ids) >= 20 else None
    with pytest.raises(ListenerFailing):
        h.deliver([ev(i) for i in range(40)], ctx())
    assert letters.put_ == []
    assert sink.handled == list(range(20)) and reached[-1] == 19  # a retry starts at 20


def test_a_lone_event_that_fails_is_the_listeners_failure_until_a_neighbour_is_handled() -> None:
    sink = Sink(poison=[1])
    h, letters, _retries, _reached = handler(sink)
    with pytest.raises(ListenerFailing):
        h.deliver([ev(1)], ctx())
    assert letters.put_ == []
    h.deliver([ev(1), ev(2)], ctx())  # the retry, once a later event came
    assert letters.put_ == [(1, 4)] and sink.handled == [2]


def test_a_run_of_poison_events_is_dead_lettered_once_an_event_after_it_is_handled() -> None:
    sink = Sink(poison=[3, 4, 5])
    h, letters, _retries, _reached = handler(sink)
    h.deliver([ev(i) for i in range(10)], ctx())
    assert [i for i, _tries in letters.put_] == [3, 4, 5]
    assert sink.handled == [0, 1, 2, 6, 7, 8, 9]


def test_a_run_longer_than_max_suspects_is_taken_for_the_listener() -> None:
    sink = Sink(poison=range(1, MAX_SUSPECTS + 2))
    h, letters, _retries, _reached = handler(sink)
    with pytest.raises(ListenerFailing):
        h.deliver([ev(i) for i in range(MAX_SUSPECTS + 4)], ctx())
    assert letters.put_ == [] and sink.handled == [0]


def test_an_outage_that_ends_before_the_last_try_dead_letters_nothing() -> None:
    """The event failed alone while the sink was down, the sink came back for its neighbour:
    the last try alone succeeds, so it is handled (after the neighbour), not dead-lettered."""
    sink = Sink()
    tries = {"n": 0}

    def script(ids: list[int]) -> Exception | None:
        if 3 in ids:
            tries["n"] += 1
            return RuntimeError("down") if tries["n"] <= 4 else None
        return None

    sink.script = script
    h, letters, _retries, _reached = handler(sink)
    h.deliver([ev(i) for i in range(6)], ctx())
    assert letters.put_ == [] and sorted(sink.handled) == list(range(6))


def test_a_flaky_call_is_retried_alone_before_anything_after_it() -> None:
    sink = Sink()
    failures = iter([True, True])
    sink.script = lambda ids: RuntimeError("flake") if next(failures, False) else None
    h, letters, retries, _reached = handler(sink)
    h.deliver([ev(0)], ctx())
    assert sink.handled == [0] and letters.put_ == [] and len(retries.retried) == 2


def test_policy_stop_fails_on_a_proven_poison_event() -> None:
    sink = Sink(poison=[2])
    h, letters, _retries, _reached = handler(sink, policy="stop", max_retries=0)
    with pytest.raises(PoisonEventError, match="while the events after it were handled"):
        h.deliver([ev(i) for i in range(4)], ctx())
    assert letters.put_ == []


@pytest.mark.parametrize("error", [SinkUnavailableError("503"), SinkRejectedError("403")])
def test_errors_that_are_not_about_the_events_are_raised_at_once(error: Exception) -> None:
    sink = Sink()
    sink.script = lambda ids: error
    h, letters, _retries, _reached = handler(sink)
    with pytest.raises(type(error)):
        h.deliver([ev(i) for i in range(16)], ctx())
    assert len(sink.calls) == 1 and letters.put_ == []


def test_a_replayed_dead_letter_that_fails_again_goes_back_at_once() -> None:
    sink = Sink(poison=[7])
    h, letters, retries, reached = handler(sink)
    h.deliver([ev(7)], ctx(), replay=True)
    assert letters.put_ == [(7, 1)] and retries.retried == [] and reached == []
