"""One tenure's failure streak on the fake clock: attempts and delays only grow, no attempt starts
past ``failure_budget``, and only getting past the stage that failed starts it over (a stream
that reads again does not reset a sink that keeps failing)."""

from __future__ import annotations

import random

import pytest
from loguru import logger

from listeners.runtime.failures import FailureStreak, Stage, UserErrors
from singleton.errors import RetriesExhaustedError
from singleton.retry import Backoff
from singleton.testing import FakeClock


def streak(budget: float = 10.0, jitter: float = 0.0) -> tuple[FailureStreak, FakeClock]:
    clock = FakeClock()
    backoff = Backoff(0.1, 2.0, jitter=jitter, rng=random.Random(1))
    return FailureStreak("orders", backoff, budget, clock), clock


def test_delays_and_attempts_grow_until_the_budget_is_spent() -> None:
    s, clock = streak(budget=8.0)
    delays = []
    with pytest.raises(RetriesExhaustedError) as exhausted:
        while True:
            delays.append(s.failed("deliver", RuntimeError("down")))
            assert s.attempts == len(delays)
            clock.advance(delays[-1])
    assert delays[:7] == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0])  # capped
    # The last wait is cut to what was left: the last attempt is made as the budget ends, and
    # none after it.
    assert delays[7] == pytest.approx(0.9) and sum(delays) == pytest.approx(8.0)
    message = str(exhausted.value)
    assert "still failing after" in message and f"{len(delays) + 1} attempts" in message
    assert "failure_budget 8s" in message and "at deliver" in message and "down" in message
    assert isinstance(exhausted.value.__cause__, RuntimeError)


def test_jittered_delays_stay_within_their_jitter() -> None:
    s, _clock = streak(jitter=0.1)
    for n in range(5):
        delay = s.failed("read", TimeoutError())
        assert 0.1 * 2**n * 0.9 <= delay <= 0.1 * 2**n * 1.1


@pytest.mark.parametrize(
    ("failed", "succeeded", "resets"),
    [
        ("deliver", "open", False),  # the loop: the stream reopens, the sink still fails
        ("deliver", "read", False),
        ("deliver", "deliver", True),
        ("deliver", "save", True),
        ("save", "deliver", False),  # a checkpoint store that is down, a sink that works
        ("read", "read", True),
        ("open", "read", True),
        ("start", "start", True),
    ],
)
def test_only_getting_past_the_stage_that_failed_starts_over(
    failed: Stage, succeeded: Stage, resets: bool
) -> None:
    s, clock = streak(budget=1.0)
    s.failed(failed, RuntimeError("x"))
    clock.advance(0.6)
    assert s.succeeded(succeeded) is resets
    assert s.failing is not resets
    if resets:
        assert s.attempts == 0 and s.spent() == 0.0
        s.failed(failed, RuntimeError("x"))  # a fresh budget
        return
    clock.advance(0.4)
    with pytest.raises(RetriesExhaustedError):
        s.failed(failed, RuntimeError("x"))  # the budget went on counting


def test_the_furthest_stage_that_failed_is_the_one_to_get_past() -> None:
    s, _clock = streak()
    s.failed("deliver", RuntimeError("sink"))
    s.failed("open", ConnectionError("mongo"))  # then the stream failed to open
    assert s.stage == "deliver"
    assert not s.succeeded("open") and not s.succeeded("read")
    assert s.attempts == 2
    assert s.succeeded("deliver") and not s.failing


def test_a_success_when_nothing_failed_changes_nothing() -> None:
    s, _clock = streak()
    assert s.succeeded("save") is False and not s.failing and s.attempts == 0


def _raise_at_one_line(message: str) -> RuntimeError:
    try:
        raise RuntimeError(message)
    except RuntimeError as exc:
        return exc


def test_a_listeners_error_is_logged_with_its_traceback_once_per_place() -> None:
    errors = UserErrors("orders")
    lines: list[str] = []
    sink = logger.add(lambda m: lines.append(str(m)), level="ERROR", format="{message}")
    try:
        assert errors.report(_raise_at_one_line("one"), "handle_batch") is True
        assert errors.report(_raise_at_one_line("two"), "handle_batch") is False  # same place
        try:
            raise ValueError("elsewhere")
        except ValueError as exc:
            assert errors.report(exc, "flush") is True
    finally:
        logger.remove(sink)
    assert len(lines) == 2
    assert lines[0].startswith("handle_batch raised RuntimeError: one") and "Traceback" in lines[0]
    assert "_raise_at_one_line" in lines[0] and "listener=orders" in lines[0]
    assert lines[1].startswith("flush raised ValueError: elsewhere")
