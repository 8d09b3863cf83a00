"""Fault kinds, the seeded schedule, and how each fault is injected.

The schedule is a pure function of ``(seed, rounds, kinds, ttl)``: the same arguments give the
same faults in the same order with the same parameters (pause lengths, cut lengths, clock
offsets), so a failed run can be replayed. Each fault hits whoever leads at that moment; the
drill waits for a leader that is streaming again before the next one.
"""

from __future__ import annotations

import json
import random
import signal
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from loguru import logger

from listeners.elasticsearch.transport import Transport, connect
from singleton.errors import ConfigurationError
from singleton.service.dev.cluster import ReplicaProcess
from singleton.service.drill.cluster import DrillCluster

#: kind -> share of the default mix (``make drill``: 100 rounds -> 30 stops)
DEFAULT_MIX: dict[str, float] = {
    "stop": 0.30,
    "kill": 0.09,
    "term": 0.07,
    "rotate": 0.08,
    "net-cut": 0.06,
    "redis-restart": 0.04,
    "redis-pause": 0.04,
    "clock-jump": 0.05,
    "lease-wipe": 0.05,
    "checkpoint-loss": 0.05,
    "listener-error": 0.05,
    "index-close": 0.025,
    "alias-split": 0.025,
    "index-delete": 0.025,
    "alias-delete": 0.025,
}
#: kinds only a Sentinel drill (``--sentinel``) has, and their share of its mix
SENTINEL_MIX: dict[str, float] = {"sentinel-failover": 0.11}
#: kinds only asked for by name (``--faults history-loss``): the oplog flood slows the stand-in
#: down for tens of seconds, long enough to cost a MongoDB lease store its leases
OPT_IN_MIX: dict[str, float] = {"history-loss": 0.02}
KINDS = (*DEFAULT_MIX, *SENTINEL_MIX, *OPT_IN_MIX)
REDIS_KINDS = ("redis-restart", "redis-pause")
#: kinds that need the one embedded Redis or a per-replica proxy in front of the lease store:
#: Sentinel hands the replicas the master's real address, so ``--sentinel`` leaves them out
PROXY_KINDS = ("net-cut", *REDIS_KINDS)
#: seconds from the promotion within which a leader must stream again after sentinel-failover
PROMOTION_BOUND = 10.0
#: what an operator does to the index under a streaming leader (every listener's alias): delete
#: the physical index, remove the alias, close the index for a while, or point the alias at a
#: second index for a while (no write index)
SINK_KINDS = ("index-delete", "alias-delete", "index-close", "alias-split")
#: faults after which events must reach the index within 3 x ttl + 5 s
STORE_LOSS_KINDS = (
    "lease-wipe",
    "checkpoint-loss",
    "listener-error",
    *SINK_KINDS,
)
#: faults aimed at whoever leads
VICTIM_KINDS = ("kill", "stop", "term", "rotate", "net-cut", "clock-jump", "listener-error")
#: faults after which the old tenure ends by itself (drain and release) before the takeover
PLANNED = ("term", "rotate")
#: what a replica's Elasticsearch proxy answers during ``listener-error``: credentials revoked
_FORBIDDEN_BODY = b'{"error":{"type":"security_exception","reason":"drill"},"status":403}'
FORBIDDEN = (
    b"HTTP/1.1 403 Forbidden\r\nContent-Type: application/json\r\n"
    + f"Content-Length: {len(_FORBIDDEN_BODY)}\r\nConnection: close\r\n\r\n".encode()
    + _FORBIDDEN_BODY
)


_TIMED_SINK = ("index-close", "alias-split")


@dataclass(frozen=True)
class PlannedFault:
    index: int
    kind: str
    #: seconds the fault lasts (stop, redis-pause, net-cut) or the clock offset (clock-jump)
    param: float
    #: seconds to wait once a leader streams again, before injecting
    settle: float

    def describe(self) -> str:
        if self.kind == "clock-jump":
            return f"clock-jump {self.param:+.0f}s"
        if self.kind in ("stop", "redis-pause", "net-cut", "listener-error", *_TIMED_SINK):
            return f"{self.kind} {self.param:.1f}s"
        if self.kind == "checkpoint-loss":
            return f"{self.kind} ({'all stopped' if self.param else 'running'})"
        return self.kind


@dataclass
class FaultRecord:
    """One injected fault: when (monotonic), whom, and the token that led before it."""

    index: int
    kind: str
    param: float
    at: float
    victim: str | None
    token: int | None
    end: float = 0.0
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def parse_kinds(text: str | None, backend: str, *, sentinel: bool = False) -> list[str]:
    """``--faults`` -> kinds (default: every kind that applies to ``backend`` and ``sentinel``,
    but the opt-in ones, :data:`OPT_IN_MIX`)."""
    if not text:
        return [
            k
            for k in KINDS
            if (sentinel or k not in SENTINEL_MIX)
            and not (sentinel and k in PROXY_KINDS)
            and (backend == "redis" or k not in REDIS_KINDS)
            and k not in OPT_IN_MIX
        ]
    kinds = [k.strip() for k in text.split(",") if k.strip()]
    for k in kinds:
        if k not in KINDS:
            raise ConfigurationError(f"--faults: unknown fault {k!r}; known: {', '.join(KINDS)}")
        if k in REDIS_KINDS and backend != "redis":
            raise ConfigurationError(f"--faults: {k} needs --backend redis")
        if k in SENTINEL_MIX and not sentinel:
            raise ConfigurationError(f"--faults: {k} needs --sentinel")
        if k in PROXY_KINDS and sentinel:
            raise ConfigurationError(
                f"--faults: {k} needs the embedded Redis and its proxies, not --sentinel"
            )
    return list(dict.fromkeys(kinds))


def plan(seed: int, rounds: int, kinds: list[str], ttl: float) -> list[PlannedFault]:
    """``rounds`` faults over ``kinds`` in the default mix's proportions, shuffled by ``seed``."""
    if rounds < 1:
        raise ConfigurationError(f"--rounds must be >= 1, got {rounds}")
    weights = {k: {**DEFAULT_MIX, **SENTINEL_MIX, **OPT_IN_MIX}[k] for k in kinds}
    total = sum(weights.values())
    exact = {k: rounds * w / total for k, w in weights.items()}
    counts = {k: int(v) for k, v in exact.items()}
    by_remainder = sorted(kinds, key=lambda k: (counts[k] - exact[k], kinds.index(k)))
    for k in by_remainder[: rounds - sum(counts.values())]:
        counts[k] += 1
    if rounds >= len(kinds):
        _each_at_least_once(counts, kinds)
    rng = random.Random(seed)
    sequence = [k for k in kinds for _ in range(counts[k])]
    rng.shuffle(sequence)
    out = []
    for i, kind in enumerate(sequence):
        if kind == "stop":
            param = rng.uniform(2.0, 5.0) * ttl
        elif kind == "redis-pause":
            param = rng.uniform(0.2, 1.2) * ttl
        elif kind == "net-cut":
            param = rng.uniform(1.5, 2.5) * ttl
        elif kind == "clock-jump":
            param = rng.choice((-1.0, 1.0)) * rng.uniform(60.0, 7200.0)
        elif kind == "listener-error":
            param = rng.uniform(1.5, 3.0) * ttl
        elif kind in _TIMED_SINK:
            param = rng.uniform(0.5, 1.5) * ttl
        elif kind == "checkpoint-loss":  # 1: while no replica runs; 0: under a running leader
            param = float(sum(k == kind for k in sequence[:i]) % 2)
        else:
            param = 0.0
        out.append(PlannedFault(i, kind, round(param, 3), round(rng.uniform(0.3, 1.0), 3)))
    return out


def _each_at_least_once(counts: dict[str, int], kinds: list[str]) -> None:
    """Give every kind of ``counts`` one round at least, taken from the most frequent."""
    for k in kinds:
        if counts[k] == 0:
            counts[max(kinds, key=lambda m: (counts[m], -kinds.index(m)))] -= 1
            counts[k] = 1


class Injector:
    """Applies planned faults to a :class:`DrillCluster`."""

    def __init__(self, cluster: DrillCluster, stop: threading.Event) -> None:
        self.cluster = cluster
        self._stop = stop

    def _wait(self, seconds: float) -> None:
        self._stop.wait(seconds)

    def inject(self, fault: PlannedFault) -> FaultRecord:
        victim, token = self.cluster.leader()
        rec = FaultRecord(
            fault.index,
            fault.kind,
            fault.param,
            time.monotonic(),
            victim.identity if victim else None,
            token,
        )
        logger.info(
            "fault {}: {} on {} (token {})", fault.index, fault.describe(), rec.victim, token
        )
        if fault.kind in VICTIM_KINDS:
            if victim is None:
                rec.note = "no leader to hit"
            else:
                self._hit_leader(victim, fault, rec)
        else:
            self._hit_stores(fault, rec)
        rec.end = time.monotonic()
        return rec

    def _hit_leader(self, victim: ReplicaProcess, fault: PlannedFault, rec: FaultRecord) -> None:
        c = self.cluster
        kind = fault.kind
        if kind in ("kill", "term"):  # a crash, or a planned exit (drain, release); restart
            victim.signal(signal.SIGKILL if kind == "kill" else signal.SIGTERM)
            code = victim.wait(20)
            rec.note = f"exit {code}"
            if code is None:
                victim.signal(signal.SIGKILL)
                victim.wait(5)
            victim.restart()
        elif kind == "stop":
            victim.signal(signal.SIGSTOP)
            self._wait(fault.param)
            victim.signal(signal.SIGCONT)
        elif kind == "rotate":
            victim.signal(signal.SIGUSR1)
        elif kind == "net-cut":
            proxy = c.proxies[victim.identity]
            proxy.blackhole()
            self._wait(fault.param)
            proxy.restore()
        elif kind == "clock-jump":
            clock = c.clock_files[victim.identity]
            clock.write_text(f"{fault.param:+.0f}\n")
            rec.note = f"wall clock {fault.param:+.0f}s"
        elif kind == "listener-error":
            es_proxy = c.es_proxies[victim.identity]
            es_proxy.refuse(FORBIDDEN)
            self._wait(fault.param)
            es_proxy.restore()

    def _hit_stores(self, fault: PlannedFault, rec: FaultRecord) -> None:
        c = self.cluster
        kind = fault.kind
        if kind == "lease-wipe":
            c.wipe_leases()
        elif kind in SINK_KINDS:
            rec.note = self._hit_index(fault)
        elif kind == "checkpoint-loss":
            rec.note = self._lose_checkpoint(all_stopped=bool(fault.param))
        elif kind == "history-loss":
            rec.note = self._lose_history()
        elif kind == "sentinel-failover":
            if c.sentinel is None:
                raise ConfigurationError(f"{kind} needs --sentinel")
            killed, master, promoted = c.sentinel.failover()
            rec.extra["promoted"] = promoted
            rec.note = (
                f"master {killed.port} killed, a replica promoted {promoted - rec.at:.1f}s "
                f"later; master now {master.port}, {killed.port} back as a replica"
            )
        elif kind in ("redis-restart", "redis-pause"):
            if c.redis is None:
                raise ConfigurationError(f"{kind} needs the embedded Redis")
            if kind == "redis-restart":
                c.redis.restart()
            else:
                c.redis.pause()
                self._wait(fault.param)
                c.redis.resume()

    def _lose_history(self) -> str:
        """The saved position a bare cluster time (as after a copy) and the oplog rolled past
        it while no replica runs (a long pause, a long copy): the successor must notice."""
        replicas = list(self.cluster.replicas.values())
        for p in replicas:
            p.stop()
        try:
            return self.cluster.lose_history()
        finally:
            for p in replicas:
                p.restart()

    def _lose_checkpoint(self, *, all_stopped: bool) -> str:
        c = self.cluster
        if not all_stopped:
            return "deleted" if c.delete_checkpoint() else "there was none"
        replicas = list(c.replicas.values())
        for p in replicas:
            p.stop()  # SIGTERM: drain, checkpoint, release, exit
        deleted = c.delete_checkpoint()
        for p in replicas:
            p.restart()
        return f"{'deleted' if deleted else 'there was none'} with every replica stopped"

    def _hit_index(self, fault: PlannedFault) -> str:
        """``fault`` (one of :data:`SINK_KINDS`) on every listener's index, done as an operator
        would, through Elasticsearch's own API; what was hit."""
        es = connect(self.cluster.es_url, maxsize=2)
        try:
            done = [self._on_alias(es, li.index, fault) for li in self.cluster.listeners]
        finally:
            es.close()
        return "; ".join(done)

    def _on_alias(self, es: Transport, alias: str, fault: PlannedFault) -> str:
        status, body = es.request("GET", f"/_alias/{alias}")
        physical = sorted(body) if status == 200 and isinstance(body, dict) else []
        if not physical:
            return f"{alias}: no alias to hit"
        targets = ",".join(physical)
        if fault.kind == "index-delete":
            es.request("DELETE", f"/{targets}")
        elif fault.kind == "alias-delete":
            es.request("DELETE", f"/{targets}/_alias/{alias}")
        elif fault.kind == "index-close":
            es.request("POST", f"/{targets}/_close")
            self._wait(fault.param)
            es.request("POST", f"/{targets}/_open")
        else:  # alias-split: a second index behind the alias, so that it has no write index
            decoy = f"{alias}-drill-decoy"
            es.request("PUT", f"/{decoy}", json.dumps({"aliases": {alias: {}}}).encode())
            self._wait(fault.param)
            es.request("DELETE", f"/{decoy}")
        return f"{alias} -> {targets}"
