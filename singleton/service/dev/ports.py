"""Ports for the embedded servers: one that is free now, and whether a process listens on one.

Between :func:`free_port` and a server's bind, another process may take the port (the test suite
starts hundreds of servers from parallel workers); :func:`listens` tells our server answering
from another one answering in its place (:meth:`EmbeddedServer.start
<singleton.service.dev.embedded.EmbeddedServer.start>`).
"""

from __future__ import annotations

import contextlib
import os
import socket
from pathlib import Path

__all__ = ["free_port", "listens"]


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (the usual bind-to-0 trick)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _listening_inodes(port: int) -> set[str] | None:
    """The socket inodes listening on TCP ``port`` (``None`` where ``/proc`` does not tell)."""
    found: set[str] | None = None
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        if found is None:
            found = set()
        for row in rows:
            fields = row.split()
            if (
                len(fields) > 9
                and fields[3] == "0A"
                and int(fields[1].rsplit(":", 1)[1], 16) == port
            ):
                found.add(fields[9])
    return found


def _family(pid: int) -> list[int]:
    """``pid`` and its descendants (a server may listen from a child process)."""
    out, todo = [], [pid]
    while todo:
        current = todo.pop()
        out.append(current)
        with contextlib.suppress(OSError):
            for task in os.listdir(f"/proc/{current}/task"):
                text = Path(f"/proc/{current}/task/{task}/children").read_text()
                todo.extend(int(child) for child in text.split())
    return out


def listens(pid: int, port: int) -> bool | None:
    """Whether process ``pid`` (or a descendant) listens on TCP ``port``; ``None`` where this
    cannot be told (no ``/proc``). A probe that another process answered (one that took the port
    between :func:`free_port` and our server's bind) must not pass for our server being up."""
    inodes = _listening_inodes(port)
    if inodes is None:
        return None
    for member in _family(pid):
        try:
            fds = os.listdir(f"/proc/{member}/fd")
        except OSError:
            continue
        for fd in fds:
            with contextlib.suppress(OSError):
                link = os.readlink(f"/proc/{member}/fd/{fd}")
                if link.startswith("socket:[") and link[8:-1] in inodes:
                    return True
    return False
