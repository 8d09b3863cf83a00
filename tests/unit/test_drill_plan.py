"""The drill's schedule and verdict arithmetic, without servers."""

from __future__ import annotations

from typing import Any

import pytest

from listeners.elasticsearch.documents import doc_id
from singleton.errors import ConfigurationError
from singleton.service.drill.faults import KINDS, FaultRecord, parse_kinds, plan
from singleton.service.drill.verdict import (
    checkpoint_regressions,
    fencing_violations,
    percentile,
    split_extra,
    takeover_gaps,
)


def test_schedule_is_a_function_of_the_seed() -> None:
    kinds = parse_kinds(None, "redis")
    assert plan(5, 40, kinds, 2.5) == plan(5, 40, kinds, 2.5)
    assert plan(5, 40, kinds, 2.5) != plan(6, 40, kinds, 2.5)


def test_long_default_mix_has_thirty_stops_of_two_to_five_ttl() -> None:
    faults = plan(1, 100, list(KINDS), 2.5)
    stops = [f for f in faults if f.kind == "stop"]
    assert len(faults) == 100 and len(stops) >= 30
    assert all(2 * 2.5 <= f.param <= 5 * 2.5 for f in stops)
    assert {f.kind for f in faults} == set(KINDS)
    # the checkpoint is lost both under a running leader and while every replica is stopped
    assert {f.param for f in faults if f.kind == "checkpoint-loss"} == {0.0, 1.0}


def test_kinds_are_validated_against_the_backend() -> None:
    assert "redis-pause" not in parse_kinds(None, "mongo")
    with pytest.raises(ConfigurationError, match="needs --backend redis"):
        parse_kinds("kill,redis-pause", "mongo")
    with pytest.raises(ConfigurationError, match="unknown fault 'kil'"):
        parse_kinds("kil", "redis")


def rec(kind: str, token: int, mono: float, sent: float | None = None, **kw: Any) -> dict[str, Any]:
    return {"kind": kind, "token": token, "mono": mono, "sent": sent, "identity": "r", **kw}


def test_a_write_begun_after_a_newer_election_is_a_violation() -> None:
    records = [
        rec("elected", 1, 0.0),
        rec("batch", 1, 1.0, 0.9),
        rec("elected", 2, 5.0),
        rec("batch", 1, 5.2, 4.8),  # began before the successor: in flight, allowed
        rec("batch", 2, 6.0, 5.5),
    ]
    assert fencing_violations(records) == []
    records.append(rec("checkpoint", 1, 7.0, 6.5))
    (v,) = fencing_violations(records)
    assert (v["token"], v["newer_token"], v["kind"]) == (1, 2, "checkpoint")


def test_checkpoint_regressions_from_samples_and_audit() -> None:
    samples = [(0.0, 1, [10, 1]), (1.0, 1, [10, 2]), (2.0, 2, [10, 1])]
    records = [
        rec("checkpoint", 1, 1.0, 0.9, ct=[10, 5]),
        rec("checkpoint", 2, 2.0, 1.5, ct=[10, 4]),
    ]
    found = checkpoint_regressions(records, samples)
    assert [r["seen"] for r in found] == ["sampler", "audit"]


def test_gap_runs_from_the_old_tenures_last_act_to_the_next_election() -> None:
    faults = [FaultRecord(0, "term", 0.0, at=10.0, victim="r", token=1, end=10.5)]
    records = [
        rec("batch", 1, 10.2, 10.1),
        rec("lost", 1, 10.3),
        rec("elected", 2, 10.35),
    ]
    (g,) = takeover_gaps(faults, records, end=20.0)
    assert g["takeover"] and g["gap"] == pytest.approx(0.05)
    none = takeover_gaps([FaultRecord(0, "clock-jump", 60.0, 10.0, "r", 1)], records[:1], 20.0)
    assert none[0]["takeover"] is False


def test_percentiles_and_resurrections() -> None:
    assert percentile([], 99) is None
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert percentile(list(range(1, 101)), 99) == 99
    four, nine, four_str = doc_id(4), doc_id(9), doc_id("4")
    _, _, resurrected, extra = split_extra([], [], [four, nine, four_str], [4])
    assert resurrected == [four] and extra == [nine, four_str]  # "4" is not 4
