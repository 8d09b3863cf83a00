"""The index a listener writes to: created with the user's settings and mappings and a raised
``index.gc_deletes`` (why and how much: :mod:`.sync`), raised on an existing index whose setting
is lower, and deleted when its collection is dropped and the listener says so.

Another leader may drop or recreate the index while this one is not leading, so what was checked
is forgotten at the start of every tenure (:meth:`IndexKeeper.forget`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from bson import json_util

from listeners.elasticsearch.transport import Transport, error_text, path_index
from singleton.errors import SinkError

if TYPE_CHECKING:
    from listeners.base import ListenerContext

#: Elasticsearch's own default for ``index.gc_deletes``.
DEFAULT_GC_DELETES = 60.0
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 0.001}


def parse_duration(value: Any) -> float | None:
    """Seconds of an Elasticsearch time value (``"60s"``, ``"5m"``; bare numbers are ms)."""
    match = _DURATION.match(str(value)) if value is not None else None
    return None if match is None else float(match.group(1)) * _UNITS[match.group(2)]


class IndexKeeper:
    """Makes sure each index exists with ``gc_deletes`` seconds or more, once per tenure."""

    def __init__(
        self,
        transport: Transport,
        *,
        gc_deletes: int,
        settings: Mapping[str, Any] | None = None,
        mappings: Mapping[str, Any] | None = None,
    ) -> None:
        self.transport = transport
        self.gc_deletes = gc_deletes
        self.settings = dict(settings or {})
        self.mappings = dict(mappings or {})
        self._ready: set[str] = set()

    def forget(self) -> None:
        self._ready.clear()

    def ensure(self, name: str, ctx: ListenerContext) -> None:
        """Create ``name`` if missing (user settings and mappings, raised ``gc_deletes``), or
        raise ``gc_deletes`` on an existing index whose setting is lower."""
        if name in self._ready:
            return
        ctx.check()
        gc = f"{self.gc_deletes}s"
        body: dict[str, Any] = {"settings": {**self.settings, "index.gc_deletes": gc}}
        if self.mappings:
            body["mappings"] = self.mappings
        status, resp = self._request("PUT", name, "", body)
        if status == 200:
            ctx.logger.info("elasticsearch: created index {} (gc_deletes {})", name, gc)
        elif status == 400 and "already_exists" in error_text(resp):
            self._raise_gc_deletes(name, ctx)
        else:
            raise SinkError(f"cannot create index {name}: HTTP {status} {error_text(resp)}")
        self._ready.add(name)

    def delete(self, name: str, ctx: ListenerContext) -> None:
        ctx.check()
        status, resp = self._request("DELETE", name)
        if status not in (200, 404):
            raise SinkError(f"cannot delete index {name}: HTTP {status} {error_text(resp)}")
        self._ready.discard(name)

    def _raise_gc_deletes(self, name: str, ctx: ListenerContext) -> None:
        status, resp = self._request("GET", name, "/_settings")
        if status != 200 or not isinstance(resp, dict):
            raise SinkError(f"cannot read settings of {name}: HTTP {status} {error_text(resp)}")
        current = None
        for idx in resp.values():
            current = parse_duration(idx.get("settings", {}).get("index", {}).get("gc_deletes"))
        if current is None:
            current = DEFAULT_GC_DELETES
        if current >= self.gc_deletes:
            return
        ctx.check()
        body = {"index": {"gc_deletes": f"{self.gc_deletes}s"}}
        status, resp = self._request("PUT", name, "/_settings", body)
        if status != 200:
            raise SinkError(f"cannot raise gc_deletes on {name}: HTTP {status}")
        ctx.logger.info(
            "elasticsearch: raised gc_deletes of {} from {} s to {} s",
            name,
            current,
            self.gc_deletes,
        )

    def _request(
        self, method: str, name: str, suffix: str = "", body: Any = None
    ) -> tuple[int, Any]:
        data = None if body is None else json_util.dumps(body).encode()
        return self.transport.request(method, f"/{path_index(name)}{suffix}", data)
