"""The operator surface holds together: ``/metrics`` is Prometheus' own exposition (OpenMetrics
when asked), and every metric the shipped Grafana dashboard and alert rules read is one that a
replica serves."""

from __future__ import annotations

import json
import re
import urllib.request
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from bson.timestamp import Timestamp

from listeners.status import RunnerStatus
from singleton.health import ElectorStats
from singleton.service.metrics import MetricsServer

ROOT = Path(__file__).resolve().parents[2]


def _replica() -> Any:
    """A leading replica's collector inputs, with every optional value known."""
    status = RunnerStatus(
        "orders",
        state="streaming",
        leader=True,
        fencing_token=7,
        last_checkpoint_cluster_time=Timestamp(1_700_000_000, 1),
        last_seen_cluster_time=Timestamp(1_700_000_010, 1),
        last_batch_seconds=0.05,
    )
    elector = SimpleNamespace(leadership=SimpleNamespace(token=7), stats=ElectorStats())
    hosted = SimpleNamespace(
        name="orders", elector=elector, runner=SimpleNamespace(status=lambda: status)
    )
    return SimpleNamespace(hosted=[hosted], jobs=None, started_at=1.0, problems=list)


def _scrape(accept: str) -> tuple[str, str]:
    server = MetricsServer(_replica(), "127.0.0.1:0").start()
    try:
        request = urllib.request.Request(f"{server.url}/metrics", headers={"Accept": accept})
        with urllib.request.urlopen(request, timeout=5) as reply:
            return reply.headers["Content-Type"], reply.read().decode()
    finally:
        server.stop()


def test_openmetrics_is_negotiated() -> None:
    ctype, body = _scrape("application/openmetrics-text; version=1.0.0")
    assert ctype.startswith("application/openmetrics-text") and body.rstrip().endswith("# EOF")
    ctype, body = _scrape("text/plain")
    assert ctype.startswith("text/plain") and "# EOF" not in body


def test_the_dashboard_and_the_alerts_read_only_served_metrics() -> None:
    _, body = _scrape("text/plain")
    served = set(re.findall(r"^(singleton_[a-z_]+)", body, re.MULTILINE))
    assert "singleton_lag_seconds" in served  # now minus the newest acknowledged position
    dashboard = json.loads((ROOT / "deploy" / "grafana-dashboard.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    exprs.append((ROOT / "deploy" / "alerts.yml").read_text())
    wanted = {name for expr in exprs for name in re.findall(r"singleton_[a-z_]+", expr)}
    assert wanted and wanted <= served, sorted(wanted - served)
