"""``singleton status``: who leads each lease and where each checkpoint stands, read straight
from the stores, so it works from any machine that can reach them."""

from __future__ import annotations

import datetime as dt
from typing import Any

from singleton.errors import SingletonError
from singleton.redact import redact
from singleton.service.config import Config


def _cluster_time_seconds(ts: Any) -> float | None:
    return None if ts is None else float(getattr(ts, "time", ts))


def cluster_status(config: Config, extra_leases: list[str] | None = None) -> dict[str, Any]:
    """``{"leases": [...], "checkpoints": [...]}`` for every configured listener."""
    from singleton.service.registry import make_backend, make_checkpoint_store
    from singleton.service.replica import build_listeners

    listener_names = [listener.lease_name for listener in build_listeners(config)]
    names = listener_names + list(extra_leases or [])
    leases: list[dict[str, Any]] = []
    checkpoints: list[dict[str, Any]] = []
    errors: list[str] = []
    backend = make_backend(config)
    try:
        for name in names:
            try:
                state = backend.inspect(name)
            except SingletonError as exc:
                errors.append(f"lease {name}: {redact(str(exc))}")
                continue
            leases.append(
                {
                    "name": name,
                    "holder": None if state is None else state.holder,
                    "identity": None if state is None else state.identity,
                    "token": None if state is None else state.token,
                    "ttl_remaining": None if state is None else round(state.ttl_remaining, 3),
                }
            )
    finally:
        backend.close()
    if config.listeners:
        import pymongo

        client: pymongo.MongoClient[dict[str, Any]] = pymongo.MongoClient(
            config.mongo_url, serverSelectionTimeoutMS=3000
        )
        try:
            store = make_checkpoint_store(config, client)
            now = dt.datetime.now(dt.timezone.utc).timestamp()
            for name in listener_names:
                try:
                    cp = store.load(name)
                except SingletonError as exc:
                    errors.append(f"checkpoint {name}: {redact(str(exc))}")
                    continue
                seconds = None if cp is None else _cluster_time_seconds(cp.cluster_time)
                checkpoints.append(
                    {
                        "name": name,
                        "cluster_time": seconds,
                        "age_seconds": None if seconds is None else round(now - seconds, 3),
                        "fencing_token": None if cp is None else cp.fencing_token,
                        "holder": None if cp is None else cp.holder,
                    }
                )
        finally:
            client.close()
    return {"leases": leases, "checkpoints": checkpoints, "errors": errors}


def format_status(status: dict[str, Any]) -> str:
    lines = ["LEASE                          HOLDER                         TOKEN   TTL LEFT"]
    for lease in status["leases"]:
        left = lease["ttl_remaining"]
        left_text = "-" if left is None else f"{left:.2f}s"
        lines.append(
            f"{lease['name']:<30} {lease['holder'] or '-':<30} {lease['token'] or '-':>5} "
            f"{left_text:>10}"
        )
    lines.append("")
    lines.append("CHECKPOINT                     CLUSTER TIME           AGE      TOKEN")
    for cp in status["checkpoints"]:
        when = "-"
        if cp["cluster_time"] is not None:
            stamp = dt.datetime.fromtimestamp(cp["cluster_time"], dt.timezone.utc)
            when = stamp.strftime("%Y-%m-%d %H:%M:%S")
        age = "-" if cp["age_seconds"] is None else f"{cp['age_seconds']:.1f}s"
        lines.append(f"{cp['name']:<30} {when:<22} {age:>8} {cp['fencing_token'] or '-':>6}")
    for err in status.get("errors", []):
        lines.append(f"error: {err}")
    return "\n".join(lines)
