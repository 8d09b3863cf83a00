"""The one MongoDB client factory: a URL becomes a client bounded by a named use's timeouts (no
server needed: clients connect on first use), a client passed in is returned as it is."""

from __future__ import annotations

from typing import Any

import pytest

from singleton.drivers import mongo
from singleton.drivers.mongo import Timeouts
from singleton.errors import ConfigurationError

URL = "mongodb://127.0.0.1:1/"


def bounds(client: Any) -> tuple[float, float, float]:
    """(server selection, connect, socket) seconds, as pymongo holds them."""
    pool = client.options.pool_options
    return client.options.server_selection_timeout, pool.connect_timeout, pool.socket_timeout


@pytest.mark.parametrize(
    ("timeouts", "expected"),
    [
        (None, (3.0, 3.0, 5.0)),  # the one default: STORE
        (Timeouts.STORE, (3.0, 3.0, 5.0)),
        (Timeouts.COMMAND, (5.0, 5.0, 7.0)),
        (Timeouts.BULK_READ, (10.0, 10.0, 60.0)),
        (Timeouts.BULK_WRITE, (5.0, 5.0, 30.0)),
        (Timeouts.PROBE, (0.5, 0.5, 2.5)),
        (Timeouts.within(4.0), (4.0, 4.0, 4.0)),
        (Timeouts.lease_bound(15.0), (3.0, 3.0, 15.0)),
        (Timeouts.lease_bound(1.0), (3.0, 3.0, 5.0)),  # never shorter than STORE's socket
    ],
)
def test_a_url_becomes_an_owned_client_bounded_by_its_use(
    timeouts: Timeouts | None, expected: tuple[float, float, float]
) -> None:
    client, owned = mongo.client(URL, timeouts)
    try:
        assert owned and bounds(client) == expected
        assert client.codec_options.tz_aware
    finally:
        client.close()


def test_the_older_keywords_still_mean_what_they_meant() -> None:
    """``timeout`` / ``socket_timeout`` (the callers not converted yet): socket defaults to
    ``timeout + 2``."""
    for timeout, socket_timeout, expected in (
        (5.0, None, (5.0, 5.0, 7.0)),
        (5.0, 30.0, (5.0, 5.0, 30.0)),
        (3.0, 5.0, (3.0, 3.0, 5.0)),
    ):
        client, _ = mongo.client(URL, timeout=timeout, socket_timeout=socket_timeout)
        try:
            assert bounds(client) == expected, (timeout, socket_timeout)
        finally:
            client.close()
    with pytest.raises(ConfigurationError, match="not both"):
        mongo.client(URL, Timeouts.STORE, timeout=1.0)


def test_a_client_passed_in_is_not_owned_and_bad_input_is_a_configuration_error() -> None:
    built, _ = mongo.client(URL)
    try:
        same, owned = mongo.client(built, Timeouts.BULK_READ)
        assert same is built and not owned
        assert bounds(same) == (3.0, 3.0, 5.0)  # as it was built: not rebuilt
    finally:
        built.close()
    with pytest.raises(ConfigurationError, match="invalid MongoDB URL"):
        mongo.client("mongodb://u:p@h:notaport/")
    with pytest.raises(ConfigurationError, match="socket timeout must be > 0"):
        Timeouts(1.0, 0.0)
