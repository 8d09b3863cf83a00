"""The indexes a listener writes to, behind one alias.

The name users query (``index``, say ``shop.orders``) is an **alias** over one physical index
named ``<alias>-<cluster seconds>`` (``-<n>`` added when that name is taken). Writes go through
the alias. An initial sync or a resync fills a *fresh* physical index (:meth:`IndexKeeper.fresh`),
and :meth:`IndexKeeper.swap` then moves the alias onto it in one atomic ``_aliases`` call
(remove + add) and drops the physical indexes it leaves: readers see the old index until that
call and the new one from then on, and a document deleted while nothing was streaming cannot
survive a resync.

Adoption: a plain index named like the alias (written by an earlier version of this listener) is
used as it is until the next initial sync or resync, whose ``_aliases`` call removes it
(``remove_index``) and adds the alias in the same atomic request. Until then, writes go to it.

Every physical index is created with the user's settings and mappings and a raised
``index.gc_deletes`` (why and how much: :mod:`.sync`); an existing one whose setting is lower is
raised. Another leader may drop or recreate indexes while this one is not leading, so what was
checked is forgotten at the start of every tenure (a keeper per tenure).

Errors: a failed request raises :func:`.transport.request_error` (429 / 5xx transient, other
statuses permanent), except a 404 from ``_aliases``, which means the aliases changed under us
(another leader): transient, the runner retries.

Lost targets: a tenure that resumed from a checkpoint expects its alias (or adopted index) to be
there. Finding neither (an operator deleted the index or removed the alias while no one led)
raises :class:`~singleton.errors.SinkLostError` rather than creating an empty index to stream
on into, and the tenure resyncs; writes through an alias require one (``require_alias``), so an
alias removed mid-tenure is the same error on the next bulk, never an auto-created index.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from bson import json_util

from listeners.elasticsearch.transport import Transport, error_text, path_index, request_error
from singleton.errors import SinkLostError, SinkUnavailableError

if TYPE_CHECKING:
    from listeners.base import ListenerContext

#: Elasticsearch's own default for ``index.gc_deletes``.
DEFAULT_GC_DELETES = 60.0
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 0.001}
_MAX_INDEX_BYTES = 255
#: ``seconds(ctx)``: the cluster time in seconds, for physical index names.
Seconds = Callable[["ListenerContext"], int]


def parse_duration(value: Any) -> float | None:
    """Seconds of an Elasticsearch time value (``"60s"``, ``"5m"``; bare numbers are ms)."""
    match = _DURATION.match(str(value)) if value is not None else None
    return None if match is None else float(match.group(1)) * _UNITS[match.group(2)]


def physical_name(alias: str, seconds: int, n: int = 0) -> str:
    """``<alias>-<seconds>`` (``-<n>`` appended for n > 0), the alias cut to fit 255 bytes."""
    suffix = f"-{seconds}" + (f"-{n}" if n else "")
    head = alias
    while len((head + suffix).encode()) > _MAX_INDEX_BYTES:
        head = head[:-1]
    return head + suffix


def is_physical_of(alias: str, name: str) -> bool:
    """Whether ``name`` has the form :func:`physical_name` gives for ``alias``."""
    return re.fullmatch(re.escape(alias) + r"-\d+(-\d+)?", name) is not None


class IndexKeeper:
    """Keeps the alias, its physical index and their ``gc_deletes``; see the module docstring."""

    def __init__(
        self,
        transport: Transport,
        *,
        gc_deletes: int,
        seconds: Seconds,
        settings: Mapping[str, Any] | None = None,
        mappings: Mapping[str, Any] | None = None,
    ) -> None:
        self.transport = transport
        self.gc_deletes = gc_deletes
        self.seconds = seconds
        self.settings = dict(settings or {})
        self.mappings = dict(mappings or {})
        self._ready: set[str] = set()
        #: Names known to be aliases: writes to them require one (``require_alias``), so that
        #: an alias deleted under the listener is an error, never an auto-created index.
        self.aliases: set[str] = set()
        self._deleted: set[str] = set()  # by this keeper (``on_drop``): not lost, recreated
        #: Whether writes check the physical index they landed in (a partition's keeper:
        #: another partition may replace a deleted index behind the alias), and what each
        #: alias pointed to when found.
        self.watch = False
        self.watched: dict[str, frozenset[str]] = {}
        #: The ``index.uuid`` of each watched physical index: a name can come back (an index
        #: deleted and created again within a second gets the same name), its uuid cannot.
        self._uuids: dict[str, dict[str, str]] = {}
        #: ``_meta`` entries of the physical indexes created for an alias (a shaped index
        #: names the shape that built it: :mod:`.shape.stream`).
        self.meta: dict[str, Mapping[str, Any]] = {}

    # -- what the stream writes to -----------------------------------------------------------
    def ensure(self, name: str, ctx: ListenerContext) -> None:
        """Make ``name`` writable once per tenure: an alias (its indexes' ``gc_deletes``
        raised), a plain index of an earlier version (likewise), or, if neither exists, a new
        physical index created together with the alias ``name`` in one request."""
        if name in self._ready:
            return
        ctx.check()
        targets = self.targets(name)
        if targets:
            for target in targets:
                self._raise_gc_deletes(target, ctx)
            self._watching(name, targets, again=False)
        elif self.exists(name):
            if (ctx.resumed or name in self.aliases) and name not in self._deleted:
                self._not_made_by_a_delete(name)
            self._raise_gc_deletes(name, ctx)
        elif (ctx.resumed or name in self.aliases) and name not in self._deleted:
            raise SinkLostError(
                f"index {name} is gone (neither an alias nor an index of that name exists),"
                " though this listener wrote there (this tenure, or the checkpoint it resumed"
                " from): deleted under it? Only a copy makes it equal again"
            )
        else:
            self.fresh(name, ctx, with_alias=True)
            self.aliases.add(name)
        self._ready.add(name)

    def _not_made_by_a_delete(self, name: str) -> None:
        """Raise :class:`SinkLostError` if the plain index ``name``, where this listener wrote
        through an alias, holds no document: Elasticsearch made it for a delete (a missing
        index is created for a delete with an external version, whatever ``require_alias``
        says) once the alias was gone. A plain index of an earlier version that does hold
        documents is used as it is (see the module docstring)."""
        if self.empty(name):
            raise SinkLostError(
                f"index {name} is an empty plain index where this listener wrote through an"
                " alias: the alias was deleted under it, and a delete made the index. Only a"
                " copy makes it equal again"
            )

    def empty(self, name: str) -> bool:
        """Whether the index ``name`` holds no document (as last refreshed)."""
        status, resp = self._request("GET", name, "/_count")
        if status != 200 or not isinstance(resp, dict):
            raise request_error(status, resp, f"cannot count documents of {name}")
        return resp.get("count") == 0

    def watch_alias(self, alias: str) -> bool:
        """Whether ``alias`` is an alias now; if so, writes through it require one and, on a
        watching keeper, must land in what it points to now."""
        targets = self.targets(alias)
        if targets:
            self._watching(alias, targets)
        return bool(targets)

    def _watching(self, alias: str, targets: list[str], again: bool = True) -> None:
        """Writes through ``alias`` require it; a watching keeper remembers what it points to
        (``again=False``: unless already known this tenure - what a partition's copy found
        stays the reference, or a replacement after it would go unnoticed)."""
        self.aliases.add(alias)
        if self.watch and (again or alias not in self.watched):
            self.watched[alias] = frozenset(targets)
            self._uuids[alias] = self.uuids(alias)

    def lost(self) -> str | None:
        """Why what this tenure wrote is no longer behind its aliases, or ``None``: an alias
        gone (its index deleted, or the alias removed; a plain index of that name, which a
        write elsewhere auto-created, is no alias either), or, on a watching keeper, pointing
        to other indexes than when found (another partition recreated a deleted index). An
        alias this keeper deleted itself (``on_drop``) is not lost. One request per alias."""
        for alias in sorted(self.aliases - self._deleted):
            now = self.uuids(alias)
            if not now or alias in now:
                return f"alias {alias} is gone (its index deleted, or the alias removed)"
            then = self._uuids.get(alias)
            if then is not None and now != then:
                return (
                    f"alias {alias} points to other indexes than when this tenure began (now"
                    f" {', '.join(sorted(now))}, then {', '.join(sorted(then))}, by"
                    " index.uuid): the index was replaced (deleted, and created again by"
                    " another partition?)"
                )
        return None

    def reference(self) -> dict[str, dict[str, str]]:
        """What each watched alias pointed to when found (``index.uuid`` by physical index):
        a partition keeps it beside its checkpoint after a copy (:meth:`adopt`)."""
        return {alias: dict(uuids) for alias, uuids in sorted(self._uuids.items())}

    def adopt(self, alias: str, uuids: Mapping[str, str]) -> None:
        """Take ``uuids``, what an earlier tenure copied into through ``alias``, as what it
        must still point to: writes and :meth:`lost` compare with it, not with what this tenure
        finds first (the index may have been replaced while no tenure of this partition ran)."""
        self.aliases.add(alias)
        self.watched[alias] = frozenset(uuids)
        self._uuids[alias] = dict(uuids)

    def uuids(self, alias: str) -> dict[str, str]:
        """``index.uuid`` of each physical index behind ``alias`` (none: no such alias)."""
        status, resp = self._request("GET", alias, "/_settings/index.uuid")
        if status == 404:
            return {}
        if status != 200 or not isinstance(resp, dict):
            raise request_error(status, resp, f"cannot read the settings of {alias}")
        return {
            name: str(((info or {}).get("settings") or {}).get("index", {}).get("uuid"))
            for name, info in resp.items()
        }

    def forget(self, name: str) -> None:
        """Check ``name`` again before the next write (:meth:`ensure`)."""
        self._ready.discard(name)

    def targets(self, alias: str) -> list[str]:
        """The physical indexes ``alias`` points to (none: no such alias)."""
        status, resp = self._request("GET", "_alias", f"/{path_index(alias)}")
        if status == 404:
            return []
        if status != 200 or not isinstance(resp, dict):
            raise request_error(status, resp, f"cannot read alias {alias}")
        return sorted(resp)

    def exists(self, name: str) -> bool:
        status, resp = self._request("GET", name, "/_settings")
        if status == 404:
            return False
        if status != 200:
            raise request_error(status, resp, f"cannot read index {name}")
        return True

    # -- rebuilding -------------------------------------------------------------------------------
    def fresh(self, alias: str, ctx: ListenerContext, *, with_alias: bool = False) -> str:
        """Create a new, empty physical index for ``alias`` and return its name; with
        ``with_alias`` the alias is created with it (nothing pointed to it before)."""
        seconds = self.seconds(ctx)
        gc = f"{self.gc_deletes}s"
        body: dict[str, Any] = {"settings": {**self.settings, "index.gc_deletes": gc}}
        if self.mappings or alias in self.meta:
            body["mappings"] = dict(self.mappings)
        if alias in self.meta:
            body["mappings"]["_meta"] = {**body["mappings"].get("_meta", {}), **self.meta[alias]}
        if with_alias:
            body["aliases"] = {alias: {}}
        for n in range(100):
            name = physical_name(alias, seconds, n)
            ctx.check()
            status, resp = self._request("PUT", name, "", body)
            if status == 200:
                ctx.logger.info(
                    "elasticsearch: created index {}{} (gc_deletes {})",
                    name,
                    f" behind alias {alias}" if with_alias else "",
                    gc,
                )
                self._ready.add(name)
                return name
            if not (status == 400 and "already_exists" in error_text(resp)):
                raise request_error(status, resp, f"cannot create index {name}")
        raise SinkUnavailableError(f"no free physical index name for {alias} at {seconds} s")

    def swap(self, alias: str, target: str, ctx: ListenerContext) -> None:
        """Point ``alias`` at ``target`` alone in one atomic ``_aliases`` request (removing a
        plain index named ``alias`` in the same request), then drop the indexes it left."""
        ctx.check()
        current = self.targets(alias)
        old = [t for t in current if t != target]
        actions: list[dict[str, Any]] = [{"remove": {"index": o, "alias": alias}} for o in old]
        plain = not current and self.exists(alias)
        if plain:
            actions.append({"remove_index": {"index": alias}})
        actions.append({"add": {"index": target, "alias": alias}})
        ctx.check()
        data = json_util.dumps({"actions": actions}).encode()
        status, resp = self.transport.request("POST", "/_aliases", data)
        if status == 404:
            raise SinkUnavailableError(f"aliases of {alias} changed meanwhile: {error_text(resp)}")
        if status != 200:
            raise request_error(status, resp, f"cannot move alias {alias} to {target}")
        ctx.logger.info(
            "elasticsearch: alias {} now on {} (was on {})",
            alias,
            target,
            ", ".join(old) or ("the plain index " + alias if plain else "nothing"),
        )
        self._ready.discard(alias)
        self._deleted.discard(alias)
        self.watched.pop(alias, None)
        self._uuids.pop(alias, None)
        self.aliases.add(alias)  # (from now on a write through it requires it)
        for name in sorted(set(old) | set(self._leftovers(alias, target))):
            self.delete(name, ctx)

    def _leftovers(self, alias: str, target: str) -> list[str]:
        """Physical indexes of ``alias`` that it does not point to: copies a crashed or
        deposed leader never finished."""
        status, resp = self._request("GET", f"{alias}-*", "/_alias")
        if status != 200 or not isinstance(resp, dict):
            return []
        return [
            name
            for name, info in resp.items()
            if name != target
            and is_physical_of(alias, name)
            and alias not in ((info or {}).get("aliases") or {})
        ]

    def delete(self, name: str, ctx: ListenerContext) -> None:
        """Delete ``name``: the indexes behind it if it is an alias (the alias goes with them),
        else the index itself."""
        ctx.check()
        for index in self.targets(name) or [name]:
            status, resp = self._request("DELETE", index)
            if status not in (200, 404):
                raise request_error(status, resp, f"cannot delete index {index}")
            ctx.logger.info("elasticsearch: deleted index {}", index)
            self._ready.discard(index)
        self._ready.discard(name)
        self._deleted.add(name)

    def _raise_gc_deletes(self, name: str, ctx: ListenerContext) -> None:
        status, resp = self._request("GET", name, "/_settings")
        if status != 200 or not isinstance(resp, dict):
            raise request_error(status, resp, f"cannot read settings of {name}")
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
            raise request_error(status, resp, f"cannot raise gc_deletes on {name}")
        raised = f"{current} s to {self.gc_deletes} s"
        ctx.logger.info("elasticsearch: raised gc_deletes of {} from {}", name, raised)

    def _request(
        self, method: str, name: str, suffix: str = "", body: Any = None
    ) -> tuple[int, Any]:
        data = None if body is None else json_util.dumps(body).encode()
        if name.startswith("_"):
            path = name
        elif name.endswith("*"):
            path = path_index(name[:-1]) + "*"
        else:
            path = path_index(name)
        return self.transport.request(method, f"/{path}{suffix}", data)
