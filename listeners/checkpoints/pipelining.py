"""The checkpoint policy of a sink that keeps writes in flight after ``handle_batch`` returned.

:class:`CheckpointPolicy` saves the position after a batch as soon as ``handle_batch`` returned.
A pipelining sink (``ElasticsearchSync``'s window of bulk requests) acknowledges later, so this
subclass asks the listener (:meth:`ChangeStreamListener.acknowledged` and
:meth:`~ChangeStreamListener.flush`) which position the sink has acknowledged and hands only that
one to the policy. For every other listener the hooks answer "all of it" and nothing changes.

Invariant: a resume token is saved only after the sink acknowledged every event before it. So the
window is flushed before the policy saves a position it did not get from the listener: the idle
position (``caught_up``), a handover, an invalidate. And it is flushed when a stream (re)opens, so
the window never mixes two streams' positions: the reopened stream starts after the last
*acknowledged* position and replays the rest (external versions make that harmless).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from listeners.checkpoints.policy import CheckpointPolicy

if TYPE_CHECKING:
    from bson.timestamp import Timestamp

    from listeners.base import Acknowledged, ChangeEvent, ChangeStreamListener

__all__ = ["PipelinedCheckpoints"]


class PipelinedCheckpoints(CheckpointPolicy):
    """:class:`CheckpointPolicy` over what ``listener`` acknowledged (see the module)."""

    def __init__(self, *args: Any, listener: ChangeStreamListener, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._listener = listener

    def _settle(self, acked: Acknowledged | None) -> None:
        if acked is not None and acked[1]:
            super().handled(acked[0], list(acked[1]))

    def _flush(self) -> None:
        self._settle(self._listener.flush(self._ctx))

    def opened(self, token: Any, at_time: Timestamp | None) -> None:
        # What was in flight belongs to the previous stream: wait for it, keep none of it (the
        # new stream starts at the last acknowledged position and re-delivers the rest).
        self._listener.flush(self._ctx)
        super().opened(token, at_time)

    def handled(self, token: Any, batch: list[ChangeEvent]) -> None:
        self._settle(self._listener.acknowledged(token, batch))

    def caught_up(self, token: Any) -> None:
        self._flush()
        super().caught_up(token)

    def handover(self, token: Any) -> None:
        self._flush()
        super().handover(token)

    def before_invalidate(self) -> None:
        self._flush()
        super().before_invalidate()

    def release(self, left: float) -> None:
        # Only what the sink acknowledged within the drain's budget: the rest is replayed.
        # One deadline for both: the wait for the sink and the save after it.
        with self.within(left):
            self._settle(self._listener.flush_for_handover(self._ctx, left))
            CheckpointPolicy.before_invalidate(self)
