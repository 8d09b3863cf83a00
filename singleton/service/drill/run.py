"""One drill run: start the cluster, write, inject the schedule, wait for quiescence, judge.

Everything needed to replay or inspect a run lands in the work directory: ``schedule.json``
(seed, options, planned faults) first, then each replica's log and audit file, and at the end
``history.json`` (faults as injected, lease and checkpoint samples, audit records, the writer's
timeline, the verdict). The directory is removed after a passing run unless ``--workdir`` was
given; after a failing run it is always kept.
"""

from __future__ import annotations

import json
import random
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from loguru import logger

from listeners.elasticsearch.verify import Diff, compare
from singleton.drivers.mongo import client as mongo_client
from singleton.service.dev.cluster import WriteGate, Writer
from singleton.service.drill import faults as fl
from singleton.service.drill import shaped
from singleton.service.drill.balance import (
    BalanceSample,
    BalanceSampler,
    FaultBalance,
    balance_bound,
)
from singleton.service.drill.cluster import (
    COLLECTION,
    DATABASE,
    ClusterSpec,
    DrillCluster,
)
from singleton.service.drill.converge import FaultEqual, converge
from singleton.service.drill.history import AuditTail, Sampler, raw_stream_rate
from singleton.service.drill.jobs import JOB, check_job
from singleton.service.drill.verdict import (
    Verdict,
    checkpoint_regressions,
    fencing_violations,
    per_lease,
    planned_expired,
    split_extra,
    summary,
    takeover_gaps,
    write_lag,
)
from singleton.service.registry import make_backend

SCHEMA_VERSION = 1
#: The mirror drill's writer, or ``--shaped``'s.
AnyWriter = Writer | shaped.ShapedWriter
#: the per-listener document counts of the verdict, in split_extra's order
MISMATCHES = ("missing", "stale", "resurrected", "extra")
#: events the raw stream rate is measured over (the writer's last ones)
RAW_RATE_EVENTS = 5_000


@dataclass
class DrillOptions(ClusterSpec):
    rounds: int = 20
    seed: int = 1
    kinds: list[str] = field(default_factory=list)
    rate: float = 40.0
    txn_share: float = 0.05
    workdir: str | None = None
    #: seconds a leader may take to stream again after a fault (beyond the fault itself)
    recover_timeout: float = 30.0
    #: seconds an index may take to equal its collection once every listener streams again
    equal_timeout: float = 30.0
    quiesce_timeout: float = 30.0


class Drill:
    def __init__(self, opts: DrillOptions, say: Callable[[str], None]) -> None:
        self.opts = opts
        self.say = say
        self.keep = opts.workdir is not None
        self.workdir = Path(opts.workdir or tempfile.mkdtemp(prefix="singleton-drill-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.stop = threading.Event()
        self.schedule = fl.plan(opts.seed, opts.rounds, opts.kinds, opts.timings.ttl)
        opts.clock_jumps = "clock-jump" in opts.kinds
        self.cluster = DrillCluster(self.workdir, opts)
        self.injected: list[fl.FaultRecord] = []
        self.stalls: list[str] = []
        self.balance: list[FaultBalance] = []
        self.equal: list[FaultEqual] = []
        self.balance_samples: list[BalanceSample] = []
        #: listener leases that had not streamed again at the last check
        self.lagging: list[str] = []
        self.t0 = time.monotonic()

    # -- helpers ----------------------------------------------------------------------------
    def _t(self, mono: float) -> float:
        return mono - self.t0

    def _save_schedule(self) -> None:
        opts = asdict(self.opts)
        data = {
            "seed": self.opts.seed,
            "options": opts,
            "faults": [asdict(f) for f in self.schedule],
        }
        (self.workdir / "schedule.json").write_text(json.dumps(data, indent=1))

    def _streaming(self, tail: AuditTail, since: float) -> bool:
        """Every listener lease's live leader acknowledged a write after ``since``."""
        tail.poll()
        self.lagging = [n for n in self.cluster.listener_leases if not self._acked(tail, n, since)]
        return not self.lagging

    def _acked(self, tail: AuditTail, lease: str, since: float) -> bool:
        state = self.cluster.lease_state(name=lease)
        proc = None if state is None else self.cluster.replicas.get(state.identity)
        if state is None or proc is None or not proc.alive:
            return False
        for kind in ("batch", "checkpoint"):
            rec = tail.latest(kind, state.token, lease)
            if rec is not None and rec["mono"] > since:
                return True
        return False

    def _balanced(self, sampler: BalanceSampler, fault: fl.PlannedFault, end: float) -> None:
        """Wait until the leases are balanced after ``fault`` (see :mod:`.balance`), or its
        bound has passed, and record how long it took."""
        t = self.opts.timings
        bound = balance_bound(t.ttl)
        settled = partial(sampler.settled, end, ttl=t.ttl, confirm=t.renew_interval)
        wait = end + bound + t.ttl + t.renew_interval + 1.0 - time.monotonic()
        self._await(lambda: settled() is not None, max(0.0, wait))
        seconds = settled()
        result = FaultBalance(
            fault.index, fault.kind, seconds, bound, sampler.held_at(time.monotonic())
        )
        self.balance.append(result)
        took = "-" if seconds is None else f"{seconds:.2f}s"
        self.say(
            f"           leases {'balanced' if result.ok else 'NOT BALANCED'} {took} after the "
            f"fault (bound {bound:.1f}s): {result.held}"
        )

    def _await(self, pred: Callable[[], bool], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while not self.stop.is_set():
            if pred():
                return True
            if time.monotonic() >= deadline:
                return False
            self.stop.wait(0.05)
        return False

    # -- the run ----------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        """Run the drill and return the result (its schema: docs/how-to/drill.md)."""
        try:
            return self._run()
        finally:
            self.cluster.stop()  # idempotent; covers a failure while starting

    def _run(self) -> dict[str, Any]:
        c = self.cluster
        self._save_schedule()
        self._announce()
        c.start_servers()
        client, _ = mongo_client(c.mongo_url, timeout=5.0, socket_timeout=30.0)
        coll = client[DATABASE][COLLECTION]
        self._seed(client)
        c.start_replicas()
        self.say(c.describe())
        assert c.config is not None
        sampler_backend = make_backend(c.config)
        balance_backend = make_backend(c.config)
        store = c.checkpoint_store(client)
        sampler = Sampler(
            lambda: sampler_backend.inspect(c.lease), store.load, c.listener_leases
        ).start()
        balance = BalanceSampler(balance_backend, [*c.listener_leases, JOB], c.running).start()
        tail = AuditTail(c.audit_paths.values())
        writer = self._writer(client)
        writer_thread = threading.Thread(target=writer.run, name="drill-writer", daemon=True)
        diffs: list[Any] = []
        raw: dict[str, Any] = {"events": 0, "seconds": None, "per_s": None}
        try:
            self.t0 = time.monotonic()
            writer_thread.start()
            self._inject_schedule(tail, balance, partial(self._diffs, coll), writer.gate)
            self.stop.wait(1.0)
            writer.stop_event.set()
            writer_thread.join(10)
            self.say(f"  writer stopped after {writer.ops} writes; waiting for quiescence")
            self._quiesce(tail, writer)
            diffs = self._compare(coll)
            cts = [ct for _, ct in writer.log if ct is not None]
            since = cts[max(0, len(cts) - RAW_RATE_EVENTS)] if cts else None
            raw = raw_stream_rate(coll, since, 2 * RAW_RATE_EVENTS)
        finally:
            writer.stop_event.set()
            end = time.monotonic()
            sampler.stop()
            balance.stop()
            sampler_backend.close()
            balance_backend.close()
            c.stop()
            client.close()
        tail.poll()
        self.balance_samples = balance.samples
        return self._judge(diffs, writer, sampler, tail, end, raw)

    def _seed(self, client: Any) -> None:
        """The documents there before the replicas start."""
        if self.opts.shaped:
            shaped.seed(client[DATABASE], 200, random.Random(self.opts.seed), self.opts.related)
            return
        client[DATABASE][COLLECTION].insert_many(
            [{"_id": i, "sku": f"seed-{i}", "qty": i % 7, "v": 0} for i in range(1, 201)]
        )

    def _writer(self, client: Any) -> AnyWriter:
        opts = self.opts
        if opts.shaped:
            return shaped.ShapedWriter(
                client,
                DATABASE,
                rate=opts.rate,
                seed=opts.seed,
                txn_share=opts.txn_share,
                related=opts.related,
            )
        coll = client[DATABASE][COLLECTION]
        return Writer(coll, rate=opts.rate, seed=opts.seed, client=client, txn_share=opts.txn_share)

    def _announce(self) -> None:
        opts = self.opts
        kinds = ", ".join(f"{k}={sum(f.kind == k for f in self.schedule)}" for k in opts.kinds)
        self.say(
            f"singleton drill: {opts.replicas} replicas, {opts.backend} leases, {opts.listeners} "
            f"listener(s) x {opts.partitions} partition(s), {opts.rounds} faults ({kinds}), seed "
            f"{opts.seed}{', FENCING DISABLED' if opts.unsafe else ''}"
        )
        self.say(f"  workdir {self.workdir}")

    def _inject_schedule(
        self,
        tail: AuditTail,
        balance: BalanceSampler,
        diffs: Callable[[], list[Diff]],
        gate: WriteGate,
    ) -> None:
        """Once every listener streams, each planned fault in turn; stop at the first one after
        which a listener does not stream again, or an index does not equal its collection
        again, in time."""
        injector = fl.Injector(self.cluster, self.stop)
        if not self._await(lambda: self._streaming(tail, 0.0), 90.0):
            self.stalls.append(f"not every listener streamed within 90 s: {self.lagging}")
            return
        for fault in self.schedule:
            if self.stop.is_set():
                break
            self.stop.wait(fault.settle)
            rec = injector.inject(fault)
            self.injected.append(rec)
            if not self._recovered(fault, rec, tail) or not self._equalled(fault, rec, diffs, gate):
                break
            self._balanced(balance, fault, rec.end)

    def _recovered(self, fault: fl.PlannedFault, rec: fl.FaultRecord, tail: AuditTail) -> bool:
        """Wait until every listener streams again after ``fault``; say how long it took, and
        record a stall if it did not within its limit."""
        limit = self.opts.recover_timeout
        acked_after = rec.end
        if fault.kind in fl.STORE_LOSS_KINDS:  # the never-stuck promise, measured
            limit = min(limit, 3 * self.opts.timings.ttl + 5.0)
        promoted = "promoted" in rec.extra
        if promoted:  # sentinel-failover: streaming within 10 s of it
            acked_after = rec.extra["promoted"]
            limit = max(0.0, acked_after + fl.PROMOTION_BOUND - time.monotonic())
        ok = self._await(partial(self._streaming, tail, acked_after), limit)
        after = time.monotonic() - rec.end
        self.say(
            f"  [{self._t(rec.at):6.1f}s] {fault.index + 1:>3}/{len(self.schedule)} "
            f"{fault.describe():<22} leader {rec.victim or '-'} (token {rec.token}) "
            f"{'streaming again' if ok else 'NOT STREAMING'} {after:.2f}s after the fault"
        )
        if not ok:
            within = f", {fl.PROMOTION_BOUND:.0f}s after the promotion" if promoted else ""
            self.stalls.append(f"fault {fault.index} ({fault.describe()}{within}): {self.lagging}")
        return ok

    def _equalled(
        self,
        fault: fl.PlannedFault,
        rec: fl.FaultRecord,
        diffs: Callable[[], list[Diff]],
        gate: WriteGate,
    ) -> bool:
        """Hold the writer until every index equals its collection (see :mod:`.converge`);
        say how long after the fault that was, and whether it was within the bound."""
        bound = time.monotonic() - rec.end + self.opts.equal_timeout
        seconds, compares, last = converge(diffs, gate, rec.end, bound, self.stop)
        entry = FaultEqual(fault.index, fault.kind, seconds, round(bound, 2), compares, last)
        self.equal.append(entry)
        took = f"{seconds:.2f}s" if seconds is not None else f"NOT within {bound:.0f}s"
        self.say(f"           index equal {took} after the fault ({compares} compares)")
        return entry.ok

    def _quiesce(self, tail: AuditTail, writer: AnyWriter) -> None:
        """Wait until every lease of every listener saved a checkpoint at or after the writer's
        last write: everything up to it acknowledged by the sink (a checkpoint is saved only
        then). An acknowledged batch's last event is not enough: a partition may own none of
        the last events, and an event's cluster time need not grow along the stream."""
        last_ct = max((ct for _, ct in writer.log if ct is not None), default=None)
        reached: dict[str, tuple[int, int]] = {}  # each lease's newest checkpoint
        read = 0

        def quiet() -> bool:
            nonlocal read
            tail.poll()
            records = tail.records[read:]  # (others poll too: read the list, not the news)
            read += len(records)
            for r in records:
                lease, ct = r.get("lease"), r.get("ct")
                if r.get("kind") == "checkpoint" and ct and isinstance(lease, str):
                    reached[lease] = max(reached.get(lease, (0, 0)), tuple(ct))
            if last_ct is None:
                return True
            leases = [lease for li in self.cluster.listeners for lease in li.leases]
            return all(reached.get(lease, (0, 0)) >= last_ct for lease in leases)

        if not self._await(quiet, self.opts.quiesce_timeout):
            self.say(
                f"  not every lease checkpointed the last write (cluster time {last_ct}) within"
                f" {self.opts.quiesce_timeout:.0f}s; checkpoints at: {reached}"
            )

    def _diffs(self, coll: Any) -> list[Diff]:
        """Each listener's index against the collection (``--shaped``: its shaped view)."""
        c = self.cluster
        if self.opts.shaped:
            db_client = coll.database.client
            return [shaped.compare(db_client, DATABASE, c.es_url, self.opts.related)]
        return [compare(coll, c.es_url, li.index) for li in c.listeners]

    def _compare(self, coll: Any) -> list[Diff]:
        """:meth:`_diffs`, retried a few times for the last refresh."""
        diffs: list[Diff] = []
        for _ in range(10):
            diffs = self._diffs(coll)
            if all(d.ok for d in diffs):
                break
            self.stop.wait(0.5)
        return diffs

    def _judge(
        self,
        diffs: list[Any],
        writer: AnyWriter,
        sampler: Sampler,
        tail: AuditTail,
        end: float,
        raw: dict[str, Any],
    ) -> dict[str, Any]:
        v = Verdict(stalls=list(self.stalls), balance=list(self.balance), equal=list(self.equal))
        if not diffs:
            v.errors.append("no comparison was made (interrupted?)")
        per_listener = self._count_documents(v, diffs, writer)
        self._check_leases(v, sampler, tail, writer, end)
        job = check_job(self.cluster.job_record, (f.kind for f in self.injected))
        v.errors += job.failures()
        result = self._result(v, job.as_dict(), per_listener, writer, diffs, end, raw)
        history = self._history(v, result, sampler, tail, writer, end)
        if not v.ok or self.keep:
            result["workdir"] = str(self.workdir)
            (self.workdir / "history.json").write_text(json.dumps(history, default=str))
        else:
            shutil.rmtree(self.workdir, ignore_errors=True)
        self.history = history
        logger.debug("drill finished: ok={}", v.ok)
        return result

    def _count_documents(
        self, v: Verdict, diffs: list[Any], writer: AnyWriter
    ) -> list[dict[str, Any]]:
        """Each listener's mismatched ids into ``v`` (prefixed by the listener when there are
        several); returns the per-listener counts."""
        listeners = self.cluster.listeners
        per_listener = []
        for li, diff in zip(listeners, diffs, strict=False):
            found = split_extra(
                list(diff.missing), list(diff.stale), list(diff.extra), writer.deleted
            )
            tag = "" if len(listeners) == 1 else f"{li.index}:"
            for into, ids in zip((v.missing, v.stale, v.resurrected, v.extra), found, strict=True):
                into.extend(f"{tag}{x}" for x in ids)
            per_listener.append(
                {
                    "name": li.name,
                    "index": li.index,
                    "leases": list(li.leases),
                    "es": getattr(diff, "es_count", None),
                    **{k: len(ids) for k, ids in zip(MISMATCHES, found, strict=True)},
                }
            )
        return per_listener

    def _check_leases(
        self, v: Verdict, sampler: Sampler, tail: AuditTail, writer: AnyWriter, end: float
    ) -> None:
        """Checkpoint regressions, fencing violations, takeover gaps, expired handovers and the
        writer-to-index lag, into ``v``."""
        c = self.cluster
        by_lease = per_lease(tail.records)
        overlap = [
            (f.at, f.end + self.opts.timings.renew_deadline)
            for f in self.injected
            if f.kind == "lease-wipe"
        ]
        found_violations = []
        for lease in c.listener_leases:
            records = by_lease.get(lease, [])
            v.regressions += checkpoint_regressions(records, sampler.checkpoints.get(lease, []))
            found_violations += fencing_violations(records, overlap)
        v.violations = [x for x in found_violations if not x["overlap"]]
        v.overlap_writes = len(found_violations) - len(v.violations)
        aimed = by_lease.get(c.lease, [])  # the lease the faults aim at
        v.gaps = takeover_gaps(self.injected, aimed, end)
        v.expired = planned_expired(self.injected, aimed)
        first = [r for lease in c.listeners[0].leases for r in by_lease.get(lease, [])]
        v.lags = write_lag(writer.log, first)

    def _result(
        self,
        v: Verdict,
        jobs: dict[str, Any],
        per_listener: list[dict[str, Any]],
        writer: AnyWriter,
        diffs: list[Any],
        end: float,
        raw: dict[str, Any],
    ) -> dict[str, Any]:
        """The result printed by ``--json`` (its schema is in docs/how-to/drill.md)."""
        opts = self.opts
        return {
            "schema": SCHEMA_VERSION,
            "ok": v.ok,
            "failures": v.failures(),
            "seed": opts.seed,
            "backend": opts.backend,
            "sentinel": opts.sentinel,
            "replicas": opts.replicas,
            "listeners": opts.listeners,
            "partitions": opts.partitions,
            "shaped": opts.shaped,
            "related": opts.related,
            "fencing": not opts.unsafe,
            "duration": round(end - self.t0, 2),
            "faults": len(self.injected),
            "faults_by_kind": {k: sum(f.kind == k for f in self.injected) for k in opts.kinds},
            "missing": len(v.missing),
            "stale": len(v.stale),
            "resurrected": len(v.resurrected),
            "extra": len(v.extra),
            "by_listener": per_listener,
            "checkpoint_regressions": len(v.regressions),
            "fencing_violations": len(v.violations),
            "overlap_writes": v.overlap_writes,
            "stalls": len(v.stalls),
            "planned_expired": len(v.expired),
            "balance": v.balance_summary(balance_bound(opts.timings.ttl)),
            "jobs": jobs,
            "gaps": v.gaps_by_kind(opts.kinds),
            "equal": v.equal_summary(opts.kinds),
            "lag": {**summary(v.lags), "writes": len(v.lags)},
            "raw_stream": raw,
            "oplog_max_entries": opts.oplog_max_entries,
            "writes": {
                "ops": writer.ops,
                "failed": writer.failed,
                "transactions": writer.transactions,
                "deleted": len(writer.deleted),
            },
            "documents": {
                "mongo": getattr(diffs[0], "mongo_count", None) if diffs else None,
                "es": getattr(diffs[0], "es_count", None) if diffs else None,
            },
            "timings": asdict(opts.timings),
            "workdir": None,
        }

    def _history(
        self,
        v: Verdict,
        result: dict[str, Any],
        sampler: Sampler,
        tail: AuditTail,
        writer: AnyWriter,
        end: float,
    ) -> dict[str, Any]:
        """Everything the report draws and a person replaying the run needs."""
        return {
            "t0": self.t0,
            "end": end,
            "result": result,
            "schedule": [asdict(f) for f in self.schedule],
            "faults": [f.as_dict() for f in self.injected],
            "gaps": v.gaps,
            "leases": sampler.leases,
            "checkpoints": sampler.checkpoints,
            "balance": [b.as_dict() for b in self.balance_samples],
            "audit": tail.records,
            "writes": [at for at, _ in writer.log],
            "identities": list(self.cluster.replicas),
            "examples": {
                "missing": v.missing[:20],
                "stale": v.stale[:20],
                "resurrected": v.resurrected[:20],
                "extra": v.extra[:20],
                "regressions": v.regressions[:20],
                "violations": v.violations[:20],
                "planned_expired": v.expired[:20],
            },
        }
