"""``drain_timeout`` (config) reaches every listener's runner: it bounds a planned handover."""

from __future__ import annotations

from pathlib import Path

from singleton.service.config import load_config
from singleton.service.replica import Replica
from singleton.testing import MemoryLeaseBackend


def _config(tmp_path: Path, mongo_url: str, unique: str, extra: str) -> Path:
    path = tmp_path / "singleton.toml"
    path.write_text(
        f"""mongo_url = "{mongo_url}"
namespace = "drain{unique}"
metrics_address = "off"
{extra}
[lease]
ttl = 6.0
renew_interval = 1.0
renew_deadline = 4.0

[[listeners]]
use = "logging"
name = "drain-{unique}"
database = "d{unique}"
collection = "c"
"""
    )
    return path


def test_the_configured_drain_timeout_bounds_each_runner(
    tmp_path: Path, mongo_url: str, unique: str
) -> None:
    for extra, expected in (("", 0.25), ("drain_timeout = 0.08", 0.08)):
        config = load_config(_config(tmp_path, mongo_url, unique, extra))
        replica = Replica(config, backend=MemoryLeaseBackend()).start()
        try:
            assert [h.runner.drain_timeout for h in replica.hosted] == [expected]
        finally:
            replica.stop()
