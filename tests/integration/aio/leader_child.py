"""An asyncio leader in its own process, for the SIGKILL / SIGSTOP / SIGTERM tests.

``python -m tests.integration.aio.leader_child KIND URL NAMESPACE IDENTITY`` runs
``AsyncElector.run(work)`` (ttl=1) on the asyncio backend ``KIND`` (redis or mongo). The work
acts every 20 ms, each act after ``leadership.check()``. It prints one JSON object per line:
``elected``, ``act``, ``cancelled``, ``lost`` and ``stopped``, each with the fencing token and
``t``, the system-wide monotonic clock (``CLOCK_MONOTONIC`` is one clock for every process on
the machine, so the parent can order the lines of all its children). SIGTERM is a planned stop
(``await elector.stop()``: cancel the work, release). :class:`AsyncChild` runs it from a test.
"""

from __future__ import annotations

import asyncio
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

from singleton.aio import AsyncElector, AsyncLeases, AsyncMongoLeaseBackend, AsyncRedisLeaseBackend
from singleton.election.leadership import Leadership
from singleton.errors import LeaseLostError

ROOT = Path(__file__).resolve().parents[3]
TTL = 1.0


def emit(**fields: object) -> None:
    sys.stdout.write(json.dumps({**fields, "t": time.monotonic()}) + "\n")
    sys.stdout.flush()


async def main(kind: str, url: str, namespace: str, identity: str) -> None:
    backend: AsyncLeases = (
        AsyncRedisLeaseBackend(url, namespace=namespace)
        if kind == "redis"
        else AsyncMongoLeaseBackend(url, database=namespace)
    )
    elector = AsyncElector(
        backend,
        "job",
        identity=identity,
        ttl=TTL,
        retry_interval=0.2,
        on_elected=lambda ld: emit(event="elected", token=ld.token),
        on_lost=lambda ld, why: emit(event="lost", token=ld.token, reason=why),
    )

    async def work(ld: Leadership) -> None:
        try:
            while True:
                ld.check()
                emit(event="act", token=ld.token, remaining=ld.remaining())
                await asyncio.sleep(0.02)
        except asyncio.CancelledError:
            emit(event="cancelled", token=ld.token)
            raise
        except LeaseLostError:
            emit(event="refused", token=ld.token)
            raise

    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, lambda: asyncio.ensure_future(elector.stop()))
    try:
        await elector.run(work)
    finally:
        await backend.aclose()
        emit(event="stopped")


class AsyncChild:
    """One leader_child process; its lines go to ``lines`` as ``(identity, line)``."""

    def __init__(
        self,
        kind: str,
        url: str,
        namespace: str,
        identity: str,
        lines: queue.Queue[tuple[str, dict[str, Any]]],
        log: Path,
    ) -> None:
        self.identity = identity
        self._log = open(log, "wb")  # noqa: SIM115 - closed in close()
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.integration.aio.leader_child",
                kind,
                url,
                namespace,
                identity,
            ],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
        )
        self._lines = lines
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put((self.identity, json.loads(line)))

    def signal(self, sig: int) -> float:
        """Send ``sig``; returns when it was sent, on the shared monotonic clock."""
        os.kill(self.proc.pid, sig)
        return time.monotonic()

    def close(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        self._log.close()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:5]))
