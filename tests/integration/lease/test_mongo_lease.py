"""MongoLeaseBackend against SecantusDB: many processes, a skewed wall clock, stale holders, bad
configuration. The contract itself is checked by ``test_contract.py``.

Child processes run this module (``python -m tests.integration.lease.test_mongo_lease MODE
...``); they print one JSON object per line and start their work when the parent writes ``go``
on stdin.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, SupportsIndex

import pymongo
import pytest

from singleton.election.elector import Elector
from singleton.errors import BackendUnavailableError, ConfigurationError, PermissionDeniedError
from singleton.lease.leases import Lease
from singleton.lease.mongo import MongoLeaseBackend
from singleton.service.dev.embedded import MongoServer, wait_until
from singleton.service.dev.ports import free_port

ROOT = Path(__file__).resolve().parents[3]
NAME = "job"
SKEW = 30.0


def _ms(value: Any) -> int:
    return int(value.replace(tzinfo=timezone.utc).timestamp() * 1000)


def _server_skew(client: pymongo.MongoClient[dict[str, Any]]) -> float:
    before = time.time()
    server: datetime = client.admin.command("hello")["localTime"]
    return (before + time.time()) / 2 - _ms(server) / 1000


# -- child processes ---------------------------------------------------------------------------
def _emit(**fields: Any) -> None:
    sys.stdout.write(json.dumps(fields) + "\n")
    sys.stdout.flush()


def _child(argv: list[str]) -> None:
    mode, url, db, ident = argv[:4]
    client: pymongo.MongoClient[dict[str, Any]] = pymongo.MongoClient(url)
    backend = MongoLeaseBackend(client, database=db)
    raw = client[db]["leases"]
    _emit(ready=True, skew=_server_skew(client), mono=time.monotonic())
    sys.stdin.readline()  # "go"
    rng = random.Random(ident)
    if mode == "loop":
        duration, ttl = float(argv[4]), float(argv[5])
        end = time.monotonic() + duration
        refused = 0
        while time.monotonic() < end:
            holder = f"{ident}/{rng.getrandbits(32):08x}"
            lease = backend.try_acquire(NAME, holder, ttl)
            if lease is None:
                refused += 1
                backend.wait_for_release(NAME, timeout=0.1)
                continue
            doc = raw.find_one({"_id": NAME, "holder": holder, "token": lease.token})
            acquired = None if doc is None else _ms(doc["acquiredAt"])
            renewed = backend.renew(lease) is not None
            abandon = rng.random() < 0.1  # as a crash: never released, left to expire
            released = False if abandon else backend.release(lease)
            _emit(
                token=lease.token,
                holder=holder,
                acquired=acquired,
                renewed=renewed,
                released=released,
            )
        _emit(done=True, refused=refused)
    elif mode == "takeover":
        ttl = float(argv[4])
        while (lease := backend.try_acquire(NAME, f"{ident}/x", ttl)) is None:
            backend.wait_for_release(NAME, timeout=0.05)
        doc = raw.find_one({"_id": NAME})
        assert doc is not None
        _emit(token=lease.token, acquired=_ms(doc["acquiredAt"]))
    backend.close()
    client.close()


class Children:
    """Child processes of this module; each is killed at exit if still running."""

    def __init__(self, url: str, db: str) -> None:
        self.url, self.db = url, db
        self.procs: list[subprocess.Popen[str]] = []

    def spawn(
        self, mode: str, ident: str, *args: object, skew: bool = False
    ) -> subprocess.Popen[str]:
        cmd = [sys.executable, "-m", "tests.integration.lease.test_mongo_lease"]
        cmd += [mode, self.url, self.db, ident]
        env = dict(os.environ)
        if skew:
            faketime = shutil.which("faketime")
            assert faketime, "faketime missing: apt-get install -y faketime (make sysdeps)"
            cmd = [faketime, "-f", f"+{SKEW:.0f}s", *cmd]
            env["FAKETIME_DONT_FAKE_MONOTONIC"] = "1"
        proc = subprocess.Popen(
            [*cmd, *map(str, args)],
            cwd=ROOT,
            env=env,
            text=True,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        self.procs.append(proc)
        return proc

    @staticmethod
    def ready(proc: subprocess.Popen[str]) -> dict[str, Any]:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line, f"child exited with {proc.wait()} before it was ready"
        return dict(json.loads(line))

    @staticmethod
    def go(proc: subprocess.Popen[str]) -> None:
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()

    @staticmethod
    def finish(proc: subprocess.Popen[str], timeout: float = 60) -> list[dict[str, Any]]:
        out, _ = proc.communicate(timeout=timeout)
        assert proc.returncode == 0, f"child failed with {proc.returncode}"
        return [json.loads(line) for line in out.splitlines() if line.strip()]

    def kill_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)


@pytest.fixture
def children(mongo_url: str, unique: str) -> Iterator[Children]:
    kids = Children(mongo_url, f"t{unique}")
    try:
        yield kids
    finally:
        kids.kill_all()


class Transcript:
    """Every write to the leases collection, in the server's order, from a change stream."""

    def __init__(self, coll: pymongo.collection.Collection[dict[str, Any]]) -> None:
        self.coll = coll
        self.events: list[dict[str, Any]] = []
        self.opened = threading.Event()
        self.marker = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        assert self.opened.wait(10), "change stream did not open"

    def _run(self) -> None:
        with self.coll.watch(max_await_time_ms=200) as stream:
            self.opened.set()
            while not self.marker.is_set():
                change = stream.try_next()
                if change is None:
                    continue
                if change["documentKey"]["_id"] == "marker":
                    self.marker.set()
                else:
                    self.events.append(change)

    def drain(self) -> list[dict[str, Any]]:
        self.coll.insert_one({"_id": "marker"})
        self.thread.join(20)
        assert self.marker.is_set(), "the change stream never delivered the marker"
        return self.events


def replay(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The tenures the server granted, each with its server-time window [acquired, end]."""
    tenures: list[dict[str, Any]] = []
    for ev in events:
        if ev["operationType"] in ("insert", "replace"):
            fields = ev["fullDocument"]
        else:
            fields = ev["updateDescription"]["updatedFields"]
        cur = tenures[-1] if tenures else None
        if "token" in fields and (cur is None or fields["token"] != cur["token"]):
            tenures.append(
                {
                    "token": fields["token"],
                    "holder": fields["holder"],
                    "acquired": _ms(fields["acquiredAt"]),
                    "end": _ms(fields["expiresAt"]),
                    "released": False,
                }
            )
        elif cur is not None and "expiresAt" in fields:  # renewal, or release (holder null)
            cur["end"] = _ms(fields["expiresAt"])
            cur["released"] = cur["released"] or ("holder" in fields and fields["holder"] is None)
    return tenures


# -- tests -------------------------------------------------------------------------------------
def test_eight_contenders_one_skewed_never_overlap(
    children: Children, client: pymongo.MongoClient[dict[str, Any]]
) -> None:
    coll = client[children.db]["leases"]
    transcript = Transcript(coll)
    procs = [children.spawn("loop", f"c{i}", 10.0, 0.5, skew=i == 0) for i in range(8)]
    hello = [Children.ready(p) for p in procs]
    assert abs(hello[0]["skew"] - SKEW) < 5, f"faketime did not move the wall clock: {hello[0]}"
    assert all(abs(h["skew"]) < 5 for h in hello[1:]), hello
    assert abs(hello[0]["mono"] - time.monotonic()) < 60, "faketime moved the monotonic clock"
    for p in procs:
        Children.go(p)
    outputs = [Children.finish(p) for p in procs]
    tenures = replay(transcript.drain())

    grants = [g for out in outputs for g in out if "token" in g]
    tokens = [g["token"] for g in grants]
    assert len(tokens) == len(set(tokens)), "a token was granted twice"
    by_acquired = sorted((g for g in grants if g["acquired"] is not None), key=lambda g: g["token"])
    times = [g["acquired"] for g in by_acquired]
    assert times == sorted(times), "tokens do not increase in grant order"

    # The server's own transcript, in commit order: each token is max(previous + 1, the grant's
    # $$NOW in ms), and each grant saw the previous tenure over: released before it (an earlier
    # event), or expired by the grant's $$NOW. ($$NOW is fixed when a command starts, before it
    # waits for the document, so a grant queued behind a release may carry a time a few ms
    # before that release: only the order of commits, not those timestamps, can show a released
    # tenure ended first.)
    assert tenures[0]["token"] == tenures[0]["acquired"], tenures[0]
    for prev, cur in itertools.pairwise(tenures):
        assert cur["token"] == max(prev["token"] + 1, cur["acquired"]), (prev, cur)
        assert prev["released"] or cur["acquired"] >= prev["end"], f"overlap: {prev} and {cur}"
    assert {(t["token"], t["holder"]) for t in tenures} == {
        (g["token"], g["holder"]) for g in grants
    }

    winners = {g["holder"].split("/")[0] for g in grants}
    assert len(grants) >= 16 and len(winners) >= 4, (
        f"too little contention to prove anything: {winners}"
    )
    assert any(t["released"] for t in tenures) and any(not t["released"] for t in tenures[:-1])
    refused = sum(out[-1]["refused"] for out in outputs)
    assert refused > 0


@pytest.mark.parametrize("skew", [False, True], ids=["same-clock", "wall-clock+30s"])
def test_crash_takeover_waits_exactly_for_server_expiry(
    children: Children, client: pymongo.MongoClient[dict[str, Any]], skew: bool
) -> None:
    ttl, retry = 1.5, 0.05
    proc = children.spawn("takeover", "late", ttl, skew=skew)
    Children.ready(proc)
    backend = MongoLeaseBackend(client, database=children.db)
    lease = backend.try_acquire(NAME, "leader/1", ttl)  # then "crashes": never renews
    assert lease is not None
    held = client[children.db]["leases"].find_one({"_id": NAME})
    assert held is not None
    Children.go(proc)
    (taken,) = Children.finish(proc)
    waited = (taken["acquired"] - _ms(held["acquiredAt"])) / 1000
    # Minted from the server's clock: the skewed child's own clock is 30 s ahead of it.
    assert taken["token"] == taken["acquired"] > lease.token
    # Never before the server's expiry; at most one retry (plus scheduling slack) after it.
    assert ttl <= waited <= ttl + retry + 1.0, waited
    backend.close()


def test_stale_holder_cannot_renew_release_or_clear(mongo_url: str, unique: str) -> None:
    with (
        MongoLeaseBackend(mongo_url, database=f"t{unique}") as old_side,
        MongoLeaseBackend(mongo_url, database=f"t{unique}") as new_side,
    ):
        stale = old_side.try_acquire(NAME, "old/1", 0.3)
        assert stale is not None
        wait_until(lambda: new_side.inspect(NAME) is None, 10, what="the old lease expiring")
        live = new_side.try_acquire(NAME, "new/1", 30)
        assert live is not None and live.token > stale.token
        assert old_side.renew(stale) is None
        assert old_side.renew(stale, ttl=60) is None
        assert old_side.release(stale) is False
        assert old_side.try_acquire(NAME, "old/1", 30) is None
        assert old_side.release(Lease(NAME, "old/1", live.token, 30)) is False
        state = old_side.inspect(NAME)
        assert state is not None and (state.holder, state.token) == ("new/1", live.token)
        assert new_side.renew(live) == live
        assert new_side.release(live)


@pytest.mark.parametrize(
    "url", ["http://localhost:27017", "mongodb://", "mongodb://admin:s3cret@localhost:notaport/"]
)
def test_bad_url_is_a_configuration_error_without_the_password(url: str) -> None:
    with pytest.raises(ConfigurationError) as err:
        MongoLeaseBackend(url)
    assert "s3cret" not in str(err.value)
    if "admin" in url:
        assert "admin:***@" in str(err.value)


def test_unreachable_server_fails_within_the_timeout_and_never_leads() -> None:
    url = f"mongodb://127.0.0.1:{free_port()}/"
    backend = MongoLeaseBackend(url, timeout=0.5)
    start = time.monotonic()
    with pytest.raises(BackendUnavailableError, match=str(url.split(":")[-1].strip("/"))):
        backend.try_acquire(NAME, "a/1", 5)
    assert time.monotonic() - start < 0.5 + 5, "the configured timeout was not applied"
    for call in (lambda: backend.inspect(NAME), lambda: backend.renew(Lease(NAME, "a/1", 1, 5))):
        with pytest.raises(BackendUnavailableError):
            call()
    _assert_never_leads(backend, failing=False)


def _assert_never_leads(backend: MongoLeaseBackend, failing: bool) -> None:
    """Run an Elector on ``backend`` until it has failed three times; it must never lead, and
    say why (``failing``: the error is one that retrying will not fix)."""
    attempts: list[Exception] = []
    real = backend.contend

    def counting(name: str, holder: str, ttl: float) -> Any:
        try:
            return real(name, holder, ttl)
        except Exception as exc:
            attempts.append(exc)
            raise

    backend.contend = counting  # type: ignore[method-assign]
    elected = threading.Event()
    elector = Elector(
        backend, NAME, ttl=3, retry_interval=0.1, on_elected=lambda _ld: elected.set()
    )
    elector.start()
    try:
        wait_until(lambda: len(attempts) >= 3, 30, what="three failed campaigns")
        assert not elected.is_set() and not elector.is_leader
        assert elector.failing is failing and elector.stats.contend_failures >= 3
        assert elector.last_error is not None and type(attempts[-1]).__name__ in elector.last_error
    finally:
        elector.stop()
        backend.close()


@pytest.fixture(scope="module")
def auth_server() -> Iterator[MongoServer]:
    server = MongoServer()
    with server:
        admin: pymongo.MongoClient[dict[str, Any]] = pymongo.MongoClient(server.url)
        admin.admin.command(
            "createUser", "reader", pwd="readerpw", roles=[{"role": "read", "db": "t"}]
        )
        admin.close()
        server.extra_args.append("--auth")
        server.restart()
        yield server


@pytest.mark.parametrize("user", ["reader:readerpw", "reader:wrong", None])
def test_no_permission_is_permission_denied_and_never_leads(
    auth_server: MongoServer, user: str | None
) -> None:
    creds = f"{user}@" if user else ""
    url = f"mongodb://{creds}{auth_server.host}:{auth_server.port}/?authSource=admin"
    backend = MongoLeaseBackend(url, database="t")
    with pytest.raises(PermissionDeniedError) as err:
        backend.try_acquire(NAME, "a/1", 5)
    assert "wrong" not in str(err.value) and "readerpw" not in str(err.value)
    if user == "reader:readerpw":
        assert backend.inspect(NAME) is None  # reading is allowed, writing is not
    _assert_never_leads(backend, failing=True)


if __name__ == "__main__":
    from loguru import logger

    logger.remove()
    logger.add(sys.stderr, level="WARNING")
    if "FAKETIME" in os.environ:
        # libfaketime 0.9.10 makes clock_nanosleep (time.sleep) fail with EINVAL when the
        # monotonic clock is not faked, which kills pymongo's monitor threads; condition waits
        # are unaffected, so sleep on one. The wall clock stays 30 s ahead.
        def _sleep(seconds: float | SupportsIndex) -> None:
            threading.Event().wait(float(seconds))

        time.sleep = _sleep
    _child(sys.argv[1:])
