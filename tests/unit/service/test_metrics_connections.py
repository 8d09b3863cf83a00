"""The metrics server's connections, on a real socket: an idle one is closed after the connection
timeout (it held a thread forever before), and at most ``max_connections`` threads serve at
once (one more connection is closed unanswered), so idle clients cannot starve the scraper for
longer than the timeout nor take a thread each."""

from __future__ import annotations

import socket
import threading
import time
import urllib.request
from collections.abc import Iterator
from types import SimpleNamespace

import pytest

from singleton.service.dev.embedded import wait_until
from singleton.service.metrics import MetricsServer
from singleton.testing import MemoryLeaseBackend

TIMEOUT = 0.5
SLOTS = 4


@pytest.fixture(params=[TIMEOUT])
def server(request: pytest.FixtureRequest) -> Iterator[MetricsServer]:
    """A server whose connections time out after ``request.param`` seconds."""
    replica = SimpleNamespace(hosted=[], jobs=None, backend=MemoryLeaseBackend(), started_at=1.0)
    started = MetricsServer(
        replica,  # type: ignore[arg-type]
        "127.0.0.1:0",
        connection_timeout=request.param,
        max_connections=SLOTS,
    ).start()
    try:
        yield started
    finally:
        started.stop()


def _idle(server: MetricsServer) -> socket.socket:
    host, port = server.server_address[:2]
    sock = socket.create_connection((str(host), port), timeout=5)
    return sock


def _closed_within(sock: socket.socket, seconds: float) -> bool:
    """Whether the server closes ``sock`` (sending nothing) within ``seconds``."""
    sock.settimeout(seconds)
    try:
        return sock.recv(1024) == b""
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True


def _healthz(server: MetricsServer) -> int:
    with urllib.request.urlopen(f"{server.url}/healthz", timeout=5) as reply:
        return int(reply.status)


def test_an_idle_connection_is_closed_after_the_timeout(server: MetricsServer) -> None:
    sock = _idle(server)
    try:
        start = time.monotonic()
        assert _closed_within(sock, 5 * TIMEOUT + 2)
        assert time.monotonic() - start >= TIMEOUT * 0.8
    finally:
        sock.close()


@pytest.mark.parametrize("server", [3.0], indirect=True)
def test_idle_connections_take_at_most_max_connections_threads(server: MetricsServer) -> None:
    before = threading.active_count()
    held = [_idle(server) for _ in range(SLOTS)]
    try:
        # each accepted and handed its thread
        wait_until(lambda: threading.active_count() - before >= SLOTS, 5, what="the slots taken")
        for _ in range(20):
            # beyond the slots: closed at once (well before the held ones' timeout), unanswered,
            # without a thread of its own
            with _idle(server) as extra:
                assert _closed_within(extra, 1.0)
            assert threading.active_count() - before <= SLOTS
        # the idle ones time out, and the slots serve a scraper again
        assert all(_closed_within(sock, 6.0) for sock in held)
        assert _healthz(server) == 200
    finally:
        for sock in held:
            sock.close()
