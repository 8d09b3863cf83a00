"""Passwords never reach an output channel: a Hypothesis search over passwords made of any
printable characters, written into URLs raw or percent-encoded, checked against every channel
that can show a URL: ``redact`` itself, the exit-2 message, ``Config.redacted()`` (what status and
logs show of the configuration), a lease backend's description (in every log line about it) and
the JSON log format. The URLs include Redis Sentinel's, whose Sentinels have a password of their
own (``sentinel_password=``), written raw in the query too. Passwords hold spaces, tabs and line
ends as well as ``,`` and ``&``, and are searched as written, percent-encoded, and escaped as
``repr`` and JSON write them. Passwords made of pieces joined by ``#``, ``/``, ``?``, ``@``, ``%``,
``,``, ``&``, spaces, tabs, line ends or non-ASCII are searched piece by piece in every URL key's
parser errors, which once quoted a piece as a port (a comma-cut piece of ``es_url`` as a host, a
``&``-cut piece of a ``sentinel_password`` as a parameter)."""

from __future__ import annotations

import json
import re
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
PASSWORDS = st.text(alphabet=string.printable.strip() + " \t\n", min_size=1, max_size=20).map(
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
    # es_url is a list: the Elasticsearch listener splits it at every comma
    "https://elastic:{p}@search1.internal:9200,https://search2.internal:9200",
    # Redis behind Sentinel: the master's password, the Sentinels' own (a query value), TLS
    "redis+sentinel://:{p}@s1.internal:26379,s2.internal/mymaster/0?sentinel_password={q}",
    "rediss+sentinel://app:{p}@s1.internal:26379/mymaster?sentinel_username=sen&"
    "sentinel_password={q}&ssl_ca_certs=/etc/ca.pem&ssl_cert_reqs=required",
    "redis+sentinel://s1.internal:26379/mymaster?sentinel_username=sen&sentinel_password={q}",
    # ... and written raw: a space, a line end or an `&` in it (the value and what follows)
    "redis+sentinel://s1.internal:26379/mymaster?sentinel_password={p}",
    "redis+sentinel://s1.internal:26379/mymaster?sentinel_password={p}&sentinel_username=sen",
    # redis-py's own query: a raw `&` in its password made an unknown connection keyword
    "redis://cache.internal:6379/0?password={p}&db=1",
)
ENCODINGS = (lambda p: p, quote, quote_plus)


def _forms(password: str) -> set[str]:
    return {password, quote(password), quote_plus(password), quote(password, safe="")}


def _urls(password: str) -> list[str]:
    q = quote(password, safe="")
    return [t.format(p=enc(password), q=q) for t in TEMPLATES for enc in ENCODINGS]


def _unescaped(text: str) -> str:
    """``text`` with the escapes of ``repr`` and JSON (``\\n``, ``\\t``, ``\\'``, ``\\xe9``,
    ``\\u00e9``...) read back, so that a password shown escaped is found too."""
    try:
        return text.encode("latin-1", "backslashreplace").decode("unicode_escape")
    except UnicodeDecodeError:  # a lone backslash at the end: nothing was escaped there
        return text


def _leaks(text: str, password: str) -> bool:
    return any(form in shown for shown in (text, _unescaped(text)) for form in _forms(password))


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


#: A password made of distinctive pieces joined by what URL parsers read as the end of a host
#: part or mangle (``#``, ``/``, ``?``, ``@``, ``%``, a space, non-ASCII). A parser that cut such a
#: URL short quoted a *piece* in its own error (``Port could not be cast to integer value as
#: 'pre'``), which no search for the whole password finds: these tests search for every piece.
#: Pieces that look like ports (digits) are the worst case: the URL then parses, wrongly.
PIECES = st.one_of(
    st.text(alphabet=string.ascii_letters + string.digits, min_size=3, max_size=8).map(
        lambda s: f"Zq{s}"
    ),
    st.integers(1000, 65535).map(str),
)
SEPARATORS = st.sampled_from(
    ["#", "/", "?", "@", "%", " ", "é", "#/", "?#", "@#", "%zz", ",", "&", "\n", "\t", " &", ",\n"]
)


@st.composite
def split_passwords(draw: st.DrawFn) -> tuple[str, list[str]]:
    pieces = draw(st.lists(PIECES, min_size=2, max_size=3, unique=True))
    password = pieces[0] + "".join(draw(SEPARATORS) + piece for piece in pieces[1:])
    return password, pieces


#: The random ObjectId pymongo prints in a topology description ("id: 6b10...d1"): a short
#: piece of a generated password may occur in its hex by chance (seen once: "6689").
_RANDOM_ID = re.compile(r"\bid: [0-9a-f]{24}\b")


def _leaks_a_piece(text: str, password: str, pieces: list[str]) -> bool:
    bare = _RANDOM_ID.sub("id: <random>", text)
    return _leaks(text, password) or any(piece in bare for piece in pieces)


def _elasticsearch_channels(url: str) -> list[str]:
    """What the Elasticsearch listener's transport shows of an ``es_url`` the service accepted:
    its description of the nodes, or its error."""
    from listeners.elasticsearch.transport import connect, describe
    from singleton.errors import SingletonError

    try:
        shown = [describe(url)]
        connect(url).close()  # connects to nothing yet
    except SingletonError as exc:
        shown = [str(exc)]
    return shown


def _url_key(url: str) -> str:
    if url.startswith("mongodb"):
        return "mongo_url"
    return "es_url" if url.startswith("http") else "redis_url"


def _driver_channels(url: str) -> list[str]:
    """What the drivers show of ``url``: their error, else their description of the client.
    (Elasticsearch URLs reach a client only through the service's checks: ``es_url`` and a
    listener table's own URL options are refused before ``listeners.elasticsearch`` parses
    them; what its transport shows of an accepted one is :func:`_elasticsearch_channels`.)"""
    from singleton.drivers import mongo
    from singleton.drivers.redis import client_from_url, describe_client
    from singleton.errors import SingletonError

    key = _url_key(url)
    try:
        if key == "redis_url":
            client = client_from_url(url)
            shown = describe_client(client)
            client.close()
        elif key == "mongo_url":
            built, _ = mongo.client(url)
            shown = repr(built.topology_description)
            built.close()
        else:
            return []
    except SingletonError as exc:
        shown = str(exc)
    return [shown]


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(secret=split_passwords())
def test_parser_errors_never_show_a_piece_of_it(
    secret: tuple[str, list[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    """Every URL key (redis_url, Sentinel URLs, mongo_url, es_url), raw and percent-encoded:
    the exit-2 message, the configuration error, ``Config.redacted()`` and what ``status``
    names (``store``), and the drivers' own errors and descriptions."""
    from singleton.errors import ConfigurationError
    from singleton.service.status import describe_store, store_entry

    password, pieces = secret
    _assume_distinct(password)
    skeleton = " ".join(TEMPLATES)
    assume(not any(piece in skeleton for piece in pieces))
    for url in _urls(password):
        key = _url_key(url)
        shown = [redact(f"connecting to {url} failed")]
        try:
            config = load_config(environ={"SINGLETON_" + key.upper(): url})
        except ConfigurationError as exc:
            shown.append(str(exc))
            assert main(["status", "--" + key.replace("_", "-"), url]) == 2
            out = capsys.readouterr()
            shown += [out.out, out.err]
        else:
            shown.append(json.dumps(config.redacted()))
            store = store_entry(config, None)
            shown += [json.dumps(store), describe_store(store)]
            if key == "es_url":
                shown += _elasticsearch_channels(url)
        shown += _driver_channels(url)
        for text in shown:
            assert not _leaks_a_piece(text, password, pieces), (url, text)


@pytest.mark.parametrize(
    "url",
    [
        "redis://u:pre#post@cache.internal/0",
        "redis://u:1234#post@cache.internal/0",  # parsed as host u, port 1234 before
        "redis+sentinel://:pre/post@s1.internal:26379/mymaster/0",
        "redis+sentinel://:pre?post@s1.internal:26379/mymaster/0",
        "mongodb://app:pre/post@db.internal/",
        "mongodb://app:pre?post@db.internal/",
        "https://elastic:1234#post@search.internal:9200",
    ],
)
def test_a_password_a_parser_would_cut_short_is_refused_naming_the_key_and_the_fix(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    key = _url_key(url)
    assert main(["status", "--" + key.replace("_", "-"), url]) == 2
    err = capsys.readouterr().err
    assert f"error: {key}: the user name or password in" in err
    assert "percent-encode" in err and "`#` as %23" in err
    assert "pre" not in err.replace("prefix", "") and "post" not in err and "1234" not in err
