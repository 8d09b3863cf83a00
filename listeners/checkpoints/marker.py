"""The marker next to the lease that says "this listener has had a checkpoint", so that a claim
finding none can tell a checkpoint that disappeared from a first start, even after every replica
restarted.

A runner's memory (:class:`~listeners.checkpoints.policy.LastSeen`) already notices a checkpoint
that vanishes while it runs; it forgets on a restart. So each tenure, after its first accepted
checkpoint, also records ``{"checkpointed": "1", "token": <fencing token>, "at": <cluster time,
seconds>}`` in the lease store (:meth:`~singleton.lease.contract.LeaseBackend.remember`), which
outlives the checkpoint store's losses: an operator deleting the record, a Redis checkpoint store
restarted without persistence while the leases live in MongoDB.

Failure model: writing the marker is best effort: a failure is logged at WARNING, never fails
the tenure, and is retried after the tenure's next save (one write per tenure when the lease
store answers). Reading it is part of the claim: a lease store that cannot say whether a
checkpoint existed fails the claim like any other error of it (a transient one is retried), since
"unknown" must not pass for "never started". A lease store that lost its data has lost the marker
too: a checkpoint lost at the same time then looks like a first start, as it did without one.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING

from bson.timestamp import Timestamp
from loguru import logger

if TYPE_CHECKING:
    from listeners.checkpoints.stores import Checkpoint
    from singleton.lease.contract import LeaseBackend

#: The marker's field that says a checkpoint was saved (``token`` and ``at`` tell which).
CHECKPOINTED = "checkpointed"


class CheckpointMarker:
    """One tenure's use of the marker of lease ``name`` in ``store``; ``bounded`` bounds each
    call like the tenure's other calls."""

    def __init__(
        self,
        store: LeaseBackend,
        name: str,
        bounded: Callable[[], contextlib.AbstractContextManager[None]],
    ) -> None:
        self._store, self.name, self._bounded = store, name, bounded
        self._written = self._warned = False

    def saved(self, cp: Checkpoint) -> None:
        """A checkpoint was accepted: record the marker, if this tenure has not yet."""
        if self._written:
            return
        facts: dict[str, str | int] = {
            CHECKPOINTED: "1",
            "token": cp.fencing_token,
            "at": cp.cluster_time.time,
        }
        try:
            with self._bounded():
                self._store.remember(self.name, facts)
        except Exception as exc:  # best effort: the checkpoint itself is saved
            log = logger.debug if self._warned else logger.warning
            log(
                "checkpoint marker not recorded in the lease store ({}), retrying after the next "
                "checkpoint: listener={} token={}: {!r}",
                self._store.describe(),
                self.name,
                cp.fencing_token,
                exc,
            )
            self._warned = True
            return
        self._written = True

    def disappeared(self, seen: Checkpoint | None) -> tuple[str, Timestamp | None] | None:
        """A claim found no checkpoint: if one existed, say so and from where (this replica's
        memory, ``seen``, else the lease store's marker) and since when; ``None`` if none did."""
        gone = f"checkpoint of {self.name} disappeared"
        if seen is not None:
            return (
                f"{gone}: last seen at {seen.cluster_time} token {seen.fencing_token} "
                "(remembered by this replica)",
                seen.cluster_time,
            )
        with self._bounded():
            facts = self._store.recall(self.name)
        if facts.get(CHECKPOINTED) != "1":
            return None
        at = facts.get("at", "")
        since = Timestamp(int(at), 0) if at.isdigit() else None
        return (
            f"{gone}: the lease store ({self._store.describe()}) records one saved by token "
            f"{facts.get('token', '?')} at {since} or later",
            since,
        )
