"""The asyncio backends take the thread backends' URLs and options, and refuse the same bad ones
with the same words (one checking code path: ``checked_url``, ``building_client``,
``check_options``), connecting to nothing."""

from __future__ import annotations

import asyncio

import pytest

from singleton.aio import AsyncMongoLeaseBackend, AsyncRedisLeaseBackend
from singleton.errors import ConfigurationError
from singleton.lease.mongo import MongoLeaseBackend
from singleton.lease.redis import RedisLeaseBackend

BAD_REDIS = [
    "http://127.0.0.1:6379/0",
    "redis://:pa ss#word@127.0.0.1:6379/0",
    "redis://127.0.0.1:6379/0?socket_timeot=1",
    "redis+sentinel://:secret@127.0.0.1:26379",
    "redis+sentinel://127.0.0.1:26379/mymaster/x",
    "redis+sentinel://127.0.0.1:26379/mymaster?ssl_ca_certs=/ca.pem",
    "redis://127.0.0.1:6379/0\n",
]
BAD_MONGO = [
    "mongodb://user:secret@127.0.0.1:notaport/",
    "mongodb://127.0.0.1:27017/\r",
]


def refusal(make: object, *args: object, **kw: object) -> str:
    with pytest.raises(ConfigurationError) as caught:
        make(*args, **kw)  # type: ignore[operator]
    return str(caught.value)


@pytest.mark.parametrize("url", BAD_REDIS)
def test_redis_urls_are_refused_as_the_thread_backend_refuses_them(url: str) -> None:
    assert refusal(AsyncRedisLeaseBackend, url) == refusal(RedisLeaseBackend, url)


@pytest.mark.parametrize("url", BAD_MONGO)
def test_mongo_urls_are_refused_as_the_thread_backend_refuses_them(url: str) -> None:
    assert refusal(AsyncMongoLeaseBackend, url) == refusal(MongoLeaseBackend, url)


@pytest.mark.parametrize(
    "options",
    [{"namespace": ""}, {"socket_timeout": 0}, {"socket_connect_timeout": True}],
)
def test_redis_options_are_refused_alike(options: dict[str, object]) -> None:
    url = "redis://127.0.0.1:6379/0"
    assert refusal(AsyncRedisLeaseBackend, url, **options) == refusal(
        RedisLeaseBackend, url, **options
    )


@pytest.mark.parametrize(
    "options", [{"database": "a$b"}, {"collection": ""}, {"timeout": -1}, {"timeout": "2"}]
)
def test_mongo_options_are_refused_alike(options: dict[str, object]) -> None:
    url = "mongodb://127.0.0.1:27017/"
    assert refusal(AsyncMongoLeaseBackend, url, **options) == refusal(
        MongoLeaseBackend, url, **options
    )


def test_good_urls_build_clients_without_connecting() -> None:
    async def build() -> None:
        for url in (
            "redis://:secret@127.0.0.1:1/0",
            "unix:///tmp/nothing.sock",
            "redis+sentinel://:secret@127.0.0.1:1,127.0.0.1:2/mymaster/2",
        ):
            backend = AsyncRedisLeaseBackend(url)
            assert "secret" not in backend.describe()
            await backend.aclose()
        mongo = AsyncMongoLeaseBackend("mongodb://u:secret@127.0.0.1:1/")
        assert "secret" not in mongo.describe()
        await mongo.aclose()

    asyncio.run(build())
