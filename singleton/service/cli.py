"""The ``singleton`` command: run, status, verify, dead-letters, demo, drill.

Exit codes: 0 success; 1 a verdict failed or the service failed at run time; 2 bad input (the
message names the key, the value and the rule).
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import fields
from typing import Any

from bson import json_util
from loguru import logger

import singleton
from singleton.errors import ConfigurationError, SingletonError
from singleton.redact import redact
from singleton.service.config import Config, LeaseConfig, TestSwitches, load_config
from singleton.service.imports import own_packages_first, use_app_dir

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2

TOP_FLAGS = (
    *("backend", "redis_url", "mongo_url", "es_url", "namespace", "identity"),
    *("checkpoint_store", "metrics_address", "log_format", "log_level"),
)
LEASE_FLAGS = tuple(f.name for f in fields(LeaseConfig))
#: flag -> config key (top level or "table.key")
FLAG_KEYS = {**{k: k for k in TOP_FLAGS}, **{k: f"lease.{k}" for k in LEASE_FLAGS}}


def _common(p: argparse.ArgumentParser) -> None:
    _connection(p)
    _listener_flags(p)


def _config_file(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", "-c", help="singleton.toml (default: $SINGLETON_CONFIG)")
    p.add_argument(
        "--app-dir",
        default=".",
        help="import 'module:Class' listeners from here first (default: the current directory)",
    )


def _connection(p: argparse.ArgumentParser) -> None:
    """The configuration file and what overrides it: stores, namespace, timings, logs."""
    _config_file(p)
    p.add_argument("--backend", help="lease store: redis or mongo")
    p.add_argument("--redis-url")
    p.add_argument("--mongo-url")
    p.add_argument("--es-url")
    p.add_argument("--namespace")
    p.add_argument("--identity", help="this replica's name (default: host-pid)")
    p.add_argument("--checkpoint-store", help="mongo (default) or redis")
    p.add_argument("--metrics-address", help="HOST:PORT for /metrics, /healthz, /readyz; 'off'")
    p.add_argument("--log-format", help="text or json")
    p.add_argument("--log-level")
    for key in LEASE_FLAGS:
        p.add_argument("--" + key.replace("_", "-"), dest=key, help=f"lease {key} in seconds")


def _listener_flags(p: argparse.ArgumentParser) -> None:
    # One ordered list, so that each --option applies to the --listener before it.
    p.add_argument(
        "--listener",
        dest="listener_items",
        action="append",
        type=lambda v: ("use", v),
        default=[],
        metavar="USE",
        help="add a listener: alias (elasticsearch, logging) or pkg.module:Class",
    )
    p.add_argument(
        "--option",
        "-o",
        dest="listener_items",
        action="append",
        type=lambda v: ("option", v),
        metavar="KEY=VALUE",
        help="an option for the --listener before it (repeatable)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="singleton", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"%(prog)s {singleton.__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run one replica")
    _common(run)
    status = sub.add_parser("status", help="who leads each lease; where each checkpoint stands")
    _common(status)
    status.add_argument("--json", action="store_true")
    status.add_argument("--lease", action="append", default=[], help="also show this lease")
    verify = sub.add_parser(
        "verify", help="compare each Elasticsearch index with its collection (--repair fixes)"
    )
    _connection(verify)
    verify.add_argument("--listener", dest="listener_name", metavar="NAME", help="only this one")
    verify.add_argument("--repair", action="store_true", help="fix with versioned writes")
    verify.add_argument(
        "--sample", type=int, metavar="N", help="check N random documents (no extra-id check)"
    )
    verify.add_argument("--json", action="store_true")
    dev = sub.add_parser(
        "dev-servers", help="Redis, MongoDB and Elasticsearch stand-ins to point `run` at"
    )
    dev.add_argument("--write-config", metavar="FILE", help="write a ready singleton.toml here")
    letters = sub.add_parser(
        "dead-letters", help="list, replay or purge what a listener could not handle"
    )
    letters.add_argument("action", choices=("list", "replay", "purge"))
    _config_file(letters)  # dead letters live in MongoDB, in the namespace's database
    letters.add_argument("--mongo-url")
    letters.add_argument("--namespace")
    letters.add_argument("--listener", dest="listener_name", metavar="NAME", required=True)
    letters.add_argument("--json", action="store_true")
    demo = sub.add_parser("demo", help="the whole thing on embedded servers, with a verdict")
    demo.add_argument("--duration", type=float, default=45.0, help="seconds (default 45)")
    demo.add_argument("--replicas", type=int, default=3)
    demo.add_argument("--backend", default="redis", help="redis or mongo")
    demo.add_argument("--workdir", help="keep logs and data here (default: a temp dir)")
    demo.add_argument("--quiet", action="store_true", help="no live status lines")
    drill = sub.add_parser("drill", help="inject failures and prove nothing was lost")
    drill.add_argument("args", nargs=argparse.REMAINDER)
    return parser


def _parse_value(text: str) -> Any:
    """``-o batch_size=100`` -> 100; TOML value syntax where it parses, else the raw string."""
    from singleton.service.config import tomllib  # type: ignore[attr-defined]

    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def config_from_args(args: argparse.Namespace, environ: dict[str, str] | None = None) -> Config:
    use_app_dir(getattr(args, "app_dir", None) or ".")  # your own modules resolve by name
    overrides: dict[str, Any] = {}
    for dest, key in FLAG_KEYS.items():
        value = getattr(args, dest, None)
        if value is None:
            continue
        table, _, sub = key.partition(".")
        if sub:
            overrides.setdefault(table, {})[sub] = value
        else:
            overrides[table] = value
    listeners: list[dict[str, Any]] = []
    for kind, item in getattr(args, "listener_items", []):
        if kind == "use":
            listeners.append({"use": item})
            continue
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigurationError(f"--option must be KEY=VALUE, got {item!r}")
        if not listeners:
            raise ConfigurationError(f"--option {item!r} needs a --listener before it")
        listeners[-1][key] = _parse_value(value)
    if listeners:
        overrides["listeners"] = listeners
    env = dict(os.environ) if environ is None else environ
    path = config_path(args, env)
    env.pop("SINGLETON_CONFIG", None)
    return load_config(path, env, overrides)


def config_path(args: argparse.Namespace, environ: Mapping[str, str]) -> str | None:
    """The configuration file: ``--config``, else ``$SINGLETON_CONFIG``, else none."""
    return getattr(args, "config", None) or environ.get("SINGLETON_CONFIG") or None


#: Seconds past the replica's stop deadline that the interpreter's exit may take (it joins the
#: threads still running: a sink's request that will never be answered would hold it).
EXIT_GRACE = 0.3
#: Set by ``run`` once its replica stopped: the command's process exits by then (:func:`entry`).
_exit_deadline: float | None = None


def _exit_by(deadline: float, code: int) -> None:
    """Let the interpreter exit as usual, but not past ``deadline`` (monotonic): then end the
    process with ``code``. What was still in flight is unacknowledged: the successor replays
    it, and the lease was already released."""

    def force() -> None:
        logger.warning(
            "exiting without waiting for {} thread(s) still waiting on a sink or store"
            " (shutdown_timeout): what they had in flight is unacknowledged, the successor"
            " replays it",
            threading.active_count() - 1,
        )
        logger.complete()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)

    timer = threading.Timer(max(0.0, deadline - time.monotonic()), force)
    timer.daemon = True  # (runs while the interpreter joins the others at its exit)
    timer.start()


def cmd_run(args: argparse.Namespace) -> int:
    from singleton.service.assembly import warn_world_readable
    from singleton.service.logs import setup_logging
    from singleton.service.metrics import MetricsServer
    from singleton.service.replica import Replica

    config = config_from_args(args)
    setup_logging(config.log_format, config.log_level, config.identity)
    warn_world_readable(config_path(args, os.environ))
    replica = Replica(config, switches=TestSwitches.from_environ(os.environ))
    metrics = None
    if config.metrics_address not in (None, "", "off"):
        assert config.metrics_address is not None
        try:
            metrics = MetricsServer(replica, config.metrics_address).start()
        except OSError as exc:
            raise ConfigurationError(_unservable(config.metrics_address, exc)) from None
        logger.info("serving /metrics, /healthz, /readyz and /status at {}", metrics.url)
    try:
        code = replica.run()
    finally:
        if metrics is not None:
            metrics.stop()
    global _exit_deadline
    if replica.stop_deadline is not None:  # shutdown_timeout holds, through the exit too
        _exit_deadline = replica.stop_deadline + EXIT_GRACE
    return code


def _unservable(address: str, exc: OSError) -> str:
    why = f"metrics_address {address!r} cannot be served: {exc.strerror}"
    if exc.errno != errno.EADDRINUSE:
        return why
    return (
        f"{why} (another replica on this machine?): give each replica its own port with"
        " --metrics-address HOST:PORT (or SINGLETON_METRICS_ADDRESS), or set"
        ' metrics_address = "127.0.0.1:0" to take a free one (each replica logs its URL)'
    )


def cmd_status(args: argparse.Namespace) -> int:
    from singleton.service.status import cluster_status, describe_store, format_status, store_entry

    config = config_from_args(args)
    for name in args.lease:
        if not name:
            raise ConfigurationError(f"--lease must name a lease, got {name!r}")
    path = config_path(args, os.environ)
    if path is None and not (config.listeners or config.jobs or args.lease):
        print(  # noqa: T201
            "singleton: note: no --config (nor $SINGLETON_CONFIG), so no listeners or jobs:"
            f" reading the lease store {describe_store(store_entry(config, None))}; pass"
            " --config singleton.toml to see yours",
            file=sys.stderr,
        )
    status = cluster_status(config, args.lease, config_file=path)
    print(json.dumps(status, default=str) if args.json else format_status(status))  # noqa: T201
    return EXIT_FAILED if status["errors"] else EXIT_OK


def cmd_verify(args: argparse.Namespace) -> int:
    """Exit 0 when every index equals its collection (after the repair, with --repair)."""
    from singleton.service.verify import verify

    config = config_from_args(args)
    reports = verify(config, args.listener_name, repair=args.repair, sample=args.sample)
    if args.repair and not all(r.ok for r in reports):
        repaired = {(r.listener, r.index): r for r in reports}
        # what the repair left, if anything
        reports = verify(config, args.listener_name, sample=args.sample)
        for r in reports:
            r.repaired = repaired[r.listener, r.index].repaired
            r.refused_as_newer = repaired[r.listener, r.index].refused_as_newer
    if args.json:
        print(json.dumps([r.as_dict() for r in reports]))  # noqa: T201
    else:
        for r in reports:
            print(_verify_line(r))  # noqa: T201
    return EXIT_OK if all(r.ok for r in reports) else EXIT_FAILED


def _verify_line(r: Any) -> str:
    head = f"{r.listener} -> {r.index}: {r.documents} documents, {r.indexed} indexed"
    if r.repaired or r.refused_as_newer:
        head += f"; repaired {r.repaired} ({r.refused_as_newer} already newer)"
    if r.ok:
        return head + ": equal"
    parts = [
        f"\n  {kind} {len(ids)}: {', '.join(ids[:20])}{' ...' if len(ids) > 20 else ''}"
        for kind, ids in (("missing", r.missing), ("stale", r.stale), ("extra", r.extra))
        if ids
    ]
    return head + ": NOT equal" + "".join(parts)


def cmd_dead_letters(args: argparse.Namespace) -> int:
    """``list`` prints them; ``replay`` marks them for the running leader, which re-delivers
    them through the listener's path (with their original versions); ``purge`` deletes them."""
    from listeners.deadletters import DeadLetterStore
    from singleton.drivers import mongo
    from singleton.service.assembly import lease_names

    config = config_from_args(args)
    names = lease_names(config)
    if args.listener_name not in names:
        raise ConfigurationError(
            f"--listener {args.listener_name!r} is not configured; configured: {', '.join(names)}"
        )
    client, _ = mongo.client(config.mongo_url, mongo.Timeouts.COMMAND)
    store = DeadLetterStore(client, database=config.namespace)
    try:
        if args.action == "list":
            letters = store.letters(args.listener_name)
            if args.json:
                print(json_util.dumps(letters))  # noqa: T201
            for letter in [] if args.json else letters:
                print(  # noqa: T201
                    f"{letter['_id']['key']!r}: {letter.get('reason')} (status "
                    f"{letter.get('status')}, {letter.get('attempts')} attempts, first "
                    f"{letter.get('first_seen')}, last {letter.get('last_seen')})"
                    f"{' [replay requested]' if letter.get('replay') else ''}"
                )
            return EXIT_OK
        count = (store.request_replay if args.action == "replay" else store.purge)(
            args.listener_name
        )
        done = "marked for replay by the leader" if args.action == "replay" else "purged"
        print(f"{count} dead letters of {args.listener_name} {done}")  # noqa: T201
        return EXIT_OK
    finally:
        client.close()


def cmd_dev_servers(args: argparse.Namespace) -> int:
    from singleton.service.dev.servers import run_dev_servers

    return run_dev_servers(
        lambda text: print(text, flush=True),  # noqa: T201
        write_config=args.write_config,
        stop=None,
    )


def cmd_demo(args: argparse.Namespace) -> int:
    from singleton.service.dev.demo import run_demo

    return int(
        run_demo(
            duration=args.duration,
            replicas=args.replicas,
            backend=args.backend,
            workdir=args.workdir,
            live=not args.quiet,
        )
    )


def cmd_drill(args: argparse.Namespace) -> int:
    from singleton.service.drill.cli import main as drill_main

    rest = list(args.args)
    return int(drill_main(rest[1:] if rest[:1] == ["--"] else rest))


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["drill"]:  # the drill parses its own flags (argparse.REMAINDER cannot)
        argv = ["drill", "--", *argv[1:]]
    args = parser.parse_args(argv)
    handlers = {
        "run": cmd_run,
        "status": cmd_status,
        "verify": cmd_verify,
        "dead-letters": cmd_dead_letters,
        "dev-servers": cmd_dev_servers,
        "demo": cmd_demo,
        "drill": cmd_drill,
    }
    try:
        own_packages_first()  # before any handler imports them
        return int(handlers[args.command](args))
    except ConfigurationError as exc:
        print(f"singleton: error: {redact(str(exc))}", file=sys.stderr)  # noqa: T201
        return EXIT_USAGE
    except SingletonError as exc:
        print(f"singleton: failed: {redact(str(exc))}", file=sys.stderr)  # noqa: T201
        return EXIT_FAILED
    except KeyboardInterrupt:
        return 130


def entry() -> None:
    """The ``singleton`` command: :func:`main`, then an exit that ``run``'s deadline bounds
    (:func:`main` alone, called in-process, never ends the process)."""
    code = main()
    if _exit_deadline is not None:
        _exit_by(_exit_deadline, code)
    raise SystemExit(code)


if __name__ == "__main__":
    entry()
