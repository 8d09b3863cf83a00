"""Run ``singleton run`` replicas as real processes for tests."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


class ReplicaProc:
    def __init__(
        self, identity: str, args: list[str], log_dir: Path, env: dict[str, str] | None = None
    ):
        self.identity = identity
        self.args = args
        self.log_path = log_dir / f"{identity}.log"
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("SINGLETON_")}
        self.env.update(env or {})
        self.env["SINGLETON_IDENTITY"] = identity
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> ReplicaProc:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "singleton.service.cli", "run", *self.args],
                cwd=ROOT,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        return self

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def signal(self, sig: signal.Signals) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, sig)

    def wait(self, timeout: float) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.signal(signal.SIGTERM)
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)


def status_json(args: list[str]) -> dict[str, object]:
    import json

    env = {k: v for k, v in os.environ.items() if not k.startswith("SINGLETON_")}
    out = subprocess.run(
        [sys.executable, "-m", "singleton.service.cli", "status", "--json", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    result: dict[str, object] = json.loads(out.stdout)
    return result
