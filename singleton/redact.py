"""Credentials never reach a log line, an error message, a status page or a metric label.

One function, :func:`redact`, used by every layer. For each ``scheme://`` URL in a text it hides
the userinfo's password: everything from the first ``:`` of the userinfo to the **last** ``@``
that is followed by something shaped like a host, so a password holding a raw ``@``, ``%``,
``#``, ``/``, ``?`` or a space is hidden whole. A userinfo without ``:`` is taken for a bare
password. It also hides the values of secret query parameters (``password=``, any
``*_password=`` such as a Sentinel URL's ``sentinel_password=``,
``authMechanismProperties=``...). When in doubt it hides more, never less: the test suite
searches generated passwords (``tests/unit/test_redaction.py``).

What no redaction can hide is a piece of a password that a URL parser took for a host or a port
(a raw ``#`` ends the host part there): :func:`userinfo_cut_short` finds such URLs, and every
URL key refuses them before a parser sees them.
"""

from __future__ import annotations

import re

_SCHEME = re.compile(r"[a-zA-Z][a-zA-Z0-9+.-]*:/{1,2}")
#: A URL ends at a line end, or where another URL starts after a separator.
_NEXT_URL = re.compile(r"(?:\n|(?<=[\s'\"(,=])[a-zA-Z][a-zA-Z0-9+.-]*:/{1,2})")
#: What may follow the ``@`` that ends a userinfo: a host (name, IPv4, [IPv6]), optional port,
#: more hosts (MongoDB seed lists), then the end of the authority.
_HOST_AFTER_AT = re.compile(r"@[A-Za-z0-9._\-\[\]:,%]*(?=$|[/?#\s'\")])")
_QUERY_SECRETS = re.compile(
    r"(?P<key>[?&;](?:[a-z_]*_)?(?:password|passwd|pwd|api_?key|token|secret|access_?key|"
    r"authMechanismProperties|tlsCertificateKeyFilePassword|sslPassword)=)[^&\s]*",
    re.IGNORECASE,
)
MASK = "***"
#: The fix for a user name or password that a URL parser would cut short.
PERCENT_ENCODE = (
    "percent-encode the user name and password (urllib.parse.quote(password, safe='')):"
    " `#` as %23, `/` as %2F, `?` as %3F, `@` as %40, `%` as %25, a space as %20"
)


def _userinfo(userinfo: str) -> str:
    user, colon, _ = userinfo.partition(":")
    return f"{user}:{MASK}" if colon else MASK


def _end_of_userinfo(text: str, start: int, end: int) -> int:
    """The index of the ``@`` that ends the userinfo of the URL at ``text[start:end]``, or -1."""
    found = -1
    for match in _HOST_AFTER_AT.finditer(text, start, end):
        found = match.start()
    if found < 0:  # no host-shaped tail: hide up to the last '@' anyway
        found = text.rfind("@", start, end)
    return found


def redact(text: str) -> str:
    """``text`` with every URL password and secret query value replaced by ``***``."""
    # Query secrets first: a raw '@' inside one must not pass for the end of a userinfo.
    text = _QUERY_SECRETS.sub(lambda m: f"{m['key']}{MASK}", text)
    out: list[str] = []
    pos = 0
    for match in _SCHEME.finditer(text):
        start = match.end()
        if start <= pos:
            continue
        nxt = _NEXT_URL.search(text, start)
        end = len(text) if nxt is None else nxt.start()
        at = _end_of_userinfo(text, start, end)
        if at < 0:
            continue
        out.append(text[pos:start])
        out.append(_userinfo(text[start:at]))
        pos = at
    out.append(text[pos:])
    return "".join(out)


def userinfo_cut_short(url: str, ends: str = "/?#") -> bool:
    """Whether a parser that ends a URL's authority at the first of ``ends`` (``urlsplit``
    does at ``/``, ``?`` and ``#``) would end it inside the userinfo, as :func:`redact` finds it:
    the rest of the password would then be read as a host, a port, a path, a query or a fragment,
    and shown as one in the parser's errors and in every later message about that "host".
    Callers refuse such a URL, saying :data:`PERCENT_ENCODE`. (A raw ``@`` followed by something
    host-shaped in a path, a query or a fragment counts too: when in doubt, refuse.)"""
    match = _SCHEME.match(url)
    if match is None:
        return False
    start = match.end()
    cut = min((i for i in (url.find(c, start) for c in ends) if i >= 0), default=len(url))
    nxt = _NEXT_URL.search(url, start)
    return _end_of_userinfo(url, start, len(url) if nxt is None else nxt.start()) > cut


def cut_short(url: str) -> str:
    """What to say of a URL :func:`userinfo_cut_short` refused: the URL redacted, and the fix."""
    return (
        f"the user name or password in {redact(url)!r} holds a character that ends a URL's host"
        f" part (a raw `/`, `?` or `#`), so the rest of it would be read as host, port or path:"
        f" {PERCENT_ENCODE}"
    )
