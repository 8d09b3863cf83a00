"""Configuration precedence and validation; the CLI's exit code 2 for bad input."""

from __future__ import annotations

from pathlib import Path

import pytest

from listeners.base import ChangeStreamListener
from singleton.errors import ConfigurationError
from singleton.redact import redact
from singleton.service.assembly import build_listeners, lease_names
from singleton.service.cli import main
from singleton.service.config import load_config

TOML = """
backend = "redis"
redis_url = "redis://127.0.0.1:6379/0"
namespace = "file"

[lease]
ttl = 15.0
renew_interval = 5.0
renew_deadline = 10.0

[[listeners]]
use = "logging"
name = "orders-log"
database = "shop"
collection = "orders"
"""


@pytest.fixture
def toml(tmp_path: Path) -> Path:
    path = tmp_path / "singleton.toml"
    path.write_text(TOML)
    return path


def test_file_then_env_then_flags(toml: Path) -> None:
    cfg = load_config(toml)
    assert (cfg.namespace, cfg.lease.ttl, cfg.listeners[0].options["name"]) == (
        "file",
        15.0,
        "orders-log",
    )
    assert cfg.listeners[0].options["collection"] == "orders"
    env = {"SINGLETON_NAMESPACE": "env", "SINGLETON_LEASE__TTL": "30", "OTHER": "x"}
    cfg = load_config(toml, env)
    assert (cfg.namespace, cfg.lease.ttl) == ("env", 30.0)
    cfg = load_config(toml, env, {"namespace": "flag", "lease": {"ttl": 20}})
    assert (cfg.namespace, cfg.lease.ttl) == ("flag", 20.0)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"SINGLETON_BAKEND": "redis"}, "unknown key 'bakend' (did you mean 'backend'?)"),
        ({"SINGLETON_LEASE__TLL": "3"}, "unknown key lease.tll (did you mean 'ttl'?)"),
        ({"SINGLETON_LEASE__TTL": "soon"}, "lease.ttl must be a number, got 'soon'"),
        ({"SINGLETON_LEASE__RENEW_DEADLINE": "15"}, "ttl=15, renew_deadline=15"),
        (
            {"SINGLETON_BACKEND": "zookeeper"},
            "backend must be one of redis, mongo, got 'zookeeper'",
        ),
        ({"SINGLETON_REDIS_URL": "http://u:hunter2@h"}, "redis_url must start with"),
        ({"SINGLETON_METRICS_ADDRESS": "9090"}, "metrics_address must be HOST:PORT"),
        ({"SINGLETON_DRAIN_TIMEOUT": "0"}, "drain_timeout must be > 0 and <= shutdown_timeout"),
        ({"SINGLETON_DRAIN_TIMEOUT": "30"}, "got 30.0"),
    ],
)
def test_bad_values_name_key_value_and_rule(toml: Path, env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        load_config(toml, env)
    assert message in str(info.value)
    assert "hunter2" not in str(info.value)


def test_drain_timeout_defaults_to_a_quarter_second_and_can_be_set(toml: Path) -> None:
    assert load_config(toml).drain_timeout == 0.25
    assert load_config(toml, {"SINGLETON_DRAIN_TIMEOUT": "0.08"}).drain_timeout == 0.08


def test_wrong_type_in_file(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text('[lease]\nttl = "fifteen"\n')
    with pytest.raises(ConfigurationError, match=r"lease\.ttl must be a number, got 'fifteen'"):
        load_config(path)


def test_missing_and_invalid_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="does not exist"):
        load_config(tmp_path / "nope.toml")
    broken = tmp_path / "broken.toml"
    broken.write_text("backend = \n")
    with pytest.raises(ConfigurationError, match="not valid TOML"):
        load_config(broken)


def test_duplicate_listener_names(tmp_path: Path) -> None:
    path = tmp_path / "dup.toml"
    path.write_text(TOML + TOML.split("\n\n")[-1])
    with pytest.raises(ConfigurationError, match="repeated: orders-log"):
        build_listeners(load_config(path))


def test_redact() -> None:
    assert (
        redact("mongodb://app:s3cr%3Dt@db:27017/?tls=true")
        == "mongodb://app:***@db:27017/?tls=true"
    )
    assert redact("redis://:pw@host:6379/0 and http://u:p@es:9200") == (
        "redis://:***@host:6379/0 and http://u:***@es:9200"
    )
    assert redact("http://es:9200/?api_key=abc&x=1") == "http://es:9200/?api_key=***&x=1"
    assert (
        "hunter2" in load_config(environ={"SINGLETON_REDIS_URL": "redis://:hunter2@h/0"}).redis_url
    )
    assert "hunter2" not in str(
        load_config(environ={"SINGLETON_REDIS_URL": "redis://:hunter2@h/0"}).redacted()
    )


# -- the command line: exit code 2 and a message naming the bad value -------------------------
class Exploding(ChangeStreamListener):
    """A user's listener whose constructor fails."""

    def __init__(self, **options: object) -> None:
        raise RuntimeError("boom")


def test_a_config_file_that_is_not_utf8_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "latin1.toml"
    path.write_bytes('namespace = "caf\xe9"\n'.encode("latin-1"))
    assert main(["status", "--config", str(path)]) == 2
    assert "is not UTF-8" in capsys.readouterr().err


def test_a_metrics_port_in_use_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        argv = ["run", "--listener", "logging", "-o", "database=a"]
        argv += ["--metrics-address", f"127.0.0.1:{port}"]
        assert main(argv) == 2
    err = capsys.readouterr().err
    assert "cannot be served: Address already in use" in err
    # names the fix: a port per replica, or a free one
    assert "--metrics-address HOST:PORT" in err and 'metrics_address = "127.0.0.1:0"' in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["status", "--ttl", "5", "--renew-deadline", "6"], "ttl=5, renew_deadline=6"),
        (["status", "--backend", "mongodb"], "did you mean 'mongo'?"),
        (["run", "--listener", "elastisearch"], "did you mean 'elasticsearch'?"),
        (["run", "--listener", "nosuch.module:Thing"], "cannot import listener"),
        (["run", "--listener", "listeners.base:ChangeStreamListenr"], "did you mean"),
        (["run", "--option", "x=1"], "needs a --listener"),
        (["run"], "no listeners or jobs configured"),
        (["run", "--listener", "logging", "-o", "database=shop", "-o", "colection=x"], "colection"),
        (["status", "--config", "/nonexistent/singleton.toml"], "does not exist"),
        (["status", "--redis-url", "redis:/:hunter2@x"], "redis_url must start with"),
        (["run", "--config", "/"], "is a directory"),
        (["run", "--listener", "builtins:dict"], "not a subclass of"),
        (["run", "--listener", "os:getcwd"], "not a subclass of"),
        (["run", "--listener", "tests.unit.service.test_config:Exploding"], "RuntimeError: boom"),
        (["run", "--ttl", "1e6", "--listener", "logging"], "ttl must be < 1000000"),
        (["run", "--mongo-url", "mongodb://u:hunter2@x@h/", "--listener", "logging"], "u:***@h"),
        (
            ["run", "--mongo-url", "mongodb://u:hun%ter2@h/", "--listener", "logging"],
            "not a valid MongoDB URL",
        ),
    ],
)
def test_cli_bad_input_exits_2(
    argv: list[str],
    message: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in list(__import__("os").environ):
        if name.startswith("SINGLETON_"):
            monkeypatch.delenv(name)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err, err
    assert "hunter2" not in err


_PLACED = '[[listeners]]\nuse = "logging"\nname = "orders"\ndatabase = "d"\ncollection = "c"\n'


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ("partitions = 0", "listeners[0].partitions must be an integer from 1 to 1024, got 0"),
        ("partitions = 2.5", "listeners[0].partitions must be an integer"),
        ('prefer = "a"', "listeners[0].prefer must be a list of replica identities, got 'a'"),
        ("min_tenure = -1", "listeners[0].min_tenure must be seconds in [0, 1e6), got -1"),
    ],
)
def test_bad_placement_keys_name_the_value(tmp_path: Path, extra: str, message: str) -> None:
    path = tmp_path / "s.toml"
    path.write_text(_PLACED + extra + "\n", encoding="utf-8")
    with pytest.raises(ConfigurationError) as err:
        load_config(path)
    assert message in str(err.value)


def test_placement_keys_never_reach_the_listener(tmp_path: Path) -> None:
    path = tmp_path / "s.toml"
    path.write_text(
        _PLACED + 'partitions = 3\nprefer = ["r1"]\nmin_tenure = 30\n', encoding="utf-8"
    )
    config = load_config(path)
    (lc,) = config.listeners
    assert (lc.partitions, lc.prefer, lc.min_tenure) == (3, ("r1",), 30.0)
    assert "partitions" not in lc.options
    names = [listener.lease_name for listener in build_listeners(config)]
    assert names == ["orders.0-of-3", "orders.1-of-3", "orders.2-of-3"]
    assert config.redacted()["listeners"][0]["partitions"] == 3


def test_balance_is_a_boolean(tmp_path: Path) -> None:
    assert load_config(None).balance is True
    assert load_config(None, {"SINGLETON_BALANCE": "false"}).balance is False
    path = tmp_path / "s.toml"
    path.write_text('balance = "yes"\n', encoding="utf-8")
    with pytest.raises(ConfigurationError, match="balance must be true or false, got 'yes'"):
        load_config(path)


# -- lease names, from the configuration alone -------------------------------------------------
class Counted(ChangeStreamListener):
    """A user's listener that names itself on the class and counts its constructions."""

    database = "shop"
    collection = "orders"
    built = 0

    def __init__(self, **options: object) -> None:
        type(self).built += 1
        super().__init__(**options)


class Renames(ChangeStreamListener):
    """A user's listener that names itself in ``__init__``: invisible to ``status``."""

    def __init__(self, **options: object) -> None:
        super().__init__(**options)
        self.name = f"{self.database}-renamed"


_NAMED = [
    ('use = "logging"\nname = "n"\ndatabase = "d"\n', ["n"]),
    ('use = "logging"\ndatabase = "d"\ncollection = "c"\n', ["d.c"]),
    ('use = "logging"\ndatabase = "d"\n', ["d.*"]),  # a whole database
    ('use = "tests.unit.service.test_config:Counted"\n', ["shop.orders"]),  # from the class
    ('use = "tests.unit.service.test_config:Counted"\ncollection = "x"\n', ["shop.x"]),
    ('use = "logging"\nname = "p"\ndatabase = "d"\npartitions = 2\n', ["p.0-of-2", "p.1-of-2"]),
]


@pytest.mark.parametrize(("table", "names"), _NAMED)
def test_lease_names_come_from_the_table_and_class_as_the_replica_names_them(
    tmp_path: Path, table: str, names: list[str]
) -> None:
    path = tmp_path / "s.toml"
    path.write_text("[[listeners]]\n" + table, encoding="utf-8")
    config = load_config(path)
    Counted.built = 0
    assert lease_names(config) == names
    assert Counted.built == 0  # no listener was constructed
    assert [listener.lease_name for listener in build_listeners(config)] == names


def test_a_listener_that_renames_itself_in_init_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "s.toml"
    path.write_text(
        '[[listeners]]\nuse = "tests.unit.service.test_config:Renames"\ndatabase = "d"\n'
    )
    config = load_config(path)
    assert lease_names(config) == ["d.*"]
    with pytest.raises(ConfigurationError, match="named itself 'd-renamed' in __init__"):
        build_listeners(config)


def test_lease_names_refuse_what_the_listener_would(tmp_path: Path) -> None:
    path = tmp_path / "s.toml"
    path.write_text('[[listeners]]\nuse = "logging"\ncollection = "c"\n', encoding="utf-8")
    with pytest.raises(ConfigurationError, match='add `database = "<name>"` to its'):
        lease_names(load_config(path))  # (said "must be a database name, got None")
    with pytest.raises(ConfigurationError, match="no database to watch"):
        build_listeners(load_config(path))
    path.write_text(TOML + TOML.split("\n\n")[-1])
    with pytest.raises(ConfigurationError, match="repeated: orders-log"):
        lease_names(load_config(path))


def test_dead_letters_builds_no_listener(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``Exploding.__init__`` raises: ``dead-letters`` checks its ``--listener`` against the
    lease names without constructing it, where ``run`` does (exit 2). (``status``: in
    tests/integration/service/test_service.py, against real stores.)"""
    path = tmp_path / "s.toml"
    path.write_text(
        '[[listeners]]\nuse = "tests.unit.service.test_config:Exploding"\ndatabase = "d"\n'
    )
    assert main(["dead-letters", "list", "--listener", "nope", "--config", str(path)]) == 2
    assert "'nope' is not configured; configured: d.*" in capsys.readouterr().err
    assert main(["run", "--config", str(path)]) == 2
    assert "RuntimeError: boom" in capsys.readouterr().err
