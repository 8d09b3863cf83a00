"""A TCP proxy that can black-hole its connections (packets stop, sockets stay open) or refuse them
with a canned answer.

The drill puts one in front of the lease store for every replica, so that one replica can be cut off
(a partition looks like this to a client: no RST, no FIN, reads just hang) while the others keep
going, and one in front of Elasticsearch for every replica, so that one replica's sink can refuse it
(an HTTP 403 to every request: its credentials were revoked) while the others work.
(``tests/integration/proxy.py`` is the test suite's copy; the drill must not import tests.)
"""

from __future__ import annotations

import contextlib
import select
import socket
import threading
from urllib.parse import urlsplit, urlunsplit

TICK = 0.1  # how long a thread blocks in select(): bounds how late close() and restore() act


class TcpProxy:
    """Forward ``127.0.0.1:<port>`` to ``target_host:target_port``, one thread per connection."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self.port: int = self._listener.getsockname()[1]
        self._flowing = threading.Event()
        self._flowing.set()
        self._answer: bytes | None = None
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._clients: list[socket.socket] = []
        self._threads: list[threading.Thread] = []
        self._spawn(self._accept, "accept")

    def blackhole(self) -> None:
        """Stop forwarding in both directions (and stop accepting), keeping every socket open."""
        self._flowing.clear()

    def held(self) -> int:
        """How many client connections have sent something that is not forwarded (a request
        held while black-holed): a test's signal that a request is in flight."""
        with self._lock:
            clients = [c for c in self._clients if c.fileno() >= 0]
        try:
            ready, _, _ = select.select(clients, [], [], 0)
        except (OSError, ValueError):
            return 0
        return len(ready)

    def refuse(self, answer: bytes) -> None:
        """Drop every open connection and answer each new one with ``answer``, then close it."""
        self._answer = answer
        self._drop_all()

    def restore(self) -> None:
        self._answer = None
        self._flowing.set()

    def _drop_all(self) -> None:
        with self._lock:
            sockets, self._sockets, self._clients = self._sockets, [], []
        for s in sockets:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self._closed.set()
        self._flowing.set()
        for t in list(self._threads):
            t.join(5)
        with contextlib.suppress(OSError):
            self._listener.close()
        with self._lock:
            for s in self._sockets:
                with contextlib.suppress(OSError):
                    s.close()
            self._sockets.clear()
            self._clients.clear()

    def __enter__(self) -> TcpProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- threads ---------------------------------------------------------------------------
    def _spawn(self, target: object, what: str, *args: object) -> None:
        t = threading.Thread(
            target=target,  # type: ignore[arg-type]
            args=args,
            name=f"tcp-proxy-{self.port}-{what}",
            daemon=True,
        )
        self._threads.append(t)
        t.start()

    def _accept(self) -> None:
        while not self._closed.is_set():
            if not self._flowing.wait(TICK):
                continue  # the kernel still completes handshakes: clients connect, then hang
            try:
                ready, _, _ = select.select([self._listener], [], [], TICK)
                if not ready:
                    continue
                client, _ = self._listener.accept()
            except (OSError, ValueError):
                return
            answer = self._answer
            if answer is not None:
                self._spawn(self._refuse, "refuse", client, answer)
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            for s in (client, upstream):
                s.settimeout(5)  # a peer that never reads must not wedge a pump forever
            with self._lock:
                self._sockets += [client, upstream]
                self._clients.append(client)
            self._spawn(self._pump, "pump", client, upstream)

    @staticmethod
    def _refuse(client: socket.socket, answer: bytes) -> None:
        try:
            client.settimeout(2)
            client.recv(65536)  # the request line and headers: enough to answer after
            client.sendall(answer)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                client.close()

    def _pump(self, a: socket.socket, b: socket.socket) -> None:
        peer = {a: b, b: a}
        try:
            while not self._closed.is_set():
                if not self._flowing.wait(TICK):
                    continue
                ready, _, _ = select.select([a, b], [], [], TICK)
                for s in ready:
                    if not self._flowing.is_set():
                        break  # black-holed between select() and here: leave it unread
                    data = s.recv(65536)
                    if not data:
                        return
                    peer[s].sendall(data)
        except OSError:
            return
        finally:
            for s in (a, b):
                with contextlib.suppress(OSError):
                    s.close()


def host_port(url: str, default: int) -> tuple[str, int]:
    """The first host of ``url`` (a proxy forwards to one server: give the primary's URL)."""
    first = urlsplit(url).netloc.rpartition("@")[2].split(",")[0]
    host, _, port = first.rpartition(":") if ":" in first else (first, "", "")
    return host or "127.0.0.1", int(port) if port.isdigit() else default


def via_proxy(url: str, port: int) -> str:
    """``url`` with its host and port replaced by the local proxy's (credentials, database and
    options kept); a MongoDB URL also gets ``directConnection=true`` so that the driver does not
    discover the replica set's real addresses and go around the proxy."""
    parts = urlsplit(url)
    userinfo = parts.netloc.rpartition("@")[0]
    netloc = f"{userinfo}@127.0.0.1:{port}" if userinfo else f"127.0.0.1:{port}"
    query = parts.query
    if parts.scheme.startswith("mongodb"):
        query = "&".join(q for q in (query, "directConnection=true") if q)
    return urlunsplit(
        (
            "mongodb" if parts.scheme.startswith("mongodb") else parts.scheme,
            netloc,
            parts.path or "/",
            query,
            parts.fragment,
        )
    )
