"""What an election tells its subscribers, and how: the callback protocols and their registry.

Failure model: callbacks are user code. One that raises must not stop the election nor keep the
others from hearing the news, so each is called on its own and its exception logged. They run on
the driver's threads, outside every lock (``on_lost`` may join threads that call back into the
elector), and must return quickly; ``before_release`` is the one allowed to block, and the
election bounds it by ``release_timeout``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, TypedDict

from loguru import logger

from singleton.election.leadership import Leadership

if TYPE_CHECKING:
    from typing_extensions import Unpack  # typing.Unpack from Python 3.11


class OnElected(Protocol):
    def __call__(self, leadership: Leadership, /) -> None: ...


class OnLost(Protocol):
    def __call__(self, leadership: Leadership, reason: str, /) -> None: ...


class OnNewLeader(Protocol):
    def __call__(self, identity: str | None, /) -> None: ...


class BeforeRelease(Protocol):
    def __call__(self, leadership: Leadership, /) -> None: ...


class RunBounded(Protocol):
    """The driver's bound on ``before_release``: run ``work`` for at most ``timeout`` seconds;
    return whether it finished in time."""

    def __call__(self, work: Callable[[], None], timeout: float, /) -> bool: ...


class OnReleased(Protocol):
    """The ended tenure's lease was given back (``released``: the store confirmed it), or the
    call failed and the lease will expire (``released`` False)."""

    def __call__(self, leadership: Leadership, released: bool, /) -> None: ...


class Subscribers(TypedDict, total=False):
    """The callbacks one subscription adds, each optional (``None`` adds nothing)."""

    on_elected: OnElected | None
    on_lost: OnLost | None
    on_new_leader: OnNewLeader | None
    before_release: BeforeRelease | None
    on_released: OnReleased | None


class Callbacks:
    """The subscribers of one election; :meth:`add` may be called while it runs."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._lock = threading.Lock()
        self._lists: dict[str, list[Any]] = {
            kind: []
            for kind in ("on_elected", "on_lost", "on_new_leader", "before_release", "on_released")
        }

    def add(self, **subscribers: Unpack[Subscribers]) -> None:
        with self._lock:
            for kind, callback in subscribers.items():
                if callback is not None:
                    self._lists[kind].append(callback)

    @property
    def drains(self) -> bool:
        """Whether anyone asked to drain (``before_release``) before a planned release."""
        return bool(self._lists["before_release"])

    def elected(self, leadership: Leadership) -> None:
        self._fire("on_elected", leadership)

    def lost(self, leadership: Leadership, reason: str) -> None:
        self._fire("on_lost", leadership, reason)

    def new_leader(self, identity: str | None) -> None:
        self._fire("on_new_leader", identity)

    def before_release(self, leadership: Leadership) -> None:
        self._fire("before_release", leadership)

    def released(self, leadership: Leadership, released: bool) -> None:
        self._fire("on_released", leadership, released)

    def _fire(self, kind: str, *args: Any) -> None:
        with self._lock:
            todo: list[Callable[..., None]] = list(self._lists[kind])
        for callback in todo:
            try:
                callback(*args)
            except Exception:
                logger.exception("callback {!r} failed: lease={}", callback, self._name)
