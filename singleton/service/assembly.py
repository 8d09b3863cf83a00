"""What the configuration makes: the leases its listeners hold, the listeners themselves (one
per partition), the scheduler of its jobs, and the start-up checks that need no running replica.

Not part of :mod:`singleton.service.replica`, because the replica is only one of its readers:
``singleton status`` and ``singleton dead-letters`` need the listeners' lease names without
building a listener (a listener's ``__init__`` is user code, and those commands must work from
any machine without running it), and ``singleton verify`` builds only the Elasticsearch ones.
The lease names are derived here once, by :func:`listener_name` and
:func:`~listeners.stream.partition.layout_names`; :func:`placed_listeners` builds each listener
under the name derived for it and refuses one whose ``__init__`` renamed itself, so what
``status`` reads is what the replica holds.
"""

from __future__ import annotations

import os
import re
import stat

from loguru import logger

from listeners.base import ChangeStreamListener
from listeners.elasticsearch import ElasticsearchSync
from listeners.stream.partition import Partition, layout_names
from singleton.balance.balancer import Balancer
from singleton.errors import ConfigurationError, SingletonError
from singleton.jobs.scheduler import LeaderScheduler
from singleton.lease.contract import LeaseBackend
from singleton.redact import redact
from singleton.service.config import Config, ListenerConfig, read_config_file, secret_keys
from singleton.service.config.urls import check_option_urls
from singleton.service.registry import job_function, listener_kind


def build_listener(lc: ListenerConfig, config: Config) -> ChangeStreamListener:
    """Instantiate a ``[[listeners]]`` table: every key but ``use`` is a keyword argument;
    the service settings its kind declares (Elasticsearch URL and credentials, lease ttl) fill
    in what the table did not set."""
    kind = listener_kind(lc.use)
    check_options(lc, kind.cls)
    options = dict(lc.options)
    for option, key in kind.service_options.items():
        table, _, sub = key.partition(".")
        value = getattr(getattr(config, table), sub) if sub else getattr(config, key)
        if option not in options and value is not None:
            options[option] = value
    try:
        return kind.cls(**options)
    except SingletonError:
        _require_database(lc, kind.cls)  # a missing database, said as where to add it
        raise
    except Exception as exc:  # a user's __init__ may raise anything: name the listener
        raise ConfigurationError(f"listener {lc.use!r}: {type(exc).__name__}: {exc}") from exc


def check_options(lc: ListenerConfig, cls: type[ChangeStreamListener]) -> None:
    """What the service refuses in a ``[[listeners]]`` table before the listener sees it: a URL
    of the table's own (``es = "https://..."``, maybe a list) that a parser would cut short or
    that holds a control character, and for an Elasticsearch listener an ``index`` that
    Elasticsearch would not take (refused, not rewritten)."""
    for option, value in lc.options.items():
        check_option_urls(f"listener {lc.use!r}: {option}", value)
    if issubclass(cls, ElasticsearchSync):
        templates = [("index", lc.options.get("index", cls.index))]
        tables = lc.options.get("collections")
        for name, table in tables.items() if isinstance(tables, dict) else ():
            if isinstance(table, dict) and "index" in table:
                templates.append((f"collections.{name}.index", table["index"]))
        for key, template in templates:
            why = index_template_problem(template) if isinstance(template, str) else None
            if why is not None:
                raise ConfigurationError(f"listener {lc.use!r}: {key} {template!r} {why}")


#: What Elasticsearch refuses in an index name (its rules, as of 7.0 and since).
_INDEX_FORBIDDEN = re.compile(r'[\\/*?"<>|,#: A-Z]')
_INDEX_RULES = (
    'Elasticsearch index names are lower case, hold none of \\ / * ? " < > | , # : or a space,'
    " do not start with - _ or +, are not . or .., and have at most 255 bytes"
)
_PLACEHOLDER = re.compile(r"\{(?:database|collection)\}")


def index_template_problem(template: str) -> str | None:
    """``None``, or why the index name ``template`` (with ``{database}`` and ``{collection}``)
    is one Elasticsearch would refuse, by what the template itself writes: the names it fills
    in are the listener's to make valid (lower-cased, as documented there)."""
    literal = _PLACEHOLDER.sub("x", template)
    bad = _INDEX_FORBIDDEN.search(literal)
    if literal in (".", "..") or len(literal.encode()) > 255:
        return f"is too long or reserved: {_INDEX_RULES}"
    if bad is None and not literal.startswith(("-", "_", "+")):
        return None
    if bad is None:
        what = f"a leading {literal[0]!r}"
    else:
        what = "upper case" if bad[0].isupper() else f"a {bad[0]!r}"
    pieces = [_INDEX_FORBIDDEN.sub("_", p.lower()) for p in _PLACEHOLDER.split(template)]
    names = [*_PLACEHOLDER.findall(template), ""]
    fixed = "".join(p + n for p, n in zip(pieces, names, strict=True)).lstrip("-_+")
    return f"has {what}: {_INDEX_RULES} (e.g. index = {fixed!r})"


def listener_name(lc: ListenerConfig) -> str:
    """The name a ``[[listeners]]`` table's listener goes by (its lease and checkpoint key when
    it has one partition): the table's ``name``, else its class's, else ``database.collection``
    (``database.*`` for a whole database), each option read from the table, else the class, as
    :class:`~listeners.base.ChangeStreamListener` names itself. Imports the class; never
    instantiates it."""
    cls = listener_kind(lc.use).cls
    check_options(lc, cls)

    def option(key: str) -> object:
        return lc.options[key] if key in lc.options else getattr(cls, key, None)

    name, database, collection = option("name"), option("database"), option("collection")
    if name is None:
        _require_database(lc, cls)
        return f"{database}.{collection or '*'}"
    if not isinstance(name, str) or not name:
        raise ConfigurationError(
            f"listener {lc.use!r}: name must be a non-empty string, got {name!r}"
        )
    return name


def _require_database(lc: ListenerConfig, cls: type[ChangeStreamListener]) -> None:
    """A listener watches one database: refuse a table that names none, saying where to."""
    database = lc.options.get("database", cls.database)
    if database is None:
        raise ConfigurationError(
            f'listener {lc.use!r} has no database to watch: add `database = "<name>"` to its'
            " [[listeners]] table (or `-o database=<name>` after --listener), or set `database`"
            " on the class"
        )
    if not isinstance(database, str) or not database:
        raise ConfigurationError(
            f"listener {lc.use!r}: database must be a database name, got {database!r}"
            " (in its [[listeners]] table or on its class, where singleton status reads it)"
        )


def lease_names(config: Config) -> list[str]:
    """Every configured listener's lease names, in order (``name.<i>-of-<K>`` for each of
    ``partitions = K``), without running any listener's code; they must be unique."""
    names = [n for lc in config.listeners for n in layout_names(listener_name(lc), lc.partitions)]
    _unique(names)
    return names


def build_listeners(config: Config) -> list[ChangeStreamListener]:
    """Every configured listener, one instance per partition (``partitions = K``); their lease
    names must be unique."""
    return [listener for listener, _ in placed_listeners(config)]


def placed_listeners(config: Config) -> list[tuple[ChangeStreamListener, ListenerConfig]]:
    """:func:`build_listeners`, each with the table it came from (for its placement keys), each
    under the lease name :func:`lease_names` gives it."""
    built: list[tuple[ChangeStreamListener, ListenerConfig]] = []
    for lc in config.listeners:
        table: list[tuple[ChangeStreamListener, ListenerConfig]] = []
        for i in range(lc.partitions):
            listener = build_listener(lc, config)
            if lc.partitions > 1:
                listener.partition = Partition(i, lc.partitions)
            table.append((listener, lc))
        # Derived after building, so that a user's __init__ that fails still says so first.
        expected = layout_names(listener_name(lc), lc.partitions)
        for (listener, _), lease in zip(table, expected, strict=True):
            if listener.lease_name != lease:
                raise ConfigurationError(
                    f"listener {lc.use!r} named itself {listener.lease_name!r} in __init__, but"
                    f" its table and class name it {lease!r}: set name in the table or on the"
                    " class (singleton status names leases without building listeners)"
                )
        built += table
    _unique([listener.lease_name for listener, _ in built])
    return built


def _unique(names: list[str]) -> None:
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ConfigurationError(f"listener names must be unique, repeated: {', '.join(dupes)}")


def build_scheduler(
    config: Config, backend: LeaseBackend, identity: str, gate: Balancer | None
) -> LeaderScheduler:
    """Every ``[[jobs]]`` table in one :class:`LeaderScheduler` (each job its own lease)."""
    scheduler = LeaderScheduler(
        backend, identity=identity, timings=config.lease.timings(), gate=gate
    )
    for job in config.jobs:
        scheduler.add_job(
            job_function(job.use),
            job.trigger,
            name=job.name,
            coalesce=job.coalesce,
            misfire_grace_time=job.misfire_grace,
            max_instances=job.max_instances,
            max_failures=job.max_failures,
        )
    return scheduler


def _redis_settings(redis_url: str, *names: str) -> dict[str, str] | None:
    """``CONFIG GET`` of each of ``names`` on the Redis of ``redis_url`` (under Sentinel, its
    current master), or ``None`` when it does not answer them: unreachable (the replica says so
    elsewhere), or a managed Redis / an ACL that hides ``CONFIG`` (given the benefit of the
    doubt, said at DEBUG)."""
    import redis

    from singleton.drivers.redis import client_from_url

    client = client_from_url(redis_url, socket_timeout=2, socket_connect_timeout=2)
    try:
        return {name: str(client.config_get(name).get(name, "")) for name in names}
    except redis.RedisError as exc:
        logger.debug("cannot read CONFIG {} of {}: {}", names, redact(redis_url), redact(str(exc)))
        return None
    finally:
        client.close()


def warn_without_persistence(redis_url: str) -> None:
    """A Redis checkpoint store that keeps nothing on disk loses every position on a restart:
    say so once at start-up."""
    found = _redis_settings(redis_url, "appendonly", "save")
    if found is not None and found["appendonly"] == "no" and not found["save"]:
        logger.warning(
            "checkpoint_store = redis, but {} keeps nothing on disk (appendonly no, no save "
            "points): a restart loses every checkpoint; enable appendonly or use the mongo store",
            redact(redis_url),
        )


def warn_evicting_policy(redis_url: str) -> None:
    """A Redis that evicts keys under memory pressure may drop a lease (a second leader), its
    fencing counter, a member's heartbeat or a checkpoint: every ``allkeys-*`` policy, and every
    ``volatile-*`` one too (lease and member keys carry a TTL). Say so once at start-up."""
    found = _redis_settings(redis_url, "maxmemory-policy", "maxmemory")
    policy = "" if found is None else found["maxmemory-policy"]
    if policy.startswith(("allkeys-", "volatile-")):
        limit = found["maxmemory"] if found else "?"
        limit = "maxmemory 0: no limit yet" if limit in ("", "0") else f"maxmemory {limit} bytes"
        logger.warning(
            "{} has maxmemory-policy {} ({}): under memory pressure it evicts lease, fencing,"
            " member and checkpoint keys (a lost lease key lets a second leader in); set"
            " maxmemory-policy noeviction on the Redis that holds singleton's keys",
            redact(redis_url),
            policy,
            limit,
        )


def warn_world_readable(path: str | None) -> None:
    """A configuration file that every user of the machine may read should hold no password:
    say so once at start-up, naming the keys that hold one (never their values)."""
    if path is None:
        return
    try:
        mode = os.stat(path).st_mode
        keys = secret_keys(read_config_file(path))
    except (OSError, ConfigurationError):
        return  # (read and refused by the configuration already, or gone since)
    if mode & stat.S_IROTH and keys:
        logger.warning(
            "config file {} is readable by every user of this machine (mode {:o}) and holds"
            " secrets in {}: chmod o-r it (600 or 640), or pass them in SINGLETON_* environment"
            " variables",
            path,
            stat.S_IMODE(mode),
            ", ".join(keys),
        )
