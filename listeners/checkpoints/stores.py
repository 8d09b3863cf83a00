"""Fenced checkpoints: where a listener's stream stands, written only by the current tenure.

The contract and its failure model are :mod:`listeners.checkpoints.contract` (re-exported here);
this module holds the two stores: one MongoDB document per listener (conditional updates), one
Redis hash per listener (Lua scripts).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from bson import json_util
from bson.timestamp import Timestamp

from listeners.checkpoints.contract import (
    Checkpoint,
    CheckpointStore,
    Deployment,
    ResumeToken,
    check_deployment,
    deployment_mismatch,
    stale_message,
)
from singleton.drivers import mongo
from singleton.drivers.redis import client_from_url
from singleton.errors import ConfigurationError, StaleWriterError
from singleton.lease.redis import translate as redis_translate

if TYPE_CHECKING:
    import redis
    from pymongo import MongoClient

    from singleton.election.leadership import Leadership

__all__ = [
    "Checkpoint",
    "CheckpointStore",
    "Deployment",
    "MongoCheckpointStore",
    "RedisCheckpointStore",
    "ResumeToken",
    "check_deployment",
]


def _sorted(deployment: Deployment) -> dict[str, str]:
    """One key order, so that stored deployments compare equal as documents and as JSON."""
    return {k: str(deployment[k]) for k in sorted(deployment)}


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
        self._client, self._owned = mongo.client(client_or_url, mongo.Timeouts.STORE)
        self._fenced = not unsafe_disable_fencing
        self._coll = self._client[database][collection]

    def describe(self) -> str:
        return f"mongo:{self._coll.full_name}"

    def load(self, name: str) -> Checkpoint | None:
        with mongo.translate(f"load checkpoint {name!r}"):
            return self._checkpoint(name, self._coll.find_one({"_id": name}))

    @staticmethod
    def _checkpoint(name: str, doc: Mapping[str, Any] | None) -> Checkpoint | None:
        if doc is None or doc.get("cluster_time") is None:
            return None
        deployment = doc.get("deployment")
        return Checkpoint(
            name=name,
            resume_token=doc.get("resume_token"),
            cluster_time=doc["cluster_time"],
            fencing_token=int(doc["fencing_token"]),
            holder=str(doc.get("holder", "")),
            updated_at=doc.get("updated_at"),
            start_after=bool(doc.get("start_after", False)),
            deployment=None if deployment is None else dict(deployment),
        )

    def load_deployment(self, name: str) -> dict[str, str] | None:
        with mongo.translate(f"load checkpoint {name!r}"):
            doc = self._coll.find_one({"_id": name}, {"deployment": 1})
        deployment = None if doc is None else doc.get("deployment")
        return None if deployment is None else dict(deployment)

    def claim(
        self, name: str, fencing_token: int, holder: str, deployment: Deployment
    ) -> Checkpoint | None:
        import pymongo
        import pymongo.errors as pe

        ours = _sorted(deployment)
        cond: dict[str, Any] = {
            "_id": name,
            "$and": [{"$or": [{"deployment": None}, {"deployment": ours}]}],
        }
        if self._fenced:
            cond["$and"].append({"fencing_token": {"$lte": fencing_token}})
        update = {
            "$set": {"fencing_token": fencing_token, "holder": holder, "deployment": ours},
            "$currentDate": {"updated_at": True},
        }
        after = pymongo.ReturnDocument.AFTER
        with mongo.translate(f"claim checkpoint {name!r}"):
            try:
                doc = self._coll.find_one_and_update(
                    cond, update, upsert=True, return_document=after
                )
            except pe.DuplicateKeyError:  # refused by the stored document, or a racing insert
                doc = self._coll.find_one_and_update(cond, update, return_document=after)
            if doc is not None:
                return self._checkpoint(name, doc)
            stored = self._coll.find_one({"_id": name}) or {}
        theirs = stored.get("deployment")
        if theirs is not None and dict(theirs) != ours:
            raise ConfigurationError(deployment_mismatch(name, dict(theirs), ours))
        raise StaleWriterError(
            f"checkpoint {name!r}: claim by token {fencing_token} refused, the stored token is "
            f"{stored.get('fencing_token')} (holder {stored.get('holder')!r})"
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
        if cp.deployment is not None:
            fields["deployment"] = _sorted(cp.deployment)
        with mongo.translate(f"save checkpoint {cp.name!r}"):
            if self._fenced_set(cp.name, cp.fencing_token, fields, cp.cluster_time):
                return
            current = self.load(cp.name)
        raise StaleWriterError(stale_message(cp.name, current, cp.fencing_token, cp.cluster_time))

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
        raise StaleWriterError(stale_message(name, current, leadership.token, None))

    def delete(self, name: str) -> None:
        with mongo.translate(f"delete checkpoint {name!r}"):
            self._coll.delete_one({"_id": name})

    def names(self, prefix: str) -> list[str]:
        with mongo.translate(f"list checkpoints {prefix!r}"):
            ids = self._coll.distinct("_id", {"_id": {"$regex": "^" + re.escape(prefix)}})
        return sorted(str(i) for i in ids)

    def close(self) -> None:
        if self._owned:
            self._client.close()


# -- Redis ----------------------------------------------------------------------------------
# KEYS[1] checkpoint hash
# ARGV[1] mode ("cp" = checkpoint, "progress")   ARGV[2] fencing token
# ARGV[3] holder   ARGV[4] payload (JSON: resume token, or progress; "" = none)
# ARGV[5] cluster time seconds   ARGV[6] cluster time increment   ARGV[7] start_after (0/1)
# ARGV[8] deployment (sorted JSON; "" = leave as stored)
# ARGV[9] "1" skips the fencing check (unsafe_disable_fencing: the failover drill only)
# returns {1} when written, {0, stored_token, stored_t, stored_i} when refused.
# Cluster times compare as (t, i) pairs; TIME is the server's clock, for display only.
_SAVE_LUA = """
local stored = tonumber(redis.call('HGET', KEYS[1], 'fencing') or '-1')
local token = tonumber(ARGV[2])
local st = tonumber(redis.call('HGET', KEYS[1], 'ct_t') or '-1')
local si = tonumber(redis.call('HGET', KEYS[1], 'ct_i') or '-1')
if token < stored and ARGV[9] ~= '1' then return {0, stored, st, si} end
local now = redis.call('TIME')
if ARGV[1] == 'cp' then
  local t = tonumber(ARGV[5])
  local i = tonumber(ARGV[6])
  if t < st or (t == st and i < si) then return {0, stored, st, si} end
  redis.call('HSET', KEYS[1], 'fencing', ARGV[2], 'holder', ARGV[3], 'resume', ARGV[4],
    'ct_t', ARGV[5], 'ct_i', ARGV[6], 'start_after', ARGV[7], 'updated', now[1] .. '.' .. now[2])
  if ARGV[8] ~= '' then redis.call('HSET', KEYS[1], 'deployment', ARGV[8]) end
else
  redis.call('HSET', KEYS[1], 'fencing', ARGV[2], 'holder', ARGV[3], 'progress', ARGV[4],
    'updated', now[1] .. '.' .. now[2])
end
return {1}
"""

# KEYS[1] checkpoint hash
# ARGV[1] fencing token   ARGV[2] holder   ARGV[3] deployment (sorted JSON)
# ARGV[4] "1" skips the fencing check (unsafe_disable_fencing: the failover drill only)
# returns {"ok", field, value, ...} (the whole hash after the claim: the position is untouched),
# {"stale", stored_token, stored_holder} or {"deployment", stored_deployment} when refused.
_CLAIM_LUA = """
local stored = tonumber(redis.call('HGET', KEYS[1], 'fencing') or '-1')
if tonumber(ARGV[1]) < stored and ARGV[4] ~= '1' then
  return {'stale', tostring(stored), redis.call('HGET', KEYS[1], 'holder') or ''}
end
local dep = redis.call('HGET', KEYS[1], 'deployment')
if dep and dep ~= '' and dep ~= ARGV[3] then return {'deployment', dep} end
local now = redis.call('TIME')
redis.call('HSET', KEYS[1], 'fencing', ARGV[1], 'holder', ARGV[2], 'deployment', ARGV[3],
  'updated', now[1] .. '.' .. now[2])
local out = redis.call('HGETALL', KEYS[1])
table.insert(out, 1, 'ok')
return out
"""


def _glob(text: str) -> str:
    """``text`` with Redis glob characters escaped."""
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _json(deployment: Deployment) -> str:
    return json.dumps(_sorted(deployment), sort_keys=True, separators=(",", ":"))


class RedisCheckpointStore(CheckpointStore):
    """One hash per listener at ``{namespace}:checkpoint:{name}``, written by Lua scripts."""

    def __init__(
        self,
        client_or_url: redis.Redis | str,
        namespace: str = "singleton",
        *,
        unsafe_disable_fencing: bool = False,
    ) -> None:
        self._fenced = not unsafe_disable_fencing
        if isinstance(client_or_url, str):  # redis://, rediss://, unix:// or redis+sentinel://
            self._client: redis.Redis = client_from_url(
                client_or_url, socket_timeout=5, socket_connect_timeout=3
            )
            self._owned = True
        else:
            self._client, self._owned = client_or_url, False
        self._ns = namespace
        self._script = self._client.register_script(_SAVE_LUA)
        self._claim = self._client.register_script(_CLAIM_LUA)

    def _key(self, name: str) -> str:
        return f"{self._ns}:checkpoint:{name}"

    def describe(self) -> str:
        return f"redis:{self._ns}"

    def load(self, name: str) -> Checkpoint | None:
        with redis_translate(f"load checkpoint {name!r}"):
            raw = self._client.hgetall(self._key(name))
        return self._checkpoint(name, {_text(k): _text(v) for k, v in raw.items()})

    @staticmethod
    def _checkpoint(name: str, h: Mapping[str, str]) -> Checkpoint | None:
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
            deployment=json.loads(h["deployment"]) if h.get("deployment") else None,
        )

    def load_deployment(self, name: str) -> dict[str, str] | None:
        with redis_translate(f"load checkpoint {name!r}"):
            raw = self._client.hget(self._key(name), "deployment")
        return dict(json.loads(raw)) if raw else None

    def claim(
        self, name: str, fencing_token: int, holder: str, deployment: Deployment
    ) -> Checkpoint | None:
        ours = _json(deployment)
        args: list[str | int] = [fencing_token, holder, ours, "0" if self._fenced else "1"]
        with redis_translate(f"claim checkpoint {name!r}"):
            out = [_text(x) for x in self._claim(keys=[self._key(name)], args=args)]
        if out[0] == "deployment":
            raise ConfigurationError(
                deployment_mismatch(name, json.loads(out[1]), json.loads(ours))
            )
        if out[0] == "stale":
            raise StaleWriterError(
                f"checkpoint {name!r}: claim by token {fencing_token} refused, the stored token "
                f"is {out[1]} (holder {out[2]!r})"
            )
        return self._checkpoint(name, dict(zip(out[1::2], out[2::2], strict=True)))

    def _run(self, name: str, args: list[Any]) -> list[int]:
        with redis_translate(f"save {args[0]} {name!r}"):
            args = [*args, "0" if self._fenced else "1"]
            return [int(x) for x in self._script(keys=[self._key(name)], args=args)]

    def save(self, checkpoint: Checkpoint) -> None:
        cp = checkpoint
        payload = "" if cp.resume_token is None else json_util.dumps(dict(cp.resume_token))
        ct = cp.cluster_time
        dep = "" if cp.deployment is None else _json(cp.deployment)
        args = [
            "cp",
            cp.fencing_token,
            cp.holder,
            payload,
            ct.time,
            ct.inc,
            int(cp.start_after),
            dep,
        ]
        result = self._run(cp.name, args)
        if result[0] != 1:
            stored = self.load(cp.name)
            raise StaleWriterError(stale_message(cp.name, stored, cp.fencing_token, ct))

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
            name, ["progress", leadership.token, leadership.holder, payload, 0, 0, 0, ""]
        )
        if result[0] != 1:
            raise StaleWriterError(stale_message(name, self.load(name), leadership.token, None))

    def delete(self, name: str) -> None:
        with redis_translate(f"delete checkpoint {name!r}"):
            self._client.delete(self._key(name))

    def names(self, prefix: str) -> list[str]:
        start = len(self._key(""))
        with redis_translate(f"list checkpoints {prefix!r}"):
            keys = self._client.scan_iter(match=self._key(_glob(prefix)) + "*", count=500)
            return sorted(_text(k)[start:] for k in keys)

    def close(self) -> None:
        if self._owned:
            self._client.close()
