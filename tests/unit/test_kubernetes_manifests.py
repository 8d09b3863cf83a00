"""deploy/kubernetes/ is valid against the Kubernetes API schemas (``kubernetes-validate
--strict``, offline) and says what the service needs: the ConfigMap's singleton.toml loads with
the Secret's variables, the probes hit the metrics port's /readyz and /healthz, the grace period
is above the drain bound, one replica at a time may go, and nothing runs as root or writes to
its image. The Dockerfile's user is the manifests' user."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml  # type: ignore[import-untyped,unused-ignore]

from singleton.service.config import load_config

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = ROOT / "deploy" / "kubernetes"


def _load() -> dict[str, dict[str, Any]]:
    docs: dict[str, dict[str, Any]] = {}
    for path in sorted(MANIFESTS.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            docs[doc["kind"]] = doc
    return docs


@pytest.fixture(scope="module")
def manifests() -> dict[str, dict[str, Any]]:
    return _load()


@pytest.fixture(scope="module")
def pod(manifests: dict[str, dict[str, Any]]) -> dict[str, Any]:
    spec: dict[str, Any] = manifests["Deployment"]["spec"]["template"]["spec"]
    return spec


def test_kubernetes_validate_strict_passes() -> None:
    binary = shutil.which("kubernetes-validate", path=str(Path(sys.executable).parent))
    assert binary, "kubernetes-validate must be installed (the dev extras)"
    files = sorted(str(p) for p in MANIFESTS.glob("*.yaml"))
    out = subprocess.run(
        [binary, "--strict", *files], capture_output=True, text=True, timeout=120, check=False
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.count(" passed for resource ") == len(files), out.stdout


def test_every_kind_is_there(manifests: dict[str, dict[str, Any]]) -> None:
    assert set(manifests) == {"ConfigMap", "Secret", "Deployment", "PodDisruptionBudget", "Service"}
    assert manifests["Deployment"]["spec"]["replicas"] == 3


def _config(manifests: dict[str, dict[str, Any]], tmp_path: Path) -> Any:
    path = tmp_path / "singleton.toml"
    path.write_text(manifests["ConfigMap"]["data"]["singleton.toml"])
    secret = manifests["Secret"]["stringData"]
    return load_config(path, {**secret, "SINGLETON_IDENTITY": "singleton-abc"})


def test_the_config_map_and_secret_make_a_valid_config(
    manifests: dict[str, dict[str, Any]], tmp_path: Path
) -> None:
    config = _config(manifests, tmp_path)
    secret = manifests["Secret"]["stringData"]
    assert all(k.startswith("SINGLETON_") for k in secret)
    assert config.redis_url == secret["SINGLETON_REDIS_URL"]
    assert config.es_url == secret["SINGLETON_ES_URL"]
    assert config.listeners and config.listeners[0].use == "elasticsearch"
    assert "change-me" not in manifests["ConfigMap"]["data"]["singleton.toml"]


def test_probes_grace_and_rollout(
    manifests: dict[str, dict[str, Any]], pod: dict[str, Any], tmp_path: Path
) -> None:
    config = _config(manifests, tmp_path)
    (container,) = pod["containers"]
    port = int(config.metrics_address.rsplit(":", 1)[1])
    assert config.metrics_address.startswith("0.0.0.0:")  # reachable by the kubelet
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["metrics"] == port
    for probe, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")):
        get = container[probe]["httpGet"]
        assert get["path"] == path and ports[get["port"]] == port, probe
    # SIGTERM drains within shutdown_timeout; the kubelet's SIGKILL must come after that.
    assert pod["terminationGracePeriodSeconds"] > config.shutdown_timeout + 5
    # A liveness failure must outlast a lease handover (a store blip must not restart all).
    live = container["livenessProbe"]
    assert live["periodSeconds"] * live["failureThreshold"] > config.lease.timings().ttl
    rollout = manifests["Deployment"]["spec"]["strategy"]["rollingUpdate"]
    assert rollout["maxUnavailable"] == 0
    assert container["resources"]["requests"].keys() >= {"cpu", "memory"}
    env = {e["name"]: e for e in container["env"]}
    assert env["SINGLETON_CONFIG"]["value"] == "/etc/singleton/singleton.toml"
    assert env["SINGLETON_IDENTITY"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert container["envFrom"] == [
        {"secretRef": {"name": manifests["Secret"]["metadata"]["name"]}}
    ]


def test_disruption_budget_and_service_select_the_pods(
    manifests: dict[str, dict[str, Any]],
) -> None:
    labels = manifests["Deployment"]["spec"]["template"]["metadata"]["labels"]
    pdb = manifests["PodDisruptionBudget"]["spec"]
    assert pdb["maxUnavailable"] == 1
    assert pdb["selector"]["matchLabels"].items() <= labels.items()
    assert manifests["Service"]["spec"]["selector"].items() <= labels.items()


def test_non_root_read_only(pod: dict[str, Any]) -> None:
    (container,) = pod["containers"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    sc = container["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"]
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert mounts["/etc/singleton"]["readOnly"] is True


def test_the_dockerfile_runs_as_the_manifests_user(pod: dict[str, Any]) -> None:
    text = (ROOT / "Dockerfile").read_text()
    users = re.findall(r"^USER\s+(\S+)\s*$", text, re.MULTILINE)
    assert users, "the Dockerfile must end on a USER line"
    uid = users[-1].split(":")[0]
    assert uid.isdigit() and int(uid) == pod["securityContext"]["runAsUser"] != 0
    assert f"--uid {uid}" in text
