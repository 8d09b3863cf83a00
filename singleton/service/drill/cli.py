"""``singleton drill``: break the leader every way we know, prove nothing was lost, draw it.

N ``singleton run`` replicas mirror a collection into Elasticsearch with ``--listeners L``
ElasticsearchSync listeners (one index each), each split in ``--partitions K``, while a writer
inserts, updates, replaces, deletes and commits transactions. Faults from a seeded
schedule hit whoever leads (:mod:`.faults`); after the last one the drill waits for quiescence
and judges (:mod:`.verdict`); after every fault the leases must be balanced again over the live
replicas within 3 x ttl + 5 s (:mod:`.balance`). Exit 0 only if every invariant holds, 1 if one
does not, 2 on bad arguments.

    singleton drill --rounds 20 --faults kill,stop,term,rotate --json --report drill.html
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from singleton.errors import ConfigurationError, SingletonError
from singleton.lease.timings import LeaseTimings
from singleton.redact import redact
from singleton.service.config.urls import check_url
from singleton.service.drill.cluster import DRILL_OPLOG_ENTRIES
from singleton.service.drill.faults import KINDS, PROXY_KINDS, parse_kinds
from singleton.service.drill.run import Drill, DrillOptions

__all__ = ["Drill", "DrillOptions", "main"]


SHAPED_HELP = (
    "one shaped listener instead: orders (a filter, routing), legacy_orders (into the orders "
    "index) and customers (field rules), written across collections"
)


RELATED_HELP = (
    "--shaped, and each order embeds its customer and its lines, each line its product "
    "(relate, two levels); lines are added, moved between orders and deleted, products retitled"
)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="singleton drill",
        description=__doc__.splitlines()[0],
        epilog="After every fault, within 3 x ttl + 5 s of its end, every lease (each listener's "
        "partitions and the drill's job) must be held by a live replica and the leases per live "
        "replica must differ by at most one, else the verdict fails.",
    )
    p.add_argument("--backend", default="redis", choices=("redis", "mongo"))
    p.add_argument("--replicas", type=int, default=3)
    p.add_argument("--rounds", type=int, default=20, help="number of faults (default 20)")
    p.add_argument(
        "--faults", help=f"comma-separated kinds (default: all that apply): {', '.join(KINDS)}"
    )
    p.add_argument(
        "--listeners",
        type=int,
        default=1,
        help="ElasticsearchSync listeners, all reading the collection, each into its own index "
        "(default 1)",
    )
    p.add_argument(
        "--partitions",
        type=int,
        default=1,
        help="partitions = K for every listener: K leases and checkpoints each (default 1)",
    )
    p.add_argument("--shaped", action="store_true", help=SHAPED_HELP)
    p.add_argument("--related", action="store_true", help=RELATED_HELP)
    p.add_argument("--seed", type=int, default=1, help="the schedule is a function of the seed")
    p.add_argument("--rate", type=float, default=40.0, help="writer operations per second")
    p.add_argument("--ttl", type=float, default=2.5, help="lease ttl in seconds (default 2.5)")
    p.add_argument(
        "--oplog-entries",
        type=int,
        default=DRILL_OPLOG_ENTRIES,
        help=f"cap of the embedded SecantusDB's oplog (default {DRILL_OPLOG_ENTRIES}; 0: its own)",
    )
    p.add_argument("--json", action="store_true", help="print the result as JSON on stdout")
    p.add_argument("--report", metavar="FILE", help="write an HTML timeline here")
    p.add_argument("--workdir", help="keep schedule, logs and histories here")
    p.add_argument("--redis-url", help="use this Redis instead of an embedded one")
    p.add_argument(
        "--sentinel",
        action="store_true",
        help="Redis leases behind Sentinel: start two data nodes and three Sentinels on loopback, "
        "give the replicas a redis+sentinel:// URL, and drill sentinel-failover (SIGKILL the "
        "master; the Sentinels promote the replica; the old master comes back as its replica). "
        f"Leaves out {', '.join(PROXY_KINDS)}: they need the embedded Redis and its proxies",
    )
    p.add_argument("--mongo-url", help="use this MongoDB (replica set) instead of SecantusDB")
    p.add_argument("--es-url", help="use this Elasticsearch instead of osmem-server")
    p.add_argument(
        "--unsafe-disable-fencing",
        action="store_true",
        help="TESTS ONLY: run the replicas with fencing off; the verdict should then fail",
    )
    return p


def timings_for(ttl: float) -> LeaseTimings:
    """The drill's defaults scaled to ``ttl``; the runner's 0.1 s stream poll must stay under a
    quarter of the renew deadline, and a loaded 2-core box needs some slack on top."""
    if ttl < 1.5:
        raise ConfigurationError(f"--ttl must be >= 1.5 s, got {ttl!r}")
    return LeaseTimings.of(
        ttl=ttl,
        renew_interval=round(ttl / 5, 3),
        renew_deadline=round(0.8 * ttl, 3),
        retry_interval=round(ttl / 10, 3),
        cooldown=round(ttl * 0.4, 3),
    )


def options_from(args: argparse.Namespace) -> DrillOptions:
    if args.replicas < 2:
        raise ConfigurationError(f"--replicas must be >= 2, got {args.replicas}")
    if not args.rate > 0:
        raise ConfigurationError(f"--rate must be > 0, got {args.rate}")
    if not 1 <= args.listeners <= 16:
        raise ConfigurationError(f"--listeners must be between 1 and 16, got {args.listeners}")
    args.shaped = args.shaped or args.related
    if args.shaped and args.listeners != 1:
        raise ConfigurationError(
            f"--shaped runs one shaped listener; leave --listeners out (got {args.listeners})"
        )
    if not 1 <= args.partitions <= 16:
        raise ConfigurationError(f"--partitions must be between 1 and 16, got {args.partitions}")
    if args.oplog_entries < 0:
        raise ConfigurationError(f"--oplog-entries must be >= 0, got {args.oplog_entries}")
    if args.sentinel and (args.backend != "redis" or args.redis_url):
        raise ConfigurationError("--sentinel needs --backend redis and starts its own Redis")
    for flag, url in (
        ("--redis-url", args.redis_url),
        ("--mongo-url", args.mongo_url),
        ("--es-url", args.es_url),
    ):
        if url:  # checked as the replicas' configuration will check it, naming the flag
            try:
                check_url(flag[2:].replace("-", "_"), url)
            except ConfigurationError as exc:
                raise ConfigurationError(f"{flag}: {exc}") from None
    kinds = parse_kinds(args.faults, args.backend, sentinel=args.sentinel)
    if args.redis_url and any(k.startswith("redis-") for k in kinds):
        raise ConfigurationError("redis-restart and redis-pause need the embedded Redis")
    return DrillOptions(
        backend=args.backend,
        replicas=args.replicas,
        rounds=args.rounds,
        seed=args.seed,
        kinds=kinds,
        rate=args.rate,
        workdir=args.workdir,
        redis_url=args.redis_url,
        sentinel=args.sentinel,
        mongo_url=args.mongo_url,
        es_url=args.es_url,
        unsafe=args.unsafe_disable_fencing,
        timings=timings_for(args.ttl),
        oplog_max_entries=args.oplog_entries or None,
        listeners=args.listeners,
        partitions=args.partitions,
        shaped=args.shaped,
        related=args.related,
    )


def format_summary(result: dict[str, Any]) -> str:
    def sec(v: float | None) -> str:
        return "-" if v is None else f"{v * 1000:.0f}ms" if v < 1 else f"{v:.2f}s"

    bal = result["balance"]
    lines = [
        f"verdict: {'PASS' if result['ok'] else 'FAIL'} ({result['faults']} faults, "
        f"{result['duration']:.0f}s, {result['writes']['ops']} writes, "
        f"{result['writes']['transactions']} transactions)",
        f"  documents: mongo {result['documents']['mongo']}, es {result['documents']['es']}; "
        f"missing {result['missing']}, stale {result['stale']}, resurrected "
        f"{result['resurrected']}, extra {result['extra']}",
        f"  {result['listeners']} listener(s) x {result['partitions']} partition(s): "
        + "; ".join(
            f"{li['index']} es {li['es']}, missing {li['missing']}, stale {li['stale']}, "
            f"resurrected {li['resurrected']}, extra {li['extra']}"
            for li in result["by_listener"]
        ),
        f"  balance (every lease held, leases per live replica within 1) after {bal['faults']} "
        f"faults: p50 {sec(bal['p50'])}, p99 {sec(bal['p99'])}, max {sec(bal['max'])}; "
        f"{bal['unbalanced']} not balanced within {bal['bound']:.1f}s",
        f"  checkpoint regressions {result['checkpoint_regressions']}, fencing violations "
        f"{result['fencing_violations']}, stalls {result['stalls']}, planned handovers left to "
        f"expire {result['planned_expired']}",
        f"  scheduled job: {result['jobs']['runs']} runs, {result['jobs']['twice']} twice, "
        f"{result['jobs']['missing']} missing"
        f"{'' if result['jobs']['missing_fails'] else ' (skipping faults drilled)'}, token "
        f"regressions {result['jobs']['token_regressions']}",
        f"  writer-to-index lag: p50 {sec(result['lag']['p50'])}, p99 {sec(result['lag']['p99'])}, "
        f"max {sec(result['lag']['max'])}; raw change stream "
        f"{_rate(result['raw_stream']['per_s'])} events/s (pymongo alone, same SecantusDB, "
        f"oplog cap {result['oplog_max_entries'] or 'its default'})",
        "  takeover gap (the old tenure's last acknowledged write, or its release, to the next"
        " election):",
        "    fault              faults takeovers      p50      p99      max",
    ]
    for kind, g in result["gaps"].items():
        lines.append(
            f"    {kind:<18} {g['count']:>6} {g['takeovers']:>9} {sec(g['p50']):>8} "
            f"{sec(g['p99']):>8} {sec(g['max']):>8}"
        )
    lines.append("  time to balance (from the fault's end):")
    for b in bal["by_fault"]:
        lines.append(
            f"    {b['index'] + 1:>3} {b['kind']:<18} {sec(b['seconds']):>8}"
            f"{'' if b['ok'] else '  NOT BALANCED'}  held {b['held']}"
        )
    lines += [f"  FAILED: {f}" for f in result["failures"]]
    if result.get("workdir"):
        lines.append(f"  schedule, logs and histories kept in {result['workdir']}")
    return "\n".join(lines)


def _rate(per_s: float | None) -> str:
    return "-" if per_s is None else f"{per_s:,.0f}"


def main(argv: Sequence[str] | None = None) -> int:
    from singleton.service.logs import setup_logging

    args = build_parser().parse_args(list(argv) if argv is not None else None)
    try:
        opts = options_from(args)
    except ConfigurationError as exc:
        print(f"singleton drill: error: {redact(str(exc))}", file=sys.stderr)  # noqa: T201
        return 2
    setup_logging("text", "WARNING")
    stream = sys.stderr if args.json else sys.stdout

    def say(line: str) -> None:
        print(line, file=stream, flush=True)

    drill = Drill(opts, say)
    previous = signal.signal(signal.SIGINT, lambda *_: drill.stop.set())
    try:
        result = drill.run()
    except SingletonError as exc:
        say(f"singleton drill: failed: {redact(str(exc))}; workdir {drill.workdir}")
        return 1
    finally:
        signal.signal(signal.SIGINT, previous)
    if args.report:
        from singleton.service.drill.report import render

        Path(args.report).write_text(render(drill.history))
        say(f"  report: {args.report}")
    say(format_summary(result))
    if args.json:
        print(json.dumps(result, indent=1))  # noqa: T201
    return 0 if result["ok"] else 1
