"""Membership (:mod:`singleton.lease.membership`) on the lease stores' own clients and clocks.

Redis, under the backend's namespace:

* ``<ns>:members:<group>``: a sorted set, member = identity, score = expiry in the server's
  milliseconds (``TIME`` inside the script);
* ``<ns>:members:<group>:info``: a hash, identity -> the JSON ``info`` of its last heartbeat.

One Lua script per heartbeat writes both and prunes expired members; both keys expire a minute
after the last heartbeat, so an abandoned group leaves nothing behind.

MongoDB: one document per member in ``<collection>.members`` beside the leases,
``{_id: "<group>\\n<identity>", group, identity, info, expiresAt}`` written by one pipeline
update whose expiry is ``$$NOW + ttl``; reads compute the time left on the server's clock too.
Every 16th heartbeat of a process also deletes its group's expired documents.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Mapping
from typing import Any

from singleton.lease.leases import validate_lease_args
from singleton.lease.membership import Member, Membership, validate_heartbeat

# KEYS[1] sorted set, KEYS[2] info hash; ARGV[1] identity, ARGV[2] ttl ms, ARGV[3] info JSON
HEARTBEAT = """
local now = redis.call('TIME')
local ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local gone = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ms)
for _, m in ipairs(gone) do redis.call('HDEL', KEYS[2], m) end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ms)
redis.call('ZADD', KEYS[1], ms + tonumber(ARGV[2]), ARGV[1])
redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])
local keep = tonumber(ARGV[2]) + 60000
redis.call('PEXPIRE', KEYS[1], keep)
redis.call('PEXPIRE', KEYS[2], keep)
return 1
"""

# KEYS[1] sorted set, KEYS[2] info hash -> {identity, ms left, info JSON, ...}
MEMBERS = """
local now = redis.call('TIME')
local ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local live = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. ms, '+inf', 'WITHSCORES')
local out = {}
for i = 1, #live, 2 do
  table.insert(out, live[i])
  table.insert(out, tonumber(live[i + 1]) - ms)
  table.insert(out, redis.call('HGET', KEYS[2], live[i]) or '{}')
end
return out
"""

# KEYS[1] sorted set, KEYS[2] info hash; ARGV[1] identity
LEAVE = """
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
return 1
"""

Translate = Callable[[str, str], contextlib.AbstractContextManager[None]]


def _ms(ttl: float) -> int:
    return max(1, round(ttl * 1000))


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _info(raw: Any) -> dict[str, str]:
    try:
        loaded = json.loads(_text(raw))
    except ValueError:
        return {}
    return {str(k): str(v) for k, v in loaded.items()} if isinstance(loaded, dict) else {}


class RedisMembership(Membership):
    """Membership on a ``redis.Redis`` client the lease backend already owns."""

    def __init__(self, client: Any, namespace: str, translate: Translate) -> None:
        self._namespace = namespace
        self._translate = translate
        self._heartbeat = client.register_script(HEARTBEAT)
        self._members = client.register_script(MEMBERS)
        self._leave = client.register_script(LEAVE)

    def _keys(self, group: str) -> list[str]:
        base = f"{self._namespace}:members:{group}"
        return [base, f"{base}:info"]

    def heartbeat(
        self, group: str, identity: str, ttl: float, info: Mapping[str, str | int]
    ) -> None:
        fields = validate_heartbeat(group, identity, ttl, info)
        with self._translate("heartbeat", group):
            self._heartbeat(keys=self._keys(group), args=[identity, _ms(ttl), json.dumps(fields)])

    def members(self, group: str) -> list[Member]:
        validate_lease_args(group)
        with self._translate("members", group):
            flat: list[Any] = self._members(keys=self._keys(group))
        out = [
            Member(_text(flat[i]), int(flat[i + 1]) / 1000, _info(flat[i + 2]))
            for i in range(0, len(flat), 3)
        ]
        return sorted(out, key=lambda m: m.identity)

    def leave(self, group: str, identity: str) -> None:
        validate_lease_args(group, identity)
        with self._translate("leave", group):
            self._leave(keys=self._keys(group), args=[identity])


PRUNE_EVERY = 16


class MongoMembership(Membership):
    """Membership in ``<collection>.members`` beside the leases, on the server's clock."""

    def __init__(self, collection: Any, translate: Translate) -> None:
        self._coll = collection
        self._translate = translate
        self._beats = 0

    def heartbeat(
        self, group: str, identity: str, ttl: float, info: Mapping[str, str | int]
    ) -> None:
        fields = validate_heartbeat(group, identity, ttl, info)
        update = [
            {
                "$set": {
                    "group": group,
                    "identity": identity,
                    "info": {"$literal": fields},
                    "expiresAt": {"$add": ["$$NOW", _ms(ttl)]},
                }
            }
        ]
        with self._translate("heartbeat", group):
            self._coll.update_one({"_id": f"{group}\n{identity}"}, update, upsert=True)
        self._beats += 1
        if self._beats % PRUNE_EVERY == 0:
            expired = {"$expr": {"$lte": [{"$toLong": "$expiresAt"}, {"$toLong": "$$NOW"}]}}
            with self._translate("heartbeat", group):
                self._coll.delete_many({"group": group, **expired})

    def members(self, group: str) -> list[Member]:
        validate_lease_args(group)
        pipeline = [
            {"$match": {"group": group}},
            {
                "$project": {
                    "identity": 1,
                    "info": 1,
                    "leftMs": {"$subtract": [{"$toLong": "$expiresAt"}, {"$toLong": "$$NOW"}]},
                }
            },
        ]
        with self._translate("members", group):
            docs = list(self._coll.aggregate(pipeline))
        out = [
            Member(str(d["identity"]), int(d["leftMs"]) / 1000, _info(json.dumps(d.get("info"))))
            for d in docs
            if d.get("leftMs") is not None and int(d["leftMs"]) > 0
        ]
        return sorted(out, key=lambda m: m.identity)

    def leave(self, group: str, identity: str) -> None:
        validate_lease_args(group, identity)
        with self._translate("leave", group):
            self._coll.delete_one({"_id": f"{group}\n{identity}"})
