"""The user-facing deployment files stay valid: compose config and the replica's config file."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import yaml

from singleton.service.config import load_config

ROOT = Path(__file__).resolve().parents[3]


def test_docker_compose_config_is_valid() -> None:
    binary = shutil.which("docker-compose")
    assert binary, "docker-compose must be installed (make sysdeps installs Debian's)"
    result = subprocess.run(
        [binary, "-f", str(ROOT / "docker-compose.yml"), "config"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    services = yaml.safe_load(result.stdout)["services"]
    assert {
        "mongo",
        "redis",
        "elasticsearch",
        "replica-1",
        "replica-2",
        "replica-3",
        "drill",
    } <= set(services)
    for name in ("replica-1", "replica-2", "replica-3"):
        assert services[name]["environment"]["SINGLETON_IDENTITY"] == name
        assert "healthcheck" in services[name]
    assert "--replSet" in services["mongo"]["command"]


def test_replica_config_file_is_valid() -> None:
    config = load_config(ROOT / "deploy" / "singleton.toml")
    assert config.listeners[0].use == "elasticsearch"
    assert config.lease.timings().renew_deadline == 10.0
