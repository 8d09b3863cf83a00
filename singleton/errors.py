"""singleton's exceptions: one root, translated at the boundary.

Driver exceptions (redis-py, pymongo, elasticsearch) never leave a backend or a sink: each is
re-raised as one of these with ``raise ... from exc`` so the cause stays visible in tracebacks.
"""

from __future__ import annotations


class SingletonError(Exception):
    """Root of every error singleton raises."""


class ConfigurationError(SingletonError, ValueError):
    """A value given to singleton is invalid. The message names the value and the rule."""


class LeaseLostError(SingletonError):
    """The caller acted on a leadership it no longer holds (or cannot prove it still holds)."""


class BackendError(SingletonError):
    """A lease or checkpoint backend failed in a way that is not a lost lease."""


class BackendUnavailableError(BackendError):
    """The backend could not be reached or did not answer in time: the outcome is unknown.

    Callers treat an unknown outcome as "not leader"; it is transient and may be retried.
    """


class PermissionDeniedError(BackendError):
    """The backend refused the credentials or the operation. Not transient: fix the config."""


class StaleWriterError(LeaseLostError):
    """A fenced write (checkpoint or sink) was refused because a newer fencing token has written."""


class SinkError(SingletonError):
    """A sink (for example Elasticsearch) failed to acknowledge a batch."""


class SinkUnavailableError(SinkError, BackendUnavailableError):
    """The sink could not be reached, timed out, or asked us to come back later (429, 5xx).

    Transient: retried with backoff while the lease holds; never a dead letter, since no event
    is at fault.
    """


class SinkRejectedError(SinkError):
    """The sink refused the whole request (401/403, a 400 about the request itself): no event
    is at fault and retrying will not help, so the tenure fails (and resigns) instead of
    dead-lettering the batch."""


class SinkLostError(SinkError):
    """The sink no longer holds what was written to it (its index deleted, its alias removed
    under the listener): the checkpoint is past events the sink lost, so only a copy makes it
    equal again. The tenure resyncs (a listener with an ``initial_sync``) or fails."""


class HistoryLostError(SingletonError):
    """The saved resume position is no longer in the oplog (server error 286 and its family)."""


class ElectionTimeoutError(SingletonError, TimeoutError):
    """:meth:`~singleton.Elector.lead` was not elected within its ``timeout``."""


class RetriesExhaustedError(SingletonError):
    """A transient failure outlasted its failure budget: the tenure ends and the lease is
    released so that another replica can try."""


class PoisonEventError(SingletonError):
    """An event failed on its own every time and there was no dead-letter store to keep it."""


class EventTooLargeError(SingletonError):
    """A change event over the 16 MB BSON limit that even the reduced stream cannot read."""


class UnindexableError(SinkError):
    """A document the sink can never accept as it is (its id, a value): it is dead-lettered,
    never retried."""


class UnindexableIdError(UnindexableError):
    """A ``_id`` whose index id would be too long (or that is no BSON id)."""


class NonFiniteNumberError(UnindexableError):
    """A document holds NaN or an infinity, which JSON (and so the index) cannot hold."""


class VersionOverflowError(SinkError):
    """An external version could not be derived from an event's oplog position (out of range,
    or no position at all): writing without one would give up the stale-write guard."""


class ItemRejectedError(SinkError):
    """The sink refused one item for good (a mapping error, another 4xx): a dead letter."""

    def __init__(self, reason: str, status: int) -> None:
        super().__init__(reason)
        self.status = status


class EsUnavailableError(SinkUnavailableError):
    """Elasticsearch did not answer (connection refused, timeout) or asked to come back later."""
