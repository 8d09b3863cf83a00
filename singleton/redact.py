"""Credentials never reach a log line or an error message: every URL passes through here."""

from __future__ import annotations

import re

_URL_CREDENTIALS = re.compile(
    r"(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]*://)(?P<user>[^:/@\s]*):(?P<password>[^@\s]*)@"
)
_QUERY_SECRETS = re.compile(
    r"(?P<key>[?&](?:password|api_key|apikey|token|secret)=)[^&\s]*", re.IGNORECASE
)


def redact(text: str) -> str:
    """Replace passwords in every URL inside ``text`` (and secret query parameters) by ``***``."""
    text = _URL_CREDENTIALS.sub(lambda m: f"{m['scheme']}{m['user']}:***@", text)
    return _QUERY_SECRETS.sub(lambda m: f"{m['key']}***", text)
