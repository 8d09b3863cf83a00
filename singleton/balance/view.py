"""What the balancer (:mod:`singleton.balance.balancer`) shares with its callers: what it needs
of an elector, and its view."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from singleton.election.leadership import Leadership

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from singleton.election.callbacks import Subscribers


class Balanced(Protocol):
    """What the balancer needs of an elector."""

    @property
    def name(self) -> str: ...

    @property
    def leadership(self) -> Leadership | None: ...

    @property
    def cooling(self) -> bool: ...

    def rotate(self) -> None: ...

    def subscribe(self, **callbacks: Unpack[Subscribers]) -> None: ...


@dataclass(frozen=True)
class BalanceView:
    """One replica's view: the live members and the leases each reports holding, the number of
    leases balanced, this replica's share and what it holds now."""

    identity: str
    members: Mapping[str, int]
    leases: int
    share: int
    held: tuple[str, ...]
    sheds: int = 0
    stale: bool = False

    def as_dict(self) -> dict[str, object]:
        return {
            "identity": self.identity,
            "members": dict(self.members),
            "leases": self.leases,
            "share": self.share,
            "held": list(self.held),
            "sheds": self.sheds,
            "stale": self.stale,
        }


def share_of(leases: int, members: int) -> int:
    """``ceil(leases / members)``: the most leases one replica should hold."""
    return math.ceil(leases / members) if members > 0 else leases
