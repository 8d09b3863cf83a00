"""`singleton demo --duration 30`: the main job on embedded servers ends with a passing verdict."""

from __future__ import annotations

from pathlib import Path

from tests.integration.cluster import run_singleton


def test_demo_passes(tmp_path: Path) -> None:
    result = run_singleton("demo", "--duration", "30", "--workdir", str(tmp_path), timeout=240)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    assert "verdict: PASS" in out, out
    for kind in ("kill", "term", "rotate"):
        assert f"fault: {kind} the leader" in out, out
    # Every replica that was SIGTERMed handed over and exited cleanly.
    assert "exited with 0 after handing over" in out, out
