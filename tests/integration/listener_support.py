"""Shared pieces of the listener tests (no tests here): a recording listener, a checkpoint store
that records every accepted write, a reference reader of the raw stream, a runner factory, and
:class:`Scene`, the per-test setup (a client, a fresh database, a recording store, a backend)."""

from __future__ import annotations

import itertools
import re
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pymongo
from bson.timestamp import Timestamp
from loguru import logger

from listeners import Checkpoint, ListenerRunner, MongoCheckpointStore
from listeners.base import ChangeEvent, ChangeStreamListener, ListenerContext
from listeners.checkpoints.stores import CheckpointStore
from listeners.deadletters import DeadLetterStore
from listeners.runtime.status import RunnerState, RunnerStatus
from singleton import Elector
from singleton.lease.contract import LeaseBackend
from singleton.service.dev.embedded import wait_until
from singleton.testing import MemoryLeaseBackend


def key(event: ChangeEvent) -> str:
    return str(event["_id"]["_data"])


class Recorder(ChangeStreamListener):
    """Records every handled event with the fencing token that handled it."""

    batch_size = 50
    max_batch_wait = 0.05

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.lock = threading.Lock()
        self.handled: list[tuple[str, int, ChangeEvent]] = []
        self.fail: Callable[[ChangeEvent], bool] = lambda _e: False
        self.gate = threading.Event()
        self.gate.set()
        self.blocked = threading.Event()
        self.invalidated: list[ChangeEvent] = []
        self.syncs = 0

    def handle_batch(self, events: Sequence[ChangeEvent], ctx: ListenerContext) -> int | None:
        for e in events:
            if self.fail(e):
                raise ValueError(f"poison {e.get('documentKey')}")
        if not self.gate.is_set():
            self.blocked.set()
            self.gate.wait(30)
        with self.lock:
            self.handled.extend((key(e), ctx.token, e) for e in events)
        return None  # durable on return

    def on_invalidate(self, event: ChangeEvent, ctx: ListenerContext) -> None:
        self.invalidated.append(event)

    def keys(self) -> list[str]:
        with self.lock:
            return [k for k, _t, _e in self.handled]


class SyncingRecorder(Recorder):
    def initial_sync(self, ctx: ListenerContext) -> None:
        self.syncs += 1


class RecordingStore(MongoCheckpointStore):
    """Remembers every save the server accepted, in order."""

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self.accepted: list[Checkpoint] = []
        self._rec = threading.Lock()

    def save(self, checkpoint: Checkpoint) -> None:
        with self._rec:  # serialise so that the order recorded is the order accepted
            super().save(checkpoint)
            self.accepted.append(checkpoint)


def assert_monotonic(saves: Sequence[Checkpoint]) -> None:
    for a, b in itertools.pairwise(saves):
        assert b.cluster_time >= a.cluster_time, f"position moved back: {a} -> {b}"
        assert b.fencing_token >= a.fencing_token, f"older token wrote after newer: {a} -> {b}"


def now(client: pymongo.MongoClient[dict[str, Any]]) -> Timestamp:
    ts = client.admin.command("ping")["operationTime"]
    assert isinstance(ts, Timestamp)
    return ts


def reference(
    coll: Any, since: Timestamp, until_count: int | None = None, timeout: float = 20.0
) -> list[str]:
    """Every event key of the raw stream from ``since`` until ``until_count`` events, or until a
    getMore comes back empty after the writes have finished."""
    import time

    keys: list[str] = []
    deadline = time.monotonic() + timeout
    with coll.watch(start_at_operation_time=since, max_await_time_ms=200) as cs:
        while time.monotonic() < deadline:
            ev = cs.try_next()
            if ev is None:
                if until_count is None or len(keys) >= until_count:
                    return keys
                continue
            if ev["operationType"] != "invalidate":
                keys.append(key(ev))
    raise AssertionError(f"reference stream: {len(keys)} events within {timeout}s")


def make_runner(
    url: str,
    db: str,
    backend: LeaseBackend,
    listener: ChangeStreamListener,
    identity: str,
    store: CheckpointStore | None = None,
    **kw: Any,
) -> ListenerRunner:
    elector = Elector(
        backend,
        listener.lease_name,
        identity=identity,
        ttl=1.0,
        retry_interval=0.1,
        release_timeout=0.55,
        cooldown=kw.pop("cooldown", None),
    )
    client: pymongo.MongoClient[dict[str, Any]] = pymongo.MongoClient(
        url, tz_aware=True, heartbeatFrequencyMS=500
    )
    kw.setdefault("standby_interval", None)
    kw.setdefault("idle_checkpoint_interval", 0.3)
    return ListenerRunner(
        listener,
        elector,
        client,
        checkpoints=store or MongoCheckpointStore(client, database=db),
        dead_letters=DeadLetterStore(client, database=db),
        max_await_time=0.1,
        **kw,
    )


def wait_state(runner: ListenerRunner, *states: RunnerState, timeout: float = 10.0) -> None:
    """Wait until the runner reports one of ``states``."""
    wait_until(lambda: runner.status().state in states, timeout, what=" or ".join(states))


@dataclass
class Scene:
    """One test's world: a client on ``url``, a fresh database, a recording checkpoint store in
    it, and one in-memory lease backend shared by every runner the test makes."""

    url: str
    db: str
    client: pymongo.MongoClient[dict[str, Any]]
    store: RecordingStore
    backend: MemoryLeaseBackend = field(default_factory=MemoryLeaseBackend)

    @classmethod
    def on(cls, url: str, unique: str) -> Scene:
        client: pymongo.MongoClient[dict[str, Any]] = pymongo.MongoClient(url, tz_aware=True)
        db = f"t{unique}"
        return cls(url, db, client, RecordingStore(client, database=db))

    def coll(self, name: str) -> Any:
        return self.client[self.db][name]

    def listener(self, collection: str, cls: type[Recorder] = Recorder, **options: Any) -> Recorder:
        return cls(database=self.db, collection=collection, **options)

    def runner(
        self, listener: ChangeStreamListener, identity: str = "a", **kw: Any
    ) -> ListenerRunner:
        """A runner (not started) on this scene's backend and store."""
        return make_runner(self.url, self.db, self.backend, listener, identity, self.store, **kw)


def handled_by(*listeners: Recorder) -> set[str]:
    return set().union(*(listener.keys() for listener in listeners))


def finish_writes(
    writer: Writer, since: Timestamp, *listeners: Recorder, at_least: int = 0
) -> list[str]:
    """Stop ``writer`` once it made ``at_least`` writes, read the raw stream since ``since`` for
    reference, and wait until ``listeners`` together handled every event of it; return the
    reference keys."""
    wait_until(lambda: writer.ops >= at_least, 20, what=f"{at_least} writes")
    writer.stop_event.set()
    writer.join(10)
    expected = reference(writer.coll, since)
    wait_until(lambda: set(expected) <= handled_by(*listeners), 30, what="every event handled")
    return expected


class Writer(threading.Thread):
    """Inserts, updates and deletes until stopped; counts its operations."""

    def __init__(self, coll: Any, prefix: str = "w") -> None:
        super().__init__(daemon=True)
        self.coll = coll
        self.prefix = prefix
        self.stop_event = threading.Event()
        self.ops = 0

    def run(self) -> None:
        i = 0
        while not self.stop_event.is_set():
            doc_id = f"{self.prefix}{i}"
            self.coll.insert_one({"_id": doc_id, "v": 0})
            self.coll.update_one({"_id": doc_id}, {"$set": {"v": 1}})
            if i % 3 == 0:
                self.coll.delete_one({"_id": doc_id})
                self.ops += 1
            self.ops += 2
            i += 1
            self.stop_event.wait(0.002)


class LogCapture:
    """Collects loguru records at ``level`` (default ERROR) and above."""

    def __init__(self, level: str = "ERROR") -> None:
        self.errors: list[str] = []
        self._level = level
        self._id: int | None = None

    def __enter__(self) -> LogCapture:
        self._id = logger.add(
            lambda m: self.errors.append(str(m)), level=self._level, format="{message}"
        )
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._id is not None
        logger.remove(self._id)


FAILED_LINE = re.compile(
    r"listener failed, resigning the lease for (?P<cooldown>[\d.]+)s: listener=(?P<listener>\S+) "
    r"identity=(?P<identity>\S+) token=(?P<token>\d+) retryable=(?P<retryable>\w+) "
    r"reason=(?P<reason>.*)"
)


def failed_lines(logs: LogCapture) -> list[dict[str, str]]:
    """The runner's one-line failure reports; every ERROR must be one of them."""
    found = [FAILED_LINE.match(m) for m in logs.errors]
    assert all(found), f"an ERROR that is not a failure report: {logs.errors}"
    return [m.groupdict() for m in found if m is not None]


def wait_recovered(runner: ListenerRunner) -> RunnerStatus:
    """Wait until ``runner`` is ready again with a tenure streaming; its status then."""
    wait_until(lambda: runner.status().ready, 15, what="ready again")
    wait_state(runner, "streaming")
    return runner.status()


def wait_resigned(scene: Scene, runner: ListenerRunner, timeout: float = 10.0) -> None:
    """The runner reports its failure and no longer holds the lease."""

    def resigned() -> bool:
        held = scene.backend.inspect(runner.name)
        mine = held is not None and held.holder == runner.elector.holder
        return runner.status().failure is not None and not runner.elector.is_leader and not mine

    wait_until(resigned, timeout, what="failure reported and lease released")


def set_fail_point(client: Any, mode: Any, **data: Any) -> None:
    """Configure SecantusDB's ``failCommand`` fail point (``mode`` "off" clears it)."""
    client.admin.command(
        {"configureFailPoint": "failCommand", "mode": mode, "data": {"failCommands": [], **data}}
    )


@contextmanager
def resigned(scene: Scene, runner: ListenerRunner, **fail_point: Any) -> Iterator[LogCapture]:
    """Start ``runner`` with ERROR logs captured and enter once it has failed and resigned; stop it
    on the way out. With ``fail_point`` data, ``failCommand`` is on from before the start until
    just before the stop."""
    if fail_point:
        set_fail_point(scene.client, "alwaysOn", **fail_point)
    with LogCapture() as logs:
        try:
            runner.start()
            wait_resigned(scene, runner)
            yield logs
        finally:
            if fail_point:
                set_fail_point(scene.client, "off")
            runner.stop()
