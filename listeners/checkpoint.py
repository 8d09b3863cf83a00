"""Fenced checkpoints: where a listener's stream stands, written only by the current tenure.

Failure model: two runners may believe they lead at once (a paused leader wakes up after its
lease expired and a successor took over). The store, not the runners, settles it: every write
carries the writer's fencing token, and the server refuses it atomically (one conditional update,
one Lua script) when a newer token has written or when the position would move backwards. A
refused writer gets :class:`~singleton.errors.StaleWriterError` and stops.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from bson import json_util
from bson.timestamp import Timestamp

from singleton import mongo
from singleton.backends.redis import translate as redis_translate
from singleton.errors import StaleWriterError

if TYPE_CHECKING:
    import redis
    from pymongo import MongoClient

    from singleton.leadership import Leadership

ResumeToken = Mapping[str, Any]


@dataclass(frozen=True)
class Checkpoint:
    """A saved stream position and who saved it.

    ``resume_token`` is ``None`` when only a cluster time is known (right after an initial sync
    or a resync): the stream then restarts with ``start_at_operation_time=cluster_time``.
    ``start_after`` marks the token of an invalidate event, which only ``start_after`` accepts.
    """

    name: str
    resume_token: ResumeToken | None
    cluster_time: Timestamp
    fencing_token: int
    holder: str
    updated_at: datetime | None = None
    start_after: bool = False


class CheckpointStore(ABC):
    """Stores one :class:`Checkpoint` (and optional listener progress) per listener name.

    Invariants every implementation keeps (``tests/unit/test_checkpoint_store.py``):

    * **Fencing.** :meth:`save` succeeds only if ``checkpoint.fencing_token`` is >= the stored
      fencing token, else raises :class:`~singleton.errors.StaleWriterError`. Progress writes
      (:meth:`save_progress`) are fenced by the same stored token.
    * **No regression.** :meth:`save` also refuses (``StaleWriterError``) a ``cluster_time``
      lower than the stored one. An equal cluster time is accepted: events of one transaction
      share a cluster time, and an idle stream may re-mint a token at the same time.
    * **Atomicity.** The check and the write are one server-side step; there is no
      read-then-write window.
    * **Errors.** Driver errors never leak (:func:`singleton.mongo.translate`,
      :func:`singleton.backends.redis.translate`): unreachable, timed out or "try again" ->
      :class:`~singleton.errors.BackendUnavailableError`; refused credentials ->
      :class:`~singleton.errors.PermissionDeniedError`; anything else ->
      :class:`~singleton.errors.BackendError`.
    * **Ownership.** A store closes only a client it created from a URL.
    """

    @abstractmethod
    def load(self, name: str) -> Checkpoint | None:
        """The saved checkpoint of ``name``, or ``None`` if none was ever saved."""

    @abstractmethod
    def save(self, checkpoint: Checkpoint) -> None:
        """Store ``checkpoint`` if fenced and not backwards (see the class invariants)."""

    @abstractmethod
    def load_progress(self, name: str) -> dict[str, Any] | None:
        """Listener progress last saved by :meth:`save_progress`, or ``None``."""

    @abstractmethod
    def save_progress(
        self, name: str, data: Mapping[str, Any] | None, leadership: Leadership
    ) -> None:
        """Store ``data`` (``None`` clears it), fenced by ``leadership.token``."""

    def delete(self, name: str) -> None:
        """Forget ``name`` entirely (tests and operators; not fenced)."""
        raise NotImplementedError

    def close(self) -> None:  # noqa: B027 - optional: only stores that own a client close it
        """Close the client if this store created it."""

    def describe(self) -> str:
        return type(self).__name__

    def __enter__(self) -> CheckpointStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _stale(name: str, checkpoint: Checkpoint | None, token: int, ct: Timestamp | None) -> str:
    if checkpoint is None:
        return f"checkpoint {name!r}: write by token {token} refused"
    if token < checkpoint.fencing_token:
        return (
            f"checkpoint {name!r}: token {token} is older than the stored token "
            f"{checkpoint.fencing_token} (holder {checkpoint.holder!r})"
        )
    return (
        f"checkpoint {name!r}: position {ct} would move back from {checkpoint.cluster_time} "
        f"(token {token})"
    )


# -- MongoDB --------------------------------------------------------------------------------
class MongoCheckpointStore(CheckpointStore):
    """One document per listener in ``database.collection``; the default store."""

    def __init__(
        self,
        client_or_url: MongoClient[dict[str, Any]] | str,
        database: str = "singleton",
        collection: str = "checkpoints",
        *,
        unsafe_disable_fencing: bool = False,
    ) -> None:
        self._client, self._owned = mongo.client(client_or_url, timeout=3.0, socket_timeout=5.0)
        self._fenced = not unsafe_disable_fencing
        self._coll = self._client[database][collection]

    def describe(self) -> str:
        return f"mongo:{self._coll.full_name}"

    def load(self, name: str) -> Checkpoint | None:
        with mongo.translate(f"load checkpoint {name!r}"):
            doc = self._coll.find_one({"_id": name})
        if doc is None or doc.get("cluster_time") is None:
            return None
        return Checkpoint(
            name=name,
            resume_token=doc.get("resume_token"),
            cluster_time=doc["cluster_time"],
            fencing_token=int(doc["fencing_token"]),
            holder=str(doc.get("holder", "")),
            updated_at=doc.get("updated_at"),
            start_after=bool(doc.get("start_after", False)),
        )

    def _fenced_set(self, name: str, token: int, fields: dict[str, Any], ct: Any) -> bool:
        """One conditional upsert; ``False`` when the stored document refuses the write."""
        import pymongo.errors as pe

        cond: dict[str, Any] = {"_id": name}
        if self._fenced:
            cond["fencing_token"] = {"$lte": token}
        if ct is not None:
            cond["$or"] = [{"cluster_time": {"$lte": ct}}, {"cluster_time": None}]
        update = {"$set": {**fields, "fencing_token": token}, "$currentDate": {"updated_at": True}}
        try:
            res = self._coll.update_one(cond, update, upsert=True)
        except pe.DuplicateKeyError:
            # The document exists and refused the condition, or a racing first insert won:
            # one more conditional update (without upsert) tells the two apart.
            res = self._coll.update_one(cond, update)
            return bool(res.matched_count == 1)
        return bool(res.matched_count == 1 or res.upserted_id is not None)

    def save(self, checkpoint: Checkpoint) -> None:
        cp = checkpoint
        fields = {
            "resume_token": None if cp.resume_token is None else dict(cp.resume_token),
            "cluster_time": cp.cluster_time,
            "holder": cp.holder,
            "start_after": cp.start_after,
        }
        with mongo.translate(f"save checkpoint {cp.name!r}"):
            if self._fenced_set(cp.name, cp.fencing_token, fields, cp.cluster_time):
                return
            current = self.load(cp.name)
        raise StaleWriterError(_stale(cp.name, current, cp.fencing_token, cp.cluster_time))

    def load_progress(self, name: str) -> dict[str, Any] | None:
        with mongo.translate(f"load progress {name!r}"):
            doc = self._coll.find_one({"_id": name}, {"progress": 1})
        progress = None if doc is None else doc.get("progress")
        return None if progress is None else dict(progress)

    def save_progress(
        self, name: str, data: Mapping[str, Any] | None, leadership: Leadership
    ) -> None:
        fields = {"progress": None if data is None else dict(data), "holder": leadership.holder}
        with mongo.translate(f"save progress {name!r}"):
            if self._fenced_set(name, leadership.token, fields, None):
                return
            current = self.load(name)
        raise StaleWriterError(_stale(name, current, leadership.token, None))

    def delete(self, name: str) -> None:
        with mongo.translate(f"delete checkpoint {name!r}"):
            self._coll.delete_one({"_id": name})

    def close(self) -> None:
        if self._owned:
            self._client.close()


# -- Redis ----------------------------------------------------------------------------------
# KEYS[1] checkpoint hash
# ARGV[1] mode ("cp" = checkpoint, "progress")   ARGV[2] fencing token
# ARGV[3] holder   ARGV[4] payload (JSON: resume token, or progress; "" = none)
# ARGV[5] cluster time seconds   ARGV[6] cluster time increment   ARGV[7] start_after (0/1)
# ARGV[8] "1" skips the fencing check (unsafe_disable_fencing: the failover drill only)
# returns {1} when written, {0, stored_token, stored_t, stored_i} when refused.
# Cluster times compare as (t, i) pairs; TIME is the server's clock, for display only.
_SAVE_LUA = """
local stored = tonumber(redis.call('HGET', KEYS[1], 'fencing') or '-1')
local token = tonumber(ARGV[2])
local st = tonumber(redis.call('HGET', KEYS[1], 'ct_t') or '-1')
local si = tonumber(redis.call('HGET', KEYS[1], 'ct_i') or '-1')
if token < stored and ARGV[8] ~= '1' then return {0, stored, st, si} end
local now = redis.call('TIME')
if ARGV[1] == 'cp' then
  local t = tonumber(ARGV[5])
  local i = tonumber(ARGV[6])
  if t < st or (t == st and i < si) then return {0, stored, st, si} end
  redis.call('HSET', KEYS[1], 'fencing', ARGV[2], 'holder', ARGV[3], 'resume', ARGV[4],
    'ct_t', ARGV[5], 'ct_i', ARGV[6], 'start_after', ARGV[7], 'updated', now[1] .. '.' .. now[2])
else
  redis.call('HSET', KEYS[1], 'fencing', ARGV[2], 'holder', ARGV[3], 'progress', ARGV[4],
    'updated', now[1] .. '.' .. now[2])
end
return {1}
"""


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class RedisCheckpointStore(CheckpointStore):
    """One hash per listener at ``{namespace}:checkpoint:{name}``, written by one Lua script."""

    def __init__(
        self,
        client_or_url: redis.Redis | str,
        namespace: str = "singleton",
        *,
        unsafe_disable_fencing: bool = False,
    ) -> None:
        import redis as redis_mod

        self._fenced = not unsafe_disable_fencing
        if isinstance(client_or_url, str):
            self._client: redis_mod.Redis = redis_mod.Redis.from_url(
                client_or_url, socket_timeout=5, socket_connect_timeout=3
            )
            self._owned = True
        else:
            self._client, self._owned = client_or_url, False
        self._ns = namespace
        self._script = self._client.register_script(_SAVE_LUA)

    def _key(self, name: str) -> str:
        return f"{self._ns}:checkpoint:{name}"

    def describe(self) -> str:
        return f"redis:{self._ns}"

    def load(self, name: str) -> Checkpoint | None:
        with redis_translate(f"load checkpoint {name!r}"):
            raw = self._client.hgetall(self._key(name))
        h = {_text(k): _text(v) for k, v in raw.items()}
        if "ct_t" not in h:
            return None
        resume = json_util.loads(h["resume"]) if h.get("resume") else None
        return Checkpoint(
            name=name,
            resume_token=resume,
            cluster_time=Timestamp(int(h["ct_t"]), int(h["ct_i"])),
            fencing_token=int(h["fencing"]),
            holder=h.get("holder", ""),
            updated_at=datetime.fromtimestamp(float(h["updated"]), timezone.utc),
            start_after=h.get("start_after") == "1",
        )

    def _run(self, name: str, args: list[Any]) -> list[int]:
        with redis_translate(f"save {args[0]} {name!r}"):
            args = [*args, "0" if self._fenced else "1"]
            return [int(x) for x in self._script(keys=[self._key(name)], args=args)]

    def save(self, checkpoint: Checkpoint) -> None:
        cp = checkpoint
        payload = "" if cp.resume_token is None else json_util.dumps(dict(cp.resume_token))
        ct = cp.cluster_time
        args = ["cp", cp.fencing_token, cp.holder, payload, ct.time, ct.inc, int(cp.start_after)]
        result = self._run(cp.name, args)
        if result[0] != 1:
            raise StaleWriterError(_stale(cp.name, self.load(cp.name), cp.fencing_token, ct))

    def load_progress(self, name: str) -> dict[str, Any] | None:
        with redis_translate(f"load progress {name!r}"):
            raw = self._client.hget(self._key(name), "progress")
        if not raw:
            return None
        data = json.loads(raw)
        return None if data is None else dict(data)

    def save_progress(
        self, name: str, data: Mapping[str, Any] | None, leadership: Leadership
    ) -> None:
        payload = json.dumps(None if data is None else dict(data))
        result = self._run(
            name, ["progress", leadership.token, leadership.holder, payload, 0, 0, 0]
        )
        if result[0] != 1:
            raise StaleWriterError(_stale(name, self.load(name), leadership.token, None))

    def delete(self, name: str) -> None:
        with redis_translate(f"delete checkpoint {name!r}"):
            self._client.delete(self._key(name))

    def close(self) -> None:
        if self._owned:
            self._client.close()
