"""Embedded servers for the demo, the drill and the test suite: real processes on free ports.

* Redis: the real ``redis-server`` when it is on PATH, else fakeredis's TCP server (a subprocess
  too, so that it can be killed and paused like the real one).
* MongoDB: SecantusDB (``python -m secantus``), a MongoDB wire-protocol server with change streams.
* Elasticsearch: osmem-server, the binary bundled in the ``osmem-server`` wheel.

Each class owns exactly one process; ``stop()`` ends it and removes what it created. Readiness is
a deadline-bounded probe of the real protocol, never a fixed sleep.
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


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (the usual bind-to-0 trick)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


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


def _tcp_open(port: int, host: str = "127.0.0.1") -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


class EmbeddedServer:
    """One server process on a free port; a context manager."""

    kind = "server"

    def __init__(
        self, port: int | None = None, host: str = "127.0.0.1", log_dir: str | None = None
    ):
        self.host = host
        self.port = port or free_port(host)
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
        if self.proc is not None and self.proc.poll() is None:
            return self
        log = open(self.log_path, "ab")  # noqa: SIM115 - lives as long as the process
        self._log = log
        self.proc = subprocess.Popen(
            list(self.command()),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # Ctrl-C in a terminal reaches us, and we stop it in order
        )

        def up() -> bool:
            if self.proc is not None and self.proc.poll() is not None:
                raise BackendUnavailableError(
                    f"{self.kind} exited with {self.proc.returncode}; see {self.log_path}"
                )
            return self.ready()

        try:
            wait_until(up, timeout, what=f"{self.kind} on port {self.port}")
        except BackendUnavailableError:
            self.stop()
            tail = (
                self.log_path.read_text(errors="replace")[-2000:] if self.log_path.exists() else ""
            )
            raise BackendUnavailableError(
                f"{self.kind} did not start on port {self.port}: {tail}"
            ) from None
        return self

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
            return [sys.executable, "-m", "singleton.service._fakeredis_server", str(self.port)]
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
