"""Shared fixtures: real servers started once per session on free ports, and one ``backend``
fixture parametrized over every lease backend (APScheduler's conftest pattern)."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any, Literal

import pytest
from hypothesis import HealthCheck, settings
from loguru import logger

from singleton.lease.contract import LeaseBackend
from singleton.service.dev.embedded import ElasticServer, EmbeddedServer, MongoServer, RedisServer
from singleton.testing import MemoryLeaseBackend

#: The Hypothesis state machines drive stores whose calls take what they take: no deadline per
#: example, and slow examples are no health problem. A machine's settings derive from it, as
#: ``settings(settings.get_profile("stores"), max_examples=..., stateful_step_count=...)``.
settings.register_profile("stores", deadline=None, suppress_health_check=[HealthCheck.too_slow])

# The library is silent by default (``import singleton`` disables its loggers); the tests read
# its records through sinks of their own.
for _package in ("singleton", "listeners"):
    logger.enable(_package)


def _serving(
    name: str, make: Callable[[], EmbeddedServer], scope: Literal["session", "module"] = "session"
) -> Any:
    """The fixture ``name``: the server ``make()`` returns, running while ``scope`` lasts."""

    def serve() -> Iterator[EmbeddedServer]:
        with make() as server:
            yield server

    serve.__doc__ = make.__doc__
    return pytest.fixture(serve, scope=scope, name=name)


def _real_redis() -> RedisServer:
    """A redis-server (not fakeredis's stand-in): the real-server tests need the real thing."""
    server = RedisServer()
    assert not server.fake, "redis-server must be on PATH for the real-server tests (make sysdeps)"
    return server


def _faulty_mongo() -> MongoServer:
    """A SecantusDB of the module's own with test commands on, so its fail points hurt no other
    module's server."""
    return MongoServer(test_commands=True)


redis_server = _serving("redis_server", _real_redis)
mongo_server = _serving("mongo_server", MongoServer)
faulty_mongo = _serving("faulty_mongo", _faulty_mongo, scope="module")
es_server = _serving("es_server", ElasticServer)


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    return redis_server.url


@pytest.fixture
def mongo_url(mongo_server: MongoServer) -> str:
    return mongo_server.url


@pytest.fixture
def es_url(es_server: ElasticServer) -> str:
    return es_server.url


@pytest.fixture
def client(mongo_url: str) -> Iterator[Any]:
    """A pymongo client on the session's SecantusDB (modules needing a fresh server override it)."""
    import pymongo

    c: Any = pymongo.MongoClient(mongo_url)
    yield c
    c.close()


@pytest.fixture
def docs(client: Any, unique: str) -> Any:
    """A fresh collection (``es<unique>.docs``) for one Elasticsearch test."""
    return client[f"es{unique}"]["docs"]


@pytest.fixture
def unique() -> str:
    """A fresh suffix, so tests sharing a server never share keys, collections or indices."""
    return uuid.uuid4().hex[:12]


def _fakeredis(request: pytest.FixtureRequest, unique: str) -> LeaseBackend:
    import fakeredis

    from singleton.lease.redis import RedisLeaseBackend

    # FakeRedis() instances do not share data: one FakeServer per test plays the server.
    server = getattr(request.node, "_singleton_fakeredis", None)
    if server is None:
        server = fakeredis.FakeServer()
        request.node._singleton_fakeredis = server
    return RedisLeaseBackend(fakeredis.FakeRedis(server=server), namespace=f"t{unique}")


def _redis(request: pytest.FixtureRequest, unique: str) -> LeaseBackend:
    from singleton.lease.redis import RedisLeaseBackend

    return RedisLeaseBackend(request.getfixturevalue("redis_url"), namespace=f"t{unique}")


def _mongo(request: pytest.FixtureRequest, unique: str) -> LeaseBackend:
    from singleton.lease.mongo import MongoLeaseBackend

    return MongoLeaseBackend(request.getfixturevalue("mongo_url"), database=f"t{unique}")


#: Every lease backend the contract suite runs against: adding a backend is one entry here.
BACKEND_FACTORIES: dict[str, Callable[[pytest.FixtureRequest, str], LeaseBackend]] = {
    "memory": lambda request, unique: MemoryLeaseBackend(),
    "fakeredis": _fakeredis,
    "redis": _redis,
    "mongo": _mongo,
}
BACKENDS = list(BACKEND_FACTORIES)


def make_backend(kind: str, request: pytest.FixtureRequest, unique: str) -> LeaseBackend:
    return BACKEND_FACTORIES[kind](request, unique)


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest, unique: str) -> Iterator[LeaseBackend]:
    """Every lease backend, each against a real server where it has one: the contract suite
    (``tests/integration/lease/test_contract.py``) checks each capability on it."""
    b = make_backend(request.param, request, unique)
    try:
        yield b
    finally:
        b.close()


@pytest.fixture
def backend_factory(request: pytest.FixtureRequest, unique: str) -> Iterator[Any]:
    """``backend_factory(kind)``: more backends of one kind on the same keys (replicas)."""
    made: list[LeaseBackend] = []
    memory = MemoryLeaseBackend()  # one in-process "server" shared by this test's replicas

    def make(kind: str) -> LeaseBackend:
        if kind == "memory":
            return memory
        b = make_backend(kind, request, unique)
        made.append(b)
        return b

    yield make
    for b in made:
        b.close()
