"""The smallest useful listener: log every change event. Copy it to start your own.

from listeners import ListenerRunner, LoggingListener
from singleton import Elector
from singleton.lease.redis import RedisLeaseBackend

listener = LoggingListener(database="shop", collection="orders")
elector = Elector(RedisLeaseBackend("redis://localhost"), listener.lease_name)
ListenerRunner(listener, elector, "mongodb://localhost/?replicaSet=rs0").start()
"""

from __future__ import annotations

from collections.abc import Sequence

from listeners.base import ChangeEvent, ChangeStreamListener, ListenerContext


class LoggingListener(ChangeStreamListener):
    """Logs one INFO line per event: operation, namespace, document key, cluster time."""

    full_document = None  # the key is enough for a log line; skip the post-image lookup

    def handle_batch(self, events: Sequence[ChangeEvent], ctx: ListenerContext) -> None:
        for event in events:
            ns = event.get("ns") or {}
            ctx.logger.info(
                "{} {}.{} key={} at={} (token {})",
                event.get("operationType"),
                ns.get("db"),
                ns.get("coll"),
                (event.get("documentKey") or {}).get("_id"),
                event.get("clusterTime"),
                ctx.token,
            )
