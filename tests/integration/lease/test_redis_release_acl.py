"""A Redis user whose ACL refuses the release's PUBLISH (``-publish``, or no channel at all) on a
real redis-server of the module's own: the release still deletes the lease key inside the
script and reports it released (not "release failed (lease will expire)" at ERROR), and the lost
notification is said once, at WARNING, naming the fix."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
import redis

from singleton.election.elector import Elector
from singleton.lease.leases import Lease
from singleton.lease.redis import RedisLeaseBackend
from singleton.service.dev.embedded import RedisServer
from tests.unit.election.election_support import captured_logs

USERS = {
    # the command refused, every channel allowed
    "nopublish": ["on", ">nopublish-pw", "~*", "&*", "+@all", "-publish"],
    # every command allowed, no channel
    "nochannel": ["on", ">nochannel-pw", "~*", "resetchannels", "+@all"],
}


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    with RedisServer() as started:
        assert not started.fake, "redis-server must be on PATH (make sysdeps)"
        admin = redis.Redis(host=started.host, port=started.port)
        for user, rules in USERS.items():
            admin.acl_setuser(user, reset=True)  # type: ignore[no-untyped-call]
            admin.execute_command("ACL", "SETUSER", user, *rules)
        admin.close()
        yield started


def _url(server: RedisServer, user: str) -> str:
    return f"redis://{user}:{user}-pw@{server.host}:{server.port}/0"


@pytest.mark.parametrize("user", sorted(USERS))
def test_a_refused_publish_still_releases(server: RedisServer, user: str, unique: str) -> None:
    backend = RedisLeaseBackend(_url(server, user), namespace=f"acl{unique}")
    try:
        with captured_logs("WARNING") as logs:
            for _ in range(3):
                lease = backend.contend("job", "a/1", 10.0)
                assert isinstance(lease, Lease)
                assert backend.release(lease) is True
                assert backend.inspect("job") is None  # the key is gone: a successor may take it
        refused = [msg for _, msg in logs if "refused to PUBLISH" in msg]
        assert len(refused) == 1, logs  # said once, not per release
        assert f"&acl{unique}:released +publish" in refused[0]
        assert f"{user}-pw" not in refused[0]
        assert backend.release(lease) is False  # a lease no longer held is still not released
    finally:
        backend.close()


def test_the_elector_hands_over_without_an_error(server: RedisServer, unique: str) -> None:
    """Before: ``release failed (lease will expire)`` at ERROR, the holder's release False,
    though the script had deleted the key before its PUBLISH failed."""
    backend = RedisLeaseBackend(_url(server, "nopublish"), namespace=f"acl{unique}")
    elected = threading.Event()
    released: list[bool] = []
    elector = Elector(
        backend,
        "job",
        identity="first",
        ttl=3.0,
        retry_interval=0.2,
        on_elected=lambda _ld: elected.set(),
    )
    elector.subscribe(on_released=lambda _ld, ok: released.append(ok))
    try:
        with captured_logs("WARNING") as logs:
            elector.start()
            assert elected.wait(10)
            elector.stop(release=True)
        assert released == [True], (released, logs)
        assert not [m for level, m in logs if level == "ERROR"], logs
        assert any("refused to PUBLISH" in m for _, m in logs), logs
        assert backend.inspect("job") is None
    finally:
        elector.stop()
        backend.close()
