"""StreamReader on a real pymongo change stream (SecantusDB): taking the events the driver holds
without a ``try_next`` each gives the same batches and the same resume token at every step as
reading every event with ``try_next``."""

from __future__ import annotations

import contextlib
import itertools
from typing import Any

import pymongo
from pymongo import monitoring

from listeners.stream.reader import Step, StreamReader
from singleton.clock import SYSTEM_CLOCK
from singleton.drivers.mongo import cluster_time

EVENTS = 23


class _Listener:
    """Batch sizes that change from batch to batch (an adaptive listener's)."""

    def __init__(self) -> None:
        self._sizes = itertools.cycle([3, 7, 4, 1])
        self.max_batch_wait = 60.0
        self.partition = None

    @property
    def batch_size(self) -> int:
        return next(self._sizes)

    def next_batch_size(self) -> int:  # what the reader asks as each batch starts
        return next(self._sizes)


class _TryNextOnly:
    """The stream with none of the driver's internals showing."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def try_next(self) -> Any:
        return self._stream.try_next()

    @property
    def resume_token(self) -> Any:
        return self._stream.resume_token


class _Counting(_TryNextOnly):
    """The stream as it is, counting the ``try_next`` calls."""

    calls = 0

    def try_next(self) -> Any:
        self.calls += 1
        return self._stream.try_next()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def _read(stream: Any) -> list[tuple[str, list[Any], Any]]:
    listener: Any = _Listener()
    reader = StreamReader(
        stream, listener, clock=SYSTEM_CLOCK, bounded=lambda: contextlib.nullcontext()
    )
    steps: list[Step] = []
    got = 0
    while got < EVENTS or steps[-1].batch or steps[-1].kind != "idle":
        step = reader.read()
        if step is not None:
            steps.append(step)
            got += len(step.batch)
    return [(s.kind, [e["documentKey"]["_id"] for e in s.batch], s.token) for s in steps]


def test_held_events_give_the_batches_and_tokens_of_try_next(mongo_url: str, unique: str) -> None:
    client: pymongo.MongoClient[dict[str, Any]] = pymongo.MongoClient(mongo_url, tz_aware=True)
    try:
        coll = client["streams"][unique]
        start = cluster_time(client)
        coll.insert_many([{"_id": i} for i in range(EVENTS)])
        seen: dict[str, Any] = {}
        for how in ("try_next", "held"):
            with coll.watch(
                start_at_operation_time=start, batch_size=5, max_await_time_ms=50
            ) as stream:
                wrapped = _TryNextOnly(stream) if how == "try_next" else _Counting(stream)
                seen[how] = _read(wrapped)
                if isinstance(wrapped, _Counting):
                    assert wrapped.calls < EVENTS  # the held events were taken directly
    finally:
        client.close()
    assert seen["held"] == seen["try_next"]
    assert [i for _, ids, _ in seen["held"] for i in ids] == list(range(EVENTS))
    assert [len(ids) for kind, ids, _ in seen["held"] if kind == "full"][:4] == [3, 7, 4, 1]


class _GetMores(monitoring.CommandListener):
    """The ``maxTimeMS`` of every ``getMore`` the client sends."""

    def __init__(self) -> None:
        self.waits: list[int | None] = []

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        if event.command_name == "getMore":
            self.waits.append(event.command.get("maxTimeMS"))

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        pass

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        pass


class _Lingering:
    """Batches of 100 events handed over 0.3 s after their first event at the latest."""

    batch_size = 100
    max_batch_wait = 0.3
    partition = None

    def next_batch_size(self) -> int:
        return self.batch_size


def test_a_partial_batch_bounds_the_getmore_wait(mongo_url: str, unique: str) -> None:
    """With no batch in hand a getMore waits the stream's whole ``max_await_time`` (the server
    answers as soon as an event comes); with a partial batch in hand it waits at most what is
    left of ``max_batch_wait``, so a lone event is handed over in time."""
    getmores = _GetMores()
    client: pymongo.MongoClient[dict[str, Any]] = pymongo.MongoClient(
        mongo_url, tz_aware=True, event_listeners=[getmores]
    )
    try:
        coll = client["streams"][unique]
        with coll.watch(max_await_time_ms=5000) as stream:
            listener: Any = _Lingering()
            reader = StreamReader(
                stream, listener, clock=SYSTEM_CLOCK, bounded=contextlib.nullcontext
            )
            coll.insert_one({"_id": "lone"})
            steps: list[Step] = []
            while not any(s.batch for s in steps):
                step = reader.read()
                if step is not None:
                    steps.append(step)
    finally:
        client.close()
    handed = [s for s in steps if s.batch]
    assert [e["documentKey"]["_id"] for e in handed[0].batch] == ["lone"]
    assert getmores.waits[0] == 5000  # nothing in hand yet (the first getMore may bring it)
    lingering = [w for w in getmores.waits if w != 5000]
    assert lingering, getmores.waits  # the read after the event waited for more, bounded
    assert all(w is not None and 1 <= w <= 300 for w in lingering), getmores.waits
