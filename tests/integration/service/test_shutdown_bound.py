"""``shutdown_timeout`` holds whatever the sink does: ``singleton run`` with Elasticsearch
black-holed mid-stream (a bulk request in flight that will never be answered) exits within
``shutdown_timeout`` of SIGTERM, with its lease released; what was in flight is unacknowledged
and the successor replays it."""

from __future__ import annotations

import re
import signal
import time
import urllib.request
from pathlib import Path
from typing import Any

import pymongo

from singleton.service.config import Config
from singleton.service.dev.embedded import free_port, wait_until
from singleton.service.drill.proxy import TcpProxy, host_port, via_proxy
from singleton.service.registry import make_backend
from tests.integration.cluster import ReplicaProc, store_args

SHUTDOWN = 4.0


def _events(port: int) -> float:
    """``singleton_events_processed_total`` summed, from the replica's /metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        text = reply.read().decode()
    found = re.findall(r"^singleton_events_processed_total\{[^}]*\} (\S+)$", text, re.M)
    return sum(float(v) for v in found)


def test_sigterm_with_the_sink_black_holed_exits_within_shutdown_timeout(
    redis_url: str, mongo_url: str, es_url: str, unique: str, tmp_path: Path
) -> None:
    ns, db, port = f"sb{unique}", f"db{unique}", free_port()
    lease = f"{db}.orders"
    client: Any = pymongo.MongoClient(mongo_url)
    backend = make_backend(Config(backend="redis", redis_url=redis_url, namespace=ns))
    with TcpProxy(*host_port(es_url, 9200)) as proxy:
        args = [
            *store_args("redis", redis_url, mongo_url, ns),
            *["--metrics-address", f"127.0.0.1:{port}"],
            *["--listener", "elasticsearch", "-o", f"database={db}", "-o", "collection=orders"],
            *["-o", f"es={via_proxy(es_url, proxy.port)}", "-o", "request_timeout=30"],
        ]
        env = {"SINGLETON_SHUTDOWN_TIMEOUT": str(SHUTDOWN)}
        proc = ReplicaProc("bounded", args, tmp_path, env).start()
        try:
            wait_until(lambda: backend.inspect(lease) is not None, 30, what="elected")
            marks = iter(range(-1, -(10**6), -1))

            def streaming() -> bool:  # a write reaches the stream and is indexed
                client[db].orders.insert_one({"_id": next(marks)})
                return _events(port) >= 1

            wait_until(streaming, 30, interval=0.2, what="the first event indexed")
            proxy.blackhole()  # every request from here on hangs until its 30 s timeout
            client[db].orders.insert_many([{"_id": n} for n in range(1, 50)])
            # the sink's next request (a bulk, or the check before it) is held, never answered
            wait_until(lambda: proxy.held() > 0, 30, what="a request held")
            sent = time.monotonic()
            proc.signal(signal.SIGTERM)
            code = proc.wait(SHUTDOWN + 10)
            took = time.monotonic() - sent
            log = proc.log()
            assert took <= SHUTDOWN + 1.5, f"exited {took:.1f}s after SIGTERM\n{log[-3000:]}"
            assert code == 0, log[-3000:]
            state = backend.inspect(lease)
            assert state is None or state.holder is None, state  # released, not left to expire
        finally:
            proc.stop()
            backend.close()
            client.close()
