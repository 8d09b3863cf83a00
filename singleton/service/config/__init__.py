"""Configuration: ``singleton.toml``, then ``SINGLETON_*`` environment variables, then flags.

Everything is validated here, before anything connects; an error names the key, the value and
the rule (the CLI turns it into exit code 2). Shape (stable; users script against it)::

    backend = "redis"                       # or "mongo"
    redis_url = "redis://127.0.0.1:6379/0"
    mongo_url = "mongodb://127.0.0.1:27017/?replicaSet=rs0"
    es_url = "http://127.0.0.1:9200"
    namespace = "singleton"

    [lease]
    ttl = 15.0

    [[listeners]]
    use = "elasticsearch"                   # alias or "pkg.module:Class"
    name = "orders-to-es"
    database = "shop"
    collection = "orders"

    [[jobs]]
    use = "pkg.module:function"             # called as function(ctx)
    name = "report"                         # the job's lease name
    every = 1.0                             # seconds; or cron = "*/5 * * * *"
    coalesce = false
    misfire_grace = 30.0

Environment: ``SINGLETON_<KEY>`` for top-level keys, ``SINGLETON_<TABLE>__<KEY>`` for nested ones
(``SINGLETON_LEASE__TTL=5``).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from singleton.errors import ConfigurationError
from singleton.lease.timings import LeaseTimings
from singleton.redact import MASK, is_secret_parameter, redact
from singleton.service.config.tables import (
    JobConfig as JobConfig,
)
from singleton.service.config.tables import (
    ListenerConfig as ListenerConfig,
)
from singleton.service.config.tables import (
    _suggest,
    job_config,
    listener_config,
)
from singleton.service.config.urls import SCHEMES as URL_SCHEMES
from singleton.service.config.urls import check_url

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib  # type: ignore[import-not-found,unused-ignore]

ENV_PREFIX = "SINGLETON_"
#: Test-only switches, not configuration keys: the failover drill sets them on its replicas.
#: ``SINGLETON_UNSAFE_DISABLE_FENCING=1`` turns fencing off (the drill proves it then fails);
#: ``SINGLETON_AUDIT_FILE=PATH`` makes every runner append its evidence to PATH.
UNSAFE_ENV = "SINGLETON_UNSAFE_DISABLE_FENCING"
AUDIT_ENV = "SINGLETON_AUDIT_FILE"
NOT_CONFIG_ENV = frozenset({UNSAFE_ENV, AUDIT_ENV})


@dataclass(frozen=True)
class TestSwitches:
    """What the drill asks of a replica through its environment; never set in production."""

    unsafe_disable_fencing: bool = False
    audit_file: str | None = None

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> TestSwitches:
        return cls(
            unsafe_disable_fencing=environ.get(UNSAFE_ENV, "") not in ("", "0"),
            audit_file=environ.get(AUDIT_ENV) or None,
        )


BACKENDS = ("redis", "mongo")
LOG_FORMATS = ("text", "json")
LOG_LEVELS = ("TRACE", "DEBUG", "INFO", "SUCCESS", "WARNING", "ERROR", "CRITICAL")


@dataclass(frozen=True)
class LeaseConfig:
    ttl: float = 15.0
    renew_interval: float | None = None
    renew_deadline: float | None = None
    retry_interval: float = 2.0
    max_tenure: float | None = None
    cooldown: float | None = None

    def timings(self) -> LeaseTimings:
        """The validated timings (defaults derived from ``ttl``) within the service's
        :data:`TIMING_BOUNDS`; raises naming the values."""
        try:
            timings = LeaseTimings.of(
                self.ttl,
                self.renew_interval,
                self.renew_deadline,
                self.retry_interval,
                self.max_tenure,
                self.cooldown,
            )
            _within_bounds(timings)
        except ConfigurationError as exc:
            raise ConfigurationError(f"lease: {exc}") from None
        return timings


#: The service's bounds on ``[lease]`` timings, in seconds: key -> (least, most, why). Tighter
#: than :class:`~singleton.lease.timings.LeaseTimings`'s own, which tests and embedders may push
#: lower. ``max_tenure``'s least is a multiple of ttl (:data:`MIN_TENURE_TTLS`).
TIMING_BOUNDS: dict[str, tuple[float, float, str]] = {
    "ttl": (
        1.0,
        3600.0,
        "under 1 s one slow round trip or pause deposes a leader; over an hour a crashed"
        " leader blocks its lease that long",
    ),
    "renew_interval": (0.05, 3600.0, "at most 20 renewals a second per lease"),
    # 4 x the listener runner's stream poll (its max_await_time, 0.1 s): a leader waits at
    # most a quarter of its renew deadline for the stream before it looks at its lease again.
    "renew_deadline": (0.4, 3600.0, "4 x the listeners' 0.1 s stream poll"),
    "retry_interval": (0.05, 3600.0, "at most 20 contends a second per lease and follower"),
    "cooldown": (0.0, 3600.0, "a resigned replica comes back within an hour"),
}
#: ``max_tenure``, when set, is at least this many ttls: each rotation is a handover (a drain,
#: a release, the successor's start), and a tenure must have time to work between two.
MIN_TENURE_TTLS = 2.0
#: The most seconds ``shutdown_timeout`` (and so ``drain_timeout``) may be.
MAX_SHUTDOWN_TIMEOUT = 3600.0


def _within_bounds(timings: LeaseTimings) -> None:
    for key, (least, most, why) in TIMING_BOUNDS.items():
        value = getattr(timings, key)
        if not least <= value <= most:
            # (ttl is checked first: the values derived from it are then within bounds)
            raise ConfigurationError(
                f"{key} must be from {least:g} s to {most:g} s ({why}), got {value:.6g}"
            )
    tenure, least = timings.max_tenure, MIN_TENURE_TTLS * timings.ttl
    if tenure is not None and tenure < least:
        raise ConfigurationError(
            f"max_tenure must be unset or >= {MIN_TENURE_TTLS:g} x ttl ({least:g} s): each"
            f" rotation is a handover, and a tenure needs time to work between two; got"
            f" {tenure:.6g}"
        )


@dataclass(frozen=True)
class Config:
    backend: str = "redis"
    redis_url: str = "redis://127.0.0.1:6379/0"
    mongo_url: str = "mongodb://127.0.0.1:27017/"
    es_url: str = "http://127.0.0.1:9200"
    es_api_key: str | None = None
    es_ca_certs: str | None = None
    namespace: str = "singleton"
    identity: str | None = None
    checkpoint_store: str = "mongo"
    metrics_address: str | None = None
    log_format: str = "text"
    log_level: str = "INFO"
    shutdown_timeout: float = 10.0
    #: Seconds a planned handover (SIGTERM, rotation) gives the act in hand, the sink's requests
    #: in flight and the final checkpoint write before it releases anyway (capped by the
    #: lease's release_timeout): shorter hands over faster when a store or sink stalls, and the
    #: successor replays more.
    drain_timeout: float = 0.25
    #: Spread leases over the live replicas (singleton.balance.balancer); false: every replica
    #: contends.
    balance: bool = True
    lease: LeaseConfig = field(default_factory=LeaseConfig)
    listeners: tuple[ListenerConfig, ...] = ()
    jobs: tuple[JobConfig, ...] = ()

    def redacted(self) -> dict[str, Any]:
        """For logs and ``status``: every URL with its password replaced."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name.endswith("_url") and isinstance(value, str):
                value = redact(value)
            elif f.name == "es_api_key" and value:
                value = "***"
            elif f.name == "lease":
                value = {lf.name: getattr(value, lf.name) for lf in fields(value)}
            elif f.name == "listeners":  # a table's own URLs and keys may hold secrets too
                value = [_redacted(lc.as_table()) for lc in value]
            elif f.name == "jobs":
                # the table's keys, not what was built from them (the trigger)
                value = [
                    {jf.name: getattr(jc, jf.name) for jf in fields(jc) if jf.init} for jc in value
                ]
            out[f.name] = value
        return out


_TOP_TYPES: dict[str, tuple[type, ...]] = {
    "backend": (str,),
    "redis_url": (str,),
    "mongo_url": (str,),
    "es_url": (str,),
    "es_api_key": (str,),
    "es_ca_certs": (str,),
    "namespace": (str,),
    "identity": (str,),
    "checkpoint_store": (str,),
    "metrics_address": (str,),
    "log_format": (str,),
    "log_level": (str,),
    "shutdown_timeout": (float,),
    "drain_timeout": (float,),
    "balance": (bool,),
}
_LEASE_TYPES: dict[str, tuple[type, ...]] = {f.name: (float,) for f in fields(LeaseConfig)}
_TABLES = {"lease": _LEASE_TYPES}


def _coerce(where: str, value: Any, types: tuple[type, ...], from_text: bool) -> Any:
    if value is None:
        return None
    if bool in types:
        if not from_text and not isinstance(value, bool):
            raise ConfigurationError(f"{where} must be true or false, got {value!r}")
        text = str(value).lower() if from_text else value
        if text in (True, "true", "1", "yes"):
            return True
        if text in (False, "false", "0", "no"):
            return False
        raise ConfigurationError(f"{where} must be true or false, got {value!r}")
    if float in types:
        if from_text and isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                raise ConfigurationError(f"{where} must be a number, got {value!r}") from None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigurationError(f"{where} must be a number, got {value!r}")
        return float(value)
    if not isinstance(value, str):
        raise ConfigurationError(f"{where} must be a string, got {value!r}")
    return value


def _merge(target: dict[str, Any], source: Mapping[str, Any], origin: str, from_text: bool) -> None:
    for key, value in source.items():
        if key in _TABLES:
            if not isinstance(value, Mapping):
                raise ConfigurationError(f"{origin}: [{key}] must be a table, got {value!r}")
            table = target.setdefault(key, {})
            types = _TABLES[key]
            for sub, subvalue in value.items():
                if sub not in types:
                    raise ConfigurationError(
                        f"{origin}: unknown key {key}.{sub}{_suggest(sub, types)}"
                    )
                table[sub] = _coerce(f"{origin}: {key}.{sub}", subvalue, types[sub], from_text)
        elif key in ("listeners", "jobs"):
            if not isinstance(value, list) or not all(isinstance(v, Mapping) for v in value):
                raise ConfigurationError(f"{origin}: {key} must be an array of tables")
            target[key] = [dict(v) for v in value]
        elif key in _TOP_TYPES:
            target[key] = _coerce(f"{origin}: {key}", value, _TOP_TYPES[key], from_text)
        else:
            known = [*_TOP_TYPES, *_TABLES, "listeners", "jobs"]
            raise ConfigurationError(f"{origin}: unknown key {key!r}{_suggest(key, known)}")


def env_overrides(environ: Mapping[str, str]) -> dict[str, Any]:
    """``SINGLETON_REDIS_URL`` -> ``{"redis_url": ...}``; ``SINGLETON_LEASE__TTL`` -> nested."""
    out: dict[str, Any] = {}
    for name, value in environ.items():
        if not name.startswith(ENV_PREFIX) or name in NOT_CONFIG_ENV:
            continue
        key = name[len(ENV_PREFIX) :].lower()
        if "__" in key:
            table, sub = key.split("__", 1)
            out.setdefault(table, {})[sub] = value
        else:
            out[key] = value
    return out


def read_config_file(path: str | Path) -> dict[str, Any]:
    """The TOML of the file at ``path``, or :class:`ConfigurationError` saying why not."""
    p = Path(path)
    try:
        data: dict[str, Any] = tomllib.loads(p.read_text(encoding="utf-8"))
        return data
    except FileNotFoundError:
        raise ConfigurationError(f"config file {str(p)!r} does not exist") from None
    except IsADirectoryError:
        raise ConfigurationError(f"config file {str(p)!r} is a directory") from None
    except UnicodeDecodeError as exc:
        raise ConfigurationError(
            f"config file {str(p)!r} is not UTF-8 text (byte {exc.start}: {exc.reason})"
        ) from None
    except OSError as exc:
        raise ConfigurationError(f"config file {str(p)!r} cannot be read: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigurationError(f"config file {str(p)!r} is not valid TOML: {exc}") from None


#: Keys whose values are secrets whatever they look like.
_SECRET_KEYS = ("es_api_key", "api_key", "basic_auth")


def _redacted(value: Any) -> Any:
    """A table's ``value`` as it may be shown: what :func:`secret_keys` finds, hidden."""
    if isinstance(value, Mapping):
        return {
            k: MASK if v and (k in _SECRET_KEYS or is_secret_parameter(str(k))) else _redacted(v)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [_redacted(v) for v in value]
    return redact(value) if isinstance(value, str) else value


def secret_keys(data: Any, where: str = "") -> list[str]:
    """The keys of configuration ``data`` (a file's TOML) holding a secret: a URL with a
    password or a secret query parameter (what :func:`~singleton.redact.redact` would hide),
    ``es_api_key`` and the like, or any key named like a password; as ``listeners[0].es``."""
    found: list[str] = []
    if isinstance(data, Mapping):
        for key, value in data.items():
            name = f"{where}.{key}" if where else str(key)
            if value and (key in _SECRET_KEYS or is_secret_parameter(str(key))):
                found.append(name)
            else:
                found += secret_keys(value, name)
    elif isinstance(data, list):
        for n, value in enumerate(data):
            found += secret_keys(value, f"{where}[{n}]")
    elif isinstance(data, str) and redact(data) != data:
        found.append(where)
    return found


def load_config(
    path: str | Path | None = None,
    environ: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> Config:
    """File, then environment, then ``overrides`` (flags); later wins. Validates everything."""
    merged: dict[str, Any] = {}
    if path is not None:
        _merge(merged, read_config_file(path), str(path), from_text=False)
    if environ:
        _merge(merged, env_overrides(environ), "environment", from_text=True)
    if overrides:
        _merge(merged, {k: v for k, v in overrides.items() if v is not None}, "flags", True)
    return build_config(merged)


def build_config(merged: Mapping[str, Any]) -> Config:
    lease = LeaseConfig(**merged.get("lease", {}))
    lease.timings()
    listeners = []
    for i, table in enumerate(merged.get("listeners", [])):
        listeners.append(listener_config(i, table))
    jobs = tuple(job_config(i, table) for i, table in enumerate(merged.get("jobs", [])))
    names = [job.name for job in jobs]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ConfigurationError(f"job names must be unique, repeated: {', '.join(dupes)}")
    top = {k: v for k, v in merged.items() if k not in ("lease", "listeners", "jobs")}
    config = Config(**top, lease=lease, listeners=tuple(listeners), jobs=jobs)
    _validate(config)
    return config


def _choice(key: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ConfigurationError(
            f"{key} must be one of {', '.join(allowed)}, got {value!r}{_suggest(value, allowed)}"
        )


def _validate(config: Config) -> None:
    _choice("backend", config.backend, BACKENDS)
    _choice("checkpoint_store", config.checkpoint_store, BACKENDS)
    _choice("log_format", config.log_format, LOG_FORMATS)
    _choice("log_level", config.log_level.upper(), LOG_LEVELS)
    for key in URL_SCHEMES:
        check_url(key, getattr(config, key))
    if config.metrics_address not in (None, "", "off"):
        host, _, port = str(config.metrics_address).rpartition(":")
        if not host or not port.isdigit() or not 0 <= int(port) < 65536:
            raise ConfigurationError(
                f"metrics_address must be HOST:PORT or 'off', got {config.metrics_address!r}"
            )
    if not 0 < config.shutdown_timeout <= MAX_SHUTDOWN_TIMEOUT:
        raise ConfigurationError(
            f"shutdown_timeout must be > 0 and <= {MAX_SHUTDOWN_TIMEOUT:g} seconds (a stop must"
            f" end), got {config.shutdown_timeout!r}"
        )
    if not 0 < config.drain_timeout <= config.shutdown_timeout:
        raise ConfigurationError(
            f"drain_timeout must be > 0 and <= shutdown_timeout ({config.shutdown_timeout!r}), "
            f"got {config.drain_timeout!r}"
        )
    if config.identity is not None and "/" in config.identity:
        raise ConfigurationError(f"identity must not contain '/', got {config.identity!r}")
