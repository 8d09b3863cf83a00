"""Prometheus metrics and health probes for one replica, served on ``metrics_address``.

Values are read from the electors and runners at scrape time (a custom collector), so the hot
paths carry no instrumentation cost and there is no global registry.

* ``/metrics``: Prometheus text format, or OpenMetrics when the scraper asks for it.
* ``/healthz``: 200 while the process is alive and its lease store answers.
* ``/readyz``: 200 once every listener and job is either leading or a standby whose store
  answers; 503 naming each listener or job whose last tenure failed (and why), or whose lease
  store refuses us.
* ``/status``: the replica's local view as JSON.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import choose_encoder

from listeners.runtime.status import (
    collection_drops,
    per_collection,
    sink_bytes,
    sink_error_counts,
)
from singleton.errors import SingletonError
from singleton.latency import LatencySnapshot

if TYPE_CHECKING:
    from singleton.balance.balancer import Balancer
    from singleton.service.replica import Hosted, Replica

#: Status attributes exported as metrics, keyed by the label naming their subject (a listener's
#: ``lease``: RunnerStatus; a ``job``: JobStatus) and the attribute: (metric name, help, counter?).
#: Counters are produced from the start; the gauges once their value exists (after a first batch,
#: for the checkpoint age after a first checkpoint too, for lateness once a call ran; the batch
#: size while a tenure streams). Declare nothing that has no source.
_COUNTER, _GAUGE = True, False
STATUS_METRICS = {
    ("lease", "events_handled"): (
        "singleton_events_processed",
        "Change events handled",
        _COUNTER,
    ),
    ("lease", "batches"): ("singleton_batches_processed", "Batches handled", _COUNTER),
    ("lease", "checkpoint_age_seconds"): (
        "singleton_checkpoint_age_seconds",
        "Cluster-time seconds between the last checkpoint and the newest event seen",
        _GAUGE,
    ),
    ("lease", "batch_size"): (
        "singleton_batch_size",
        "Events the stream reader asked for as the latest batch started (next_batch_size(); "
        "ElasticsearchSync adapts it to the sink), while this replica streams",
        _GAUGE,
    ),
    ("lease", "listener_failed"): (
        "singleton_listener_failed",
        "1 while the last tenure failed",
        _GAUGE,
    ),
    ("lease", "failed_tenures"): (
        "singleton_failed_tenures",
        "Consecutive failed tenures",
        _GAUGE,
    ),
    ("job", "runs"): (
        "singleton_job_runs",
        "Calls of a scheduled job that returned",
        _COUNTER,
    ),
    ("job", "failures"): (
        "singleton_job_failures",
        "Calls of a scheduled job that raised",
        _COUNTER,
    ),
    ("job", "missed"): (
        "singleton_job_missed",
        "Fire times not run because they were later than the misfire grace",
        _COUNTER,
    ),
    ("job", "lateness_seconds"): (
        "singleton_job_lateness_seconds",
        "Fire time to the start of the job's last call",
        _GAUGE,
    ),
    ("job", "leader"): (
        "singleton_job_is_leader",
        "1 while this replica holds the job's lease",
        _GAUGE,
    ),
}


def _exported(subject: str) -> dict[str, tuple[str, str, bool]]:
    """The part of STATUS_METRICS about ``subject``: attribute -> (metric name, help, counter?)."""
    return {attr: spec for (of, attr), spec in STATUS_METRICS.items() if of == subject}


#: RunnerStatus attributes exported per lease.
RUNNER_METRICS = _exported("lease")


def _elector_families(hosted: list[Hosted]) -> Iterator[Metric]:
    """Each hosted lease's elector: leadership, token, transitions, renewals, store errors."""
    leader = GaugeMetricFamily("singleton_is_leader", "1 while leading", labels=["lease"])
    token = GaugeMetricFamily("singleton_fencing_token", "Current token", labels=["lease"])
    trans = CounterMetricFamily(
        "singleton_transitions", "Leadership transitions", labels=["lease", "kind"]
    )
    renew = HistogramMetricFamily(
        "singleton_renew_latency_seconds", "Renewal round trips", labels=["lease"]
    )
    renew_fail = CounterMetricFamily(
        "singleton_renew_failures", "Renewals that failed", labels=["lease"]
    )
    store_errors = CounterMetricFamily(
        "singleton_lease_store_errors",
        "Lease store calls that failed, by kind (transient: unreachable or timed out; "
        "fatal: refused credentials or permissions, a misconfiguration)",
        labels=["lease", "kind"],
    )
    resigned = CounterMetricFamily(
        "singleton_resignations", "Tenures resigned because the work failed", labels=["lease"]
    )
    for h in hosted:
        ld = h.elector.leadership
        leader.add_metric([h.name], 1.0 if ld is not None else 0.0)
        if ld is not None:
            token.add_metric([h.name], float(ld.token))
        stats = h.elector.stats
        trans.add_metric([h.name, "elected"], stats.elections)
        trans.add_metric([h.name, "lost"], stats.losses)
        _observe(renew, h.name, stats.renew_latency.snapshot())
        renew_fail.add_metric([h.name], stats.renew_failures)
        fatal = stats.fatal_errors
        transient = max(0, stats.contend_failures + stats.renew_failures - fatal)
        store_errors.add_metric([h.name, "transient"], transient)
        store_errors.add_metric([h.name, "fatal"], fatal)
        resigned.add_metric([h.name], stats.resignations)
    yield from (leader, token, trans, renew, renew_fail, store_errors, resigned)


def _runner_families(hosted: list[Hosted], now: float) -> Iterator[Metric]:
    """Each hosted lease's runner: lag, batches, the sink's errors and bytes, dead letters."""
    lag = GaugeMetricFamily(
        "singleton_lag_seconds",
        "Now minus the cluster time of the newest position the leader acknowledged",
        labels=["lease"],
    )
    batch = HistogramMetricFamily(
        "singleton_batch_latency_seconds",
        "Seconds a batch took to deliver to the sink, retries included",
        labels=["lease"],
    )
    sink_errors = CounterMetricFamily(
        "singleton_sink_errors",
        "Sink errors by kind: handle_batch (calls that raised and were retried), and the "
        "sink's own (ElasticsearchSync: unavailable, rejected, item_retried, item_conflict, "
        "dead_lettered)",
        labels=["lease", "kind"],
    )
    sent = CounterMetricFamily(
        "singleton_sink_bytes",
        "Bytes sent to the sink (request bodies, retries included), for sinks that count "
        "them (ElasticsearchSync)",
        labels=["lease"],
    )
    dead = CounterMetricFamily(
        "singleton_dead_letters",
        "Dead letters written: poison events and documents the sink refused for good",
        labels=["lease"],
    )
    drops = CounterMetricFamily(
        "singleton_collection_drops",
        "Drops and renames of a watched collection (or its database) the listener saw; "
        "on_drop decides what follows (keep: its documents stay in the index)",
        labels=["lease"],
    )
    runners: list[tuple[str, Any]] = []
    for h in hosted:
        status = h.runner.status()
        runners.append((h.name, status))
        _observe(batch, h.name, status.batch_latency)
        kinds = sink_error_counts(getattr(h.runner, "listener", None))
        for kind, n in {"handle_batch": status.sink_errors, **kinds}.items():
            sink_errors.add_metric([h.name, kind], n)
        dead.add_metric([h.name], status.dead_lettered + kinds.get("dead_lettered", 0))
        nbytes = sink_bytes(getattr(h.runner, "listener", None))
        if nbytes is not None:
            sent.add_metric([h.name], nbytes)
        dropped = collection_drops(getattr(h.runner, "listener", None))
        if dropped is not None:
            drops.add_metric([h.name], dropped)
        behind = status.lag_seconds(now)
        if behind is not None:
            lag.add_metric([h.name], behind)
    yield from (lag, batch, sink_errors, sent, dead, drops)
    yield from _collection_families(hosted, now)
    yield from _status_families("lease", runners)


def _collection_families(hosted: list[Hosted], now: float) -> Iterator[Metric]:
    """A shaped listener's events, dead letters and lag with a ``collection`` label."""
    by_collection = {
        kind: CounterMetricFamily(
            f"singleton_collection_{kind}",
            f"{what} per collection of a shaped ElasticsearchSync listener",
            labels=["lease", "collection"],
        )
        for kind, what in (
            ("events", "Change events handled"),
            ("dead_letters", "Dead letters"),
            ("rebuilds", "Roots rebuilt with their related documents (relate)"),
        )
    }
    pending = GaugeMetricFamily(
        "singleton_collection_pending_rebuilds",
        "Roots of a collection queued for a rebuild because a related document changed (relate)",
        labels=["lease", "collection"],
    )
    collection_lag = GaugeMetricFamily(
        "singleton_collection_lag_seconds",
        "singleton_lag_seconds for each collection of a shaped listener (one stream, one "
        "position: the same value for all of them)",
        labels=["lease", "collection"],
    )
    for h in hosted:
        listener = getattr(h.runner, "listener", None)
        counts_by_name = per_collection(listener)
        behind = h.runner.status().lag_seconds(now) if counts_by_name else None
        for name, counts in counts_by_name.items():
            for kind, family in by_collection.items():
                family.add_metric([h.name, name], counts.get(kind, 0))
            if behind is not None:
                collection_lag.add_metric([h.name, name], behind)
            pending.add_metric([h.name, name], counts.get("pending_rebuilds", 0))
    yield from (*by_collection.values(), collection_lag, pending)


def _status_families(subject: str, statuses: Iterable[tuple[str, Any]]) -> list[Metric]:
    """The families of ``subject``'s status attributes, with a sample per ``(label value,
    status)`` whose attribute is known (not yet: no sample)."""
    families: dict[str, CounterMetricFamily | GaugeMetricFamily] = {}
    for attr, (name, doc, counter) in _exported(subject).items():
        kind = CounterMetricFamily if counter else GaugeMetricFamily
        families[attr] = kind(name, doc, labels=[subject])
    for label, status in statuses:
        for attr, family in families.items():
            value = getattr(status, attr)
            if value is not None:
                family.add_metric([label], float(value))
    return list(families.values())


def _observe(family: HistogramMetricFamily, lease: str, snap: LatencySnapshot) -> None:
    family.add_metric([lease], buckets=snap.cumulative(), sum_value=snap.total)


class ReplicaCollector:
    def __init__(self, replica: Replica) -> None:
        self.replica = replica

    def collect(self) -> Iterator[Metric]:
        hosted = self.replica.hosted
        yield from _elector_families(hosted)
        yield from _runner_families(hosted, time.time())
        jobs = [] if self.replica.jobs is None else self.replica.jobs.status()
        yield from _status_families("job", [(job.name, job) for job in jobs])
        yield from _balance_families(getattr(self.replica, "balancer", None))


def _balance_families(balancer: Balancer | None) -> list[Metric]:
    """This replica's view of the membership (``balance = true``): none without a balancer, and
    no members or share while the view is stale (the store did not answer within a ttl)."""
    if balancer is None:
        return []
    view = balancer.view()
    members = GaugeMetricFamily(
        "singleton_members", "Live replicas this replica sees (heartbeats not expired)"
    )
    held = GaugeMetricFamily("singleton_leases_held", "Leases this replica holds now")
    share = GaugeMetricFamily(
        "singleton_lease_share", "The most leases one replica should hold: ceil(leases / members)"
    )
    held.add_metric([], float(len(view.held)))
    if not view.stale:
        members.add_metric([], float(len(view.members)))
        share.add_metric([], float(view.share))
    return [members, held, share]


#: Seconds a connection may stay silent (no request line, headers or body read, nothing
#: written) before it is closed: a scraper sends its request at once.
CONNECTION_TIMEOUT = 10.0
#: Connections served at once (one thread each); one more is closed unanswered, so idle or
#: slow clients can hold at most this many threads.
MAX_CONNECTIONS = 16


class _Handler(BaseHTTPRequestHandler):
    server: MetricsServer

    def setup(self) -> None:
        super().setup()
        self.connection.settimeout(self.server.connection_timeout)  # a silent client is let go

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/metrics":
            # Prometheus' own exposition: OpenMetrics when the scraper asks for it, else text.
            encoder, content_type = choose_encoder(self.headers.get("Accept", ""))
            self._send(200, encoder(self.server.registry), content_type)
        elif path == "/healthz":
            ok, detail = self.server.health()
            self._json(200 if ok else 503, {"ok": ok, "detail": detail})
        elif path == "/readyz":
            ok, detail = self.server.ready()
            self._json(200 if ok else 503, {"ok": ok, "detail": detail})
        elif path == "/status":
            self._json(200, self.server.replica.status())
        else:
            self._json(404, {"error": f"no such path {path!r}"})

    def _json(self, code: int, body: Any) -> None:
        self._send(code, json.dumps(body, default=str).encode(), "application/json")

    def _send(self, code: int, body: bytes, ctype: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        return


class MetricsServer(ThreadingHTTPServer):
    """One thread per connection, at most ``max_connections`` of them, each ended by
    ``connection_timeout`` seconds of silence."""

    daemon_threads = True

    def __init__(
        self,
        replica: Replica,
        address: str,
        *,
        connection_timeout: float = CONNECTION_TIMEOUT,
        max_connections: int = MAX_CONNECTIONS,
    ) -> None:
        host, _, port = address.rpartition(":")
        super().__init__((host, int(port)), _Handler)
        self.connection_timeout = connection_timeout
        self._slots = threading.BoundedSemaphore(max_connections)
        self.replica = replica
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(ReplicaCollector(replica))
        self._thread = threading.Thread(
            target=self.serve_forever, name="singleton-metrics", daemon=True
        )

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):  # full: refuse, rather than queue a thread
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> MetricsServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.shutdown()
        self.server_close()

    def health(self) -> tuple[bool, str]:
        try:
            names = [h.name for h in self.replica.hosted]
            names += [] if self.replica.jobs is None else self.replica.jobs.names
            self.replica.backend.inspect(names[0] if names else "-")
        except SingletonError as exc:
            return False, f"lease store unreachable: {exc}"
        return True, "ok"

    def ready(self) -> tuple[bool, str]:
        if self.replica.started_at is None:
            return False, "starting"
        problems = self.replica.problems()
        if problems:
            return False, "; ".join(problems)
        return self.health()
