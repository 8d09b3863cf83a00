"""``redis+sentinel://`` URLs: the one parser (bad URLs are configuration errors that hide the
password), leases with their release notifications, the Redis checkpoint store and the
start-up persistence warning through Sentinel, and a real failover: the primary is SIGKILLed
while a leader writes fenced checkpoints; a leader exists again within 10 s of the promotion,
tokens strictly increase across tenures, the demoted leader's renew fails, and no checkpoint the
replica had acknowledged is lost.

Processes: :class:`~tests.integration.sentinel_support.SentinelGroup` (primary, replica, three
Sentinels on loopback free ports)."""

from __future__ import annotations

import itertools
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import redis
from bson.timestamp import Timestamp

from listeners.checkpoints.stores import Checkpoint, RedisCheckpointStore
from singleton.drivers.redis import client_from_url, parse_sentinel_url
from singleton.election.elector import Elector
from singleton.election.leadership import Leadership
from singleton.errors import (
    BackendUnavailableError,
    ConfigurationError,
    PermissionDeniedError,
    StaleWriterError,
)
from singleton.lease.contract import Lease
from singleton.lease.redis import RedisLeaseBackend
from singleton.service.assembly import warn_without_persistence
from singleton.service.config import load_config
from singleton.service.dev.embedded import free_port, wait_until
from tests.integration.lease.test_redis_backend import assert_release_observed
from tests.integration.sentinel_support import SERVICE, SentinelGroup
from tests.unit.election.election_support import captured_logs

SECRET = "s3nt1nel-pa55"
MASTER_SECRET = "ma5ter-pa55"
DEPLOYMENT = {"listener": "tests.sentinel", "collection": "shop.orders"}


# -- the URL, no server needed ---------------------------------------------------------------
def test_sentinel_url_parts() -> None:
    url = f"redis+sentinel://bob:{SECRET}%40x@a:26380,b,[::1]:26381/{SERVICE}/3"
    parts = parse_sentinel_url(url)
    assert parts.sentinels == [("a", 26380), ("b", 26379), ("::1", 26381)]
    assert (parts.service_name, parts.db) == (SERVICE, 3)
    assert (parts.username, parts.password) == ("bob", f"{SECRET}@x")
    assert SECRET not in repr(parts)
    bare = parse_sentinel_url(f"redis+sentinel://:{SECRET}@a:1/{SERVICE}")
    assert (bare.username, bare.password, bare.db) == (None, SECRET, 0)
    assert bare.sentinel_kwargs() == {} and not bare.ssl  # Sentinels asked without credentials


@pytest.mark.parametrize(
    ("url", "why"),
    [
        (f"redis+sentinel://:{SECRET}@127.0.0.1:26379", "service name is missing"),
        (f"redis+sentinel://:{SECRET}@127.0.0.1:26379/", "service name is missing"),
        (f"redis+sentinel://:{SECRET}@127.0.0.1:nope/m", "bad Sentinel port"),
        (f"redis+sentinel://:{SECRET}@127.0.0.1:70000/m", "bad Sentinel port"),
        (f"redis+sentinel://:{SECRET}@127.0.0.1,/m", "has no host"),
        (f"redis+sentinel://:{SECRET}@127.0.0.1/m/zero", "db must be"),
        (f"redis+sentinel://:{SECRET}@127.0.0.1/m/0/x", "expected /<service_name>[/db]"),
        (f"redis+sentinel://:{SECRET}@127.0.0.1/m?db=1", "unknown parameter 'db'"),
        (f"redis+sentinel://:{SECRET}@127.0.0.1/m#x", "no fragment"),
        ("redis+sentinel://127.0.0.1/m?ssl_ca_certs=/ca.pem", "needs TLS: use rediss+sentinel"),
        ("rediss+sentinel://127.0.0.1/m?ssl_cert_reqs=maybe", "ssl_cert_reqs must be one of"),
        ("rediss+sentinel://127.0.0.1/m?ssl_check_hostname=2", "must be true or false"),
        (
            f"redis+sentinel://127.0.0.1/m?sentinel_password={SECRET}&sentinel_password=x",
            "given twice",
        ),
        (f"sentinel://:{SECRET}@127.0.0.1/m", "not a Redis URL"),
    ],
)
def test_bad_sentinel_url_is_a_configuration_error(url: str, why: str) -> None:
    for build in (
        lambda: client_from_url(url),
        lambda: RedisLeaseBackend(url),
        lambda: RedisCheckpointStore(url),
    ):
        with pytest.raises(ConfigurationError) as info:
            build()
        assert why in str(info.value)
        assert SECRET not in str(info.value) and "127.0.0.1" in str(info.value)


def test_config_accepts_sentinel_urls_and_names_what_is_wrong() -> None:
    url = f"redis+sentinel://:{SECRET}@10.0.0.1:26379,10.0.0.2:26379/{SERVICE}/1"
    config = load_config(environ={"SINGLETON_REDIS_URL": url})
    assert config.redis_url == url
    assert SECRET not in str(config.redacted())
    with pytest.raises(ConfigurationError) as info:
        load_config(environ={"SINGLETON_REDIS_URL": url.rsplit("/", 2)[0]})
    message = str(info.value)
    assert message.startswith("redis_url is not a valid Redis URL, got 'redis+sentinel://:***@")
    assert "service name is missing" in message and SECRET not in message


def test_unreachable_sentinels_are_unavailable_quickly() -> None:
    url = f"redis+sentinel://:{SECRET}@127.0.0.1:{free_port()},127.0.0.1:{free_port()}/m"
    backend = RedisLeaseBackend(url, socket_timeout=0.5, socket_connect_timeout=0.5)
    try:
        assert SECRET not in backend.describe() and "redis+sentinel://:***@" in backend.describe()
        started = time.monotonic()
        with pytest.raises(BackendUnavailableError) as info:
            backend.try_acquire("job", "a/1", 1.0)
        assert time.monotonic() - started < 5
        assert isinstance(info.value.__cause__, redis.ConnectionError)
        assert "No master found" in str(info.value) and SECRET not in str(info.value)
    finally:
        backend.close()


# -- through a running Sentinel group --------------------------------------------------------
@pytest.fixture(scope="module")
def group() -> Iterator[SentinelGroup]:
    with SentinelGroup() as g:
        yield g


def test_leases_and_release_notifications_go_to_the_master(
    group: SentinelGroup, unique: str
) -> None:
    ns = f"t{unique}"
    theirs = client_from_url(group.url)  # a caller's client: described, never closed here
    waiter = RedisLeaseBackend(theirs, namespace=ns)
    releaser = RedisLeaseBackend(group.url, namespace=ns)
    try:
        assert group.url in releaser.describe()
        assert f"{group.url}/0" in waiter.describe()
        lease = releaser.try_acquire("held", "a/1", 30)
        assert lease is not None
        primary = redis.Redis(group.primary.host, group.primary.port, decode_responses=True)
        try:
            assert primary.get(f"{ns}:lease:held") == f"{lease.token}:a/1"
        finally:
            primary.close()
        assert waiter.inspect("held") is not None
        assert_release_observed(waiter, releaser, "a release published through Sentinel")
        waiter.close()
        assert theirs.ping()
    finally:
        waiter.close()
        releaser.close()
        theirs.close()


def test_owned_client_closes_its_sentinel_connections(group: SentinelGroup, unique: str) -> None:
    first = group.sentinels[0]
    probe = redis.Redis(first.host, first.port, decode_responses=True)

    def askers() -> int:  # connections whose last command was the client's master lookup
        return sum(1 for c in probe.client_list() if c.get("cmd") == "sentinel|masters")

    try:
        backend = RedisLeaseBackend(group.url, namespace=f"t{unique}")
        backend.inspect("job")
        assert askers() >= 1
        backend.close()
        wait_until(lambda: askers() == 0, 10, what="the Sentinel connections closed")
    finally:
        probe.close()


def test_sentinels_with_a_password_of_their_own(unique: str) -> None:
    """The data nodes and the Sentinels each require their own password: leases and checkpoints
    work with both in the URL; without the Sentinels' one no master is found, and neither
    password is ever shown."""
    ns = f"t{unique}"
    with SentinelGroup(master_password=MASTER_SECRET, sentinel_password=SECRET) as group:
        assert f"sentinel_password={SECRET}" in group.url and MASTER_SECRET in group.url
        backend = RedisLeaseBackend(group.url, namespace=ns)
        store = RedisCheckpointStore(group.url, namespace=ns)
        try:
            lease = backend.try_acquire("held", "a/1", 30)
            assert lease is not None
            master = group.master_client()
            assert master.get(f"{ns}:lease:held") == f"{lease.token}:a/1"
            assert store.claim("cp", 7, "a/1", DEPLOYMENT) is None
            store.save(_checkpoint(7, "a/1", 41))
            stored = store.load("cp")
            assert stored is not None and stored.cluster_time == Timestamp(41, 0)
            for secret in (SECRET, MASTER_SECRET):
                assert secret not in backend.describe()
        finally:
            store.close()
            backend.close()
        without = RedisLeaseBackend(
            group.url.split("?")[0], socket_timeout=1, socket_connect_timeout=1
        )
        try:
            with pytest.raises(PermissionDeniedError) as info:  # refused: fatal, not "no master"
                without.try_acquire("held", "b/1", 30)
            assert "every Sentinel refused the credentials" in str(info.value)
            assert SECRET not in str(info.value) and MASTER_SECRET not in str(info.value)
        finally:
            without.close()


def test_checkpoint_store_round_trip_and_persistence_warning(
    group: SentinelGroup, unique: str
) -> None:
    ns = f"t{unique}"
    store = RedisCheckpointStore(group.url, namespace=ns)
    try:
        assert store.claim("cp", 7, "a/1", DEPLOYMENT) is None
        store.save(_checkpoint(7, "a/1", 41))
        stored = store.load("cp")
        assert stored is not None and stored.cluster_time == Timestamp(41, 0)
        with pytest.raises(StaleWriterError):
            store.save(_checkpoint(6, "b/1", 42))
    finally:
        store.close()
    with captured_logs("WARNING") as logs:
        warn_without_persistence(group.url)
    warnings = [msg for _, msg in logs if "keeps nothing on disk" in msg]
    assert len(warnings) == 1, logs
    assert group.url in warnings[0]


def _checkpoint(token: int, holder: str, position: int) -> Checkpoint:
    return Checkpoint(
        name="cp",
        resume_token={"_data": f"{position:08d}"},
        cluster_time=Timestamp(position, 0),
        fencing_token=token,
        holder=holder,
        deployment=DEPLOYMENT,
    )


# -- the failover ----------------------------------------------------------------------------
TIMINGS: dict[str, Any] = {
    "ttl": 1.5,
    "renew_interval": 0.3,
    "renew_deadline": 1.0,
    "retry_interval": 0.2,
}


@dataclass
class Tenure:
    holder: str
    token: int
    elected_at: float
    lost_at: float | None = None
    reason: str | None = None
    claimed: int | None = None  # the position the claim returned (0: none stored)
    saved: list[int] = field(default_factory=list)
    refused: bool = False


class Replica:
    """One replica as the service runs one: an elector whose tenures claim the checkpoint and
    then save ever higher positions, checking the leadership before each write."""

    def __init__(self, identity: str, url: str, ns: str, tenures: list[Tenure]) -> None:
        self.identity = identity
        self.tenures = tenures
        self.backend = RedisLeaseBackend(
            url, namespace=ns, socket_timeout=0.5, socket_connect_timeout=0.5
        )
        self.store = RedisCheckpointStore(url, namespace=ns)
        self.elector = Elector(self.backend, "cp", identity=identity, **TIMINGS,
                               on_elected=self._elected, on_lost=self._lost)  # fmt: skip
        self._mine: dict[int, Tenure] = {}
        self._threads: list[threading.Thread] = []

    def _elected(self, ld: Leadership) -> None:
        tenure = Tenure(self.identity, ld.token, time.monotonic())
        self._mine[ld.token] = tenure
        self.tenures.append(tenure)
        t = threading.Thread(target=self._work, args=(ld, tenure), daemon=True)
        self._threads.append(t)
        t.start()

    def _lost(self, ld: Leadership, reason: str) -> None:
        tenure = self._mine[ld.token]
        tenure.lost_at, tenure.reason = time.monotonic(), reason

    def _work(self, ld: Leadership, tenure: Tenure) -> None:
        while tenure.claimed is None and ld.valid():
            try:
                cp = self.store.claim("cp", ld.token, self.identity, DEPLOYMENT)
                tenure.claimed = 0 if cp is None else cp.cluster_time.time
            except BackendUnavailableError:
                ld.wait_lost(0.05)
            except StaleWriterError:
                tenure.refused = True
                return
        position = (tenure.claimed or 0) + 1
        while not ld.wait_lost(0.02) and ld.valid():  # a paced stream, ended by the loss
            try:
                self.store.save(_checkpoint(ld.token, self.identity, position))
            except BackendUnavailableError:
                continue
            except StaleWriterError:
                tenure.refused = True
                return
            tenure.saved.append(position)
            position += 1

    def start(self) -> None:
        self.elector.start()

    def stop(self) -> None:
        self.elector.stop(timeout=10)
        for t in self._threads:
            t.join(10)
        self.store.close()
        self.backend.close()


@pytest.mark.parametrize("auth", [False, True], ids=["open", "passwords"])
def test_failover_keeps_one_leader_per_token_and_every_acknowledged_checkpoint(auth: bool) -> None:
    ns = f"t{uuid.uuid4().hex[:12]}"
    tenures: list[Tenure] = []
    passwords = {"master_password": MASTER_SECRET, "sentinel_password": SECRET} if auth else {}
    with SentinelGroup(**passwords) as group:
        replicas = [Replica(name, group.url, ns, tenures) for name in ("a", "b")]
        try:
            for r in replicas:
                r.start()
            wait_until(
                lambda: bool(tenures) and len(tenures[0].saved) >= 5,
                15,
                what="a leader streaming checkpoints",
            )
            first = tenures[0]
            # Everything acknowledged up to now is on the replica once a later write is.
            acknowledged = max(first.saved)
            master = group.master_client()
            master.set(f"{ns}:marker", "1")
            assert master.wait(1, 5000) == 1
            with group.watch_switch() as watch:
                killed_at = time.monotonic()
                group.primary.kill()
                promoted_at, port = watch.wait(30)
            assert port == group.replica.port

            def successor() -> Tenure | None:
                later = [t for t in tenures if t.elected_at > killed_at and t.saved]
                return later[0] if later else None

            wait_until(lambda: successor() is not None, 15, what="a leader after the failover")
            second = successor()
            assert second is not None
            assert second.elected_at - promoted_at <= 10, "no leader within 10 s of promotion"
            wait_until(lambda: len(second.saved) >= 3, 10, what="the new leader streaming")

            # The old tenure cannot come back: its renew and its writes are refused.
            old = Lease("cp", first.holder, first.token, TIMINGS["ttl"])
            owner = next(r for r in replicas if r.identity == first.holder)
            assert owner.backend.renew(old) is None
            with pytest.raises(StaleWriterError):
                owner.store.save(_checkpoint(first.token, first.holder, 10**6))
        finally:
            for r in replicas:
                r.stop()

    assert first.lost_at is not None and first.lost_at <= promoted_at, first
    ordered = sorted(tenures, key=lambda t: t.elected_at)
    tokens = [t.token for t in ordered]
    assert tokens == sorted(set(tokens)), f"tokens must strictly increase: {ordered}"
    for earlier, later in itertools.pairwise(ordered):
        assert earlier.lost_at is not None and earlier.lost_at <= later.elected_at, ordered
    # Nothing the replica had is lost; positions only move forward across tenures.
    assert second.claimed is not None and second.claimed >= acknowledged, (acknowledged, second)
    assert min(second.saved) == second.claimed + 1
    for earlier, later in itertools.pairwise(ordered):
        if earlier.saved and later.claimed is not None and later.saved:
            assert min(later.saved) > later.claimed
