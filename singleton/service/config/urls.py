"""The URL keys (``redis_url``, ``mongo_url``, ``es_url``, and the URLs of a ``[[listeners]]``
table's own options), checked before any parser or driver sees them.

A URL is refused, naming its key and the fix, when a parser would show a piece of its password:
a raw control character (a line end splits it over two log lines: not even the key's value is
shown then), a user name or password that a parser would cut short (a raw ``/``, ``?`` or ``#``;
in ``es_url``, a list split at every comma, a raw ``,`` too), or a query that a raw ``&`` cut. A
refused URL is shown redacted with everything after a secret query parameter hidden
(:func:`~singleton.redact.redact_refused`). The Redis URL is then parsed as the lease backend
parses it, and a ``mongodb://`` URL as pymongo does (its options too, for ``mongodb+srv://``,
whose hosts need DNS: left to the driver).
"""

from __future__ import annotations

import difflib
import re
from typing import Any

from singleton.drivers import redis as redis_client
from singleton.errors import ConfigurationError
from singleton.redact import (
    PERCENT_ENCODE,
    cut_short,
    is_secret_parameter,
    redact,
    redact_refused,
    refuse_control_characters,
    userinfo_cut_short,
)

#: URL key -> the schemes it takes.
SCHEMES = {
    "redis_url": redis_client.SCHEMES,
    "mongo_url": ("mongodb://", "mongodb+srv://"),
    "es_url": ("http://", "https://"),
}
#: URL key -> where its parser ends a URL's host part (pymongo reads a raw ``#`` in a password
#: as part of it; redis-py and our Sentinel parser do not; the Elasticsearch listener splits a
#: list of URLs at every comma).
_AUTHORITY_ENDS = {"redis_url": "/?#", "mongo_url": "/?", "es_url": "/?#,"}
#: The commas of a list that start another URL (where a list of URLs can be split safely).
_NEXT_IN_LIST = re.compile(r",(?=\s*[a-zA-Z][a-zA-Z0-9+.-]*://)")
_SCHEME = re.compile(r"\s*[a-zA-Z][a-zA-Z0-9+.-]*://")
_MONGO_OPTIONS_DOC = "https://www.mongodb.com/docs/manual/reference/connection-string-options/"


def check_url(key: str, value: str) -> None:
    """Refuse ``value`` for the URL key ``key`` (see the module docstring); connects to
    nothing."""
    refuse_control_characters(key, value)
    schemes = SCHEMES[key]
    if not value.startswith(schemes):
        raise ConfigurationError(
            f"{key} must start with {' or '.join(schemes)}, got {redact_refused(value)!r}"
        )
    if key == "es_url":
        check_url_list(key, value, schemes)
        return
    if userinfo_cut_short(value, _AUTHORITY_ENDS[key]):
        raise ConfigurationError(f"{key}: {cut_short(value, _AUTHORITY_ENDS[key])}")
    if key == "redis_url":
        try:  # parsed as the lease backend and the checkpoint store will parse it
            redis_client.check_url(value)
        except ConfigurationError as exc:
            raise ConfigurationError(
                f"redis_url is not a valid Redis URL, got {redact_refused(value)!r}: {exc}"
            ) from None
    else:
        _check_mongo_url(value)


def check_url_list(where: str, value: str, schemes: tuple[str, ...] = SCHEMES["es_url"]) -> None:
    """``value``, a comma-separated list of URLs as the Elasticsearch listener reads one (split
    at every comma): no user name or password holds a raw comma, and every URL has one of
    ``schemes``."""
    for url in _NEXT_IN_LIST.split(value):
        if userinfo_cut_short(url.strip(), "/?#,"):
            raise ConfigurationError(f"{where}: {cut_short(url.strip(), '/?#,')}")
    pieces = [p.strip() for p in value.split(",") if p.strip()]
    for n, piece in enumerate(pieces, 1):
        if not piece.startswith(schemes):
            raise ConfigurationError(
                f"{where} is a comma-separated list of {' or '.join(schemes)} URLs, but URL {n}"
                f" of {len(pieces)} in {redact_refused(value)!r} has no such scheme"
            )


def check_option_urls(where: str, value: Any) -> None:
    """A ``[[listeners]]`` option's URLs (a string or a list of strings that starts with a
    scheme, maybe a comma-separated list): no raw control character, no user name or password a
    parser would cut short (at a ``/``, ``?``, ``#`` or ``,``)."""
    for text in value if isinstance(value, list) else [value]:
        if not isinstance(text, str) or not _SCHEME.match(text):
            continue
        refuse_control_characters(where, text)
        for url in _NEXT_IN_LIST.split(text):
            if userinfo_cut_short(url.strip(), "/?#,"):
                raise ConfigurationError(f"{where}: {cut_short(url.strip(), '/?#,')}")


def _check_mongo_url(url: str) -> None:
    """Parse a ``mongodb://`` URL (of a ``mongodb+srv://`` one, its options) as pymongo will,
    so an unencoded ``@`` or ``%`` in a password, or an unknown option, is a clean exit naming
    the value."""
    from pymongo.errors import ConfigurationError as MongoConfigurationError
    from pymongo.uri_parser import parse_uri, split_options

    try:
        if url.startswith("mongodb://"):
            parse_uri(url)
        elif "?" in url:
            split_options(url.partition("?")[2])
    except (MongoConfigurationError, ValueError) as exc:
        why = redact(str(exc))
        if why.startswith("Unknown option"):
            why = _unknown_option(url) or why
        fix = f"; {PERCENT_ENCODE}" if "escaped" in why or "key=value" in why else ""
        raise ConfigurationError(
            f"mongo_url is not a valid MongoDB URL, got {redact_refused(url)!r}: {why}{fix}"
        ) from None


def _unknown_option(url: str) -> str | None:
    """Which option of ``url`` pymongo does not know (pymongo does not say: the name could be
    credential text), named when it cannot be: not right after a secret's value, and shaped
    like an option name."""
    from pymongo.common import URI_OPTIONS_VALIDATOR_MAP

    known = list(URI_OPTIONS_VALIDATOR_MAP)
    after_secret = False
    for piece in re.split("[&;]", url.partition("?")[2]):
        name = piece.partition("=")[0]
        if name.lower() in URI_OPTIONS_VALIDATOR_MAP:
            after_secret = is_secret_parameter(name)
            continue
        if after_secret or not re.fullmatch(r"[A-Za-z][A-Za-z0-9_]*", name):
            return (
                "an option pymongo does not know (not shown: it may be the rest of a secret"
                f" value, cut at a raw `&`): {PERCENT_ENCODE}"
            )
        near = difflib.get_close_matches(name.lower(), known, n=1)
        hint = f" (did you mean {near[0]!r}? names are case-insensitive)" if near else ""
        return f"unknown option {name!r}{hint}: see {_MONGO_OPTIONS_DOC}"
    return None
