"""The gate an election asks before contending: how a balancer (or any policy) holds a
replica back from a lease without touching the election's rules.

A gate only delays contends; it never grants, renews or releases, so a wrong answer costs time,
never safety.
"""

from __future__ import annotations

from typing import Protocol


class Gate(Protocol):
    """What an :class:`~singleton.election.machine.Election` asks before and tells after
    contending."""

    def gate(self, name: str) -> float:
        """0 to contend for ``name`` now, else the seconds to wait first."""
        ...

    def done(self, name: str) -> None:
        """The contend that :meth:`gate` admitted has returned."""
        ...
