"""The checkpoint store contract, as a Hypothesis state machine against both real stores
(MongoCheckpointStore on SecantusDB, RedisCheckpointStore on redis-server): writers with random
fencing tokens and positions; no stale writer ever succeeds and the position never regresses.
(The checkpoint policy, when a tenure saves and which position: ``test_checkpoint_policy.py``.)"""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any

import pymongo
import pytest
import redis
from bson.timestamp import Timestamp
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from listeners import Checkpoint, CheckpointStore, MongoCheckpointStore, RedisCheckpointStore
from listeners.base import ChangeStreamListener
from listeners.checkpoints.stores import check_deployment
from listeners.stream.tokens import token_time
from singleton.errors import ConfigurationError, StaleWriterError


class _Writer:
    """What save_progress needs from a Leadership."""

    def __init__(self, token: int) -> None:
        self.token = token
        self.holder = f"w{token}"


DEPLOYMENT = {"listener": "tests:L", "namespace": "d.c", "sink": ""}


class StoreMachine(RuleBasedStateMachine):
    store: CheckpointStore

    def __init__(self) -> None:
        super().__init__()
        self.name = uuid.uuid4().hex
        self.fencing = -1
        self.position: Timestamp | None = None
        self.token: dict[str, Any] | None = None
        self.progress: dict[str, Any] | None = None

    @rule(
        writer=st.integers(1, 5),
        t=st.integers(1, 4),
        i=st.integers(0, 2),
        start_after=st.booleans(),
        no_token=st.booleans(),
    )
    def save(self, writer: int, t: int, i: int, start_after: bool, no_token: bool) -> None:
        ct = Timestamp(t, i)
        token = None if no_token else {"_data": f"{writer:02x}{t:02x}{i:02x}"}
        cp = Checkpoint(self.name, token, ct, writer, f"w{writer}", start_after=start_after)
        allowed = writer >= self.fencing and (self.position is None or ct >= self.position)
        try:
            self.store.save(cp)
        except StaleWriterError:
            assert not allowed, f"refused an allowed write {cp} over {self.fencing}/{self.position}"
            return
        assert allowed, (
            f"accepted a stale or backward write {cp} over {self.fencing}/{self.position}"
        )
        self.fencing, self.position, self.token = writer, ct, token

    @rule(writer=st.integers(1, 5))
    def claim(self, writer: int) -> None:
        try:
            found = self.store.claim(self.name, writer, f"w{writer}", DEPLOYMENT)
        except StaleWriterError:
            assert writer < self.fencing, f"claim by {writer} refused over {self.fencing}"
            return
        assert writer >= self.fencing, f"claim by {writer} accepted over {self.fencing}"
        self.fencing = writer
        if self.position is None:
            assert found is None
        else:  # the position as stored at the claim, now fenced by the claimer
            assert found is not None
            assert (found.cluster_time, found.resume_token, found.fencing_token) == (
                self.position,
                self.token,
                writer,
            )
            assert found.deployment == DEPLOYMENT

    @rule(writer=st.integers(1, 5), value=st.none() | st.integers(0, 9))
    def save_progress(self, writer: int, value: int | None) -> None:
        data = None if value is None else {"copied": value}
        try:
            self.store.save_progress(self.name, data, _Writer(writer))  # type: ignore[arg-type]
        except StaleWriterError:
            assert writer < self.fencing
            return
        assert writer >= self.fencing, "a stale progress write succeeded"
        self.fencing, self.progress = writer, data

    @invariant()
    def stored_matches_model(self) -> None:
        cp = self.store.load(self.name)
        if self.position is None:
            assert cp is None
        else:
            assert cp is not None
            assert (cp.cluster_time, cp.fencing_token, cp.resume_token) == (
                self.position,
                self.fencing,
                self.token,
            )
        assert self.store.load_progress(self.name) == self.progress


def _run(store: CheckpointStore) -> None:
    StoreMachine.store = store
    stores = settings.get_profile("stores")
    run_state_machine_as_test(
        StoreMachine, settings=settings(stores, max_examples=200, stateful_step_count=8)
    )


def test_mongo_checkpoint_store_contract(mongo_url: str, unique: str) -> None:
    client: pymongo.MongoClient[dict[str, Any]] = pymongo.MongoClient(mongo_url, tz_aware=True)
    _run(MongoCheckpointStore(client, database=f"t{unique}"))


def test_redis_checkpoint_store_contract(redis_url: str, unique: str) -> None:
    _run(RedisCheckpointStore(redis.Redis.from_url(redis_url), namespace=f"t{unique}"))


class _One(ChangeStreamListener):
    database = "shop"
    name = "shared"


class _Two(ChangeStreamListener):
    database = "shop"
    name = "shared"


def _stores(mongo_url: str, redis_url: str, unique: str) -> list[CheckpointStore]:
    client: pymongo.MongoClient[dict[str, Any]] = pymongo.MongoClient(mongo_url, tz_aware=True)
    return [
        MongoCheckpointStore(client, database=f"t{unique}"),
        RedisCheckpointStore(redis.Redis.from_url(redis_url), namespace=f"t{unique}"),
    ]


@pytest.mark.parametrize(
    ("first", "second", "differs"),
    [
        (_One(collection="orders"), _One(collection="invoices"), "shop.invoices"),
        (_One(collection="orders"), _Two(collection="orders"), "_Two"),
    ],
    ids=["same-name-other-collection", "same-collection-other-class"],
)
def test_a_checkpoint_of_another_deployment_is_refused(
    first: ChangeStreamListener,
    second: ChangeStreamListener,
    differs: str,
    mongo_url: str,
    redis_url: str,
    unique: str,
) -> None:
    for store in _stores(mongo_url, redis_url, unique):
        store.claim("shared", 1, "a", first.deployment())
        store.save(Checkpoint("shared", None, Timestamp(5, 0), 1, "a"))
        check_deployment(store, first)  # its own: fine
        with pytest.raises(ConfigurationError) as startup:
            check_deployment(store, second)
        with pytest.raises(ConfigurationError) as claim:
            store.claim("shared", 2, "b", second.deployment())
        for message in (str(startup.value), str(claim.value)):
            assert "shop.orders" in message and differs in message, message  # both sides named
        cp = store.load("shared")  # the refused claim changed nothing
        assert cp is not None and (cp.fencing_token, cp.holder) == (1, "a")
        assert store.load_deployment("shared") == first.deployment()
        assert store.claim("shared", 2, "b", first.deployment()) == dataclasses.replace(
            cp,
            fencing_token=2,
            holder="b",
            updated_at=store.load("shared").updated_at,  # type: ignore[union-attr]
        )


def test_a_record_without_deployment_is_adopted(
    mongo_url: str, redis_url: str, unique: str
) -> None:
    for store in _stores(mongo_url, redis_url, unique):
        store.save(Checkpoint("old", None, Timestamp(5, 0), 1, "a"))  # written before deployments
        check_deployment(store, _One(collection="orders", name="old"))
        found = store.claim("old", 2, "b", {"listener": "x:Y", "namespace": "d.c", "sink": ""})
        assert found is not None and found.cluster_time == Timestamp(5, 0)
        assert store.load_deployment("old") == {"listener": "x:Y", "namespace": "d.c", "sink": ""}


def test_store_owns_only_what_it_creates(mongo_url: str, redis_url: str) -> None:
    client: pymongo.MongoClient[dict[str, Any]] = pymongo.MongoClient(mongo_url)
    MongoCheckpointStore(client).close()
    assert client.admin.command("ping")["ok"] == 1.0  # still usable: not ours to close
    r = redis.Redis.from_url(redis_url)
    RedisCheckpointStore(r).close()
    assert r.ping()


@pytest.mark.parametrize(
    ("token", "expected"),
    [
        ({"_data": "82" + "0000000a" + "00000003" + "2b0229296e04"}, Timestamp(10, 3)),
        ({"_data": "zz"}, None),
        (None, None),
    ],
)
def test_token_time_reads_mongod_keystrings(token: Any, expected: Timestamp | None) -> None:
    assert token_time(token) == expected
