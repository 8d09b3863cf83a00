"""``rediss+sentinel://`` and the Sentinels' own credentials, read from the URL: what reaches
redis-py's Sentinel clients and master pool (a TLS Sentinel is not started here: the parse and the
built clients are checked; ``tests/integration/lease/test_sentinel.py`` runs password-protected
Sentinels for real)."""

from __future__ import annotations

from typing import Any

from singleton.drivers.redis import client_from_url, describe_client, parse_sentinel_url
from singleton.service.config import load_config

SECRET = "s3nt1nel-pa55"
SERVICE = "mymaster"


def test_sentinel_auth_and_tls_are_query_and_scheme() -> None:
    url = (
        f"rediss+sentinel://:m%40ster@a/{SERVICE}/2?sentinel_username=sen&sentinel_password="
        f"{SECRET}%26x&ssl_ca_certs=/ca.pem&ssl_cert_reqs=Required&ssl_check_hostname=false"
    )
    parts = parse_sentinel_url(url)
    tls = {"ssl": True, "ssl_ca_certs": "/ca.pem", "ssl_cert_reqs": "required"}
    tls["ssl_check_hostname"] = False
    assert parts.sentinel_kwargs() == {"username": "sen", "password": f"{SECRET}&x", **tls}
    assert parts.master_kwargs() == {"db": 2, "username": None, "password": "m@ster", **tls}
    assert SECRET not in repr(parts)
    client = client_from_url(url)  # connects to nothing yet
    try:
        pool: Any = client.connection_pool
        assert pool.connection_class.__name__ == "SentinelManagedSSLConnection"
        assert pool.connection_kwargs["ssl_ca_certs"] == "/ca.pem"
        [sentinel] = pool.sentinel_manager.sentinels
        kw = sentinel.connection_pool.connection_kwargs
        assert (kw["username"], kw["password"], kw["ssl_ca_certs"]) == (
            "sen",
            f"{SECRET}&x",
            "/ca.pem",
        )
        assert describe_client(client) == f"rediss+sentinel://a:26379/{SERVICE}/2"
    finally:
        client.close()
    config = load_config(environ={"SINGLETON_REDIS_URL": url})
    assert SECRET not in str(config.redacted()) and "m@ster" not in str(config.redacted())
