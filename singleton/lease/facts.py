"""The facts capability: a small record per lease name that outlives the lease but not the store.

It lets work under a lease leave a note that survives losing *its* store, e.g. "this listener has
had a checkpoint" (:mod:`listeners.checkpoints.marker`): the note goes when the store's data goes,
together with the fencing counter, which is exactly when the note has to be learnt again.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping

from singleton.errors import ConfigurationError
from singleton.lease.leases import validate_lease_args


class Facts(ABC):
    """Remembered facts, one record per name, beside the leases of the same store.

    Invariants every implementation keeps (``tests/integration/lease/test_contract.py``,
    ``TestFacts``, checks them against each backend), beside those every capability keeps
    (:mod:`singleton.lease.contract`):

    * **Merged atomically.** :meth:`remember` merges its fields into the record in one atomic
      write; fields it does not name are kept; values are stored and recalled as strings.
    * **Outlive leases, not the store.** No lease operation (grant, renewal, release, expiry)
      touches a record, nor does a record touch the lease or its fencing counter: remembering
      grants nothing. A record is lost only with the store's data (with the fencing counter).
    * **Not fenced, no expiry.** Anyone may write a record at any time, so write only facts that
      stay true whoever wrote them last.
    """

    @abstractmethod
    def remember(self, name: str, facts: Mapping[str, str | int]) -> None:
        """Merge ``facts`` into the record of ``name`` (creating it), in one atomic write.

        Field names are non-empty strings without ``.`` and not starting with ``$``; values are
        ``str`` or ``int`` (not ``bool``).
        """

    @abstractmethod
    def recall(self, name: str) -> dict[str, str]:
        """The record :meth:`remember` keeps for ``name``: every field, values as strings;
        empty if nothing was remembered (or the store lost its data since)."""


def validate_facts(name: str, facts: Mapping[str, str | int]) -> dict[str, str]:
    """Check :meth:`Facts.remember`'s arguments before any I/O; the fields as strings."""
    validate_lease_args(name)
    if not isinstance(facts, Mapping) or not facts:
        raise ConfigurationError(f"facts must be a non-empty mapping, got {facts!r}")
    fields: dict[str, str] = {}
    for key, value in facts.items():
        if not isinstance(key, str) or not key or "." in key or key.startswith("$"):
            raise ConfigurationError(
                f"fact names must be non-empty strings without '.' or a leading '$', got {key!r}"
            )
        if isinstance(value, bool) or not isinstance(value, (str, int)):
            raise ConfigurationError(f"fact {key!r} must be a str or an int, got {value!r}")
        fields[key] = str(value)
    return fields
