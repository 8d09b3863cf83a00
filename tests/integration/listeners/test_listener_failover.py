"""Failover under load against SecantusDB: a leader that stops renewing (crash) loses nothing and
saves nothing afterwards; a planned release hands over with zero events handled twice."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from bson.timestamp import Timestamp

from listeners import ListenerRunner
from singleton.errors import BackendUnavailableError
from singleton.service.dev.embedded import wait_until
from tests.integration.listener_support import (
    Recorder,
    Scene,
    Writer,
    assert_monotonic,
    finish_writes,
    handled_by,
    now,
    wait_state,
)


@contextmanager
def b_under_load(
    scene: Scene, a: ListenerRunner, a_listener: Recorder, b_listener: Recorder, **b_options: Any
) -> Iterator[tuple[ListenerRunner, Writer, Timestamp]]:
    """Start B (``b_options`` for its runner) beside the leader A and a writer on ``orders``;
    once A has handled 60 events, yield B, the writer and the cluster time before its first
    write. On exit the writer stops, A's gate opens (were it shut) and A and B stop."""
    b = scene.runner(b_listener, "b", **b_options).start()
    since = now(scene.client)
    writer = Writer(scene.coll("orders"))
    writer.start()
    try:
        wait_until(lambda: len(a_listener.keys()) >= 60, 20, what="A handles events")
        yield b, writer, since
    finally:
        writer.stop_event.set()
        a_listener.gate.set()
        a.stop()
        b.stop()


@pytest.mark.parametrize("crash", ["lease_expired", "stopped_without_release"])
def test_crashed_leader_successor_handles_everything(
    crash: str, mongo_url: str, unique: str
) -> None:
    scene = Scene.on(mongo_url, unique)
    store = scene.store
    a_listener, b_listener = scene.listener("orders"), scene.listener("orders")
    a = scene.runner(a_listener, "a").start()
    wait_until(lambda: a.elector.is_leader and a.status().state == "streaming", 10, what="A")
    with b_under_load(scene, a, a_listener, b_listener) as (b, writer, since):
        # A hangs inside handle_batch (a SIGSTOP'd process) and its lease runs out: a crash as
        # far as the lease and the checkpoint are concerned.
        a_listener.gate.clear()
        wait_until(a_listener.blocked.is_set, 10, what="A blocked in handle_batch")
        if crash == "lease_expired":
            # The store forgets A's lease early, so A still believes it leads while B writes:
            # only the checkpoint store's fencing stands between A and a regression.
            # A's elector may win the free lease back before B does (its worker stays hung
            # behind the old tenure): expire again until B holds it.
            for _ in range(20):
                scene.backend.expire(a.listener.lease_name)
                try:
                    wait_until(lambda: b.elector.is_leader, 1.0, what="B elected")
                    break
                except BackendUnavailableError:
                    continue
        else:
            # A's elector stops without releasing; the drain cannot finish (A is hung), so the
            # lease is left to expire.
            threading.Thread(target=a.elector.stop, kwargs={"release": False}).start()
        wait_until(lambda: b.elector.is_leader, 10, what="B elected")
        wait_until(lambda: len(b_listener.keys()) >= 60, 20, what="B handles events")
        a_listener.gate.set()  # A wakes up after B took over: it must not save anything
        wait_state(a, "follower", "failed")
        # How fast B takes over is the elector's business: keep writing until the window
        # holds enough events to be a test under load.
        expected = finish_writes(writer, since, a_listener, b_listener, at_least=160)
    assert not set(expected) - handled_by(a_listener, b_listener), "events missing after a crash"
    assert len(expected) >= 150
    assert_monotonic(store.accepted)
    a_token = a.status().fencing_token
    assert a_token is not None
    b_saves = [i for i, cp in enumerate(store.accepted) if cp.holder != store.accepted[0].holder]
    assert b_saves, "B never checkpointed"
    assert all(cp.fencing_token > a_token for cp in store.accepted[b_saves[0] :]), (
        "A saved a checkpoint after B took over"
    )
    assert a.status().state != "failed", a.status()
    assert a.status().last_outcome is not None and a.status().last_outcome.kind == "lost"


def test_planned_release_replays_nothing(mongo_url: str, unique: str) -> None:
    scene = Scene.on(mongo_url, unique)
    listeners = [scene.listener("orders") for _ in range(2)]
    a = scene.runner(listeners[0], "a", cooldown=1.5).start()
    wait_state(a, "streaming")
    with b_under_load(scene, a, listeners[0], listeners[1], cooldown=1.5) as (b, writer, since):
        a.elector.rotate()
        wait_until(lambda: b.elector.is_leader, 10, what="B elected")
        wait_until(lambda: len(listeners[1].keys()) >= 60, 20, what="B handles events")
        b.elector.rotate()  # and back to A once A's cooldown is over: two handovers
        wait_until(lambda: a.elector.is_leader, 10, what="A elected again")
        wait_until(lambda: len(listeners[0].keys()) >= 150, 20, what="A handles again")
        expected = finish_writes(writer, since, *listeners)
        # each of the three tenures checkpointed while it led (A's second one too, not left
        # to its drain at the end, which a loaded box may overrun)
        wait_until(
            lambda: len({cp.fencing_token for cp in scene.store.accepted}) >= 3,
            20,
            what="a checkpoint of each tenure",
        )
    counts = Counter(listeners[0].keys() + listeners[1].keys())
    twice = [k for k, n in counts.items() if n > 1]
    assert not twice, f"{len(twice)} events handled twice across planned handovers"
    assert set(counts) >= set(expected)
    assert_monotonic(scene.store.accepted)
    assert len({cp.fencing_token for cp in scene.store.accepted}) >= 3
    outcome = a.status().last_outcome  # A led last and handed over on stop(): a clean end
    assert outcome is not None and (outcome.kind, outcome.reason) == ("completed", "released")


def test_overrunning_drain_releases_and_the_successor_replays_the_tail(
    mongo_url: str, unique: str
) -> None:
    """A planned handover whose act in hand outlasts the drain bound still releases (it never
    waits for expiry); that act's checkpoint is refused, and the successor replays its events."""
    scene = Scene.on(mongo_url, unique)
    a_listener, b_listener = scene.listener("orders"), scene.listener("orders")
    a = scene.runner(a_listener, "a", cooldown=30.0).start()
    wait_state(a, "streaming")
    released: list[tuple[int, bool]] = []
    a.elector.subscribe(on_released=lambda ld, ok: released.append((ld.token, ok)))
    with b_under_load(scene, a, a_listener, b_listener) as (b, writer, since):
        a_token = a.status().fencing_token
        assert a_token is not None
        a_listener.gate.clear()  # A's next handle_batch hangs: the act in hand
        wait_until(a_listener.blocked.is_set, 10, what="A blocked in handle_batch")
        a.elector.rotate()
        wait_until(lambda: b.elector.is_leader, 10, what="B elected")
        # A reports its release once the store confirmed it, which can come after B's election
        wait_until(lambda: bool(released), 5, what="A's release reported")
        assert released == [(a_token, True)], "the lease was not released"
        wait_until(lambda: len(b_listener.keys()) >= 60, 20, what="B handles events")
        handled_before = len(a_listener.keys())
        a_listener.gate.set()  # the act finishes after the release: it may not checkpoint
        wait_state(a, "follower")
        tail = a_listener.keys()[handled_before:]
        expected = finish_writes(writer, since, a_listener, b_listener, at_least=160)
        # B's own checkpoint, saved while it leads (not left to its drain at the end, which a
        # loaded box may overrun: then it hands over without one, and rightly)
        wait_until(
            lambda: any(cp.fencing_token > a_token for cp in scene.store.accepted),
            20,
            what="a checkpoint of B's",
        )
    assert tail, "A's hung batch was never handled"
    assert set(tail) <= set(b_listener.keys()), "the successor did not replay A's tail"
    assert not set(expected) - handled_by(a_listener, b_listener), "events missing"
    assert_monotonic(scene.store.accepted)
    b_first = next(i for i, cp in enumerate(scene.store.accepted) if cp.fencing_token > a_token)
    assert all(cp.fencing_token > a_token for cp in scene.store.accepted[b_first:]), (
        "A saved a checkpoint after B took over"
    )
    outcome = a.status().last_outcome
    assert outcome is not None and (outcome.kind, outcome.reason) == ("lost", "released")
