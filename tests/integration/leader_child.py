"""A leader in its own process, for SIGSTOP tests.

``python -m tests.integration.leader_child REDIS_URL NAMESPACE LEASE`` campaigns with an Elector
(ttl=1) and prints one JSON object per line on stdout: ``elected`` and ``lost`` events, and a
``valid`` report for every line read on stdin. EOF on stdin stops it (without releasing).
"""

from __future__ import annotations

import json
import sys
import threading

from singleton.backends.redis import RedisLeaseBackend
from singleton.elector import Elector
from singleton.leadership import Leadership

_out = threading.Lock()


def emit(**fields: object) -> None:
    with _out:
        sys.stdout.write(json.dumps(fields) + "\n")
        sys.stdout.flush()


def main(argv: list[str]) -> int:
    url, namespace, name = argv[1:4]
    current: list[Leadership] = []

    def elected(ld: Leadership) -> None:
        current.append(ld)
        emit(event="elected", token=ld.token, valid=ld.valid())

    def lost(ld: Leadership, reason: str) -> None:
        emit(event="lost", token=ld.token, reason=reason, valid=ld.valid())

    backend = RedisLeaseBackend(url, namespace=namespace)
    elector = Elector(
        backend,
        name,
        identity="child",
        ttl=1.0,
        retry_interval=0.2,
        on_elected=elected,
        on_lost=lost,
    )
    elector.start()
    try:
        for _ in sys.stdin:
            ld = current[-1] if current else None
            emit(
                event="valid",
                token=None if ld is None else ld.token,
                valid=ld is not None and ld.valid(),
            )
    finally:
        elector.stop(release=False, timeout=5)
        backend.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
