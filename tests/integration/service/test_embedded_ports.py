"""Embedded servers start on ports nobody else holds, and say so when they cannot.

The suite starts hundreds of servers from parallel workers, each on a port that :func:`free_port`
found free a moment before: another process can take it before the server binds it. Then the
other process answers the readiness probe, and a server that failed to bind must not pass for
up (a Sentinel group once waited 30 s on a "Sentinel" that was another test's Redis).
"""

from __future__ import annotations

import pytest
import redis

from singleton.errors import BackendUnavailableError
from singleton.service.dev.embedded import ElasticServer, EmbeddedServer, MongoServer, RedisServer
from singleton.service.dev.ports import listens

KINDS = [RedisServer, MongoServer, ElasticServer]


def _pid(server: EmbeddedServer) -> int:
    assert server.proc is not None
    return server.proc.pid


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.kind)
def test_a_picked_port_taken_before_the_first_start_moves_to_a_free_one(
    kind: type[EmbeddedServer],
) -> None:
    with kind() as holder:
        server = kind()
        server.port = holder.port  # as if another process took it after free_port()
        with server:
            assert server.port != holder.port
            assert listens(_pid(server), server.port) is True
            assert listens(_pid(server), holder.port) is False
            assert server.ready() and holder.ready()  # each on its own port
            assert str(server.port) in server.url
            assert server.log_path.name == f"{server.kind}-{server.port}.log"


def test_a_given_port_that_is_taken_fails_naming_the_port_and_the_reason() -> None:
    with RedisServer() as holder:
        server = RedisServer(port=holder.port)
        with pytest.raises(BackendUnavailableError) as err:
            server.start()
        server.cleanup()
        assert f"port {holder.port}" in str(err.value)
        assert "address already in use" in str(err.value).lower()
        assert holder.ready()  # the holder is untouched


def test_a_restart_keeps_its_port() -> None:
    with RedisServer() as server:
        port = server.port
        server.restart()
        assert server.port == port
        assert redis.Redis(port=port).info("server")["process_id"] == _pid(server)


def test_listens_tells_our_process_from_another() -> None:
    with RedisServer() as one, RedisServer() as two:
        assert listens(_pid(one), one.port) is True
        assert listens(_pid(one), two.port) is False
