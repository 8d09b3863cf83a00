"""The failover drill end to end: ``singleton drill`` as a user runs it (a subprocess, --json).

A short drill of mixed faults must pass on each lease backend (on Redis leases with two
listeners of two partitions each: five leases balanced over three replicas after every fault),
and the same drill with fencing switched off (the test-only switch) must fail its verdict: the
drill catches what it claims to. With ``--sentinel`` the leases live behind a real Sentinel
topology whose master is SIGKILLed and replaced, and the drill must still pass.
"""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

from singleton.service.dev.cluster import child_environment, singleton_command
from singleton.service.drill.cluster import have_faketime
from singleton.service.drill.faults import parse_kinds, plan

#: Alone on the machine, after the parallel part of `make test` (timing-sensitive).
pytestmark = pytest.mark.serial


#: Each fault kind that applies once: `make drill` runs the long mixes (100 rounds).
def rounds(backend: str) -> int:
    return len(parse_kinds(None, backend))


#: Short leases keep the suite fast; users' default is 2.5 s (`make drill`).
TTL = "1.5"


def drill(tmp_path: Path, *args: str, timeout: float = 200) -> tuple[int, dict[str, Any], str]:
    """``singleton drill --json ARGS`` as a user runs it. Past ``timeout`` it is interrupted
    (Ctrl-C: it stops its cluster and judges what it saw) and the test fails with what it said;
    a SIGKILL would leave its servers and replicas running and say nothing."""
    proc = subprocess.Popen(
        singleton_command("drill", "--json", *args),
        cwd=tmp_path,
        env=child_environment(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)
        try:
            out, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        pytest.fail(f"the drill ran past {timeout:.0f}s; it said:\n{err[-6000:]}")
    assert out.strip(), err[-3000:]
    return proc.returncode, json.loads(out), err


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    ("backend", "listeners", "partitions"),
    [
        ("redis", 2, 2),
        ("mongo", 1, 1),
    ],
)
def test_short_drill_of_mixed_faults_passes(
    backend: str, listeners: int, partitions: int, tmp_path: Path
) -> None:
    assert have_faketime(), "clock-jump needs Debian's faketime (make sysdeps)"
    report = tmp_path / "drill.html"
    n = rounds(backend)
    code, result, log = drill(
        tmp_path,
        "--backend",
        backend,
        "--rounds",
        str(n),
        "--seed",
        "7",
        "--ttl",
        TTL,
        "--report",
        str(report),
        "--listeners",
        str(listeners),
        "--partitions",
        str(partitions),
    )
    assert code == 0 and result["ok"], (result["failures"], log[-3000:])
    assert result["faults"] == n
    assert (result["listeners"], result["partitions"]) == (listeners, partitions)
    assert len(result["by_listener"]) == listeners
    for li in result["by_listener"]:  # every index equals the collection
        assert len(li["leases"]) == partitions
        assert (li["missing"], li["stale"], li["resurrected"], li["extra"]) == (0, 0, 0, 0), li
        assert li["es"] == result["documents"]["mongo"]
    # after every fault: every lease held, leases per live replica within one, in the bound
    balance = result["balance"]
    assert balance["faults"] == n and balance["unbalanced"] == 0, balance["by_fault"]
    assert all(b["ok"] and b["seconds"] <= balance["bound"] for b in balance["by_fault"])
    kinds = {k for k, n in result["faults_by_kind"].items() if n}
    # every kind that applies, the new ones too
    expected = set(parse_kinds(None, backend))
    assert {"lease-wipe", "checkpoint-loss", "listener-error"} <= expected
    assert kinds == expected
    for key in ("missing", "stale", "resurrected", "extra"):
        assert result[key] == 0
    assert result["checkpoint_regressions"] == 0 and result["fencing_violations"] == 0
    # a scheduled job ran through every fault: no fire time twice, tokens never went back
    assert result["jobs"]["runs"] > 0 and result["jobs"]["twice"] == 0
    assert result["jobs"]["token_regressions"] == 0
    assert result["writes"]["transactions"] > 0 and result["documents"]["mongo"] > 200
    assert set(result["gaps"]) == expected
    # after every fault every index equalled its collection again, writer held, in the bound
    equal = result["equal"]
    assert (equal["count"], equal["unequal"]) == (n, 0), equal["by_fault"]
    assert {k for k, e in equal["by_kind"].items() if e["count"]} == expected
    assert all(e["seconds"] <= e["bound"] and e["compares"] >= 1 for e in equal["by_fault"])
    for kind in ("kill", "stop", "term", "rotate"):
        gap = result["gaps"][kind]
        assert gap["takeovers"] >= 1 and set(gap) >= {"p50", "p99", "max"}
    # a crash is taken over within a lease ttl and a retry (plus slack for a busy 2-core box),
    # a planned handover (SIGTERM, rotation) typically in milliseconds and never slower than a
    # crash; it always releases (a drain that overruns its bound hands over without the act)
    ttl, retry = result["timings"]["ttl"], result["timings"]["retry_interval"]
    for kind in ("kill", "term", "rotate"):
        assert result["gaps"][kind]["max"] <= ttl + retry + 1.5, kind
    assert result["gaps"]["term"]["p50"] < 1.0 and result["gaps"]["rotate"]["p50"] < 1.0
    assert result["lag"]["p99"] is not None
    assert result["planned_expired"] == 0
    assert result["raw_stream"]["events"] > 0 and result["oplog_max_entries"] is not None
    page = report.read_text()
    assert "<svg" in page and "PASS" in page and "Balance after each fault" in page
    assert result["workdir"] is None  # a passing run cleans up after itself


@pytest.mark.timeout(180)
def test_drill_with_fencing_disabled_fails(tmp_path: Path) -> None:
    workdir = tmp_path / "work"
    code, result, log = drill(
        tmp_path,
        "--faults",
        "net-cut",
        "--rounds",
        "2",
        "--seed",
        "3",
        "--ttl",
        TTL,
        "--unsafe-disable-fencing",
        "--workdir",
        str(workdir),
    )
    assert code == 1 and not result["ok"], log[-3000:]
    assert result["fencing"] is False
    # a partitioned leader that ignores its deadline keeps writing after its successor's election
    assert result["fencing_violations"] > 0
    assert any("older fencing token" in f for f in result["failures"])
    # what is needed to replay and inspect the run is kept
    assert result["workdir"] == str(workdir)
    for name in ("schedule.json", "history.json", "replica-1.log", "audit-replica-1.jsonl"):
        assert (workdir / name).exists(), name
    schedule = json.loads((workdir / "schedule.json").read_text())
    assert schedule["seed"] == 3 and [f["kind"] for f in schedule["faults"]] == ["net-cut"] * 2


@pytest.mark.timeout(150)
def test_sentinel_failover_drill_passes(tmp_path: Path) -> None:
    """Two failovers (the master SIGKILLed, the replica promoted, the old master back as its
    replica, so the second goes the other way) and two leader kills: a leader streams within
    10 s of each promotion, nothing is lost, no token acts on two replicas."""
    code, result, log = drill(
        tmp_path,
        "--sentinel",
        "--faults",
        "sentinel-failover,kill",
        "--rounds",
        "4",
        "--seed",
        "1",
        "--ttl",
        TTL,
        timeout=120,
    )
    assert code == 0 and result["ok"], (result["failures"], log[-3000:])
    assert "redis+sentinel://" in log and "3 Sentinels" in log
    assert result["sentinel"] is True and result["backend"] == "redis"
    assert result["faults_by_kind"] == {"sentinel-failover": 2, "kill": 2}
    assert result["stalls"] == 0  # a leader streamed again within 10 s of every promotion
    for key in ("missing", "stale", "resurrected", "extra"):
        assert result[key] == 0
    assert result["documents"]["es"] == result["documents"]["mongo"] > 200
    assert result["fencing_violations"] == 0 and result["checkpoint_regressions"] == 0
    assert result["jobs"]["twice"] == 0 and result["jobs"]["shared_tokens"] == 0
    assert result["balance"]["unbalanced"] == 0, result["balance"]["by_fault"]


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("layout", ["--shaped", "--related"])
def test_shaped_drill_passes(layout: str, tmp_path: Path) -> None:
    """``--shaped``: three indexed collections into two indexes (a filter documents move in and
    out of, routing that changes, field rules, transactions across collections); ``--related``
    also embeds each order's customer and lines, and adds, moves between orders and deletes
    lines. Through SIGKILL, SIGSTOP 3 x ttl, SIGTERM and a lost checkpoint (a resync in the
    middle), every index equals the shaped (and joined) view after each fault and at the end,
    document by document (``_id``, ``_source``, ``_routing``)."""
    faults = "kill,stop,term,checkpoint-loss"
    # seed 2: the leader stopped 3.1 x ttl first, then SIGTERM, the resync, SIGKILL
    schedule = plan(2, 4, faults.split(","), float(TTL))
    assert [f.kind for f in schedule] == ["stop", "term", "checkpoint-loss", "kill"]
    assert schedule[0].param >= 3 * float(TTL)
    code, result, log = drill(
        tmp_path, layout, "--rounds", "4", "--faults", faults, "--seed", "2", "--ttl", TTL
    )
    assert code == 0 and result["ok"], (result["failures"], log[-3000:])
    assert result["shaped"] and result["related"] == (layout == "--related")
    assert result["faults"] == 4
    assert all(result["faults_by_kind"][k] == 1 for k in faults.split(","))
    (li,) = result["by_listener"]
    assert (li["missing"], li["stale"], li["resurrected"], li["extra"]) == (0, 0, 0, 0), li
    assert result["documents"]["mongo"] > 200 and result["writes"]["transactions"] > 0
    assert (result["equal"]["count"], result["equal"]["unequal"]) == (4, 0)
    assert result["checkpoint_regressions"] == 0 and result["fencing_violations"] == 0
