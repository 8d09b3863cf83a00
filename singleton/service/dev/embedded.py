"""Embedded servers for the demo, the drill and the test suite: real processes on free ports.

* Redis: the real ``redis-server`` when it is on PATH, else fakeredis's TCP server (a subprocess
  too, so that it can be killed and paused like the real one).
* MongoDB: SecantusDB (``python -m secantus``), a MongoDB wire-protocol server with change streams.
* Elasticsearch: osmem-server, the binary bundled in the ``osmem-server`` wheel.

Each class owns exactly one process; ``stop()`` ends it and removes what it created. Readiness is
a deadline-bounded probe of the real protocol, never a fixed sleep, and it must be our process
that answers: a port taken by another process before the first start moves the server to a new
one (:meth:`EmbeddedServer.start`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType

from singleton.errors import BackendUnavailableError, ConfigurationError
from singleton.service.dev.ports import free_port, listens


def wait_until(
    predicate: Callable[[], bool], timeout: float, interval: float = 0.02, what: str = "condition"
) -> None:
    """Wait for ``predicate()`` to be true, checking every ``interval``, up to ``timeout`` seconds.

    For readiness probes of other processes, which offer nothing to wait on but their socket.
    """
    deadline = time.monotonic() + timeout
    stop = threading.Event()
    while True:
        try:
            if predicate():
                return
        except BackendUnavailableError:
            raise
        except Exception:  # not up yet: refused, reset, half-started
            pass
        if time.monotonic() >= deadline:
            raise BackendUnavailableError(f"{what} not reached within {timeout} s")
        stop.wait(interval)


#: Where a server's log says its port was taken between :func:`free_port` and its bind (the
#: ``strerror`` of ``EADDRINUSE``, which Redis, Python and Go servers all print).
_PORT_TAKEN = "address already in use"
#: First starts on a fresh port after the picked one was taken by another process meanwhile.
_PORT_ATTEMPTS = 3


def _tcp_open(port: int, host: str = "127.0.0.1") -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


class _PortTakenError(BackendUnavailableError):
    """The server could not bind its port: another process took it first."""


class EmbeddedServer:
    """One server process on a free port; a context manager."""

    kind = "server"

    def __init__(
        self, port: int | None = None, host: str = "127.0.0.1", log_dir: str | None = None
    ):
        self.host = host
        self.port = port or free_port(host)
        #: A port we picked may move to another one while the server has never started (see
        #: :meth:`start`); a port given to us, or one a server has run on, stays.
        self._movable = port is None
        self.proc: subprocess.Popen[bytes] | None = None
        self._tmp = tempfile.mkdtemp(prefix=f"singleton-{self.kind}-")
        self.log_path = Path(log_dir or self._tmp) / f"{self.kind}-{self.port}.log"
        self._log: object | None = None

    # subclasses
    def command(self) -> Sequence[str]:
        raise NotImplementedError

    def ready(self) -> bool:
        return _tcp_open(self.port, self.host)

    @property
    def url(self) -> str:
        raise NotImplementedError

    # lifecycle
    def start(self, timeout: float = 30.0) -> EmbeddedServer:
        """Start the process and wait until it answers on its port, at most ``timeout`` s.

        Up means our process answers: :meth:`ready` passing is not enough while another process
        listens on the port (:func:`listens`). A first start on a port we picked, which another
        process took between :func:`free_port` and the bind, is made again on a fresh port (up
        to :data:`_PORT_ATTEMPTS` times); so read :attr:`port` and :attr:`url` after it."""
        if self.proc is not None and self.proc.poll() is None:
            return self
        attempt = 1
        while True:
            try:
                self._start(timeout)
            except _PortTakenError:
                if not self._movable or attempt == _PORT_ATTEMPTS:
                    raise
                attempt += 1
                self._move()
                continue
            self._movable = False
            return self

    def _move(self) -> None:
        self.port = free_port(self.host)
        self.log_path = self.log_path.with_name(f"{self.kind}-{self.port}.log")

    def _start(self, timeout: float) -> None:
        offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        log = open(self.log_path, "ab")  # noqa: SIM115 - lives as long as the process
        self._log = log
        self.proc = subprocess.Popen(
            list(self.command()),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # Ctrl-C in a terminal reaches us, and we stop it in order
        )
        proc = self.proc

        def up() -> bool:
            if proc.poll() is not None:
                raise BackendUnavailableError(
                    f"{self.kind} exited with {proc.returncode}; see {self.log_path}"
                )
            return self.ready() and listens(proc.pid, self.port) is not False

        try:
            wait_until(up, timeout, what=f"{self.kind} on port {self.port}")
        except BackendUnavailableError:
            self.stop()
            with open(self.log_path, "rb") as f:
                f.seek(offset)
                tail = f.read().decode(errors="replace")[-2000:]
            error = _PortTakenError if _PORT_TAKEN in tail.lower() else BackendUnavailableError
            raise error(f"{self.kind} did not start on port {self.port}: {tail}") from None

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGCONT)
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        if self._log is not None:
            self._log.close()  # type: ignore[attr-defined]
            self._log = None

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self._tmp, ignore_errors=True)

    def kill(self) -> None:
        """SIGKILL, as a crash."""
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
            self.proc.wait(10)
            self.proc = None

    def pause(self) -> None:
        if self.proc is not None:
            os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        if self.proc is not None:
            os.kill(self.proc.pid, signal.SIGCONT)

    def restart(self, timeout: float = 30.0) -> None:
        self.stop()
        self.start(timeout)

    def __enter__(self) -> EmbeddedServer:
        return self.start()

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.cleanup()


class RedisServer(EmbeddedServer):
    """``redis-server`` with no persistence (or fakeredis's TCP server if Redis is missing)."""

    kind = "redis"

    def __init__(self, port: int | None = None, *, binary: str | None = None, **kw: str) -> None:
        super().__init__(port, **kw)
        self.binary = binary or shutil.which("redis-server")

    @property
    def fake(self) -> bool:
        return self.binary is None

    def command(self) -> Sequence[str]:
        if self.binary is None:
            return [sys.executable, "-m", "singleton.service.dev.fakeredis_server", str(self.port)]
        return [
            self.binary,
            "--port",
            str(self.port),
            "--bind",
            self.host,
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            self._tmp,
        ]

    def ready(self) -> bool:
        with socket.create_connection((self.host, self.port), timeout=0.5) as s:
            s.sendall(b"*1\r\n$4\r\nPING\r\n")
            return s.recv(16).startswith(b"+PONG")

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.port}/0"


class MongoServer(EmbeddedServer):
    """SecantusDB: a single-node replica set speaking the MongoDB wire protocol."""

    kind = "mongo"

    def __init__(
        self,
        port: int | None = None,
        *,
        storage_path: str | None = None,
        oplog_max_entries: int | None = None,
        test_commands: bool = False,
        extra_args: Sequence[str] = (),
        **kw: str,
    ) -> None:
        super().__init__(port, **kw)
        self.storage_path = storage_path or os.path.join(self._tmp, "data")
        self.oplog_max_entries = oplog_max_entries
        self.test_commands = test_commands
        self.extra_args = list(extra_args)

    def command(self) -> Sequence[str]:
        cmd = [
            sys.executable,
            "-m",
            "secantus",
            "--host",
            self.host,
            "--port",
            str(self.port),
            "--storage-path",
            self.storage_path,
            "--log-level",
            "WARNING",
        ]
        if self.oplog_max_entries is not None:
            cmd += ["--oplog-max-entries", str(self.oplog_max_entries)]
        if self.test_commands:
            cmd.append("--enable-test-commands")
        return cmd + self.extra_args

    def ready(self) -> bool:
        import pymongo

        client: pymongo.MongoClient[dict[str, object]] = pymongo.MongoClient(
            self.url, serverSelectionTimeoutMS=500, connectTimeoutMS=500
        )
        try:
            return bool(client.admin.command("ping").get("ok"))
        finally:
            client.close()

    @property
    def url(self) -> str:
        return f"mongodb://{self.host}:{self.port}/"


class ElasticServer(EmbeddedServer):
    """osmem-server: the OpenSearch/Elasticsearch REST API in memory."""

    kind = "elasticsearch"

    def command(self) -> Sequence[str]:
        try:
            from osmem_server import resolve_binary
        except ImportError as exc:  # pragma: no cover - dev extra missing
            raise ConfigurationError(
                "the embedded Elasticsearch needs the 'osmem-server' package (pip install "
                "osmem-server)"
            ) from exc
        return [
            resolve_binary(),
            "-addr",
            f"{self.host}:{self.port}",
            "-no-stdin-watch",
            "-parent-pid",
            str(os.getpid()),
        ]

    def ready(self) -> bool:
        with urllib.request.urlopen(self.url + "/", timeout=0.5) as resp:
            return bool(resp.status == 200)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"
