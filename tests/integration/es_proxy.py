"""A test HTTP proxy in front of Elasticsearch that answers 429 for a share of bulk *items*.

Rejected items are not forwarded at all (so they are really not written) and the bulk answer is
rebuilt in the original item order, with ``{"status": 429, "error": ...}`` in their place. Every
other request passes through unchanged.
"""

from __future__ import annotations

import http.client
import json
import random
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from typing_extensions import Self


class BulkRejectingProxy:
    def __init__(self, upstream: str, reject_ratio: float = 0.3, seed: int = 0) -> None:
        self.upstream = urlsplit(upstream)
        self.reject_ratio = reject_ratio
        self.rng = random.Random(seed)
        self.lock = threading.Lock()
        self.rejected = 0
        self.forwarded = 0
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                headers = {
                    k: v
                    for k, v in self.headers.items()
                    if k.lower() not in ("host", "content-length", "connection")
                }
                if self.command == "POST" and self.path.split("?")[0].endswith("/_bulk") and body:
                    status, data = proxy.bulk(self.path, body, headers)
                else:
                    status, data = proxy.forward(self.command, self.path, body, headers)
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = _handle

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def forward(
        self, method: str, path: str, body: bytes | None, headers: dict[str, str]
    ) -> tuple[int, bytes]:
        """One request upstream, on a connection of its own (the handler runs in many threads)."""
        conn = http.client.HTTPConnection(self.upstream.netloc, timeout=60)
        try:
            conn.request(method, path, body=body, headers=headers)
            resp = conn.getresponse()
            return resp.status, resp.read()
        finally:
            conn.close()

    def bulk(self, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
        lines = body.splitlines()
        actions: list[list[bytes]] = []
        i = 0
        while i < len(lines):
            meta = json.loads(lines[i])
            op = next(iter(meta))
            n = 1 if op == "delete" else 2
            actions.append(lines[i : i + n])
            i += n
        with self.lock:
            reject = [self.rng.random() < self.reject_ratio for _ in actions]
        keep = [a for a, r in zip(actions, reject, strict=True) if not r]
        results: list[Any] = []
        if keep:
            payload = b"\n".join(b"\n".join(a) for a in keep) + b"\n"
            status, data = self.forward("POST", path, payload, headers)
            if status != 200:
                return status, data
            results = json.loads(data)["items"]
        merged = []
        it = iter(results)
        for action, rejected in zip(actions, reject, strict=True):
            if rejected:
                op = next(iter(json.loads(action[0])))
                merged.append(
                    {
                        op: {
                            "status": 429,
                            "error": {
                                "type": "es_rejected_execution_exception",
                                "reason": "proxy says slow down",
                            },
                        }
                    }
                )
            else:
                merged.append(next(it))
        with self.lock:
            self.rejected += sum(reject)
            self.forwarded += len(keep)
        out = {"took": 1, "errors": True, "items": merged}
        return 200, json.dumps(out).encode()

    def __enter__(self) -> Self:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


_FORBIDDEN_BODY = b'{"error":{"type":"security_exception","reason":"revoked"},"status":403}'
#: What a TCP proxy (``tests.integration.proxy.TcpProxy.refuse``) answers for an Elasticsearch
#: whose credentials were revoked: HTTP 403 to every request.
FORBIDDEN = (
    b"HTTP/1.1 403 Forbidden\r\nContent-Type: application/json\r\n"
    + f"Content-Length: {len(_FORBIDDEN_BODY)}\r\nConnection: close\r\n\r\n".encode()
    + _FORBIDDEN_BODY
)


class BulkHoldingProxy(BulkRejectingProxy):
    """Holds every bulk request until :attr:`release` is set (counting them in :attr:`held`),
    then forwards it whole; every other request passes at once."""

    def __init__(self, upstream: str) -> None:
        super().__init__(upstream, reject_ratio=0.0)
        self.release = threading.Event()
        self.held = threading.Semaphore(0)

    def bulk(self, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
        self.held.release()
        self.release.wait(60)
        return self.forward("POST", path, body, headers)
