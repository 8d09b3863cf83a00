"""One contender of ``bench/peers.py``: campaigns for one lease with one library and, while it
believes it leads, acts every ``PERIOD`` s.

An act is an ``RPUSH`` of ``"<ident> act <time.monotonic()>"`` to the list ``key`` on its own
connection, so the list's order is the order the shared resource saw the acts in; ``ready``
(about to campaign), ``lost`` (the library said the tenure ended) and ``released`` (its release
path on SIGTERM is done) go to the same list. ``time.monotonic()`` is the system-wide
``CLOCK_MONOTONIC`` on Linux, so the parent can compare these stamps with its own.

SIGTERM stops acting and leaves the way the library's documentation says (the leader's planned
handover); the parent ends followers with SIGKILL. Runs under either virtualenv (the project's,
for singleton; the bench's throwaway one for the peers), so it imports nothing but the standard
library and ``redis`` at the top, and is started with ``python -I`` so that ``bench/`` is not on
its path::

    python -I bench/_peers_child.py {singleton|python-redis-lock|tooz} IDENT REDIS_URL KEY --ttl 2
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import signal
import threading
import time
import urllib.parse
from collections.abc import Callable
from typing import Any

import redis

#: Seconds between two acts of a leader.
PERIOD = 0.01
LEASE = "peers"


class Acts:
    """Appends this contender's marks to the shared list, on a connection of its own."""

    def __init__(self, url: str, key: str, ident: str) -> None:
        self._client = redis.Redis.from_url(url, socket_timeout=5)
        self._key = key
        self._ident = ident

    def mark(self, kind: str) -> None:
        self._client.rpush(self._key, f"{self._ident} {kind} {time.monotonic():.6f}")

    def act(self) -> None:
        self.mark("act")


def run_singleton(args: argparse.Namespace, acts: Acts, stopping: threading.Event) -> None:
    """``Elector(...).lead()``, acting while ``leadership.valid()`` (README, "Use it as a
    library"); leaving the ``with`` block stops the elector and releases the lease."""
    from singleton import Elector, RedisLeaseBackend

    backend = RedisLeaseBackend(args.url, namespace="peers")
    try:
        while not stopping.is_set():
            acts.mark("ready")
            elector = Elector(backend, LEASE, identity=args.ident, ttl=args.ttl)
            with elector.lead() as leadership:
                while not stopping.is_set() and leadership.valid():
                    acts.act()
                    stopping.wait(PERIOD)
            if not stopping.is_set():
                acts.mark("lost")
        acts.mark("released")
    finally:
        backend.close()


def run_redis_lock(args: argparse.Namespace, acts: Acts, stopping: threading.Event) -> None:
    """``redis_lock.Lock(conn, name, expire=ttl, auto_renewal=True)``, acquired blocking; before
    each act the lock's owner is read (``get_owner_id() == lock.id``: ``locked()`` is true
    whoever holds it). ``release()`` on SIGTERM, as its context manager's exit does."""
    redis_lock: Any = importlib.import_module("redis_lock")
    conn = redis.Redis.from_url(args.url)
    while not stopping.is_set():
        # A fresh Lock each tenure: a deposed one's renewal thread has died on NotAcquired.
        lock = redis_lock.Lock(conn, LEASE, expire=int(args.ttl), auto_renewal=True)
        acts.mark("ready")
        lock.acquire()  # BLPOP on the release signal, SET NX after each wake or timeout
        while not stopping.is_set() and lock.get_owner_id() == lock.id:
            acts.act()
            stopping.wait(PERIOD)
        try:
            lock.release()
        except redis_lock.NotAcquired:  # expired and taken: the owner check stopped the acts
            acts.mark("lost")
    acts.mark("released")


def run_tooz(args: argparse.Namespace, acts: Acts, stopping: threading.Event) -> None:
    """tooz's Redis driver as its leader-election tutorial has it: join a group,
    ``watch_elected_as_leader``, then ``heartbeat()`` and ``run_watchers()`` every
    ``--tooz-poll`` s (the tutorial's 0.1 s). The callback is the only news it gives: there is
    no loss event, so the contender acts from its election on. ``coordinator.stop()`` on SIGTERM
    releases the leader lock and leaves the group."""
    coordination: Any = importlib.import_module("tooz.coordination")
    parsed = urllib.parse.urlsplit(args.url)
    query = urllib.parse.urlencode({"lock_timeout": int(args.ttl), "membership_timeout": args.ttl})
    url = f"redis://{parsed.hostname}:{parsed.port}/?{query}"
    group = LEASE.encode()
    coordinator = coordination.get_coordinator(url, args.ident.encode())
    coordinator.start()
    try:
        with contextlib.suppress(coordination.GroupAlreadyExist):  # another contender's
            coordinator.create_group(group).get()
        coordinator.join_group(group).get()
        elected = threading.Event()
        coordinator.watch_elected_as_leader(group, lambda _event: elected.set())
        acts.mark("ready")
        next_poll = 0.0
        while not stopping.is_set():
            if time.monotonic() >= next_poll:
                coordinator.heartbeat()
                coordinator.run_watchers()
                next_poll = time.monotonic() + args.tooz_poll
            if elected.is_set():
                acts.act()
            stopping.wait(PERIOD)
    finally:
        coordinator.stop()
    acts.mark("released")


RUNNERS: dict[str, Callable[[argparse.Namespace, Acts, threading.Event], None]] = {
    "singleton": run_singleton,
    "python-redis-lock": run_redis_lock,
    "tooz": run_tooz,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("library", choices=sorted(RUNNERS))
    parser.add_argument("ident")
    parser.add_argument("url")
    parser.add_argument("key")
    parser.add_argument("--ttl", type=float, default=2.0)
    parser.add_argument("--tooz-poll", type=float, default=0.1)
    args = parser.parse_args()
    stopping = threading.Event()
    # The handler only sets the flag: the acting loop checks it before each act and wakes from
    # its wait, so the leader stops acting before it releases.
    signal.signal(signal.SIGTERM, lambda _sig, _frame: stopping.set())
    RUNNERS[args.library](args, Acts(args.url, args.key, args.ident), stopping)


if __name__ == "__main__":
    main()
