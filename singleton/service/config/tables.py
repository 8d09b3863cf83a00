"""The workload of ``singleton.toml``: its ``[[listeners]]`` and ``[[jobs]]`` tables, each checked
on its own and turned into the record the service runs from (a job's record carries its trigger).

A module of its own because it is a different idea from the package's ``__init__``: there, the
service's settings and the file -> environment -> flags layering that fills them; here, arrays
of tables that are never layered, each validated against its own keys, and the records
(:class:`ListenerConfig`, :class:`JobConfig`) that the replica, ``status`` and ``verify`` read.

Besides a listener's own options, a ``[[listeners]]`` table takes the service's placement keys,
which never reach the listener: ``partitions`` (split its stream in K, each its own lease and
checkpoint: :mod:`listeners.stream.partition`), ``prefer`` (identities that should hold its
leases) and ``min_tenure`` (seconds a lease stays put before balancing may move it:
:mod:`singleton.balance.balancer`). ``[[jobs]]`` take ``prefer`` and ``min_tenure`` too.
``failure_budget`` (seconds a failing tenure of the listener retries in place before it fails and
resigns; default 60) is a listener option like ``max_retries`` and reaches the listener, but is
checked here too, so that a bad value is refused with its table's name before anything starts.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from singleton.errors import ConfigurationError

if TYPE_CHECKING:
    from apscheduler.triggers.base import BaseTrigger

#: Keys of a ``[[listeners]]`` table that the service takes for itself.
PLACEMENT_KEYS = ("partitions", "prefer", "min_tenure")
#: The most partitions one listener may have (as :data:`listeners.stream.partition.MAX_PARTITIONS`).
MAX_PARTITIONS = 1024


def _suggest(key: str, known: Any) -> str:
    near = difflib.get_close_matches(key, list(known), n=1)
    return f" (did you mean {near[0]!r}?)" if near else ""


@dataclass(frozen=True)
class ListenerConfig:
    """A ``[[listeners]]`` table: ``use``, the listener's own ``options``, and placement."""

    use: str
    options: Mapping[str, Any]
    partitions: int = 1
    prefer: tuple[str, ...] = ()
    min_tenure: float = 0.0

    def as_table(self) -> dict[str, Any]:
        """The table as written (placement keys only when set)."""
        table = {"use": self.use, **self.options}
        if self.partitions != 1:
            table["partitions"] = self.partitions
        if self.prefer:
            table["prefer"] = list(self.prefer)
        if self.min_tenure:
            table["min_tenure"] = self.min_tenure
        return table


def _prefer(where: str, value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise ConfigurationError(
            f"{where}.prefer must be a list of replica identities, got {value!r}"
        )
    return tuple(value)


def _min_tenure(where: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1e6:
        raise ConfigurationError(f"{where}.min_tenure must be seconds in [0, 1e6), got {value!r}")
    return float(value)


def _finite(where: str, value: Any) -> None:
    """Refuse an infinite or NaN number anywhere in a table (TOML writes them ``inf``, ``nan``):
    no option of a listener or a job means "forever" by one, and one reaching the arithmetic of
    a deadline or an interval fails there, at run time, or waits forever."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigurationError(f"{where} must be a finite number, got {value!r}")
    items = value.items() if isinstance(value, Mapping) else ()
    for key, sub in items:
        _finite(f"{where}.{key}", sub)
    for n, sub in enumerate(value if isinstance(value, list) else ()):
        _finite(f"{where}[{n}]", sub)


def listener_config(i: int, table: Mapping[str, Any]) -> ListenerConfig:
    """Check one ``[[listeners]]`` table's ``use`` and placement keys, and that its numbers are
    finite (the listener checks the rest when it is built)."""
    where = f"listeners[{i}]"
    _finite(where, table)
    use = table.get("use")
    if not isinstance(use, str) or not use:
        raise ConfigurationError(f"{where}.use must name a listener, got {use!r}")
    k = table.get("partitions", 1)
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_PARTITIONS:
        raise ConfigurationError(
            f"{where}.partitions must be an integer from 1 to {MAX_PARTITIONS}, got {k!r}"
        )
    budget = table.get("failure_budget", 1.0)
    if isinstance(budget, bool) or not isinstance(budget, (int, float)) or not budget > 0:
        raise ConfigurationError(f"{where}.failure_budget must be seconds > 0, got {budget!r}")
    options = {k: v for k, v in table.items() if k != "use" and k not in PLACEMENT_KEYS}
    return ListenerConfig(
        use,
        options,
        partitions=k,
        prefer=_prefer(where, table["prefer"]) if "prefer" in table else (),
        min_tenure=_min_tenure(where, table.get("min_tenure", 0.0)),
    )


@dataclass(frozen=True)
class JobConfig:
    """A ``[[jobs]]`` table: a leader-only scheduled job (see :mod:`singleton.jobs.scheduler`)."""

    use: str
    name: str
    every: float | None = None
    cron: str | None = None
    coalesce: bool = False
    misfire_grace: float = 30.0
    #: Consecutive calls that raise before the tenure fails (0: never).
    max_failures: int = 0
    #: APScheduler's max_instances: calls of this job that may run at once.
    max_instances: int = 1
    prefer: tuple[str, ...] = ()
    min_tenure: float = 0.0
    #: Built from ``every`` or ``cron`` once, here: the scheduler, ``singleton status`` and the
    #: checks all read this one (not a key of the table).
    trigger: BaseTrigger = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        from singleton.jobs.triggers import make_trigger

        object.__setattr__(self, "trigger", make_trigger(self.every, self.cron))


#: key -> (types, rule); ``use`` and ``name`` are checked apart.
_JOB_KEYS: dict[str, tuple[tuple[type, ...], str]] = {
    "use": ((str,), "a 'pkg.module:function'"),
    "name": ((str,), "a non-empty lease name"),
    "every": ((int, float), "a positive number of seconds"),
    "cron": ((str,), "a crontab of 5 fields"),
    "coalesce": ((bool,), "true or false"),
    "misfire_grace": ((int, float), "a positive number of seconds"),
    "max_failures": ((int,), "an integer >= 0"),
    "max_instances": ((int,), "an integer >= 1"),
    "prefer": ((list,), "a list of replica identities"),
    "min_tenure": ((int, float), "seconds in [0, 1e6)"),
}


def job_config(i: int, table: Mapping[str, Any]) -> JobConfig:
    """Check one ``[[jobs]]`` table, naming the key, the value and the rule."""
    _finite(f"jobs[{i}]", table)
    for key, value in table.items():
        if key not in _JOB_KEYS:
            raise ConfigurationError(f"unknown key jobs[{i}].{key}{_suggest(key, _JOB_KEYS)}")
        types, rule = _JOB_KEYS[key]
        if (isinstance(value, bool) and bool not in types) or not isinstance(value, types):
            raise ConfigurationError(f"jobs[{i}].{key} must be {rule}, got {value!r}")
    for key in ("use", "name"):
        if not table.get(key):
            raise ConfigurationError(
                f"jobs[{i}].{key} must be {_JOB_KEYS[key][1]}, got {table.get(key)!r}"
            )
    if ":" not in table["use"]:
        raise ConfigurationError(
            f"jobs[{i}].use must be a 'pkg.module:function', got {table['use']!r}"
        )
    values: dict[str, Any] = {
        k: float(v) if k in ("every", "misfire_grace") else v for k, v in table.items()
    }
    if "prefer" in values:
        values["prefer"] = _prefer(f"jobs[{i}]", values["prefer"])
    if "min_tenure" in values:
        values["min_tenure"] = _min_tenure(f"jobs[{i}]", values["min_tenure"])
    try:
        job = JobConfig(**values)
    except ConfigurationError as exc:  # the trigger's: name the job
        raise ConfigurationError(f"jobs[{i}] ({values['name']}): {exc}") from None
    for key, least in (("misfire_grace", 0), ("max_failures", 0), ("max_instances", 1)):
        value = getattr(job, key)
        if value < least or (key == "misfire_grace" and value == 0):
            raise ConfigurationError(f"jobs[{i}].{key} must be {_JOB_KEYS[key][1]}, got {value!r}")
    return job
