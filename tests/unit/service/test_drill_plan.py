"""The drill's schedule and verdict arithmetic, without servers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from listeners.elasticsearch.documents import doc_id
from listeners.runtime.audit import AuditLog
from singleton.errors import ConfigurationError
from singleton.service.drill.balance import (
    BalanceSample,
    FaultBalance,
    balance_bound,
    sample_of,
    time_to_balance,
)
from singleton.service.drill.cli import build_parser, options_from
from singleton.service.drill.cluster import drill_listeners
from singleton.service.drill.faults import (
    DEFAULT_MIX,
    KINDS,
    OPT_IN_MIX,
    PROXY_KINDS,
    FaultRecord,
    parse_kinds,
    plan,
)
from singleton.service.drill.jobs import check_job
from singleton.service.drill.verdict import (
    Verdict,
    checkpoint_regressions,
    fencing_violations,
    per_lease,
    percentile,
    planned_expired,
    split_extra,
    takeover_gaps,
)


def test_schedule_is_a_function_of_the_seed() -> None:
    kinds = parse_kinds(None, "redis")
    assert plan(5, 40, kinds, 2.5) == plan(5, 40, kinds, 2.5)
    assert plan(5, 40, kinds, 2.5) != plan(6, 40, kinds, 2.5)


def test_long_default_mix_has_thirty_stops_of_two_to_five_ttl() -> None:
    faults = plan(1, 100, list(DEFAULT_MIX), 2.5)  # `make drill`: every kind but Sentinel's
    stops = [f for f in faults if f.kind == "stop"]
    assert len(faults) == 100 and len(stops) >= 30
    assert all(2 * 2.5 <= f.param <= 5 * 2.5 for f in stops)
    assert {f.kind for f in faults} == set(DEFAULT_MIX) == set(parse_kinds(None, "redis"))
    # the checkpoint is lost both under a running leader and while every replica is stopped
    assert {f.param for f in faults if f.kind == "checkpoint-loss"} == {0.0, 1.0}


def test_kinds_are_validated_against_the_backend() -> None:
    assert "redis-pause" not in parse_kinds(None, "mongo")
    with pytest.raises(ConfigurationError, match="needs --backend redis"):
        parse_kinds("kill,redis-pause", "mongo")
    with pytest.raises(ConfigurationError, match="unknown fault 'kil'"):
        parse_kinds("kil", "redis")


def test_sentinel_mode_adds_sentinel_failover_and_leaves_out_the_proxy_kinds() -> None:
    kinds = parse_kinds(None, "redis", sentinel=True)
    assert "sentinel-failover" in kinds and "sentinel-failover" not in parse_kinds(None, "redis")
    assert set(kinds) == set(KINDS) - set(PROXY_KINDS) - set(OPT_IN_MIX)
    assert set(PROXY_KINDS) == {"net-cut", "redis-restart", "redis-pause"}
    assert parse_kinds("sentinel-failover,kill", "redis", sentinel=True) == [
        "sentinel-failover",
        "kill",
    ]
    with pytest.raises(ConfigurationError, match="sentinel-failover needs --sentinel"):
        parse_kinds("kill,sentinel-failover", "redis")
    for kind in PROXY_KINDS:
        with pytest.raises(ConfigurationError, match=f"{kind} needs the embedded Redis"):
            parse_kinds(f"kill,{kind}", "redis", sentinel=True)
    faults = plan(2, 30, kinds, 1.5)
    assert {f.kind for f in faults} == set(kinds)
    assert all(f.param == 0.0 for f in faults if f.kind == "sentinel-failover")


@pytest.mark.parametrize(
    "argv",
    [["--sentinel", "--backend", "mongo"], ["--sentinel", "--redis-url", "redis://h:6379/0"]],
)
def test_sentinel_flag_needs_redis_leases_of_its_own(argv: list[str]) -> None:
    with pytest.raises(ConfigurationError, match="--sentinel needs --backend redis"):
        options_from(build_parser().parse_args(argv))
    opts = options_from(build_parser().parse_args(["--sentinel", "--faults", "sentinel-failover"]))
    assert opts.sentinel and opts.kinds == ["sentinel-failover"]


def test_a_sentinel_failover_may_skip_job_fire_times_but_never_double_them(
    tmp_path: Path,
) -> None:
    record = tmp_path / "runs.txt"
    record.write_text("1000|7|r1\n3000|9|r2\n")  # 2000 skipped while the master was down
    assert check_job(record, ["kill"]).failures() == ["1 job fire times never ran (first: [2000])"]
    assert check_job(record, ["kill", "sentinel-failover"]).failures() == []
    record.write_text("1000|7|r1\n1000|9|r2\n")
    assert (
        check_job(record, ["sentinel-failover"])
        .failures()[0]
        .startswith("1 job fire times ran twice")
    )


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


def test_a_planned_handover_left_to_expire_fails_the_verdict() -> None:
    faults = [
        FaultRecord(0, "term", 0.0, at=10.0, victim="r1", token=1, end=10.5),
        FaultRecord(1, "rotate", 0.0, at=20.0, victim="r2", token=2, end=20.1),
        FaultRecord(2, "kill", 0.0, at=30.0, victim="r3", token=3, end=30.1),
    ]
    records = [
        {**rec("released", 1, 10.2), "ok": True},
        {**rec("released", 2, 20.05), "ok": False},  # the store refused: it will expire
    ]
    expired = planned_expired(faults, records)
    assert [(e["index"], e["token"]) for e in expired] == [(1, 2)]  # a kill is not planned
    v = Verdict(expired=expired)
    assert not v.ok
    assert "1 planned handovers left the lease to expire" in v.failures()[0]
    assert Verdict(expired=planned_expired(faults[:1], records)).ok


def test_percentiles_and_resurrections() -> None:
    assert percentile([], 99) is None
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert percentile(list(range(1, 101)), 99) == 99
    four, nine, four_str = doc_id(4), doc_id(9), doc_id("4")
    _, _, resurrected, extra = split_extra([], [], [four, nine, four_str], [4])
    assert resurrected == [four] and extra == [nine, four_str]  # "4" is not 4


# -- several listeners and partitions; balance after every fault ----------------------------


def test_listeners_and_partitions_name_their_leases_and_indices() -> None:
    one, two = drill_listeners(2, 2)
    assert (one.name, one.index) == ("drill-orders", "drill-orders")  # today's names stay
    assert one.leases == ("drill-orders.0-of-2", "drill-orders.1-of-2")
    assert (two.index, two.leases[1]) == ("drill-orders-2", "drill-orders-2.1-of-2")
    (only,) = drill_listeners(1, 1)
    assert only.leases == ("drill-orders",)


@pytest.mark.parametrize(
    ("flag", "value"), [("--listeners", "0"), ("--partitions", "0"), ("--partitions", "17")]
)
def test_listeners_and_partitions_are_validated(flag: str, value: str) -> None:
    args = build_parser().parse_args([flag, value])
    with pytest.raises(ConfigurationError, match=flag):
        options_from(args)
    opts = options_from(build_parser().parse_args(["--listeners", "2", "--partitions", "3"]))
    assert (opts.listeners, opts.partitions) == (2, 3)


def test_tokens_and_positions_are_judged_per_lease() -> None:
    # two partitions' tokens interleave: compared across leases they would look fenced off
    a = [{**rec("elected", 5, 0.0), "lease": "a"}, {**rec("batch", 5, 3.0, 2.0), "lease": "a"}]
    b = [{**rec("elected", 9, 1.0), "lease": "b"}]
    assert len(fencing_violations([*a, *b])) == 1
    groups = per_lease([*a, *b, rec("batch", 1, 0.5, 0.4)])
    assert sorted(groups) == ["", "a", "b"]
    assert all(fencing_violations(g) == [] for g in groups.values())


def test_a_sample_is_balanced_when_every_lease_is_held_within_one_per_live_replica() -> None:
    holders = {"a.0-of-2": "r1", "a.1-of-2": "r2", "job": "r1"}
    s = sample_of(1.0, ["r1", "r2", "r3"], holders, ["r1", "r2", "r3"])
    assert dict(s.held) == {"r1": 2, "r2": 1, "r3": 0} and not s.balanced  # 2 - 0 > 1
    assert sample_of(1.0, ["r1", "r2"], holders, ["r1", "r2"]).balanced
    # a killed replica not yet restarted does not count, and a lease it still names is unheld
    gone = sample_of(1.0, ["r1", "r2"], {**holders, "a.1-of-2": "r3"}, ["r1", "r2"])
    assert gone.unheld == ("a.1-of-2",) and not gone.balanced
    # the store must agree with the processes: a running replica not (yet) a member
    late = sample_of(1.0, ["r1", "r2"], holders, ["r1", "r2", "r3"])
    assert late.strangers == ("r3",) and not late.balanced
    assert not sample_of(1.0, ["r1"], {"x": None}, ["r1"]).balanced  # unheld
    assert not BalanceSample(1.0, {"r1": 1}, answered=False).balanced


def _bs(at: float, *held: int) -> BalanceSample:
    return BalanceSample(at, {f"r{i}": n for i, n in enumerate(held)})


def test_time_to_balance_waits_out_the_leases_a_killed_process_left() -> None:
    ttl, confirm = 1.5, 0.3
    # the fault ends at 10: the view looks balanced (the dead process's leases still named),
    # they expire at 11, the survivors take them, the restarted replica gets its share at 12.5
    samples = [_bs(9.0, 1, 1, 1), _bs(11.0, 0, 2, 1), _bs(12.5, 1, 1, 1)]
    assert time_to_balance(samples, 10.0, 12.6, ttl=ttl, confirm=confirm) is None  # unconfirmed
    assert time_to_balance(samples, 10.0, 12.8, ttl=ttl, confirm=confirm) == pytest.approx(2.5)
    # balanced all along: confirmed one ttl after the end, counted as 0 s
    assert time_to_balance(samples[:1], 10.0, 11.8, ttl=ttl, confirm=confirm) == 0.0
    assert time_to_balance(samples[:1], 10.0, 11.7, ttl=ttl, confirm=confirm) is None


def test_balance_outside_the_bound_fails_the_verdict() -> None:
    bound = balance_bound(1.5)
    assert bound == pytest.approx(9.5)  # 3 x ttl + 5 s
    inside = FaultBalance(0, "kill", 2.5, bound, {"r1": 2, "r2": 2, "r3": 1})
    late = FaultBalance(1, "stop", 9.6, bound, {"r1": 3, "r2": 2})
    never = FaultBalance(2, "rotate", None, bound, {"r1": 4, "r2": 1})
    assert Verdict(balance=[inside]).ok
    v = Verdict(balance=[inside, late, never])
    assert not v.ok
    (failure,) = v.failures()
    assert failure.startswith("2 faults not followed by balanced leases within 9.5s")
    assert "fault 1 stop" in failure
    summary = v.balance_summary(bound)
    assert (summary["faults"], summary["unbalanced"], summary["max"]) == (3, 2, 9.6)
    assert [b["ok"] for b in summary["by_fault"]] == [True, False, False]


def test_an_audit_view_names_its_lease_and_shares_the_file(tmp_path: Path) -> None:
    log = AuditLog(str(tmp_path / "audit.jsonl"), "r1")
    view = log.bound("orders.1-of-2")
    view.record("batch", token=3)
    view.close()  # a view never closes the shared file
    log.record("elected", token=4)
    log.close()
    view.record("batch", token=5)  # after the owner closed it: dropped, not an error
    lines = [json.loads(x) for x in (tmp_path / "audit.jsonl").read_text().splitlines()]
    assert [(r["kind"], r.get("lease"), r["identity"]) for r in lines] == [
        ("batch", "orders.1-of-2", "r1"),
        ("elected", None, "r1"),
    ]


def test_history_loss_is_asked_for_by_name_also_with_partitions() -> None:
    """(A partition's resync sweeps what was deleted in the hole: no longer one partition.)"""
    assert "history-loss" not in parse_kinds(None, "redis")
    assert parse_kinds("history-loss", "mongo") == ["history-loss"]
    assert parse_kinds("history-loss", "redis") == ["history-loss"]
