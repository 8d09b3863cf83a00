"""Election timings and command rates against a real ``redis-server`` started here.

* planned handover: ``Elector.rotate()`` on the leader -> successor's ``on_elected`` (50 runs);
* crash takeover: the leader stops renewing without releasing (``stop(release=False)``) ->
  successor's ``on_elected`` (10 runs, ttl=1, the default ``retry_interval`` of 2 s: the
  follower comes back at the expiry the store reported, so the goal is ttl + 0.1 s);
* commands per second sent by an idle follower and by a leader, counted per connection with
  ``MONITOR`` on a dedicated server (commands run inside Lua scripts are not counted).

All times are ``time.monotonic()`` read in the callbacks. ``python -m bench.election``.
"""

from __future__ import annotations

import json
import re
import select
import socket
import statistics
import sys
import threading
import time
from typing import Any

from loguru import logger

from singleton.election.elector import Elector
from singleton.election.leadership import Leadership
from singleton.lease.redis import RedisLeaseBackend
from singleton.service.dev.embedded import RedisServer

ROTATIONS = 50
CRASHES = 10
WINDOW = 6.0


def percentiles(samples: list[float]) -> dict[str, float]:
    ms = sorted(s * 1000 for s in samples)
    p99 = ms[min(len(ms) - 1, round(0.99 * (len(ms) - 1)))]
    return {
        "n": len(ms),
        "p50_ms": round(statistics.median(ms), 2),
        "p99_ms": round(p99, 2),
        "max_ms": round(ms[-1], 2),
    }


class Candidate:
    """An Elector on its own Redis connection (named, for MONITOR), recording callback times."""

    def __init__(self, url: str, ident: str, **timings: Any) -> None:
        self.backend = RedisLeaseBackend(f"{url}?client_name={ident}", namespace="bench")
        self.elected = threading.Event()
        self.elected_at = 0.0
        self.token = 0
        self.elector = Elector(
            self.backend, "job", identity=ident, on_elected=self._on_elected, **timings
        )

    def _on_elected(self, ld: Leadership) -> None:
        self.elected_at = time.monotonic()
        self.token = ld.token
        self.elected.set()

    def close(self, release: bool = True) -> None:
        self.elector.stop(release=release, timeout=10)
        self.backend.close()


def wait_leader(candidates: list[Candidate], timeout: float = 10) -> Candidate:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for c in candidates:
            if c.elector.is_leader:
                return c
        threading.Event().wait(0.005)
    raise TimeoutError("no leader elected")


def planned_handover(url: str) -> dict[str, Any]:
    timings: dict[str, Any] = {"ttl": 3.0, "retry_interval": 0.5, "cooldown": 0.2}
    pair = [Candidate(url, f"rot{i}", **timings) for i in range(2)]
    samples: list[float] = []
    try:
        for c in pair:
            c.elector.start()
        leader = wait_leader(pair)
        for _ in range(ROTATIONS):
            successor = pair[1 - pair.index(leader)]
            successor.elected.clear()
            # Let the previous leader's cooldown pass and its follower wait settle.
            threading.Event().wait(0.4)
            asked = time.monotonic()
            leader.elector.rotate()
            if not successor.elected.wait(10):
                raise TimeoutError("successor not elected after rotate()")
            samples.append(successor.elected_at - asked)
            leader = successor
    finally:
        for c in pair:
            c.close()
    return {**percentiles(samples), "goal_p99_ms": 50, "ok": percentiles(samples)["p99_ms"] <= 50}


def crash_takeover(url: str) -> dict[str, Any]:
    timings: dict[str, Any] = {"ttl": 1.0}
    samples: list[float] = []
    for i in range(CRASHES):
        leader = Candidate(url, f"crash{i}a", **timings)
        follower = Candidate(url, f"crash{i}b", **timings)
        try:
            leader.elector.start()
            if not leader.elected.wait(10):
                raise TimeoutError("leader not elected")
            follower.elector.start()
            threading.Event().wait(0.5)  # the follower settles into its wait; the leader renews
            crashed = time.monotonic()
            leader.elector.stop(release=False, timeout=10)  # no release: the lease must expire
            if not follower.elected.wait(10):
                raise TimeoutError("follower did not take over")
            samples.append(follower.elected_at - crashed)
            assert follower.token > leader.token
        finally:
            leader.close(release=False)
            follower.close()
    goal = (1.0 + 0.1) * 1000
    return {**percentiles(samples), "goal_ms": goal, "ok": percentiles(samples)["p99_ms"] <= goal}


class Monitor:
    """``MONITOR`` on a raw socket: counts commands per client address until stopped."""

    LINE = re.compile(rb'^\+[\d.]+ \[\d+ ([^\]]+)\] "([^"]+)"')

    def __init__(self, host: str, port: int) -> None:
        self.sock = socket.create_connection((host, port), timeout=5)
        self.sock.sendall(b"MONITOR\r\n")
        self.counts: dict[str, dict[str, int]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        buf = b""
        while not self._stop.is_set():
            ready, _, _ = select.select([self.sock], [], [], 0.1)
            if not ready:
                continue
            chunk = self.sock.recv(65536)
            if not chunk:
                return
            buf += chunk
            *lines, buf = buf.split(b"\r\n")
            for line in lines:
                m = self.LINE.match(line)
                if m is None:
                    continue
                addr, cmd = m.group(1).decode(), m.group(2).decode().lower()
                per = self.counts.setdefault(addr, {})
                per[cmd] = per.get(cmd, 0) + 1

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sock.close()


def addresses(probe: RedisLeaseBackend, name: str) -> set[str]:
    client = probe._client  # a bench may peek: CLIENT LIST maps names to addresses
    return {str(c["addr"]) for c in client.client_list() if c.get("name") == name}


def command_rates() -> dict[str, Any]:
    renew_interval, retry_interval = 0.5, 0.5
    timings: dict[str, Any] = {
        "ttl": 1.5,
        "renew_interval": renew_interval,
        "renew_deadline": 1.0,
        "retry_interval": retry_interval,
    }
    with RedisServer() as server:  # dedicated: nothing else talks to it
        leader = Candidate(server.url, "leader", **timings)
        follower = Candidate(server.url, "follower", **timings)
        probe = RedisLeaseBackend(server.url, namespace="probe")
        try:
            leader.elector.start()
            if not leader.elected.wait(10):
                raise TimeoutError("leader not elected")
            follower.elector.start()
            threading.Event().wait(2 * retry_interval)  # subscribed and idle
            monitor = Monitor(server.host, server.port)
            threading.Event().wait(WINDOW)
            monitor.stop()
            result: dict[str, Any] = {"window_s": WINDOW}
            for who, goal in (("leader", 1 / renew_interval), ("follower", 1 / retry_interval)):
                per: dict[str, int] = {}
                for addr in addresses(probe, who):
                    for cmd, n in monitor.counts.get(addr, {}).items():
                        per[cmd] = per.get(cmd, 0) + n
                rate = sum(per.values()) / WINDOW
                result[who] = {
                    "commands_per_s": round(rate, 3),
                    "goal_per_s": goal,
                    "by_command": per,
                    # Jitter (+-10 %) on the intervals allows a little over the nominal rate.
                    "ok": rate <= goal * 1.15,
                }
            return result
        finally:
            leader.close()
            follower.close()
            probe.close()


def main() -> dict[str, Any]:
    logger.remove()
    logger.add(sys.stderr, level="WARNING")
    with RedisServer() as server:
        handover = planned_handover(server.url)
        crash = crash_takeover(server.url)
    return {
        "backend": "redis",
        "planned_handover": handover,
        "crash_takeover": crash,
        "commands": command_rates(),
    }


if __name__ == "__main__":
    print(json.dumps(main(), indent=2, sort_keys=True))
