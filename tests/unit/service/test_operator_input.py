"""Operator input (#32): what an operator writes is refused with exit 2 before anything connects,
naming the value and the fix, and no password is shown on the way, whatever it holds.

The stores' URLs point at a server that accepts connections and never answers, so a command
that connected before refusing would hang for its timeouts: each refusal must come within a
second."""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from singleton.errors import ConfigurationError
from singleton.lease.redis import RedisLeaseBackend
from singleton.lease.timings import LeaseTimings
from singleton.service.assembly import index_template_problem
from singleton.service.cli import main
from singleton.service.config import TIMING_BOUNDS, load_config, secret_keys
from singleton.service.status import describe_store, store_entry

SECRET = "SECRETtail"


@pytest.fixture
def silent() -> Iterator[str]:
    """``host:port`` of a server that takes connections (the kernel's backlog) and never
    answers."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(64)
        yield f"127.0.0.1:{sock.getsockname()[1]}"


@pytest.fixture(autouse=True)
def _no_singleton_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("SINGLETON_"):
            monkeypatch.delenv(name)


def _stores(silent: str) -> list[str]:
    return ["--redis-url", f"redis://{silent}/0", "--mongo-url", f"mongodb://{silent}/"]


def _es_config(tmp_path: Path, *lines: str) -> str:
    """A configuration file with one Elasticsearch listener (and ``lines`` in its table)."""
    path = tmp_path / "singleton.toml"
    table = ["[[listeners]]", 'use = "elasticsearch"', 'database = "shop"', 'collection = "o"']
    path.write_text("\n".join([*table, *lines, ""]))
    return str(path)


def _refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """Run ``singleton ARGV`` in this process: exit 2 within a second; its stderr."""
    start = time.monotonic()
    assert main(argv) == 2, capsys.readouterr()
    took = time.monotonic() - start
    err = capsys.readouterr().err
    assert took < 1.0, f"refused after {took:.1f}s: connected first? {err}"
    assert "Traceback" not in err
    return err


# -- passwords that a parser would cut, split or print -----------------------------------------
@pytest.mark.parametrize(
    ("argv", "fix"),
    [
        # es_url is a comma-separated list: a raw comma in a password started a "URL"
        (["--es-url", f"http://elastic:Ab9Kx,{SECRET}@search:9200"], "`,` as %2C"),
        (["--es-url", f"http://a:9200,https://elastic:Ab9Kx,{SECRET}@b:9200"], "`,` as %2C"),
        # a raw & in a query secret started a "parameter" named after the rest of it
        (
            ["--redis-url", f"redis+sentinel://s1:26379/mymaster?sentinel_password=Ab9Kx&{SECRET}"],
            "`&` as %26",
        ),
        (
            ["--redis-url", f"redis+sentinel://s1/mymaster?sentinel_password=Ab9Kx&{SECRET}=x"],
            "`&` as %26",
        ),
        (["--redis-url", f"redis://cache:6379/0?password=Ab9Kx&{SECRET}=1"], "`&` as %26"),
        # a line end, a tab, another control character: refused without the value at all
        (["--redis-url", f"redis://:Ab9Kx\n{SECRET}@cache:6379/0"], "line end (%0A)"),
        (["--redis-url", f"redis+sentinel://s1/m?sentinel_password=Ab9Kx\n{SECRET}"], "%0A"),
        (["--mongo-url", f"mongodb://app:Ab9Kx\t{SECRET}@db/"], "tab (%09)"),
        (["--es-url", f"http://elastic:Ab9Kx\r{SECRET}@search:9200"], "carriage return"),
        (["--mongo-url", f"mongodb://app:Ab9Kx\x07{SECRET}@db/"], "U+0007"),
    ],
)
def test_a_password_a_parser_would_split_is_refused_unshown(
    argv: list[str], fix: str, capsys: pytest.CaptureFixture[str], silent: str
) -> None:
    for command in ("status", "run"):
        err = _refused([command, *_stores(silent), *argv, "--listener", "logging"], capsys)
        assert "Ab9Kx" not in err and SECRET not in err, err
        assert fix in err, err


def test_a_raw_space_in_a_query_secret_is_hidden_with_the_rest_of_it() -> None:
    """Accepted (the Sentinel parser reads the value whole), and hidden whole wherever the URL
    is shown: the configuration view, ``status``'s store line, the backend's description."""
    url = f"redis+sentinel://s1:26379/mymaster?sentinel_password=Ab9Kx {SECRET}"
    config = load_config(
        environ={"SINGLETON_REDIS_URL": url, "SINGLETON_CHECKPOINT_STORE": "redis"}
    )
    store = store_entry(config, None)
    backend = RedisLeaseBackend(url)
    try:
        shown = [json.dumps(config.redacted()), json.dumps(store), describe_store(store)]
        shown.append(backend.describe())
    finally:
        backend.close()
    for text in shown:
        assert SECRET not in text and "Ab9Kx" not in text, text
        assert "sentinel_password=***" in text, text


# -- accepted or a traceback before: now exit 2, naming the value and the fix -----------------
@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        (["--mongo-url", "mongodb://db/?bogusOption=1"], {}, "unknown option 'bogusOption'"),
        (
            ["--mongo-url", "mongodb+srv://db.example/?replicaSt=rs0"],
            {},
            "did you mean 'replicaset'?",
        ),
        (["--ttl", "999999"], {}, "ttl must be from 1 s to 3600 s"),
        (["--ttl", "0.001"], {}, "ttl must be from 1 s to 3600 s"),
        (["--renew-interval", "0.002"], {}, "renew_interval must be from 0.05 s"),
        (["--max-tenure", "0.001"], {}, "max_tenure must be unset or >= 2 x ttl (30 s)"),
        (["--retry-interval", "inf"], {}, "retry_interval must be a finite number"),
        ([], {"SINGLETON_SHUTDOWN_TIMEOUT": "inf"}, "shutdown_timeout must be > 0 and <= 3600"),
        ([], {"SINGLETON_DRAIN_TIMEOUT": "inf"}, "drain_timeout must be > 0 and <= shutdown"),
        (["--es-url", "http://a:9200,b:9200"], {}, "URL 2 of 2 in 'http://a:9200,b:9200'"),
    ],
)
def test_bad_settings_exit_2_before_connecting(
    argv: list[str],
    env: dict[str, str],
    message: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    silent: str,
    tmp_path: Path,
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    config = ["--config", _es_config(tmp_path)]
    for command in ("status", "verify", "run"):
        err = _refused([command, *config, *_stores(silent), *argv], capsys)
        assert message in err, (command, err)


@pytest.mark.parametrize(
    ("option", "message"),
    [
        ("gc_safety_factor = inf", "listeners[0].gc_safety_factor must be a finite number"),
        ("request_timeout = nan", "listeners[0].request_timeout must be a finite number"),
        ('index = "ord*ers"', "index 'ord*ers' has a '*': Elasticsearch index names are lower"),
        ('index = "Orders"', "(e.g. index = 'orders')"),
        ('index = "_{collection}"', "has a leading '_'"),
        ('name = ""', "name must be a non-empty string, got ''"),
    ],
)
def test_bad_listener_options_exit_2_before_connecting(
    option: str, message: str, capsys: pytest.CaptureFixture[str], silent: str, tmp_path: Path
) -> None:
    """An infinite number in a table (every tenure failed with OverflowError), an index name
    Elasticsearch refuses (rewritten silently before: ``ord*ers`` became ``ord_ers``)."""
    config = ["--config", _es_config(tmp_path, option)]
    for command in ("status", "verify", "run"):
        err = _refused([command, *config, *_stores(silent)], capsys)
        assert message in err, (command, err)


@pytest.mark.parametrize(
    ("option", "message"),
    [
        ("sample_interval = -1", "sample_interval must be seconds >= 0"),
        ("sample_size = 0", "sample_size must be an integer >= 1"),
    ],
)
def test_bad_options_of_the_listener_class_exit_2_before_run_or_verify_connects(
    option: str, message: str, capsys: pytest.CaptureFixture[str], silent: str, tmp_path: Path
) -> None:
    """``run`` and ``verify`` build the listeners (and so check the class's own options)
    before they connect; ``status`` builds none, so that it works without the application's
    code (it reads leases and checkpoints by the names the configuration gives)."""
    config = ["--config", _es_config(tmp_path, option)]
    for command in ("verify", "run"):
        err = _refused([command, *config, *_stores(silent)], capsys)
        assert message in err, (command, err)


def test_an_empty_lease_name_exits_2_before_connecting(
    capsys: pytest.CaptureFixture[str], silent: str
) -> None:
    err = _refused(["status", *_stores(silent), "--lease", ""], capsys)
    assert "--lease must name a lease, got ''" in err


def test_an_infinite_job_number_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "jobs.toml"
    path.write_text('[[jobs]]\nuse = "os:getcwd"\nname = "j"\nevery = inf\n')
    err = _refused(["run", "--config", str(path)], capsys)
    assert "jobs[0].every must be a finite number, got inf" in err


# -- the bounds ---------------------------------------------------------------------------------
def test_the_service_bounds_hold_the_projects_own_timings() -> None:
    """The drill's, the demo's and the process tests' timings are within the bounds; the
    library keeps its own lower ones (a test elects with ttl 1.2 s and renews every 0.1 s)."""
    from singleton.service.config import LeaseConfig
    from singleton.service.drill.cli import timings_for

    for t in (timings_for(1.5), LeaseConfig(4.0, 1.0, 2.5, 0.5).timings()):
        for key, (least, most, _) in TIMING_BOUNDS.items():
            assert least <= getattr(t, key) <= most, (key, t)
    LeaseTimings.of(1.2, 0.1, 0.6, 0.05, max_tenure=0.5)
    with pytest.raises(ConfigurationError, match=r"lease: renew_interval must be from 0\.05 s"):
        LeaseConfig(1.2, 0.01, 0.6).timings()


def test_the_renew_deadline_bound_is_four_listener_polls() -> None:
    from listeners.runtime.runner import RunnerSettings

    assert TIMING_BOUNDS["renew_deadline"][0] == 4 * RunnerSettings.max_await_time


@pytest.mark.parametrize("value", [float("inf"), float("-inf"), float("nan")])
@pytest.mark.parametrize(
    "key", ["ttl", "renew_interval", "renew_deadline", "retry_interval", "max_tenure", "cooldown"]
)
def test_the_library_refuses_non_finite_timings(key: str, value: float) -> None:
    with pytest.raises(ConfigurationError, match=f"{key} must be a finite number|ttl must be <"):
        LeaseTimings.of(**{key: value})


def test_an_index_template_is_judged_by_what_it_writes() -> None:
    assert index_template_problem("{database}.{collection}") is None
    assert index_template_problem("orders-{collection}") is None
    for bad in ("ord*ers", "a b", "a,b", "a:b", "A", "-x", "+x", ".", "..", "x" * 256):
        assert index_template_problem(bad) is not None, bad


def test_secret_keys_name_where_a_file_holds_secrets_never_what() -> None:
    data = {
        "redis_url": "redis://:pw@h/0",
        "mongo_url": "mongodb://h/?authMechanismProperties=AWS_SESSION_TOKEN:x",
        "es_url": "http://h:9200",
        "es_api_key": "k",
        "listeners": [{"use": "elasticsearch", "es": "http://u:p@h", "password": "x", "name": "a"}],
    }
    assert secret_keys(data) == [
        "redis_url",
        "mongo_url",
        "es_api_key",
        "listeners[0].es",
        "listeners[0].password",
    ]
    assert secret_keys({"redis_url": "redis://h/0", "namespace": "ns"}) == []


def test_the_configuration_view_hides_a_listener_tables_own_secrets() -> None:
    """``Config.redacted()`` (what logs and ``status`` may show) showed a table's own ``es`` URL
    and ``api_key`` as written."""
    from singleton.service.config import build_config

    table = {"use": "elasticsearch", "database": "d", "collection": "c"}
    table |= {"es": f"http://u:{SECRET}@h:9200", "api_key": SECRET, "basic_auth": ["u", SECRET]}
    [shown] = build_config({"listeners": [table]}).redacted()["listeners"]
    assert SECRET not in json.dumps(shown), shown
    assert shown["es"] == "http://u:***@h:9200" and shown["database"] == "d"
