"""The checkpoint store contract, written once: what a :class:`Checkpoint` is, what every
:class:`CheckpointStore` guarantees, and whose checkpoint it is (the deployment identity).

Failure model: two runners may believe they lead at once (a paused leader wakes up after its
lease expired and a successor took over; the lease store lost its data and minted a token
again). The store, not the runners, settles it: a new tenure first *claims* the record with its
fencing token, every later write carries the writer's token, and the server refuses, atomically
(one conditional update, one Lua script), a write from an older token or one that moves the
position back. A refused writer gets :class:`~singleton.errors.StaleWriterError` and stops.
The implementations are in :mod:`listeners.checkpoints.stores`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from bson.timestamp import Timestamp

from singleton.errors import ConfigurationError

if TYPE_CHECKING:
    from listeners.base import ChangeStreamListener
    from singleton.election.leadership import Leadership

ResumeToken = Mapping[str, Any]
#: What a checkpoint is for: ``listener`` ("module:Class"), ``namespace`` ("db.collection") and
#: ``sink`` (the sink's own identity, "" when it has none). See
#: :meth:`listeners.base.ChangeStreamListener.deployment`.
Deployment = Mapping[str, str]


@dataclass(frozen=True)
class Checkpoint:
    """A saved stream position and who saved it.

    ``resume_token`` is ``None`` when only a cluster time is known (right after an initial sync
    or a resync): the stream then restarts with ``start_at_operation_time=cluster_time``.
    ``start_after`` marks the token of an invalidate event, which only ``start_after`` accepts.
    ``deployment`` is what the checkpoint is for (``None`` for records written before it was
    recorded).
    """

    name: str
    resume_token: ResumeToken | None
    cluster_time: Timestamp
    fencing_token: int
    holder: str
    updated_at: datetime | None = None
    start_after: bool = False
    deployment: Deployment | None = None


class CheckpointStore(ABC):
    """Stores one :class:`Checkpoint` (and optional listener progress) per listener name.

    Invariants every implementation keeps
    (``tests/unit/listeners/checkpoints/test_checkpoint_store.py``,
    ``tests/unit/test_fencing_model.py``):

    * **Claim.** A tenure starts with :meth:`claim`: in one step the record is fenced with the
      tenure's token (refused with :class:`~singleton.errors.StaleWriterError` if a higher token
      is stored) and the position stored at that instant is returned. Anything an older tenure
      wrote before the claim is where the new tenure resumes (its sink acknowledged it);
      anything it tries after the claim is refused.
    * **Fencing.** :meth:`save` succeeds only if ``checkpoint.fencing_token`` is >= the stored
      fencing token, else raises ``StaleWriterError``. Progress writes (:meth:`save_progress`)
      are fenced by the same stored token.
    * **No regression.** :meth:`save` also refuses (``StaleWriterError``) a ``cluster_time``
      lower than the stored one. An equal cluster time is accepted: events of one transaction
      share a cluster time, and an idle stream may re-mint a token at the same time. A claimed
      tenure saving the position it claimed is therefore never refused for the position.
    * **One deployment per record.** :meth:`claim` records the claimer's deployment and raises
      :class:`~singleton.errors.ConfigurationError` naming both sides when the record belongs
      to another one: a checkpoint is never shared or reused silently.
    * **Atomicity.** The check and the write are one server-side step; there is no
      read-then-write window.
    * **Errors.** Driver errors never leak (:func:`singleton.drivers.mongo.translate`,
      :func:`singleton.lease.redis.translate`): unreachable, timed out or "try again" ->
      :class:`~singleton.errors.BackendUnavailableError`; refused credentials ->
      :class:`~singleton.errors.PermissionDeniedError`; anything else ->
      :class:`~singleton.errors.BackendError`.
    * **Ownership.** A store closes only a client it created from a URL.
    """

    @abstractmethod
    def load(self, name: str) -> Checkpoint | None:
        """The saved checkpoint of ``name``, or ``None`` if no position was ever saved."""

    @abstractmethod
    def claim(
        self, name: str, fencing_token: int, holder: str, deployment: Deployment
    ) -> Checkpoint | None:
        """Fence ``name`` with ``fencing_token`` and return its position at that instant
        (``None`` if no position is stored); see the class invariants."""

    @abstractmethod
    def save(self, checkpoint: Checkpoint) -> None:
        """Store ``checkpoint`` if fenced and not backwards (see the class invariants)."""

    @abstractmethod
    def load_progress(self, name: str) -> dict[str, Any] | None:
        """Listener progress last saved by :meth:`save_progress`, or ``None``."""

    @abstractmethod
    def save_progress(
        self, name: str, data: Mapping[str, Any] | None, leadership: Leadership
    ) -> None:
        """Store ``data`` (``None`` clears it), fenced by ``leadership.token``."""

    def load_deployment(self, name: str) -> dict[str, str] | None:
        """The deployment recorded for ``name`` (``None``: none recorded)."""
        cp = self.load(name)
        return None if cp is None or cp.deployment is None else dict(cp.deployment)

    def delete(self, name: str) -> None:
        """Forget ``name`` entirely (tests and operators; not fenced)."""
        raise NotImplementedError

    def names(self, prefix: str) -> list[str]:
        """The names with a record that start with ``prefix``, sorted (for partition layouts)."""
        raise NotImplementedError

    def close(self) -> None:  # noqa: B027 - optional: only stores that own a client close it
        """Close the client if this store created it."""

    def describe(self) -> str:
        return type(self).__name__

    def __enter__(self) -> CheckpointStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def check_deployment(store: CheckpointStore, listener: ChangeStreamListener) -> None:
    """Raise :class:`ConfigurationError` if ``store`` holds a checkpoint of
    ``listener.lease_name`` recorded by another deployment. The service calls it at start-up,
    before campaigning, and exits with code 2 on the error (the claim checks again, atomically,
    at every tenure start)."""
    stored = store.load_deployment(listener.lease_name)
    if stored is not None and stored != dict(listener.deployment()):
        raise ConfigurationError(
            deployment_mismatch(listener.lease_name, stored, listener.deployment())
        )


def deployment_mismatch(name: str, stored: Deployment, ours: Deployment) -> str:
    return (
        f"checkpoint {name!r} belongs to another deployment: stored {_show(stored)}, this "
        f"listener {_show(ours)}; give this listener its own name, or delete the checkpoint "
        f"if the old deployment is gone"
    )


def _show(deployment: Deployment) -> str:
    return "{" + ", ".join(f"{k}={v!r}" for k, v in sorted(deployment.items())) + "}"


def stale_message(
    name: str, checkpoint: Checkpoint | None, token: int, ct: Timestamp | None
) -> str:
    if checkpoint is None:
        return f"checkpoint {name!r}: write by token {token} refused"
    if token < checkpoint.fencing_token:
        return (
            f"checkpoint {name!r}: token {token} is older than the stored token "
            f"{checkpoint.fencing_token} (holder {checkpoint.holder!r})"
        )
    return (
        f"checkpoint {name!r}: position {ct} would move back from {checkpoint.cluster_time} "
        f"(token {token})"
    )
