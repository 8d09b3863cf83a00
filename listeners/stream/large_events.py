"""Change events over 16 MB: read on past them without their large fields, never fail on them.

A change event over the 16 MB BSON limit makes the server fail the stream's read with
BSONObjectTooLarge (10334, :func:`singleton.drivers.mongo.classify` says ``"too_large"``). Retrying
that read fails the same way forever, on this tenure and on every next one; so it neither spends the
failure budget nor ends the tenure. The tenure reopens the stream from its last checkpoint in
*reduced mode* instead: the listener's pipeline plus its
:meth:`~listeners.base.ChangeStreamListener.large_event_projection`, placed before a
``$changeStreamSplitLargeEvent`` stage (which must stay last). The events read meanwhile reach the
listener without their large fields (ElasticsearchSync completes them by a lookup).

Reduced mode is bounded: it ends with the first delivered batch that has reached the position the
stream failed at (the large event lies in the server's next batch after it) and that either
caught the stream up or goes ``batch_size`` events beyond that position. The tenure then saves a
checkpoint after that batch and reopens the stream normally from it, so full events are back
within about one batch. (With a resume token whose time cannot be read, the position is unknown:
the first ``batch_size`` events count as past it, and a large event further on starts another
reduced while from a later checkpoint.) A read that fails the same way in reduced mode cannot be
helped by any tenure: it ends this one as failed (:class:`EventTooLargeError`, not retryable),
which the runner's one ERROR line says.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from bson.timestamp import Timestamp
from loguru import logger

from listeners.stream.reader import StartPosition, Step, watch
from listeners.stream.tokens import event_time, token_time
from singleton.errors import EventTooLargeError

if TYPE_CHECKING:
    from listeners.base import ChangeStreamListener, ListenerContext
    from listeners.checkpoints.policy import CheckpointPolicy

SPLIT_STAGE = "$changeStreamSplitLargeEvent"


def reduced_pipeline(
    pipeline: Sequence[Mapping[str, Any]], projection: Mapping[str, Any]
) -> list[Mapping[str, Any]]:
    """``pipeline`` with ``projection`` added: last, or just before the split stage."""
    stages = list(pipeline)
    at = next((i for i, stage in enumerate(stages) if SPLIT_STAGE in stage), len(stages))
    return [*stages[:at], projection, *stages[at:]]


def position_time(pos: StartPosition) -> Timestamp | None:
    """The cluster time a stream opened at ``pos`` starts from, when it can be read."""
    return pos.at_time or token_time(pos.resume_after or pos.start_after)


class LargeEvents:
    """Reduced mode across one tenure's streams: it opens each stream (:meth:`watch`), is told
    when a read :meth:`failed` with BSONObjectTooLarge, and says after each delivered step
    whether reduced mode has :meth:`passed`."""

    def __init__(
        self, listener: ChangeStreamListener, policy: CheckpointPolicy, ctx: ListenerContext
    ) -> None:
        self._listener, self._policy, self._ctx = listener, policy, ctx
        self.reduced = False
        #: Where the stream failed (cluster time; ``None``: unknown), while reduced.
        self._failed_at: Timestamp | None = None
        #: Events read while reduced at or after ``_failed_at``, and strictly after it.
        self._reached = self._beyond = 0
        self._stream: Any = None
        self._opening: Timestamp | None = None

    @property
    def name(self) -> str:
        return self._listener.lease_name

    def watch(
        self,
        client: Any,
        pos: StartPosition,
        *,
        max_await_time: float,
        at_time: Timestamp | None,
        batch_size: int | None = None,
    ) -> Any:
        """Open the listener's stream at ``pos`` (see :func:`listeners.stream.reader.watch`), with
        the large-event projection while reduced."""
        self._stream, self._opening = None, at_time or position_time(pos)
        stages: list[Mapping[str, Any]] = list(self._listener.pipeline)
        if self.reduced:
            stages = reduced_pipeline(stages, self._listener.large_event_projection())
        self._stream = watch(
            client,
            self._listener,
            pos,
            max_await_time=max_await_time,
            at_time=at_time,
            pipeline=stages,
            batch_size=batch_size,
        )
        return self._stream

    def failed(self, exc: BaseException) -> None:
        """A read failed with BSONObjectTooLarge: reload the checkpoint the tenure reopens from
        and enter reduced mode (one WARNING), or raise :class:`EventTooLargeError` if already
        in it."""
        self._policy.reload()
        since = None if self._policy.last is None else self._policy.last.cluster_time
        if self.reduced:
            raise EventTooLargeError(
                f"listener {self.name!r}: a change event is over 16 MB even without the fields "
                f"large_event_projection() removes ({dict(self._listener.large_event_projection())}"
                f"); cannot read on from the saved position {since}: {exc}"
            ) from exc
        reading = None if self._stream is None else self._stream.resume_token
        self._failed_at = self._opening if reading is None else token_time(reading)
        self.reduced, self._reached, self._beyond = True, 0, 0
        logger.warning(
            "change event over 16 MB (BSONObjectTooLarge): reading on without its large fields "
            "from the saved position: listener={} token={} position={} failed_after={}",
            self.name,
            self._ctx.token,
            since,
            self._failed_at,
        )

    def passed(self, step: Step) -> bool:
        """``step`` was delivered: whether reduced mode is over. If so, the tenure saves the
        position after ``step`` (once the sink acknowledged it) and reopens the stream normally
        from it."""
        if not self.reduced:
            return False
        at = self._failed_at
        for event in step.batch:
            t = event_time(event)
            self._reached += at is None or (t is not None and t >= at)
            self._beyond += at is None or (t is not None and t > at)
        if not self._reached:
            return False
        if step.kind != "idle" and self._beyond < self._listener.batch_size:
            return False
        self.reduced = False
        logger.info(
            "large change event passed, reading full events again: listener={} token={}",
            self.name,
            self._ctx.token,
        )
        return True
