"""Credentials never reach a log line, an error message, a status page or a metric label.

One function, :func:`redact`, used by every layer: it finds each ``scheme://`` URL in a text and
replaces its password (everything between the first ``:`` of the userinfo and the *last* ``@``
before the host, so an unencoded ``@``, ``%`` or space in a password is hidden whole) and the
values of secret query parameters. A userinfo without ``:`` is taken for a bare password. When in
doubt it hides more, never less.
"""

from __future__ import annotations

import re

_SCHEME = re.compile(r"[a-zA-Z][a-zA-Z0-9+.-]*:/{1,2}")
#: Where an authority ends, when no ``@`` follows: the path, the query, the fragment, a line end.
_AUTHORITY_END = re.compile(r"[/?#\n]")
_QUERY_SECRETS = re.compile(
    r"(?P<key>[?&;](?:password|passwd|pwd|api_?key|token|secret|access_?key|"
    r"authMechanismProperties|tlsCertificateKeyFilePassword|sslPassword)=)[^&#\s]*",
    re.IGNORECASE,
)
MASK = "***"


def _userinfo(userinfo: str) -> str:
    user, colon, _ = userinfo.partition(":")
    return f"{user}:{MASK}" if colon else MASK


def redact(text: str) -> str:
    """``text`` with every URL password and secret query value replaced by ``***``."""
    out: list[str] = []
    pos = 0
    for match in _SCHEME.finditer(text):
        start = match.end()
        if start <= pos:
            continue
        end_match = _AUTHORITY_END.search(text, start)
        end = len(text) if end_match is None else end_match.start()
        at = text.rfind("@", start, end)
        if at < 0:
            continue
        out.append(text[pos:start])
        out.append(_userinfo(text[start:at]))
        pos = at
    out.append(text[pos:])
    return _QUERY_SECRETS.sub(lambda m: f"{m['key']}{MASK}", "".join(out))
