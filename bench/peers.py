"""Leader election side by side: singleton, python-redis-lock and tooz on one ``redis-server``.

Per library, ``CONTENDERS`` processes (``bench/_peers_child.py``) campaign for one lease with ttl
``BENCH_PEERS_TTL`` (2 s) and each library's defaults otherwise; the leader acts every 10 ms by
appending ``(contender, time.monotonic())`` to a Redis list, whose order is the order the shared
resource saw the acts in. Then, ``BENCH_PEERS_ROUNDS`` times (3) each:

* crash takeover: SIGKILL the leader -> the first act of another contender (s);
* planned handover: SIGTERM the leader, which stops acting and takes its library's own release
  path -> the first act of another contender (s); and the old leader's acts after that one;
* paused leader: SIGSTOP the leader for 3 x ttl, SIGCONT, watch ``BENCH_PEERS_WINDOW`` s (4):
  the acts it makes after its successor's first act (0 for a safe library), and whether it
  still acts at the end of the window.

A victim is killed after its round and replaced by a fresh contender; each round waits a random
ttl..2 ttl (seeded, ``BENCH_PEERS_SEED``) into the leader's tenure, so faults land anywhere in its
renewal cycle. Assumes one machine: the children's ``time.monotonic()`` is the parent's clock.

python-redis-lock and tooz are no dependencies of this project: they are installed into a
throwaway virtualenv (``BENCH_PEERS_VENV``, default ``~/.cache/singleton-bench/peers-venv``, made
once and reused) whose python runs their contenders; singleton's run on this interpreter.

    python -m bench peers
    BENCH_PEERS_ROUNDS=10 BENCH_PEERS_LIBRARIES=singleton,tooz python -m bench peers
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple, cast

import redis

import singleton
from bench._support import pct
from singleton.service.dev.embedded import RedisServer

ROUNDS = int(os.environ.get("BENCH_PEERS_ROUNDS", "3"))
TTL = float(os.environ.get("BENCH_PEERS_TTL", "2"))
#: Seconds the paused leader is watched after SIGCONT.
WINDOW = float(os.environ.get("BENCH_PEERS_WINDOW", "4"))
SEED = int(os.environ.get("BENCH_PEERS_SEED", "1"))
#: tooz's ``heartbeat()`` + ``run_watchers()`` period (its leader-election tutorial's 0.1 s).
TOOZ_POLL = float(os.environ.get("BENCH_PEERS_TOOZ_POLL", "0.1"))
CONTENDERS = 3
PAUSE_TTLS = 3
PEER_REQUIREMENTS = ["python-redis-lock>=4,<5", "tooz>=9,<10", "redis"]
CHILD = Path(__file__).with_name("_peers_child.py")
#: How often the parent reads the list; the figures come from the children's own stamps.
POLL = 0.005
#: A leader is "acting" while its latest act is at most this old.
FRESH = 0.25
_idle = threading.Event()  # never set: waits on it are bounded pauses between polls


class Library(NamedTuple):
    name: str  # the child's argument
    python: str
    label: str  # the table's first column


class Entry(NamedTuple):
    ident: str
    kind: str  # act | ready | lost | released
    at: float  # the child's time.monotonic()


class Marks:
    """The contenders' shared list, read incrementally; ``entries`` is in the list's order."""

    def __init__(self, client: redis.Redis, key: str) -> None:
        self.client = client
        self.key = key
        self.entries: list[Entry] = []

    def poll(self) -> None:
        for item in cast("list[bytes]", self.client.lrange(self.key, len(self.entries), -1)):
            ident, kind, at = item.decode().split()
            self.entries.append(Entry(ident, kind, float(at)))

    def wait(self, found: Callable[[], Any], timeout: float) -> Any:
        """Poll until ``found()`` returns something other than None (returned), or ``timeout``
        seconds pass (None)."""
        deadline = time.monotonic() + timeout
        while True:
            self.poll()
            value = found()
            if value is not None or time.monotonic() >= deadline:
                return value
            _idle.wait(POLL)

    def seconds(self, found: int | None, since: float) -> float | None:
        """From ``since`` to the mark at position ``found`` (None if there is none)."""
        return None if found is None else round(self.entries[found].at - since, 4)

    def first_act_of_another(self, since: int, victim: str) -> int | None:
        """The position of the first act after position ``since`` not by ``victim``."""
        for i in range(since, len(self.entries)):
            e = self.entries[i]
            if e.kind == "act" and e.ident != victim:
                return i
        return None

    def acts_by(self, ident: str, after: int) -> list[Entry]:
        return [e for e in self.entries[after + 1 :] if e.ident == ident and e.kind == "act"]

    def has(self, ident: str, kind: str, since: int = 0) -> bool:
        return any(e.ident == ident and e.kind == kind for e in self.entries[since:])


class Contender:
    """One child process in a session of its own, logging into ``log``."""

    def __init__(self, argv: list[str], log: Path, cwd: Path) -> None:
        self.log = log
        with open(log, "ab") as out:
            self.proc = subprocess.Popen(
                argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=cwd,
                start_new_session=True,
            )

    def signal(self, sig: signal.Signals) -> None:
        os.kill(self.proc.pid, sig)

    def kill(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)


class Field:
    """The contenders of one library and their marks; a context manager that kills them all."""

    def __init__(self, library: Library, url: str, client: redis.Redis, root: Path) -> None:
        self.library = library
        self.url = url
        self.root = root
        self.marks = Marks(client, f"peers:{library.name}:marks")
        self.procs: dict[str, Contender] = {}
        self._spawned = 0

    def fill(self) -> None:
        """Start contenders until there are ``CONTENDERS``; wait until each is campaigning."""
        while len(self.procs) < CONTENDERS:
            self._spawned += 1
            ident = f"{self.library.name}-{self._spawned}"
            argv = [self.library.python, "-I", str(CHILD), self.library.name, ident, self.url]
            argv += [self.marks.key, "--ttl", str(TTL), "--tooz-poll", str(TOOZ_POLL)]
            self.procs[ident] = Contender(argv, self.root / f"{ident}.log", self.root)
        ready = self.marks.wait(
            lambda: True if all(self.marks.has(i, "ready") for i in self.procs) else None, 60
        )
        if ready is None:
            raise RuntimeError(f"{self.library.name}: contenders not ready; {self.tails()}")

    def acting(self) -> str | None:
        """The contender whose latest act is fresh, if it is the latest act of all."""
        for e in reversed(self.marks.entries):
            if e.kind == "act":
                fresh = time.monotonic() - e.at <= FRESH
                return e.ident if fresh and e.ident in self.procs else None
        return None

    def leader(self, hold: float) -> str:
        """The leader, once it has acted ``hold`` more seconds without a change."""
        for _ in range(5):
            first = self.marks.wait(self.acting, 30 * TTL)
            if first is None:
                raise RuntimeError(f"{self.library.name}: no leader acting; {self.tails()}")
            # Deliberate: a point at random in the tenure, not a wait for an event.
            _idle.wait(hold)
            self.marks.poll()
            if self.acting() == first:
                return str(first)
            print(f"peers: {self.library.name} leader changed by itself", file=sys.stderr)
        raise RuntimeError(f"{self.library.name}: the leadership does not settle")

    def retire(self, ident: str) -> None:
        self.procs.pop(ident).kill()

    def tails(self) -> str:
        return "; ".join(
            f"{p.log.name}: {p.log.read_text(errors='replace')[-600:]!r}"
            for p in self.procs.values()
        )

    def __enter__(self) -> Field:
        return self

    def __exit__(self, *exc: object) -> None:
        for p in self.procs.values():
            p.kill()
        self.procs.clear()


def crash(field: Field, victim: str) -> dict[str, Any]:
    since = len(field.marks.entries)
    t0 = time.monotonic()
    field.procs[victim].signal(signal.SIGKILL)
    found = field.marks.wait(lambda: field.marks.first_act_of_another(since, victim), 30 * TTL)
    field.retire(victim)
    return {"takeover_s": field.marks.seconds(found, t0)}


def handover(field: Field, victim: str) -> dict[str, Any]:
    since = len(field.marks.entries)
    proc = field.procs[victim].proc
    t0 = time.monotonic()
    field.procs[victim].signal(signal.SIGTERM)
    found = field.marks.wait(lambda: field.marks.first_act_of_another(since, victim), 30 * TTL)
    try:
        code: int | None = proc.wait(10)
    except subprocess.TimeoutExpired:
        code = None
    field.marks.poll()  # everything it sent before it exited
    released = field.marks.has(victim, "released", since)
    field.retire(victim)
    late = None if found is None else len(field.marks.acts_by(victim, found))
    return {
        "takeover_s": field.marks.seconds(found, t0),
        "acts_after_successor": late,
        "released": released,
        "exit_code": code,
    }


def paused(field: Field, victim: str) -> dict[str, Any]:
    since = len(field.marks.entries)
    t0 = time.monotonic()
    field.procs[victim].signal(signal.SIGSTOP)
    pause = PAUSE_TTLS * TTL
    found = field.marks.wait(lambda: field.marks.first_act_of_another(since, victim), pause)
    _idle.wait(max(0.0, t0 + pause - time.monotonic()))  # the pause is the scenario
    resumed = time.monotonic()
    field.procs[victim].signal(signal.SIGCONT)
    _idle.wait(WINDOW)  # the window is the scenario too
    field.marks.poll()
    if found is None:
        found = field.marks.first_act_of_another(since, victim)
    noticed = field.marks.has(victim, "lost", since)
    field.retire(victim)
    if found is None:
        return {"takeover_s": None, "noticed_loss": noticed}
    late = field.marks.acts_by(victim, found)
    last = max((e.at for e in late), default=None)
    return {
        "takeover_s": field.marks.seconds(found, t0),
        "acts_after_deposition": len(late),
        "last_act_after_resume_s": None if last is None else round(last - resumed, 3),
        "still_acting_at_end": last is not None and last >= resumed + WINDOW - 0.5,
        "noticed_loss": noticed,
    }


SCENARIOS: dict[str, Callable[[Field, str], dict[str, Any]]] = {
    "crash_takeover": crash,
    "planned_handover": handover,
    "paused_leader": paused,
}


def summary(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    samples = [r["takeover_s"] for r in rounds if r["takeover_s"] is not None]
    out: dict[str, Any] = {
        "rounds": rounds,
        "takeover_s": samples,
        "timeouts": len(rounds) - len(samples),
    }
    if samples:
        out |= {
            "p50_s": round(pct(samples, 0.5), 4),
            "p99_s": round(pct(samples, 0.99), 4),
            "min_s": round(min(samples), 4),
            "max_s": round(max(samples), 4),
        }
    return out


def run_library(
    library: Library, url: str, client: redis.Redis, root: Path, rng: random.Random
) -> dict[str, Any]:
    results: dict[str, Any] = {}
    with Field(library, url, client, root) as field:
        for scenario, inject in SCENARIOS.items():
            rounds = []
            for n in range(ROUNDS):
                field.fill()
                victim = field.leader(TTL * (1 + rng.random()))
                rounds.append(inject(field, victim))
                print(f"peers: {library.name} {scenario} {n + 1}: {rounds[-1]}", file=sys.stderr)
            results[scenario] = summary(rounds)
    return results


def peer_python() -> str:
    """The python of the peers' virtualenv: reused while it imports them, else made anew (in a
    sibling directory, moved into place only once complete)."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    venv = Path(os.environ.get("BENCH_PEERS_VENV") or cache / "singleton-bench" / "peers-venv")
    python = venv / "bin" / "python"
    probe = [str(python), "-I", "-c", "import redis, redis_lock, tooz.coordination"]
    if python.exists() and subprocess.run(probe, capture_output=True).returncode == 0:
        return str(python)
    print(f"peers: installing {PEER_REQUIREMENTS} into {venv}", file=sys.stderr)
    venv.parent.mkdir(parents=True, exist_ok=True)
    building = Path(tempfile.mkdtemp(prefix=f"{venv.name}.", dir=venv.parent))
    try:
        steps = [
            [sys.executable, "-m", "venv", "--clear", str(building)],
            [str(building / "bin" / "python"), "-m", "pip", "install", "-q", *PEER_REQUIREMENTS],
        ]
        for argv in steps:
            done = subprocess.run(argv, capture_output=True, text=True)
            if done.returncode != 0:
                raise RuntimeError(f"{' '.join(argv)} failed: {done.stderr[-2000:]}")
        shutil.rmtree(venv, ignore_errors=True)
        os.replace(building, venv)
    finally:
        shutil.rmtree(building, ignore_errors=True)
    return str(python)


def versions(peers: str) -> dict[str, str]:
    code = (
        "import importlib.metadata as m, json, platform; print(json.dumps({n: m.version(n) "
        "for n in ('python-redis-lock', 'tooz', 'redis')} | {'python': platform.python_version()}))"
    )
    found: dict[str, str] = json.loads(subprocess.check_output([peers, "-I", "-c", code]))
    found["python_peers"] = found.pop("python")
    return {"singleton": singleton.__version__, "python": platform.python_version(), **found}


def libraries(peers: str, v: dict[str, str]) -> list[Library]:
    every = [
        Library("singleton", sys.executable, "singleton `Elector(...).lead()`"),
        Library(
            "python-redis-lock",
            peers,
            f"python-redis-lock {v['python-redis-lock']} (`auto_renewal`, owner checked before "
            "each act)",
        ),
        Library("tooz", peers, f"tooz {v['tooz']} (Redis driver, `watch_elected_as_leader`)"),
    ]
    wanted = os.environ.get("BENCH_PEERS_LIBRARIES")
    names = [n.strip() for n in wanted.split(",")] if wanted else [lib.name for lib in every]
    unknown = sorted(set(names) - {lib.name for lib in every})
    if unknown:
        raise RuntimeError(
            f"unknown BENCH_PEERS_LIBRARIES {unknown}; known: singleton, python-redis-lock, tooz"
        )
    return [lib for lib in every if lib.name in names]


def row(library: Library, results: dict[str, Any]) -> dict[str, str]:
    """One line of the README's table."""
    crash, planned, pause = (results[s] for s in SCENARIOS)

    def figure(scenario: dict[str, Any], fmt: str) -> str:
        if "max_s" not in scenario:
            return "no takeover"
        timeouts = scenario["timeouts"]
        return fmt.format(**scenario) + (f" ({timeouts} timed out)" if timeouts else "")

    late = [r["acts_after_deposition"] for r in pause["rounds"] if "acts_after_deposition" in r]
    if not late:
        acts = "no successor"
    elif max(late) == 0:
        acts = "0"
    else:
        counts = f"{min(late)}-{max(late)}" if min(late) != max(late) else str(max(late))
        never = any(r.get("still_acting_at_end") for r in pause["rounds"])
        acts = f"{counts} in {WINDOW:g} s" + (", never stopped" if never else ", then stopped")
    return {
        "library": library.label,
        "crash_takeover": figure(crash, "p50 {p50_s:.2f} s, max {max_s:.2f} s"),
        "planned_handover": figure(planned, "{min_s:.3f}-{max_s:.3f} s"),
        "paused_leader_acts_after_successor": acts,
    }


@contextlib.contextmanager
def redis_server(root: Path) -> Iterator[RedisServer]:
    server = RedisServer(log_dir=str(root))
    if server.fake:
        server.cleanup()
        raise RuntimeError("bench peers needs redis-server on PATH (not fakeredis)")
    try:
        server.start()
        yield server
    finally:
        server.cleanup()


def main() -> dict[str, Any]:
    peers = peer_python()
    v = versions(peers)
    rng = random.Random(SEED)
    root = Path(tempfile.mkdtemp(prefix="bench-peers-"))
    try:
        with redis_server(root) as server:
            client = redis.Redis.from_url(server.url, socket_timeout=10)
            server_version = str(client.info("server")["redis_version"])
            out: dict[str, Any] = {}
            table = []
            try:
                for library in libraries(peers, v):
                    out[library.name] = run_library(library, server.url, client, root, rng)
                    table.append(row(library, out[library.name]))
            finally:
                client.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return {
        "ttl_s": TTL,
        "rounds": ROUNDS,
        "contenders": CONTENDERS,
        "pause_s": PAUSE_TTLS * TTL,
        "window_s": WINDOW,
        "tooz_poll_s": TOOZ_POLL,
        "seed": SEED,
        "versions": {**v, "redis-server": server_version},
        "libraries": out,
        "table": table,
    }


if __name__ == "__main__":
    print(json.dumps(main(), indent=2, sort_keys=True))
