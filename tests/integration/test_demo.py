"""`singleton demo --duration 30`: the main job on embedded servers ends with a passing verdict."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_demo_passes(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SINGLETON_")}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "singleton.service.cli",
            "demo",
            "--duration",
            "30",
            "--workdir",
            str(tmp_path),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    assert "verdict: PASS" in out, out
    for kind in ("kill", "term", "rotate"):
        assert f"fault: {kind} the leader" in out, out
    # Every replica that was SIGTERMed handed over and exited cleanly.
    assert "exited with 0 after handing over" in out, out
