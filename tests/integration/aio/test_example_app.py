"""The asyncio guide's example app (docs/how-to/asyncio.md), as pasted, as two replicas on a real
redis-server: exactly one runs the leader-only task and says so on ``/readyz``, and when that
replica shuts down the other takes over at once. (The page's blocks also all run, in order, in
``tests/integration/test_docs_examples.py``.)"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from starlette.testclient import TestClient

from singleton.service.dev.embedded import wait_until
from tests.integration.test_docs_examples import LOCAL_REDIS
from tests.unit.test_docs import ROOT, blocks_of

PAGE = ROOT / "docs" / "how-to" / "asyncio.md"


def app_source() -> str:
    (block,) = [b for b in blocks_of(PAGE) if b.kind == "python" and "Starlette(" in b.code]
    return block.code


def replica(redis_url: str) -> Any:
    """One replica: the page's app module, run in a namespace of its own."""
    namespace: dict[str, Any] = {"__name__": "example_app"}
    exec(compile(app_source().replace(LOCAL_REDIS, redis_url), str(PAGE), "exec"), namespace)
    return namespace["app"]


def until(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    """The replicas' HTTP answers (there is nothing else to wait on), within ``timeout``."""
    wait_until(predicate, timeout, what=what)


def test_one_of_two_replicas_leads_and_hands_over_when_it_shuts_down(redis_url: str) -> None:
    assert LOCAL_REDIS in app_source()
    clients = [TestClient(replica(redis_url)), TestClient(replica(redis_url))]
    open_clients = [c.__enter__() for c in clients]  # runs each lifespan: both campaign
    try:

        def leaders() -> list[bool]:
            return [bool(c.get("/readyz").json()["leader"]) for c in clients]

        until(lambda: any(leaders()), 10, "a leader")
        watched = time.monotonic() + 0.3  # a few renewals: exactly one at every look
        while time.monotonic() < watched:
            assert leaders().count(True) == 1
        assert [c.get("/readyz").status_code for c in clients] == [200, 200]
        leader, follower = clients if leaders()[0] else clients[::-1]
        stopped = time.monotonic()
        open_clients.remove(leader)
        leader.__exit__(None, None, None)  # its lifespan ends: the task cancelled, released
        until(lambda: follower.get("/readyz").json()["leader"], 5, "the follower takes over")
        took = time.monotonic() - stopped
    finally:
        for c in open_clients:
            c.__exit__(None, None, None)
    assert took < 1.0, f"the follower took {took:.2f}s to take over"
