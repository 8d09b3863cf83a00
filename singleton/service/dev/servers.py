"""``singleton dev-servers``: Redis, MongoDB (SecantusDB) and Elasticsearch (osmem-server) on
this machine, for trying ``singleton run`` without installing anything.

It prints their URLs and a ready ``singleton.toml``, then waits; Ctrl-C (or SIGTERM) stops the
three servers and removes their data. Development only: SecantusDB and osmem-server are
stand-ins, and Redis keeps nothing on disk.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from pathlib import Path
from types import FrameType

from singleton.service.dev.embedded import ElasticServer, EmbeddedServer, MongoServer, RedisServer


def sample_config(redis_url: str, mongo_url: str, es_url: str) -> str:
    """A ``singleton.toml`` for these servers: one ElasticsearchSync of ``shop.orders``."""
    return f"""backend = "redis"
redis_url = "{redis_url}"
mongo_url = "{mongo_url}"
es_url = "{es_url}"
namespace = "singleton"
# port 0: each replica serves /metrics, /readyz... on a free port and logs its URL, so that
# replicas a, b, c... run side by side (or give each its own: --metrics-address 127.0.0.1:9465)
metrics_address = "127.0.0.1:0"

[lease]
ttl = 5.0

[[listeners]]
use = "elasticsearch"
name = "orders-to-es"
database = "shop"
collection = "orders"
index = "orders"
"""


def run_dev_servers(
    say: Callable[[str], None], *, write_config: str | None = None, stop: threading.Event | None
) -> int:
    """Start the three servers, describe them, wait for ``stop`` (or a signal); exit code 0."""
    stop = stop or threading.Event()
    redis_server = RedisServer()
    servers: list[EmbeddedServer] = [redis_server, MongoServer(), ElasticServer()]
    previous = {}

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, on_signal)
    try:
        for server in servers:
            server.start()
        redis, mongo, es = (s.url for s in servers)
        note = " (fakeredis: redis-server is not on PATH)" if redis_server.fake else ""
        say(f"redis  {redis}{note}\nmongo  {mongo}\nes     {es}\n")
        config = sample_config(redis, mongo, es)
        if write_config:
            Path(write_config).write_text(config)
            say(
                f"wrote {write_config}; run replicas with: singleton run --config {write_config}"
                " --identity a (then b, c... each in a terminal of its own)"
            )
        else:
            say("# singleton.toml\n" + config)
        say("Ctrl-C stops the servers and removes their data.")
        stop.wait()
        return 0
    finally:
        for server in reversed(servers):
            server.cleanup()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
