"""Run ``singleton run`` replicas as real processes for tests."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
from pathlib import Path

from singleton.service.dev.cluster import child_environment, singleton_command

ROOT = Path(__file__).resolve().parents[2]


#: Short lease timings for process-level tests (ttl 4 s).
TIMINGS = [
    "--ttl",
    "4",
    "--renew-interval",
    "1",
    "--renew-deadline",
    "2.5",
    "--retry-interval",
    "0.5",
]


def store_args(kind: str, redis_url: str, mongo_url: str, ns: str) -> list[str]:
    """Flags for the lease store, the Mongo URL, the namespace and the short timings."""
    return [
        *["--backend", kind, "--redis-url", redis_url, "--mongo-url", mongo_url],
        *["--namespace", ns, *TIMINGS],
    ]


class ReplicaProc:
    def __init__(
        self, identity: str, args: list[str], log_dir: Path, env: dict[str, str] | None = None
    ):
        self.identity = identity
        self.args = args
        self.log_path = log_dir / f"{identity}.log"
        self.env = child_environment()
        self.env.update(env or {})
        self.env["SINGLETON_IDENTITY"] = identity
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> ReplicaProc:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                singleton_command("run", *self.args),
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


def run_singleton(
    *args: str, timeout: float = 60, cwd: Path = ROOT
) -> subprocess.CompletedProcess[str]:
    """``singleton ARGS...`` as a child process, without the caller's ``SINGLETON_*`` variables."""
    return subprocess.run(
        singleton_command(*args),
        cwd=cwd,
        env=child_environment(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def status_json(args: list[str]) -> dict[str, object]:
    out = run_singleton("status", "--json", *args)
    assert out.returncode == 0, out.stderr
    result: dict[str, object] = json.loads(out.stdout)
    return result
