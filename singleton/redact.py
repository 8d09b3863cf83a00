"""Credentials never reach a log line or an error message: every URL passes through here."""

from __future__ import annotations

import re

# "user:password@" after a scheme separator, also in malformed URLs ("redis:/:pw@host").
_URL_CREDENTIALS = re.compile(r"(?P<user>[/:][^:/@\s]*):(?P<password>[^@\s]+)@")
_QUERY_SECRETS = re.compile(
    r"(?P<key>[?&](?:password|api_key|apikey|token|secret)=)[^&\s]*", re.IGNORECASE
)


def redact(text: str) -> str:
    """Replace passwords in every URL inside ``text`` (and secret query parameters) by ``***``."""
    text = _URL_CREDENTIALS.sub(lambda m: f"{m['user']}:***@", text)
    return _QUERY_SECRETS.sub(lambda m: f"{m['key']}***", text)
