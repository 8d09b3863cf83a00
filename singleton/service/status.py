"""``singleton status``: who leads each lease, where each checkpoint stands and where each
scheduled job is, read straight from the stores, so it works from any machine that can reach them.

Every lease and every checkpoint is read in parallel, and the whole command answers within one
``timeout`` however many listeners there are and however frozen a store is: what did not answer
in time is reported as an error for that name. A checkpoint's age is measured on the MongoDB
deployment's own cluster time (now, as the server sees it, minus the checkpoint's cluster time),
never on this machine's clock.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import threading
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any

from singleton.balance.balancer import DEFAULT_GROUP, share_of
from singleton.drivers import mongo
from singleton.errors import SingletonError
from singleton.jobs.triggers import from_ms, next_fire_after
from singleton.lease.contract import LeaseBackend
from singleton.lease.membership import Member
from singleton.redact import redact
from singleton.service.assembly import lease_names
from singleton.service.config import Config, JobConfig
from singleton.service.registry import BACKENDS, make_backend, make_checkpoint_store

#: Seconds the whole command may take.
DEFAULT_TIMEOUT = 5.0


def _lease_entry(backend: LeaseBackend, name: str) -> dict[str, Any]:
    state = backend.inspect(name)
    return {
        "name": name,
        "holder": None if state is None else state.holder,
        "identity": None if state is None else state.identity,
        "token": None if state is None else state.token,
        "ttl_remaining": None if state is None else round(state.ttl_remaining, 3),
    }


def _job_entry(backend: LeaseBackend, job: JobConfig) -> dict[str, Any]:
    """A job's lease holder, its latest claimed fire time (the last one run, or being run), the
    next one its leader will run, and the outcome the leader last recorded."""
    entry = _lease_entry(backend, job.name)
    claims = backend.fires(job.name)
    facts = backend.recall(job.name)
    last = from_ms(claims[0].fire_ms) if claims else None
    now = dt.datetime.now(dt.timezone.utc)  # display only: the leader decides with its own
    nxt = next_fire_after(job.trigger, last, now)
    outcome_fire = facts.get("last_outcome_fire")
    entry.update(
        last_fire=None if last is None else last.isoformat(),
        last_fire_token=claims[0].token if claims else None,
        next_fire=None if nxt is None else nxt.isoformat(),
        last_outcome=facts.get("last_outcome"),
        last_outcome_fire=None if not outcome_fire else from_ms(int(outcome_fire)).isoformat(),
    )
    return entry


def _members_entry(backend: LeaseBackend) -> dict[str, Any]:
    return {"members": backend.membership().members(DEFAULT_GROUP)}


def _members(
    live: list[Member], leases: list[dict[str, Any]], listener_leases: int
) -> dict[str, Any]:
    """The live replicas (heartbeats on the store's clock) and the leases each holds now.

    Each live entry carries its heartbeat's ``held`` and ``cooling`` as reported, its ``leases``
    (the number of lease records naming it holder now, as ``held`` by identity counts them)
    and ``balanced`` (the leases it balances over: what its heartbeat calls ``leases``)."""
    total = listener_leases + sum(1 for lease in leases if "next_fire" in lease)
    held: dict[str, list[str]] = {m.identity: [] for m in live}
    for lease in leases:
        if lease["identity"] is not None:
            held.setdefault(lease["identity"], []).append(lease["name"])
    renamed = {"leases": "balanced"}
    return {
        "live": [
            {
                "identity": m.identity,
                "ttl_remaining": round(m.ttl_remaining, 3),
                **{renamed.get(k, k): int(v) if v.isdigit() else v for k, v in m.info.items()},
                "leases": len(held[m.identity]),
            }
            for m in live
        ],
        "share": share_of(total, len(live)) if live else None,
        "held": {identity: sorted(names) for identity, names in sorted(held.items())},
    }


def _checkpoint_entry(store: Any, name: str) -> dict[str, Any]:
    cp = store.load(name)
    seconds = None if cp is None else float(cp.cluster_time.time)
    return {
        "name": name,
        "cluster_time": seconds,
        "age_seconds": None,  # filled in once the server's "now" is known
        "fencing_token": None if cp is None else cp.fencing_token,
        "holder": None if cp is None else cp.holder,
    }


def store_entry(config: Config, config_file: str | None) -> dict[str, Any]:
    """Which stores ``status`` read (URLs redacted) and the file that named them (``None``:
    defaults, ``SINGLETON_*`` and flags only)."""
    url_key, _ = BACKENDS[config.backend]
    checkpoint_key, _ = BACKENDS[config.checkpoint_store]
    return {
        "config": config_file,
        "backend": config.backend,
        "url": redact(getattr(config, url_key)),
        "namespace": config.namespace,
        "checkpoint_store": config.checkpoint_store,
        "checkpoint_url": redact(getattr(config, checkpoint_key)),
    }


def cluster_status(
    config: Config,
    extra_leases: list[str] | None = None,
    *,
    timeout: float = DEFAULT_TIMEOUT,
    config_file: str | None = None,
) -> dict[str, Any]:
    """``{"store": {...}, "leases": [...], "checkpoints": [...], "jobs": [...], "errors": [...]}``
    for every configured listener (and ``extra_leases``) and job, read in parallel within
    ``timeout`` seconds in all (``store``: :func:`store_entry`). Builds no listener: their lease
    names come from the configuration."""
    listener_names = lease_names(config)
    names = listener_names + list(extra_leases or [])
    backend = make_backend(config)
    client, _ = mongo.client(config.mongo_url, mongo.Timeouts.within(timeout))
    store = make_checkpoint_store(config, client) if listener_names else None
    pool = ThreadPoolExecutor(max_workers=min(16, 2 + 2 * len(names) + len(config.jobs)))
    try:
        now_future = pool.submit(lambda: float(mongo.cluster_time(client).time))
        leases = {name: pool.submit(_lease_entry, backend, name) for name in names}
        checkpoints: dict[str, Future[dict[str, Any]]] = {}
        if store is not None:
            checkpoints = {n: pool.submit(_checkpoint_entry, store, n) for n in listener_names}
        jobs = {job.name: pool.submit(_job_entry, backend, job) for job in config.jobs}
        members = {"members": pool.submit(_members_entry, backend)}
        every: list[Future[Any]] = [
            now_future,
            *members.values(),
            *leases.values(),
            *checkpoints.values(),
            *jobs.values(),
        ]
        wait(every, timeout=timeout)  # one deadline for everything
        now = None
        if now_future.done() and now_future.exception() is None:
            now = now_future.result()
        errors: list[str] = []
        entries = _collect("checkpoint", checkpoints, errors)
        for entry in entries:
            if now is not None and entry["cluster_time"] is not None:
                entry["age_seconds"] = round(max(0.0, now - entry["cluster_time"]), 3)
        lease_entries = _collect("lease", leases, errors)
        job_entries = _collect("job", jobs, errors)
        seen = _collect("membership", members, errors)
        return {
            "store": store_entry(config, config_file),
            "leases": lease_entries,
            "checkpoints": entries,
            "jobs": job_entries,
            "members": _members(
                seen[0]["members"] if seen else [], [*lease_entries, *job_entries], len(names)
            ),
            "errors": errors,
        }
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
        # A frozen store must not hold the answer back: close in the background (daemon).
        threading.Thread(target=_close, args=(backend, client, store), daemon=True).start()


def _close(*resources: Any) -> None:
    for resource in resources:
        if resource is not None:
            with contextlib.suppress(Exception):
                resource.close()


def _collect(
    what: str, futures: dict[str, Future[dict[str, Any]]], errors: list[str]
) -> list[dict[str, Any]]:
    out = []
    for name, future in futures.items():
        if not future.done():
            errors.append(f"{what} {name}: no answer in time")
            continue
        exc = future.exception()
        if isinstance(exc, SingletonError):
            errors.append(f"{what} {name}: {redact(str(exc))}")
        elif exc is not None:
            errors.append(f"{what} {name}: {type(exc).__name__}: {redact(str(exc))}")
        else:
            out.append(future.result())
    return out


def _table(headers: list[str], rows: list[list[str]], right: set[int]) -> list[str]:
    widths = [max([len(h), *(len(r[i]) for r in rows)]) for i, h in enumerate(headers)]

    def line(cells: list[str]) -> str:
        return "  ".join(
            c.rjust(w) if i in right else c.ljust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    return [line(headers), *(line(r) for r in rows)]


def describe_store(store: dict[str, Any]) -> str:
    """One line: the lease store read, its namespace, and where that came from."""
    where = f"config {store['config']}" if store["config"] else "no config file"
    return f"{store['backend']} {store['url']}, namespace {store['namespace']} ({where})"


def format_status(status: dict[str, Any]) -> str:
    lease_rows = []
    for lease in status["leases"]:
        left = lease["ttl_remaining"]
        lease_rows.append(
            [
                lease["name"],
                lease["holder"] or "-",
                "-" if lease["token"] is None else str(lease["token"]),
                "-" if left is None else f"{left:.2f}s",
            ]
        )
    cp_rows = []
    for cp in status["checkpoints"]:
        when = "-"
        if cp["cluster_time"] is not None:
            stamp = dt.datetime.fromtimestamp(cp["cluster_time"], dt.timezone.utc)
            when = stamp.strftime("%Y-%m-%d %H:%M:%S")
        age = "-" if cp["age_seconds"] is None else f"{cp['age_seconds']:.1f}s"
        token = "-" if cp["fencing_token"] is None else str(cp["fencing_token"])
        cp_rows.append([cp["name"], when, age, token])
    lines = [f"store: {describe_store(status['store'])}", ""] if "store" in status else []
    lines += _table(["LEASE", "HOLDER", "TOKEN", "TTL LEFT"], lease_rows, {2, 3})
    lines.append("")
    lines += _table(["CHECKPOINT", "CLUSTER TIME (UTC)", "AGE", "TOKEN"], cp_rows, {2, 3})
    if status.get("jobs"):
        job_rows = [
            [
                job["name"],
                job["holder"] or "-",
                "-" if job["token"] is None else str(job["token"]),
                job["last_fire"] or "-",
                job["next_fire"] or "-",
                job["last_outcome"] or "-",
            ]
            for job in status["jobs"]
        ]
        lines.append("")
        headers = ["JOB", "HOLDER", "TOKEN", "LAST FIRE", "NEXT FIRE", "LAST OUTCOME"]
        lines += _table(headers, job_rows, {2})
    members = status.get("members") or {}
    if members.get("held"):
        live = {m["identity"] for m in members.get("live", [])}
        rows = [
            [identity, "yes" if identity in live else "no", str(len(names)), ", ".join(names)]
            for identity, names in members["held"].items()
        ]
        lines.append("")
        lines += _table(["REPLICA", "LIVE", "HELD", "LEASES"], rows, {2})
        if members.get("share") is not None:
            lines.append(f"share: at most {members['share']} lease(s) per live replica")
    lines += [f"error: {err}" for err in status.get("errors", [])]
    return "\n".join(lines)
