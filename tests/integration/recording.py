"""A listener for process-level tests: records every event it handles, with the fencing token
and the replica's identity, into ``<database>.handled`` (duplicates are kept, to be counted)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any, ClassVar

from listeners.base import ChangeEvent, ChangeStreamListener, ListenerContext


class RecordingListener(ChangeStreamListener):
    extra_options: ClassVar[frozenset[str]] = frozenset({"record_to"})
    record_to: str = "handled"
    max_batch_wait = 0.05

    def handle_batch(self, events: Sequence[ChangeEvent], ctx: ListenerContext) -> None:
        ctx.check()
        identity = os.environ.get("SINGLETON_IDENTITY") or ctx.leadership.identity
        rows: list[dict[str, Any]] = [
            {
                "event": e["_id"]["_data"],
                "op": e.get("operationType"),
                "doc": (e.get("documentKey") or {}).get("_id"),
                "ns": f"{(e.get('ns') or {}).get('db')}.{(e.get('ns') or {}).get('coll')}",
                "token": ctx.token,
                "identity": identity,
            }
            for e in events
        ]
        if rows:
            assert self.database is not None
            ctx.client[self.database][self.record_to].insert_many(rows)


class BrokenListener(RecordingListener):
    """Fails for good on every batch, as a sink that rejects every request does."""

    def handle_batch(self, events: Sequence[ChangeEvent], ctx: ListenerContext) -> None:
        raise ValueError("HTTP 400: the sink rejected the whole request (test)")


class PoisonedListener(RecordingListener):
    """Records every event but those of documents marked ``poison``: those fail every time."""

    max_retries = 1

    def handle_batch(self, events: Sequence[ChangeEvent], ctx: ListenerContext) -> None:
        if any((e.get("fullDocument") or {}).get("poison") for e in events):
            raise ValueError("poisoned document (test)")
        super().handle_batch(events, ctx)
