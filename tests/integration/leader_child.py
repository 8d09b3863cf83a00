"""A leader in its own process, for SIGSTOP tests.

``python -m tests.integration.leader_child REDIS_URL NAMESPACE LEASE`` campaigns with an Elector
(ttl=1) and prints one JSON object per line on stdout: ``elected`` and ``lost`` events, and a
``valid`` report for every line read on stdin. EOF on stdin stops it (without releasing).
:class:`Child` runs it from a test.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from singleton.election.elector import Elector
from singleton.election.leadership import Leadership
from singleton.lease.redis import RedisLeaseBackend

ROOT = Path(__file__).resolve().parents[2]
_out = threading.Lock()


def emit(**fields: object) -> None:
    with _out:
        sys.stdout.write(json.dumps(fields) + "\n")
        sys.stdout.flush()


def main(argv: list[str]) -> int:
    url, namespace, name = argv[1:4]
    current: list[Leadership] = []

    def elected(ld: Leadership) -> None:
        current.append(ld)
        emit(event="elected", token=ld.token, valid=ld.valid())

    def lost(ld: Leadership, reason: str) -> None:
        emit(event="lost", token=ld.token, reason=reason, valid=ld.valid())

    backend = RedisLeaseBackend(url, namespace=namespace)
    elector = Elector(
        backend,
        name,
        identity="child",
        ttl=1.0,
        retry_interval=0.2,
        on_elected=elected,
        on_lost=lost,
    )
    elector.start()
    try:
        for _ in sys.stdin:
            ld = current[-1] if current else None
            emit(
                event="valid",
                token=None if ld is None else ld.token,
                valid=ld is not None and ld.valid(),
            )
    finally:
        elector.stop(release=False, timeout=5)
        backend.close()
    return 0


class Child:
    """The leader_child process and its JSON lines (read by a thread, handed over by a queue)."""

    def __init__(self, url: str, namespace: str, log: Path) -> None:
        self._log = open(log, "wb")  # noqa: SIM115 - closed in close()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.integration.leader_child", url, namespace, "job"],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
        )
        self.lines: queue.Queue[dict[str, Any]] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(json.loads(line))

    def next(self, event: str, timeout: float = 15) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """The next line with ``event``, and every line read up to it."""
        seen = []
        deadline = time.monotonic() + timeout
        while True:
            line = self.lines.get(timeout=max(0.01, deadline - time.monotonic()))
            seen.append(line)
            if line["event"] == event:
                return line, seen

    def ask_valid(self) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        assert self.proc.stdin is not None
        self.proc.stdin.write("valid?\n")
        self.proc.stdin.flush()
        return self.next("valid")

    def close(self) -> None:
        os.kill(self.proc.pid, signal.SIGCONT)
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        self._log.close()


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
