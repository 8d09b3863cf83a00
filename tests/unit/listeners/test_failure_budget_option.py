"""``failure_budget`` per listener: a base option (library), a ``[[listeners]]`` key (service)
checked with its table's name, and what the runner's tenures retry within."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from listeners import ChangeStreamListener, ListenerRunner
from singleton import Elector
from singleton.errors import ConfigurationError
from singleton.service.assembly import build_listeners
from singleton.service.config import load_config
from singleton.service.config.tables import listener_config
from singleton.testing import MemoryLeaseBackend


class Quiet(ChangeStreamListener):
    database = "shop"
    collection = "orders"

    def handle_batch(self, events: Any, ctx: Any) -> None:
        return None


def _runner(listener: ChangeStreamListener, **options: Any) -> ListenerRunner:
    elector = Elector(MemoryLeaseBackend(), listener.lease_name, identity="a", ttl=3.0)
    url = "mongodb://127.0.0.1:1/?serverSelectionTimeoutMS=100"
    return ListenerRunner(listener, elector, url, standby_interval=None, **options)


def test_the_listeners_own_budget_wins_over_the_runners() -> None:
    assert Quiet().failure_budget is None
    assert _runner(Quiet()).failure_budget == 60.0  # the runner's default
    assert _runner(Quiet(), failure_budget=20.0).failure_budget == 20.0
    runner = _runner(Quiet(failure_budget=30), failure_budget=20.0)
    assert runner.failure_budget == runner.settings.failure_budget == 30


@pytest.mark.parametrize("bad", [0, -1, True, "30", math.inf, math.nan])
def test_a_budget_that_is_not_seconds_is_refused_naming_it(bad: Any) -> None:
    with pytest.raises(ConfigurationError, match=r"Quiet\.failure_budget must be"):
        Quiet(failure_budget=bad)


def test_a_listeners_table_takes_failure_budget(tmp_path: Path) -> None:
    config = tmp_path / "singleton.toml"
    config.write_text(
        '[[listeners]]\nuse = "logging"\ndatabase = "shop"\ncollection = "orders"\n'
        "failure_budget = 30\n"
    )
    [listener] = build_listeners(load_config(config))
    assert listener.failure_budget == 30


@pytest.mark.parametrize("bad", [0, -5, "soon", False])
def test_a_bad_failure_budget_in_a_table_names_the_table(bad: Any) -> None:
    table = {"use": "logging", "database": "shop", "failure_budget": bad}
    with pytest.raises(ConfigurationError, match=r"listeners\[2\]\.failure_budget must be"):
        listener_config(2, table)
