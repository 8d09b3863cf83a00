"""Handing over on real stores: five electors in separate threads share one lease with
max_tenure (leadership rotates, the windows never overlap, tokens grow in time order), and a
leader whose work failed resigns (the next one takes over at once, not at expiry)."""

from __future__ import annotations

import itertools
import threading
import time
from typing import Any

import pytest

from singleton import Elector, Leadership
from singleton.service.dev.embedded import wait_until
from tests.unit.election.election_support import contend_times


@pytest.mark.parametrize("kind", ["memory", "fakeredis", "redis", "mongo"])
def test_five_electors_rotate_without_overlap(kind: str, backend_factory: Any) -> None:
    lock = threading.Lock()
    windows: dict[tuple[str, int], list[float]] = {}

    def elected(ld: Leadership) -> None:
        with lock:
            windows[(ld.identity, ld.token)] = [time.monotonic(), float("inf")]

    def lost(ld: Leadership, reason: str) -> None:
        with lock:
            windows[(ld.identity, ld.token)][1] = time.monotonic()

    electors = [
        Elector(
            backend_factory(kind),
            "rotating",
            identity=f"e{i}",
            ttl=1.0,
            retry_interval=0.2,
            max_tenure=1.5,
            cooldown=0.3,
            on_elected=elected,
            on_lost=lost,
        )
        for i in range(5)
    ]
    for e in electors:
        e.start()
    try:
        # Run for 10 s of rotations; the wait is the test's duration, not a synchronisation.
        stop = threading.Event()
        stop.wait(10.0)
    finally:
        for e in electors:
            e.stop()
    wait_until(lambda: all(w[1] != float("inf") for w in windows.values()), 5, what="all ended")

    ordered = sorted(windows.items(), key=lambda kv: kv[1][0])
    assert len(ordered) >= 4, ordered
    for (prev_key, (_, prev_end)), (key, (start, _)) in itertools.pairwise(ordered):
        assert start >= prev_end, f"{key} elected at {start} while {prev_key} led until {prev_end}"
        assert key[1] > prev_key[1], f"token went from {prev_key[1]} to {key[1]}"
    identities = {ident for ident, _ in windows}
    assert len(identities) >= 3, identities


@pytest.mark.parametrize("kind", ["redis", "mongo"])
def test_resign_hands_over_at_once_and_sits_out_the_cooldown(
    kind: str, backend_factory: Any
) -> None:
    a_backend = backend_factory(kind)
    contends = contend_times(a_backend)
    a_lost: list[str] = []
    a_elected, b_elected, b_follows_a = threading.Event(), threading.Event(), threading.Event()
    b_tenures: list[Leadership] = []

    def on_b_elected(ld: Leadership) -> None:
        b_tenures.append(ld)
        b_elected.set()

    # With a 30 s ttl, b leads within seconds only if a really released the lease.
    a = Elector(
        a_backend,
        "job",
        identity="a",
        ttl=30.0,
        retry_interval=0.2,
        on_elected=lambda ld: a_elected.set(),
        on_lost=lambda ld, reason: a_lost.append(reason),
    )
    b = Elector(
        backend_factory(kind),
        "job",
        identity="b",
        ttl=30.0,
        retry_interval=1.0,
        on_elected=on_b_elected,
        on_new_leader=lambda who: b_follows_a.set() if who == "a" else None,
    )
    try:
        a.start()
        assert a_elected.wait(10)
        ld = a.leadership
        assert ld is not None
        b.start()
        assert b_follows_a.wait(10)  # b saw a lead: it campaigns again on a release or in 1 s
        resigned = time.monotonic()
        assert a.resign(60.0, leadership=ld)
        assert a_lost == ["failed"] and not a.is_leader
        assert b_elected.wait(10), "b did not take over the released lease"
        assert time.monotonic() - resigned < 10, "b waited for the lease to expire"
        assert b_tenures[0].token > ld.token
        b.stop()  # releases: a still sits out its cooldown
        wait_until(lambda: a_backend.inspect("job") is None, 10, what="b's release")
        assert [t for t in contends if t > resigned] == [] and not a.is_leader
    finally:
        b.stop()
        a.stop()
