"""Three asyncio processes per backend, on real servers: the leader SIGKILLed, SIGSTOPped for
3 x ttl, SIGTERMed. Exactly one acts at a time, the paused one acts 0 times after its successor
was elected and its work is cancelled as soon as it runs again, a planned stop hands over at
once, and a crash is taken over at the lease's expiry."""

from __future__ import annotations

import contextlib
import itertools
import json
import queue
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.integration.aio.leader_child import TTL, AsyncChild
from tests.integration.aio.support import KINDS, url_of

RENEW_DEADLINE = 2 * TTL / 3
Line = tuple[str, dict[str, Any]]


class Lines:
    """Every line of every child, in arrival order, and waits for the next one that matters."""

    def __init__(self, source: queue.Queue[Line]) -> None:
        self.source = source
        self.seen: list[Line] = []

    def wait(self, wanted: Callable[[str, dict[str, Any]], bool], timeout: float) -> Line:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no such line within {timeout}s; last: {self.seen[-5:]}")
            try:
                item = self.source.get(timeout=left)
            except queue.Empty:
                continue
            self.seen.append(item)
            if wanted(*item):
                return item

    def drain_until(self, instant: float) -> None:
        """Keep reading until the shared monotonic clock reaches ``instant``."""
        while (left := instant - time.monotonic()) > 0:
            with contextlib.suppress(queue.Empty):
                self.seen.append(self.source.get(timeout=left))


def elected(excluding: str) -> Callable[[str, dict[str, Any]], bool]:
    return lambda who, line: line["event"] == "elected" and who != excluding


def acting(identity: str) -> Callable[[str, dict[str, Any]], bool]:
    """``identity``'s work runs (elected is not enough: its work may not have started)."""
    return lambda who, line: line["event"] == "act" and who == identity


@pytest.mark.slow
@pytest.mark.serial
@pytest.mark.parametrize("kind", KINDS)
def test_three_asyncio_processes_kill_pause_and_stop_the_leader(
    kind: str, request: pytest.FixtureRequest, unique: str, tmp_path: Path
) -> None:
    url = url_of(kind, request)
    source: queue.Queue[Line] = queue.Queue()
    children: dict[str, AsyncChild] = {}

    def spawn(identity: str) -> None:
        children[identity] = AsyncChild(
            kind, url, f"t{unique}", identity, source, tmp_path / f"{identity}.log"
        )

    for identity in "abc":
        spawn(identity)
    lines = Lines(source)
    numbers: dict[str, float] = {}
    try:
        first, _ = lines.wait(elected(""), 30)
        lines.wait(acting(first), 5)
        # SIGKILL: no release, the successor takes over at the lease's expiry.
        killed = children[first].signal(signal.SIGKILL)
        second, line = lines.wait(elected(first), 10)
        numbers["takeover_after_sigkill"] = line["t"] - killed
        paused_token = line["token"]
        spawn("d")
        lines.wait(acting(second), 5)
        # SIGSTOP for 3 x ttl, then SIGCONT: the paused one must not act again.
        paused = children[second].signal(signal.SIGSTOP)
        third, line = lines.wait(elected(second), 10)
        successor_at = line["t"]
        numbers["takeover_after_sigstop"] = successor_at - paused
        lines.drain_until(paused + 3 * TTL)
        resumed = children[second].signal(signal.SIGCONT)
        _, stopped_work = lines.wait(
            lambda who, ln: who == second and ln["event"] in ("cancelled", "refused"), 10
        )
        numbers["paused_work_ended_after_resume"] = stopped_work["t"] - resumed
        # SIGTERM: a planned stop releases, the successor starts at once.
        lines.wait(acting(third), 5)
        terminated = children[third].signal(signal.SIGTERM)
        _, line = lines.wait(elected(third), 10)
        numbers["takeover_after_sigterm"] = line["t"] - terminated
        assert children[third].proc.wait(10) == 0
        lines.drain_until(time.monotonic() + 0.5)
    finally:
        for child in children.values():
            child.close()
        lines.drain_until(time.monotonic() + 0.2)
    (tmp_path / "numbers.json").write_text(json.dumps(numbers))
    timeline = [(who, ln) for who, ln in lines.seen if ln["event"] != "act"]
    (tmp_path / "timeline.json").write_text(json.dumps(timeline))
    print(f"\n{kind}: {json.dumps({k: round(v, 3) for k, v in numbers.items()})}")  # noqa: T201

    acts = [(who, ln) for who, ln in lines.seen if ln["event"] == "act"]
    late = [ln for _, ln in acts if ln["token"] == paused_token and ln["t"] > successor_at]
    assert late == [], "the paused leader acted after its successor was elected"
    assert all(ln["remaining"] > 0 for _, ln in acts)
    # Exactly one acts at a time: the tenures' acting spans never overlap, tokens grow.
    spans: dict[int, list[float]] = {}
    for _, ln in acts:
        span = spans.setdefault(ln["token"], [ln["t"], ln["t"]])
        span[0], span[1] = min(span[0], ln["t"]), max(span[1], ln["t"])
    ordered = sorted(spans.items(), key=lambda kv: kv[1][0])
    assert len(ordered) >= 4
    for (token_a, (_, end_a)), (token_b, (start_b, _)) in itertools.pairwise(ordered):
        assert start_b > end_a, f"tokens {token_a} and {token_b} acted at the same time"
        assert token_b > token_a
    assert numbers["takeover_after_sigkill"] < TTL + 0.5
    assert numbers["takeover_after_sigstop"] < TTL + 0.5
    assert numbers["paused_work_ended_after_resume"] < RENEW_DEADLINE
    assert numbers["takeover_after_sigterm"] < 0.5
