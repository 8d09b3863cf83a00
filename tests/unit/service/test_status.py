"""``singleton status`` without its stores: what it says of the stores it read, and of the live
replicas (the store's answers scripted)."""

from __future__ import annotations

import json

from singleton.lease.membership import Member
from singleton.service.config import load_config
from singleton.service.status import _members, describe_store, format_status, store_entry


def _lease(name: str, identity: str | None) -> dict[str, object]:
    return {"name": name, "holder": identity, "identity": identity, "token": 1, "ttl_remaining": 1}


def test_each_live_replica_counts_the_leases_it_holds_not_those_it_balances() -> None:
    """The heartbeat's ``leases`` is the number balanced (1 here, on every replica): it used to
    show as ``leases`` for replicas holding none."""
    live = [
        Member("a", 3.0, {"held": "1", "leases": "1", "cooling": "0"}),
        Member("b", 3.0, {"held": "0", "leases": "1", "cooling": "0"}),
    ]
    members = _members(live, [_lease("orders", "a")], 1)
    by_identity = {m["identity"]: m for m in members["live"]}
    assert by_identity["a"]["leases"] == 1 and by_identity["b"]["leases"] == 0
    assert by_identity["b"]["balanced"] == 1 and by_identity["b"]["held"] == 0
    assert members["held"] == {"a": ["orders"], "b": []}


def test_the_store_read_is_named_in_the_table_and_the_json() -> None:
    config = load_config(
        environ={"SINGLETON_REDIS_URL": "redis://:s3cret@cache:6379/2", "SINGLETON_NAMESPACE": "n"}
    )
    store = store_entry(config, None)
    assert store == {
        "config": None,
        "backend": "redis",
        "url": "redis://:***@cache:6379/2",
        "namespace": "n",
        "checkpoint_store": "mongo",
        "checkpoint_url": "mongodb://127.0.0.1:27017/",
    }
    status = {"store": store, "leases": [], "checkpoints": [], "jobs": [], "errors": []}
    table = format_status(status)
    assert table.splitlines()[0] == (
        "store: redis redis://:***@cache:6379/2, namespace n (no config file)"
    )
    assert "s3cret" not in table + json.dumps(status)
    assert "(config singleton.toml)" in describe_store(store_entry(config, "singleton.toml"))
