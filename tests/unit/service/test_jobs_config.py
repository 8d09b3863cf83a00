"""``[[jobs]]`` in the service: validated before anything connects (exit 2 naming the key, the
value and the rule), resolved by the registry, hosted by a replica without listeners; and the
drill's verdict on a job's record."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from apscheduler.triggers.cron import CronTrigger

from singleton.errors import ConfigurationError
from singleton.service.cli import main
from singleton.service.config import load_config
from singleton.service.drill.jobs import check_job
from singleton.service.registry import job_function
from singleton.service.replica import Replica
from singleton.service.status import _job_entry
from singleton.testing import MemoryLeaseBackend

JOB = '[[jobs]]\nuse = "tests.integration.job_support:record"\nname = "report"\n'


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "singleton.toml"
    path.write_text(text)
    return path


def test_a_job_table_with_defaults(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, JOB + "every = 1\n"))
    [job] = config.jobs
    assert (job.name, job.every, job.cron, job.coalesce, job.misfire_grace) == (
        "report",
        1.0,
        None,
        False,
        30.0,
    )
    assert config.redacted()["jobs"][0]["name"] == "report"


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ("", "exactly one of every"),
        ('every = 1\ncron = "* * * * *"\n', "exactly one of every"),
        ("every = 0\n", "every must be a positive number"),
        ('every = "1"\n', "jobs[0].every must be a positive number of seconds, got '1'"),
        ('cron = "*/5 * * *"\n', "cron must be a crontab of 5 fields, got '*/5 * * *'"),
        ('cron = "* 25 * * *"\n', "not a valid crontab"),
        ("every = 1\ncoalesce = 1\n", "jobs[0].coalesce must be true or false, got 1"),
        ("every = 1\nmisfire_grace = 0\n", "jobs[0].misfire_grace must be a positive number"),
        ("every = 1\nmax_failures = -1\n", "jobs[0].max_failures must be an integer >= 0"),
        ("every = 1\nevry = 2\n", "unknown key jobs[0].evry (did you mean 'every'?)"),
    ],
)
def test_bad_job_tables_name_key_value_and_rule(tmp_path: Path, extra: str, message: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        load_config(write(tmp_path, JOB + extra))
    assert message in str(info.value)


def test_job_names_are_unique_and_use_names_a_function(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="repeated: report"):
        load_config(write(tmp_path, f"{JOB}every = 1\n{JOB}every = 2\n"))
    with pytest.raises(ConfigurationError, match=r"pkg\.module:function"):
        load_config(write(tmp_path, '[[jobs]]\nuse = "record"\nname = "r"\nevery = 1\n'))
    with pytest.raises(ConfigurationError, match="did you mean"):
        job_function("tests.integration.job_support:recrod")
    with pytest.raises(ConfigurationError, match="not a function"):
        job_function("tests.integration.job_support:Run")


def test_cli_exits_2_naming_the_bad_job(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, JOB + 'cron = "every minute"\n')
    assert main(["run", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert "jobs[0] (report)" in err and "'every minute'" in err


def test_a_replica_with_only_jobs_is_valid(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, JOB + "every = 1\n"))
    replica = Replica(config, backend=MemoryLeaseBackend())
    assert replica.jobs is not None and replica.jobs.names == ["report"]
    assert replica.status()["jobs"][0]["name"] == "report"
    assert replica.problems() == []
    with pytest.raises(ConfigurationError, match="no listeners or jobs"):
        Replica(load_config(write(tmp_path, "")), backend=MemoryLeaseBackend())


def test_the_trigger_is_built_once_when_the_config_is_read(tmp_path: Path) -> None:
    """The job's record carries its trigger: the scheduler schedules that very object, and
    ``singleton status`` walks it (no second parse of ``every`` / ``cron``)."""
    config = load_config(write(tmp_path, JOB + 'cron = "*/5 * * * *"\n'))
    [job] = config.jobs
    assert isinstance(job.trigger, CronTrigger)
    assert "trigger" not in config.redacted()["jobs"][0]  # not a key of the table
    replica = Replica(config, backend=MemoryLeaseBackend())
    assert replica.jobs is not None
    aps = replica.jobs.scheduler.get_job("report")
    assert aps is not None and aps.trigger is job.trigger
    entry = _job_entry(MemoryLeaseBackend(), job)  # what `singleton status` shows of it
    assert str(entry["next_fire"]).endswith(("0:00+00:00", "5:00+00:00"))


def test_a_job_function_with_the_wrong_signature_is_refused(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, '[[jobs]]\nuse = "os:getcwd"\nname = "r"\nevery = 1\n'))
    with pytest.raises(ConfigurationError, match="job 'r'"):
        Replica(config, backend=MemoryLeaseBackend())


def lines(tmp_path: Path, rows: list[tuple[int, int, str]]) -> Path:
    path = tmp_path / "runs.txt"
    path.write_text("".join(f"{f}|{t}|{who}\n" for f, t, who in rows))
    return path


@pytest.mark.parametrize(
    ("rows", "kinds", "failure"),
    [
        ([(1000, 1, "a"), (2000, 1, "a"), (3000, 2, "b")], ["kill"], None),
        ([(1000, 1, "a"), (2000, 1, "a"), (2000, 2, "b")], ["kill"], "ran twice"),
        ([(1000, 1, "a"), (3000, 2, "b")], ["kill"], "never ran"),
        ([(1000, 1, "a"), (3000, 2, "b")], ["kill", "lease-wipe"], None),  # skipped by design
        ([(1000, 2, "a"), (2000, 1, "b")], ["kill"], "decreased"),
        ([(1000, 1, "a"), (2000, 1, "b")], ["kill"], "more than one replica"),
        ([], ["kill"], "never ran"),
    ],
)
def test_the_drill_verdict_on_the_job(
    tmp_path: Path, rows: list[tuple[int, int, str]], kinds: list[str], failure: Any
) -> None:
    failures = check_job(lines(tmp_path, rows), kinds).failures()
    if failure is None:
        assert failures == []
    else:
        assert len(failures) == 1 and failure in failures[0], failures


def test_jobs_have_metrics(tmp_path: Path) -> None:
    from singleton.service.metrics import ReplicaCollector

    config = load_config(write(tmp_path, JOB + "every = 1\n"))
    replica = Replica(config, backend=MemoryLeaseBackend())
    samples = {
        s.name: s.value
        for family in ReplicaCollector(replica).collect()
        for s in family.samples
        if s.labels.get("job") == "report"
    }
    assert samples == {
        "singleton_job_runs_total": 0.0,
        "singleton_job_failures_total": 0.0,
        "singleton_job_missed_total": 0.0,
        "singleton_job_is_leader": 0.0,
    }  # no lateness until a call ran


def test_the_balancer_leaves_a_syncing_listener_where_it_is(tmp_path: Path) -> None:
    """The replica tells its balancer which leases are busy: a listener in its initial sync
    or a resync (``state == "syncing"``); any other state, or a job's lease, is movable."""

    def hosted(name: str, state: str) -> Any:
        status = SimpleNamespace(state=state)
        return SimpleNamespace(name=name, runner=SimpleNamespace(status=lambda: status))

    config = load_config(write(tmp_path, JOB + "every = 1\n"))
    replica = Replica(config, backend=MemoryLeaseBackend())
    replica.hosted = [hosted("orders", "syncing"), hosted("users", "streaming")]
    assert replica.balancer is not None
    assert replica.balancer.machine._is_busy("orders")
    assert not replica.balancer.machine._is_busy("users")
    assert not replica.balancer.machine._is_busy("report")  # a job's lease
