"""The drill's equal time after a fault: the writer is held while the index is compared, the
time runs from the fault's end, and an index still unequal at the bound fails the verdict."""

from __future__ import annotations

import threading
import time

from listeners.elasticsearch.verify import Diff
from singleton.service.dev.cluster import WriteGate
from singleton.service.drill.converge import FaultEqual, converge
from singleton.service.drill.verdict import Verdict


def test_the_writer_waits_while_the_index_is_compared_and_goes_on_once_it_is_equal() -> None:
    gate = WriteGate()
    stop = threading.Event()
    wrote_during_compare: list[bool] = []
    compares = 0
    writer_waiting = threading.Event()

    def write() -> None:
        writer_waiting.set()
        with gate:  # the writer's side: one write
            wrote_during_compare.append(compares < 3)

    writer = threading.Thread(target=write)

    def diffs() -> list[Diff]:
        nonlocal compares
        compares += 1
        if compares == 1:
            writer.start()
            assert writer_waiting.wait(5)
        return [Diff(missing=["1"])] if compares < 3 else [Diff()]

    since = time.monotonic()
    seconds, n, last = converge(diffs, gate, since, 10.0, stop)
    writer.join(5)
    assert n == 3 and seconds is not None and 0 < seconds < 10
    assert wrote_during_compare == [False]  # it wrote once, after the equal compare
    assert "index equals collection" in last


def test_an_index_not_equal_within_the_bound_is_named_in_the_verdict() -> None:
    stop = threading.Event()
    since = time.monotonic()
    seconds, n, last = converge(
        lambda: [Diff(missing=["7"], stale=["8"])], WriteGate(), since, 0.25, stop
    )
    assert seconds is None and n >= 2
    assert "1 missing, 1 stale" in last and "'7'" in last
    v = Verdict(equal=[FaultEqual(3, "index-delete", None, 30.0, n, last)])
    assert not v.ok
    (failure,) = v.failures()
    assert "not equal to its collection 30s after fault 3 (index-delete)" in failure
    summary = v.equal_summary(["index-delete", "kill"])
    assert summary["unequal"] == 1 and summary["by_kind"]["index-delete"]["unequal"] == 1
    assert summary["by_kind"]["kill"] == {
        "count": 0,
        "unequal": 0,
        "p50": None,
        "p99": None,
        "max": None,
    }


def test_equal_times_are_summarised_per_kind() -> None:
    v = Verdict(
        equal=[
            FaultEqual(0, "kill", 2.5, 30.0, 2, ""),
            FaultEqual(1, "kill", 1.5, 30.0, 2, ""),
            FaultEqual(2, "term", 0.25, 30.0, 1, ""),
        ]
    )
    assert v.ok
    s = v.equal_summary(["kill", "term"])
    assert (s["count"], s["unequal"], s["max"]) == (3, 0, 2.5)
    assert s["by_kind"]["kill"]["p50"] == 1.5 and s["by_kind"]["term"]["max"] == 0.25
    assert [e["index"] for e in s["by_fault"]] == [0, 1, 2]
