"""Passwords never reach an output channel: a Hypothesis search over passwords made of any
printable characters, written into URLs raw or percent-encoded, checked against every channel
that can show a URL: ``redact`` itself, the exit-2 message, ``Config.redacted()`` (what status and
logs show of the configuration), a lease backend's description (in every log line about it) and
the JSON log format. The URLs include Redis Sentinel's, whose Sentinels have a password of their
own (``sentinel_password=``)."""

from __future__ import annotations

import json
import string
from urllib.parse import quote, quote_plus

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from singleton.redact import redact
from singleton.service.cli import main
from singleton.service.config import load_config

#: Any printable characters between two markers, so that a generated password can never be
#: mistaken for the fixed text around it ("mongodb+srv://", "must start with"...).
PASSWORDS = st.text(alphabet=string.printable.strip(), min_size=1, max_size=20).map(
    lambda middle: f"Pw{middle}wP"
)
TEMPLATES = (
    "redis://:{p}@cache.internal:6379/0",
    "redis://app:{p}@cache.internal:6379/0",
    "rediss://default:{p}@cache.internal:6380/0?ssl_cert_reqs=none",
    "mongodb://app:{p}@db1.internal:27017,db2.internal:27017/shop?replicaSet=rs0",
    # a query value is always percent-encoded: a raw '&' there would start another parameter
    "mongodb://app:{p}@db.internal/?authMechanismProperties=AWS_SESSION_TOKEN:{q}",
    "https://elastic:{p}@search.internal:9200",
    # Redis behind Sentinel: the master's password, the Sentinels' own (a query value), TLS
    "redis+sentinel://:{p}@s1.internal:26379,s2.internal/mymaster/0?sentinel_password={q}",
    "rediss+sentinel://app:{p}@s1.internal:26379/mymaster?sentinel_username=sen&"
    "sentinel_password={q}&ssl_ca_certs=/etc/ca.pem&ssl_cert_reqs=required",
    "redis+sentinel://s1.internal:26379/mymaster?sentinel_username=sen&sentinel_password={q}",
)
ENCODINGS = (lambda p: p, quote, quote_plus)


def _forms(password: str) -> set[str]:
    return {password, quote(password), quote_plus(password), quote(password, safe="")}


def _urls(password: str) -> list[str]:
    q = quote(password, safe="")
    return [t.format(p=enc(password), q=q) for t in TEMPLATES for enc in ENCODINGS]


def _leaks(text: str, password: str) -> bool:
    return any(form in text for form in _forms(password))


def _assume_distinct(password: str) -> None:
    # A password that is also part of the URL's other text (a host, a scheme) cannot be judged.
    skeleton = " ".join(TEMPLATES).replace("{p}", "").replace("{q}", "")
    assume(not any(form in skeleton for form in _forms(password)))


@settings(max_examples=300, deadline=None)
@given(password=PASSWORDS)
def test_redact_hides_every_password_form(password: str) -> None:
    _assume_distinct(password)
    for url in _urls(password):
        shown = redact(f"connecting to {url} failed")
        assert not _leaks(shown, password), (url, shown)


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(password=PASSWORDS)
def test_the_exit_message_and_the_config_view_hide_it(
    password: str, capsys: pytest.CaptureFixture[str]
) -> None:
    _assume_distinct(password)
    for url in _urls(password):
        key = "--redis-url" if url.startswith("redis") else "--mongo-url"
        if url.startswith("http"):
            key = "--es-url"
        # A wrong scheme makes every URL flag an exit-2 error that quotes the value.
        main(["status", key, "x" + url])
        err = capsys.readouterr().err
        assert not _leaks(err, password), err
        env = {"SINGLETON_" + key[2:].replace("-", "_").upper(): url}
        try:
            shown = json.dumps(load_config(environ=env).redacted())
        except Exception as exc:  # invalid URL for that store: the error is what is shown
            shown = str(exc)
        assert not _leaks(shown, password), shown


@settings(max_examples=30, deadline=None)
@given(password=PASSWORDS)
def test_a_backend_description_hides_it(password: str) -> None:
    from singleton.errors import SingletonError
    from singleton.lease.redis import RedisLeaseBackend

    _assume_distinct(password)
    for url in _urls(password):
        if not url.startswith("redis"):
            continue
        try:
            backend = RedisLeaseBackend(url)
        except SingletonError as exc:  # an unparseable URL: its message is the channel
            assert not _leaks(str(exc), password), str(exc)
            continue
        try:
            assert not _leaks(backend.describe(), password), backend.describe()
        finally:
            backend.close()


def test_json_logs_pass_messages_through_redaction(capsys: pytest.CaptureFixture[str]) -> None:
    from loguru import logger

    from singleton.service.logs import setup_logging

    setup_logging("json", "INFO", "r1")
    try:
        logger.info("store at {}", "redis://:s3cr3t-pw@cache:6379/0")
    finally:
        logger.remove()
    out = capsys.readouterr()
    assert "s3cr3t-pw" not in out.out + out.err
    [line] = [json.loads(x) for x in out.err.splitlines() if x.strip()]
    assert "redis://:***@cache:6379/0" in line["text"]
