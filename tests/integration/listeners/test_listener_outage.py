"""A listener's outage is not poison (SecantusDB): while its downstream is down every event fails,
so nothing is dead-lettered; the failure is retried in place with one growing backoff, within
``failure_budget``, then the tenure fails visibly (released, not ready). A poison event is one
the listener fails on while it handles the events after it: dead-lettered alone, even when it
arrived alone (once a later event is handled). A takeover says where it resumed."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from loguru import logger

from listeners.base import ChangeEvent, ListenerContext
from listeners.runtime.runner import ListenerRunner
from singleton.errors import SinkUnavailableError
from singleton.service.dev.embedded import wait_until
from tests.integration.listener_support import (
    LogCapture,
    Recorder,
    Scene,
    Writer,
    finish_writes,
    now,
    wait_resigned,
    wait_state,
)

#: How long the downstream stays down under load (several retries in place, well within the
#: default 60 s failure budget).
OUTAGE = 4.0
RETRY = re.compile(
    r"\(attempt (?P<attempt>\d+), (?P<spent>[\d.]+)s of failure_budget [\d.]+s\), retrying .*"
    r"in (?P<delay>[\d.]+)s: listener=\S+ token=(?P<token>\d+)"
)


class Downstream(Recorder):
    """A custom listener whose downstream can go down: then every call raises."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.down = threading.Event()

    def handle_batch(self, events: Sequence[ChangeEvent], ctx: ListenerContext) -> int | None:
        if self.down.is_set():
            raise RuntimeError("downstream unreachable (connection refused)")
        return super().handle_batch(events, ctx)


class Unavailable(Recorder):
    """Says "transient" the documented way, for good."""

    def handle_batch(self, events: Sequence[ChangeEvent], ctx: ListenerContext) -> int | None:
        raise SinkUnavailableError("the sink answered 503 (test)")


@pytest.fixture
def scene(mongo_url: str, unique: str) -> Iterator[Scene]:
    yield Scene.on(mongo_url, unique)


def _retries(lines: list[str]) -> list[dict[str, str]]:
    return [m.groupdict() for m in map(RETRY.search, lines) if m is not None]


def test_an_outage_under_load_dead_letters_nothing_and_everything_after_it_is_delivered(
    scene: Scene,
) -> None:
    listener = Downstream(database=scene.db, collection="o")
    runner = scene.runner(listener, reconnect_backoff=0.05, max_reconnect_backoff=1.0)
    writer = Writer(scene.coll("o"))
    with LogCapture("WARNING") as logs:
        runner.start()
        try:
            wait_state(runner, "streaming")
            since = now(scene.client)
            writer.start()
            wait_until(lambda: len(listener.keys()) >= 30, 10, what="handled before the outage")
            listener.down.set()
            down_at = time.monotonic()
            wait_until(
                lambda: time.monotonic() - down_at >= OUTAGE and runner.status().reconnects >= 3,
                30,
                what="an outage of several retries",
            )
            during = list(logs.errors)
            listener.down.clear()
            expected = finish_writes(writer, since, listener, at_least=writer.ops + 100)
            status = runner.status()
        finally:
            writer.stop_event.set()
            runner.stop()
    assert scene.coll("dead_letters").count_documents({}) == 0
    assert status.dead_lettered == 0 and status.failed_tenures == 0 and status.ready
    assert set(expected) <= set(listener.keys())  # every event, those of the outage included
    retries = _retries(during)
    attempts = [int(r["attempt"]) for r in retries]
    assert len(attempts) >= 3 and attempts == list(range(1, len(attempts) + 1)), attempts
    delays = [float(r["delay"]) for r in retries]
    assert delays[-1] > delays[0], delays  # one backoff, growing through the outage
    tracebacks = [m for m in logs.errors if m.startswith("handle_batch raised RuntimeError")]
    assert len(tracebacks) == 1 and "Traceback" in tracebacks[0]  # once per tenure and place
    assert not any("dead-lettered" in m for m in logs.errors)


def test_a_permanent_sink_unavailable_fails_within_its_budget_with_growing_backoff(
    scene: Scene,
) -> None:
    budget = 3.0
    listener = Unavailable(database=scene.db, collection="u")
    runner = scene.runner(
        listener, failure_budget=budget, reconnect_backoff=0.1, max_reconnect_backoff=2.0
    )
    with LogCapture("WARNING") as logs:
        runner.start()
        try:
            wait_state(runner, "streaming")
            scene.coll("u").insert_one({"_id": 1})
            inserted = time.monotonic()
            wait_resigned(scene, runner, timeout=budget + 10)
            took = time.monotonic() - inserted
            status = runner.status()
            lines = list(logs.errors)
        finally:
            runner.stop()
    retries = _retries(lines)
    first = retries[0]["token"]
    tenure = [r for r in retries if r["token"] == first]
    attempts = [int(r["attempt"]) for r in tenure]
    delays = [float(r["delay"]) for r in tenure]
    assert attempts == list(range(1, len(attempts) + 1)) and 3 <= len(attempts) <= 8, attempts
    growing = delays[:-1]  # (the last wait is cut to what is left of the budget)
    assert growing == sorted(growing) and len(set(growing)) == len(growing), delays
    assert all(float(r["spent"]) < budget for r in tenure)  # no retry past the budget
    assert sum(delays) <= budget + 0.05, delays
    assert took < budget + 3, took  # failed within the budget (plus one read and the report)
    assert not status.ready and status.failure is not None
    assert "RetriesExhaustedError" in status.failure and "still failing after 3." in status.failure
    assert "SinkUnavailableError" in status.failure and "503" in status.failure
    assert status.last_outcome is not None and status.last_outcome.retryable
    assert status.dead_lettered == 0 and scene.coll("dead_letters").count_documents({}) == 0
    assert any(m.startswith("listener failed, resigning") for m in lines)


def test_a_lone_poison_event_is_the_listeners_failure_until_a_later_event_is_handled(
    scene: Scene,
) -> None:
    listener = scene.listener("l", max_retries=1)
    listener.fail = lambda e: e["documentKey"]["_id"] == "bad"
    runner = scene.runner(listener, reconnect_backoff=0.05, max_reconnect_backoff=0.2)
    letters = scene.coll("dead_letters")
    runner.start()
    try:
        wait_state(runner, "streaming")
        scene.coll("l").insert_one({"_id": "bad"})
        # Alone, it proves nothing: retried in place as the listener's failure, not dead-lettered.
        wait_until(lambda: runner.status().reconnects >= 2, 10, what="retried in place")
        assert letters.count_documents({}) == 0 and runner.status().dead_lettered == 0
        scene.coll("l").insert_one({"_id": "good"})
        wait_until(lambda: runner.status().dead_lettered == 1, 10, what="dead-lettered")
        wait_until(lambda: len(listener.keys()) == 1, 10, what="the later event handled")
        scene.coll("l").insert_one({"_id": "after"})
        wait_until(lambda: len(listener.keys()) == 2, 10, what="the stream goes on")
        status = runner.status()
    finally:
        runner.stop()
    [letter] = list(letters.find())
    assert letter["_id"] == {"listener": listener.lease_name, "key": "bad"}
    assert letter["attempts"] == 2  # tried alone 1 + max_retries times
    handled = [e["documentKey"]["_id"] for _k, _t, e in listener.handled]
    assert handled == ["good", "after"]
    assert status.ready and status.failed_tenures == 0 and status.failure is None


def test_a_poison_event_among_good_neighbours_is_dead_lettered_alone(scene: Scene) -> None:
    listener = scene.listener("n")
    listener.fail = lambda e: e["documentKey"]["_id"] == 7
    runner = scene.runner(listener)
    runner.start()
    try:
        wait_state(runner, "streaming")
        scene.coll("n").insert_many([{"_id": i} for i in range(30)])
        wait_until(lambda: len(listener.keys()) == 29, 10, what="the neighbours handled")
        wait_until(lambda: runner.status().dead_lettered == 1, 10, what="dead-lettered")
        status = runner.status()
    finally:
        runner.stop()
    handled = [e["documentKey"]["_id"] for _k, _t, e in listener.handled]
    assert handled == [i for i in range(30) if i != 7]  # in order, each once
    [letter] = list(scene.coll("dead_letters").find())
    assert letter["_id"]["key"] == 7 and letter["attempts"] == 1 + listener.max_retries
    assert status.ready and status.failed_tenures == 0 and status.events_handled == 29


def test_a_takeover_says_where_it_resumed(scene: Scene) -> None:
    first = scene.listener("t")
    runner = scene.runner(first, "a").start()
    try:
        wait_state(runner, "streaming")
        scene.coll("t").insert_many([{"_id": i} for i in range(3)])
        wait_until(lambda: len(first.keys()) == 3, 10, what="handled")
    finally:
        runner.stop()  # drains, checkpoints, releases
    saved = scene.store.load(first.lease_name)
    assert saved is not None
    lines: list[str] = []
    sink = logger.add(lambda m: lines.append(str(m)), level="INFO", format="{message}")
    second = scene.runner(scene.listener("t"), "b").start()
    try:
        wait_state(second, "streaming")
    finally:
        second.stop()
        logger.remove(sink)
    resumed = [m for m in lines if m.startswith("resumed from checkpoint at")]
    assert resumed and str(saved.cluster_time) in resumed[0], lines
    assert f"token={second.status().fencing_token}" in resumed[0]


def _resumed_with_its_sink_down(scene: Scene, coll: str, budget: float) -> ListenerRunner:
    """A first tenure handles one event and checkpoints; then an event waits, and a second
    tenure (started, not yet leading) resumes with its sink down from its first moment."""
    first = Downstream(database=scene.db, collection=coll)
    runner = scene.runner(first, "a").start()
    try:
        wait_state(runner, "streaming")
        scene.coll(coll).insert_one({"_id": 1})
        wait_until(lambda: len(first.keys()) == 1, 10, what="handled")
    finally:
        runner.stop()
    scene.coll(coll).insert_one({"_id": 2})  # waiting for a sink that is down
    second = Downstream(database=scene.db, collection=coll)
    second.down.set()
    return scene.runner(second, "b", failure_budget=budget).start()


def test_a_tenure_whose_sink_is_down_from_its_start_has_a_lag_sample_at_once(
    scene: Scene,
) -> None:
    """No batch is ever delivered, yet the lag gauge (and so the lag alert) has a value from
    the tenure's first moment: it counts from the position the tenure resumes from."""
    down = _resumed_with_its_sink_down(scene, "l", 30)
    try:
        wait_until(lambda: down.status().leader, 10, what="the second tenure")
        wait_until(
            lambda: down.status().lag_seconds(time.time()) is not None, 5, what="a lag sample"
        )
        status = down.status()
        assert status.batches == 0 and status.leader, status
    finally:
        down.stop()


def test_a_sink_down_from_a_resumed_tenure_s_start_spends_its_budget_and_resigns(
    scene: Scene,
) -> None:
    """The issue saw such a tenure retry at "attempt 1" forever, holding the lease: its
    budget is spent like any other's, and it resigns (then the next tenure tries again)."""
    budget = 3.0
    down = _resumed_with_its_sink_down(scene, "s", budget)
    try:
        wait_until(lambda: down.status().leader, 10, what="the second tenure (resumed)")
        started = time.monotonic()
        wait_resigned(scene, down, timeout=budget + 10)
        assert time.monotonic() - started < budget + 5
        assert down.status().failed_tenures >= 1 and not down.status().ready
    finally:
        down.stop()
