"""``singleton drill``: break the leader every way we know, prove nothing was lost, draw it.

N ``singleton run`` replicas mirror a collection into Elasticsearch with ElasticsearchSync while a
writer inserts, updates, replaces, deletes and commits transactions. Faults from a seeded
schedule hit whoever leads (:mod:`.faults`); after the last one the drill waits for quiescence
and judges (:mod:`.verdict`). Exit 0 only if every invariant holds, 1 if one does not, 2 on bad
arguments.

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
from singleton.service.drill.faults import KINDS, parse_kinds
from singleton.service.drill.run import Drill, DrillOptions
from singleton.timings import LeaseTimings

__all__ = ["Drill", "DrillOptions", "main"]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="singleton drill", description=__doc__.splitlines()[0])
    p.add_argument("--backend", default="redis", choices=("redis", "mongo"))
    p.add_argument("--replicas", type=int, default=3)
    p.add_argument("--rounds", type=int, default=20, help="number of faults (default 20)")
    p.add_argument(
        "--faults", help=f"comma-separated kinds (default: all that apply): {', '.join(KINDS)}"
    )
    p.add_argument("--seed", type=int, default=1, help="the schedule is a function of the seed")
    p.add_argument("--rate", type=float, default=40.0, help="writer operations per second")
    p.add_argument("--ttl", type=float, default=2.5, help="lease ttl in seconds (default 2.5)")
    p.add_argument("--json", action="store_true", help="print the result as JSON on stdout")
    p.add_argument("--report", metavar="FILE", help="write an HTML timeline here")
    p.add_argument("--workdir", help="keep schedule, logs and histories here")
    p.add_argument("--redis-url", help="use this Redis instead of an embedded one")
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
    kinds = parse_kinds(args.faults, args.backend)
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
        mongo_url=args.mongo_url,
        es_url=args.es_url,
        unsafe=args.unsafe_disable_fencing,
        timings=timings_for(args.ttl),
    )


def format_summary(result: dict[str, Any]) -> str:
    def sec(v: float | None) -> str:
        return "-" if v is None else f"{v * 1000:.0f}ms" if v < 1 else f"{v:.2f}s"

    lines = [
        f"verdict: {'PASS' if result['ok'] else 'FAIL'} ({result['faults']} faults, "
        f"{result['duration']:.0f}s, {result['writes']['ops']} writes, "
        f"{result['writes']['transactions']} transactions)",
        f"  documents: mongo {result['documents']['mongo']}, es {result['documents']['es']}; "
        f"missing {result['missing']}, stale {result['stale']}, resurrected "
        f"{result['resurrected']}, extra {result['extra']}",
        f"  checkpoint regressions {result['checkpoint_regressions']}, fencing violations "
        f"{result['fencing_violations']}, stalls {result['stalls']}",
        f"  scheduled job: {result['jobs']['runs']} runs, {result['jobs']['twice']} twice, "
        f"{result['jobs']['missing']} missing"
        f"{'' if result['jobs']['missing_fails'] else ' (skipping faults drilled)'}, token "
        f"regressions {result['jobs']['token_regressions']}",
        f"  writer-to-index lag: p50 {sec(result['lag']['p50'])}, p99 {sec(result['lag']['p99'])}, "
        f"max {sec(result['lag']['max'])}",
        "  takeover gap (the old tenure's last acknowledged write, or its release, to the next"
        " election):",
        "    fault            faults takeovers      p50      p99      max",
    ]
    for kind, g in result["gaps"].items():
        lines.append(
            f"    {kind:<16} {g['count']:>6} {g['takeovers']:>9} {sec(g['p50']):>8} "
            f"{sec(g['p99']):>8} {sec(g['max']):>8}"
        )
    lines += [f"  FAILED: {f}" for f in result["failures"]]
    if result.get("workdir"):
        lines.append(f"  schedule, logs and histories kept in {result['workdir']}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    from singleton.service.logs import setup_logging

    args = build_parser().parse_args(list(argv) if argv is not None else None)
    try:
        opts = options_from(args)
    except ConfigurationError as exc:
        print(f"singleton drill: error: {exc}", file=sys.stderr)  # noqa: T201
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
        say(f"singleton drill: failed: {exc}; workdir {drill.workdir}")
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
