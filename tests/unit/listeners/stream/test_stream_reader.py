"""StreamReader asks the listener's batch size as each batch starts (it may change between
batches) and posts it to the status board, reads it for a partition's runs of others' events
too, and events taken from the driver's buffer carry the resume token ``try_next`` would give
them."""

from __future__ import annotations

import contextlib
from collections import deque
from typing import Any

from listeners.runtime.status import StatusBoard
from listeners.stream.partition import Partition, partition_of
from listeners.stream.reader import Step, StreamReader
from singleton.testing import FakeClock


class _Listener:
    """A listener whose batch size changes each time it is read."""

    def __init__(self, sizes: list[int], partition: Partition | None = None) -> None:
        self._sizes = iter(sizes)
        self.max_batch_wait = 60.0
        self.partition = partition
        self.reads = 0

    @property
    def batch_size(self) -> int:  # read for a partition's run of others' events
        self.reads += 1
        return next(self._sizes)

    def next_batch_size(self) -> int:  # asked as each batch starts
        return self.batch_size


class _Plain:
    """A stream with no driver internals: every event goes through try_next."""

    def __init__(self, ids: list[Any]) -> None:
        self._events = deque({"_id": {"_data": f"{i}"}, "operationType": "insert"} for i in ids)
        self.resume_token: Any = None

    def try_next(self) -> dict[str, Any] | None:
        if not self._events:
            self.resume_token = {"_data": "post-batch"}
            return None
        event = self._events.popleft()
        self.resume_token = event["_id"]
        return event


class _Cursor:
    def __init__(self, data: deque[dict[str, Any]]) -> None:
        self._data = data


class _Buffered(_Plain):
    """pymongo 4's shape: decoded events in ``_cursor._data``; the last one of a buffer moves
    the token to the post-batch token."""

    _decode_custom = False

    def __init__(self, ids: list[Any]) -> None:
        super().__init__(ids)
        self._cursor = _Cursor(self._events)
        self.try_next_calls = 0

    def try_next(self) -> dict[str, Any] | None:
        self.try_next_calls += 1
        event = super().try_next()
        if event is not None and not self._events:
            self.resume_token = {"_data": "post-batch"}
        return event


def _steps(
    stream: Any, listener: Any, board: StatusBoard | None = None, posted: list[Any] | None = None
) -> list[Step]:
    """Read ``stream`` until it caught up; ``posted`` gets ``board.batch_size`` after each step."""
    reader = StreamReader(
        stream, listener, clock=FakeClock(), bounded=lambda: contextlib.nullcontext(), board=board
    )
    steps: list[Step] = []
    while True:  # until the stream caught up with nothing left in hand
        step = reader.read()
        if step is not None:
            steps.append(step)
            if board is not None and posted is not None:
                posted.append(board.batch_size)
            if step.kind == "idle" and not step.batch and not stream._events:
                return steps


def test_the_batch_size_is_read_as_each_batch_starts() -> None:
    listener = _Listener([2, 3, 1, 5])
    steps = _steps(_Plain(list(range(7))), listener)
    assert [(s.kind, len(s.batch)) for s in steps] == [
        ("full", 2),
        ("full", 3),
        ("full", 1),
        ("idle", 1),  # the fourth batch (of up to 5) ends when the stream has caught up
        ("idle", 0),
    ]
    assert listener.reads == 4  # once per batch, not once per event


def test_the_batch_size_asked_for_is_posted_to_the_status_board() -> None:
    """Each batch's ``next_batch_size()`` answer is the board's ``batch_size`` (the status
    field, the ``/status`` key and the gauge), posted as the batch starts."""
    board = StatusBoard("orders")
    assert board.snapshot().batch_size is None  # nothing asked yet
    posted: list[Any] = []
    steps = _steps(_Plain(list(range(7))), _Listener([2, 3, 1, 5]), board, posted)
    assert [len(s.batch) for s in steps] == [2, 3, 1, 1, 0]
    # the last two steps: the fourth batch (asked for 5) delivered as the stream caught up,
    # then an empty read, which starts no batch and asks nothing
    assert posted == [2, 3, 1, 5, 5]
    assert board.snapshot().batch_size == 5
    assert board.snapshot().as_dict()["batch_size"] == 5


def test_events_taken_from_the_buffer_carry_the_token_try_next_gives() -> None:
    plain = _steps(_Plain(list(range(10))), _Listener([4, 2, 3, 8]))
    buffered = _Buffered(list(range(10)))
    held = _steps(buffered, _Listener([4, 2, 3, 8]))
    assert [(s.kind, s.batch, s.token) for s in held[:-1]] == [
        (s.kind, s.batch, s.token) for s in plain[:-1]
    ]
    assert buffered.try_next_calls == 3  # the buffer's last event, then the two empty reads


def test_a_partition_counts_a_run_of_others_events_in_the_batch_size_of_its_start() -> None:
    part = Partition(0, 2)
    others = [i for i in range(200) if partition_of(i, 2) == 1][:7]
    stream = _Plain([])
    stream._events = deque(
        {"_id": {"_data": f"{i}"}, "documentKey": {"_id": i}, "operationType": "insert"}
        for i in others
    )
    listener = _Listener([3, 100, 100], part)
    steps = _steps(stream, listener)
    # three of the others' events move the position on (an empty idle step), then the next
    # run reads the size again (100): the stream catches up before it is reached
    assert [(s.kind, len(s.batch)) for s in steps][:2] == [("idle", 0), ("idle", 0)]
    assert steps[0].token == {"_data": f"{others[2]}"}
    assert listener.reads == 2
