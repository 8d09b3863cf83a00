"""Pieces shared by ``singleton demo`` and ``singleton drill``: replica processes and a writer.

A :class:`ReplicaProcess` is one ``singleton run`` child in its own session (so a terminal's
Ctrl-C reaches only the parent, which then stops the children in order). A :class:`Writer`
mutates a collection at a fixed rate and remembers what it needs for a verdict: which ids it
deleted (a deleted id found in the index is a resurrection) and when each write happened, with
its cluster time when the server reports one (writer-to-index lag).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bson import ObjectId


def singleton_command(*args: str) -> list[str]:
    """argv for ``singleton ARGS...`` with this interpreter (works without the console script)."""
    return [sys.executable, "-m", "singleton.service.cli", *args]


def child_environment() -> dict[str, str]:
    """This process's environment without ``SINGLETON_*`` variables: a child replica is
    configured by its own flags and file, never by what leaked from the caller's shell."""
    return {k: v for k, v in os.environ.items() if not k.startswith("SINGLETON_")}


class WriteGate:
    """Lets a reader hold a writer between two writes. The writer wraps each write in
    ``with gate:``; ``with gate.paused():`` returns once no write is in flight, and no write
    starts until its block ends (the drill compares index and collection there)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()

    def __enter__(self) -> None:
        self._lock.acquire()

    def __exit__(self, *exc: object) -> None:
        self._lock.release()

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        with self._lock:
            yield


@dataclass
class ReplicaProcess:
    identity: str
    argv: list[str]
    log_path: Path
    env: dict[str, str]
    proc: subprocess.Popen[bytes] | None = None
    restarts: int = 0

    def start(self) -> None:
        log = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child
        self.proc = subprocess.Popen(
            self.argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=self.env,
            start_new_session=True,
        )
        log.close()

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: signal.Signals) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, sig)

    def wait(self, timeout: float) -> int | None:
        if self.proc is None:
            return None
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def restart(self) -> None:
        self.restarts += 1
        self.start()

    def stop(self) -> None:
        self.signal(signal.SIGCONT)  # a stopped process cannot act on SIGTERM
        self.signal(signal.SIGTERM)
        if self.wait(15) is None:
            self.signal(signal.SIGKILL)
            self.wait(5)


def mixed_id(n: int) -> Any:
    """The ``n``-th new document's ``_id``, of the kinds real collections hold: an int, the
    *string* of the int before it (``5`` and ``"5"`` are two documents), an embedded document
    (field order matters), an ObjectId."""
    kind = n % 4
    if kind == 0:
        return n
    if kind == 1:
        return str(n - 1)
    if kind == 2:
        return {"n": n, "k": "doc"}
    return ObjectId(n.to_bytes(12, "big"))


@dataclass
class Writer:
    """Inserts, updates, replaces and deletes (and, with ``txn_share`` > 0, multi-document
    transactions) at ``rate`` operations per second until ``stop_event`` is set.

    ``client`` is needed for transactions and cluster times; without it the writer only uses
    ``collection``. A failed write is not counted (it may or may not have applied: the verdict
    compares against what MongoDB holds, not against this writer's bookkeeping).
    """

    collection: Any
    rate: float
    seed: int = 7
    client: Any = None
    txn_share: float = 0.0
    ops: int = 0
    failed: int = 0
    transactions: int = 0
    stop_event: threading.Event = field(default_factory=threading.Event)
    #: held between two writes by ``gate.paused()``
    gate: WriteGate = field(default_factory=WriteGate)
    #: every id a delete was attempted on (ids are never reused)
    deleted: list[Any] = field(default_factory=list)
    #: (monotonic time, cluster time as (t, i) or None) of each counted write
    log: list[tuple[float, tuple[int, int] | None]] = field(default_factory=list)

    def run(self) -> None:
        rng = random.Random(self.seed)
        next_at = time.monotonic()
        live: list[Any] = [d["_id"] for d in self.collection.find({}, {"_id": 1})]
        next_id = 10_000 + len(live)
        session = None if self.client is None else self.client.start_session()
        try:
            while not self.stop_event.is_set():
                with self.gate:
                    next_id = self._write(session, rng, live, next_id)
                # (no burst to catch up after a pause or a slow write)
                next_at = max(next_at + 1.0 / self.rate, time.monotonic())
                self.stop_event.wait(max(0.0, next_at - time.monotonic()))
            self._last_plain(session, live)
        finally:
            if session is not None:
                session.end_session()

    def _write(self, session: Any, rng: random.Random, live: list[Any], next_id: int) -> int:
        """One write of a random kind, counted if it was acknowledged; the next free id."""
        roll = rng.random()
        txn = False
        try:
            if self.txn_share and rng.random() < self.txn_share and len(live) >= 20:
                txn = True
                next_id = self._transaction(session, rng, live, next_id)
            elif roll < 0.45 or len(live) < 20:
                new_id = mixed_id(next_id)
                doc = {"_id": new_id, "sku": f"sku-{rng.randrange(500)}", "qty": 1, "v": 0}
                live.append(new_id)
                next_id += 1
                self.collection.insert_one(doc, session=session)
            elif roll < 0.8:
                self.collection.update_one(
                    {"_id": rng.choice(live)}, {"$inc": {"qty": 1, "v": 1}}, session=session
                )
            elif roll < 0.9:
                self.collection.replace_one(
                    {"_id": rng.choice(live)},
                    {"sku": "replaced", "qty": rng.randrange(9), "v": -1},
                    session=session,
                )
            else:
                target = live.pop(rng.randrange(len(live)))
                self.deleted.append(target)
                self.collection.delete_one({"_id": target}, session=session)
            self.ops += 1
            self.log.append((time.monotonic(), op_time(session, txn)))
        except Exception:  # refused or unknown outcome: not counted
            self.failed += 1
        return next_id

    def _last_plain(self, session: Any, live: list[Any]) -> None:
        """One more update, outside a transaction: the log then ends with an exact cluster
        time, the one a reader waits to see indexed (see :func:`op_time`)."""
        if not live:
            return
        try:
            self.collection.update_one({"_id": live[-1]}, {"$inc": {"v": 1}}, session=session)
        except Exception:  # the store is down: the caller's wait for it times out and says so
            self.failed += 1
            return
        self.ops += 1
        self.log.append((time.monotonic(), op_time(session)))

    def _transaction(self, session: Any, rng: random.Random, live: list[Any], next_id: int) -> int:
        """One insert, one update and one delete, committed together (one cluster time)."""
        target = live[rng.randrange(len(live))]
        victim = live[rng.randrange(len(live))]
        while victim == target:
            victim = live[rng.randrange(len(live))]
        self.deleted.append(victim)
        coll = self.collection
        new_id = mixed_id(next_id)
        with session.start_transaction():
            coll.insert_one(
                {"_id": new_id, "sku": "txn", "qty": 1, "v": 0, "pair": str(target)},
                session=session,
            )
            coll.update_one(
                {"_id": target}, {"$inc": {"v": 1}, "$set": {"pair": str(new_id)}}, session=session
            )
            coll.delete_one({"_id": victim}, session=session)
        live.remove(victim)
        live.append(new_id)
        self.transactions += 1
        return next_id + 1


def es_listener_toml(lease: str, database: str, collection: str, index: str, **extra: Any) -> str:
    """A ``[[listeners]]`` table for ElasticsearchSync (``extra``: more keys, TOML-quoted)."""
    lines = [
        "[[listeners]]",
        'use = "elasticsearch"',
        f'name = "{lease}"',
        f'database = "{database}"',
        f'collection = "{collection}"',
        f'index = "{index}"',
    ]
    lines += [f"{k} = {json.dumps(v)}" for k, v in extra.items()]
    return "\n".join(lines) + "\n"


def op_time(session: Any, txn: bool = False) -> tuple[int, int] | None:
    """The cluster time of the session's last write as (t, i); ``None`` after a transaction
    (``txn``): SecantusDB answers a commit with a cluster time after its events' (MongoDB
    with theirs), and a reader waiting for an event at that time would wait for ever."""
    ts = None if session is None or txn else session.operation_time
    return None if ts is None else (int(ts.time), int(ts.inc))
