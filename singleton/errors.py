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


class HistoryLostError(SingletonError):
    """The saved resume position is no longer in the oplog (server error 286 and its family)."""
