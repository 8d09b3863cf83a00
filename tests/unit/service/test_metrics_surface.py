"""The operator surface holds together: ``/metrics`` is Prometheus' own exposition (OpenMetrics
when asked), and every metric the shipped Grafana dashboard and alert rules read is one that a
replica serves."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import re
import urllib.request
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from bson.timestamp import Timestamp

from listeners.elasticsearch.bulk import BulkItem, BulkLimits, BulkWriter
from listeners.runtime.status import RunnerStatus
from singleton.balance.balancer import BalanceView
from singleton.election.health import ElectorStats
from singleton.errors import SinkRejectedError, SinkUnavailableError
from singleton.service.metrics import MetricsServer
from tests.unit.listeners.elasticsearch.test_es_bulk import Scripted, items, whole

ROOT = Path(__file__).resolve().parents[3]


def _replica(listener: Any = None, **counters: int) -> Any:
    """A leading replica's collector inputs, with every optional value known."""
    status = RunnerStatus(
        "orders",
        state="streaming",
        leader=True,
        fencing_token=7,
        last_checkpoint_cluster_time=Timestamp(1_700_000_000, 1),
        last_seen_cluster_time=Timestamp(1_700_000_010, 1),
        last_batch_seconds=0.05,
        batch_size=250,
        **counters,
    )
    elector = SimpleNamespace(leadership=SimpleNamespace(token=7), stats=ElectorStats())
    runner = SimpleNamespace(status=lambda: status, listener=listener)
    hosted = SimpleNamespace(name="orders", elector=elector, runner=runner)
    view = BalanceView("r1", {"r1": 1, "r2": 2, "r3": 1}, 4, 2, ("orders",))
    balancer = SimpleNamespace(view=lambda: view)
    return SimpleNamespace(
        hosted=[hosted], jobs=None, balancer=balancer, started_at=1.0, problems=list
    )


def _scrape(accept: str, replica: Any = None) -> tuple[str, str]:
    server = MetricsServer(replica or _replica(), "127.0.0.1:0").start()
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


def test_the_batch_size_is_served_while_known() -> None:
    """``singleton_batch_size`` is the runner status' ``batch_size`` (what the stream reader
    last asked ``next_batch_size()`` for), labelled like the other per-lease gauges; between
    tenures (``None``) the family is declared with no sample."""
    _, body = _scrape("text/plain")
    assert re.search(r'^singleton_batch_size\{lease="orders"\} 250\.0$', body, re.MULTILINE), body
    follower = _replica()
    status = dataclasses.replace(follower.hosted[0].runner.status(), leader=False, batch_size=None)
    follower.hosted[0].runner.status = lambda: status
    _, body = _scrape("text/plain", follower)
    assert "# TYPE singleton_batch_size gauge" in body
    assert "singleton_batch_size{" not in body


def test_the_status_json_has_the_batch_size() -> None:
    """``/status`` (``Replica.status()``) serves it under the listener's runner entry."""
    from singleton.service.replica import Replica

    replica = _replica()
    replica.identity = "r1"
    replica.hosted[0].elector.leadership.remaining = lambda: 9.5
    replica.status = lambda: Replica.status(replica)
    server = MetricsServer(replica, "127.0.0.1:0").start()
    try:
        with urllib.request.urlopen(f"{server.url}/status", timeout=5) as reply:
            body = json.loads(reply.read())
    finally:
        server.stop()
    (entry,) = body["listeners"]
    assert entry["name"] == "orders" and entry["runner"]["batch_size"] == 250


def test_sink_errors_are_served_by_kind() -> None:
    """What the bulk writer counted (driven through its real error paths) is served per kind
    beside the runner's own count, and the sink's dead letters add to the runner's."""
    transport = Scripted(
        items(409, "version_conflict_engine_exception"),  # 3 items already newer
        items(400, "mapper_parsing_exception"),  # 3 dead letters
        items(429),  # 3 items to retry, past retry_timeout: unavailable
        whole(403),  # the whole request refused: rejected
    )
    limits = BulkLimits(100, 10**6, 1.0, 1, 0.001, 0.002, retry_timeout=0.0)
    writer = BulkWriter(transport, limits, on_dead=lambda letters: None)
    for _ in range(4):
        batch = [BulkItem("index", "i", str(k), 1, b"{}") for k in range(3)]
        with contextlib.suppress(SinkUnavailableError, SinkRejectedError):
            writer.send(batch, lambda: None, lambda seconds: False)
    listener = SimpleNamespace(stats=writer.stats)
    _, body = _scrape("text/plain", _replica(listener, sink_errors=2, dead_lettered=1))
    pattern = r'^singleton_sink_errors_total\{kind="(\w+)",lease="orders"\} (\S+)$'
    got = {kind: float(n) for kind, n in re.findall(pattern, body, re.MULTILINE)}
    assert got == {
        "handle_batch": 2.0,
        "unavailable": 1.0,
        "rejected": 1.0,
        "item_retried": 3.0,
        "item_conflict": 3.0,
        "dead_lettered": 3.0,
    }, body
    assert 'singleton_dead_letters_total{lease="orders"} 4.0' in body
    # every request body went out (the retries of the 429 items too), each of 3 items of b"{}"
    sent = re.search(r'^singleton_sink_bytes_total\{lease="orders"\} (\S+)$', body, re.MULTILINE)
    assert sent is not None and float(sent.group(1)) == writer.stats.sent_bytes > 0
    _, plain = _scrape("text/plain")  # a listener without sink stats: the runner's count only
    assert 'singleton_sink_errors_total{kind="handle_batch",lease="orders"} 0.0' in plain
    assert 'kind="unavailable"' not in plain
    assert "singleton_sink_bytes_total{" not in plain  # declared, no sample


def test_membership_is_served_from_the_balancers_view() -> None:
    """Members, leases held and share come from ``replica.balancer.view()`` at scrape time; a
    stale view serves what this replica holds but no members or share; no balancer, none."""
    _, body = _scrape("text/plain")
    assert "singleton_members 3.0" in body
    assert "singleton_leases_held 1.0" in body
    assert "singleton_lease_share 2.0" in body
    stale = _replica()
    stale.balancer = SimpleNamespace(
        view=lambda: BalanceView("r1", {}, 4, 4, ("orders", "b"), stale=True)
    )
    _, body = _scrape("text/plain", stale)
    assert "singleton_leases_held 2.0" in body
    assert not re.search(r"^singleton_(members|lease_share) ", body, re.MULTILINE)
    unbalanced = _replica()
    unbalanced.balancer = None
    _, body = _scrape("text/plain", unbalanced)
    assert "singleton_leases_held" not in body


def test_membership_metrics_from_a_real_balancer() -> None:
    """A real :class:`Balancer` on the in-memory store: after one heartbeat this replica sees
    itself and another member, holds nothing, and its share of two leases is one."""
    from singleton.balance.balancer import Balancer
    from singleton.lease.timings import LeaseTimings
    from singleton.testing import MemoryLeaseBackend

    backend = MemoryLeaseBackend()
    timings = LeaseTimings.of(ttl=10)
    backend.membership().heartbeat("replicas", "r2", 10, {"held": 0})
    balancer = Balancer(backend, "r1", timings)
    for name in ("a", "b"):
        elector = SimpleNamespace(name=name, leadership=None, cooling=False, rotate=lambda: None)
        elector.subscribe = lambda **callbacks: None
        balancer.add(elector)
    balancer.beat()
    replica = _replica()
    replica.balancer = balancer
    _, body = _scrape("text/plain", replica)
    assert "singleton_members 2.0" in body
    assert "singleton_leases_held 0.0" in body
    assert "singleton_lease_share 1.0" in body


def test_collection_drops_are_served_for_a_listener_that_counts_them() -> None:
    _, body = _scrape("text/plain", _replica(SimpleNamespace(drops_seen=2)))
    assert 'singleton_collection_drops_total{lease="orders"} 2.0' in body, body
    _, plain = _scrape("text/plain")  # a listener that does not count them: no sample
    assert "singleton_collection_drops_total{" not in plain
