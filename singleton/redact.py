"""Credentials never reach a log line, an error message, a status page or a metric label.

One function, :func:`redact`, used by every layer. For each ``scheme://`` URL in a text it hides
the userinfo's password: everything from the first ``:`` of the userinfo to the **last** ``@``
that is followed by something shaped like a host, so a password holding a raw ``@``, ``%``,
``#``, ``/``, ``?`` or a space is hidden whole. A userinfo without ``:`` is taken for a bare
password. It also hides the values of secret query parameters (``password=``, any
``*_password=`` such as a Sentinel URL's ``sentinel_password=``,
``authMechanismProperties=``...) up to the next ``&`` or ``;`` that starts another ``name=``
parameter, so a raw space, ``&`` or line end in such a value is hidden with it (and so may be the
rest of the text; a value already shown as ``***`` is left as it is). A URL that a line end
interrupts may have a password holding it: its userinfo may end on the lines after it (up to
another URL). When in doubt it hides more, never less: the test suite searches generated
passwords (``tests/unit/test_redaction.py``).

What no redaction can hide is a piece of a password that a URL parser took for a host or a port
(a raw ``#`` ends the host part there): :func:`userinfo_cut_short` finds such URLs, and every
URL key refuses them before a parser sees them. Nor can it be sure of a URL holding a raw line end
or another control character: :func:`control_character` finds those, and the URL keys refuse them
without showing the value at all.
"""

from __future__ import annotations

import re
import unicodedata

from singleton.errors import ConfigurationError

_SCHEME = re.compile(r"[a-zA-Z][a-zA-Z0-9+.-]*:/{1,2}")
#: Where another URL starts, after a separator.
_NEXT_SCHEME = re.compile(r"(?<=[\s'\"(,=])[a-zA-Z][a-zA-Z0-9+.-]*:/{1,2}")
#: A URL ends at a line end, or where another URL starts.
_NEXT_URL = re.compile(rf"(?:\n|{_NEXT_SCHEME.pattern})")
#: What may follow the ``@`` that ends a userinfo: a host (name, IPv4, [IPv6]), optional port,
#: more hosts (MongoDB seed lists), then the end of the authority.
_HOST_AFTER_AT = re.compile(r"@[A-Za-z0-9._\-\[\]:,%]+(?=$|[/?#\s'\")])")
MASK = "***"
#: A secret query value: one already masked (``***`` and then the end of it), else everything
#: up to the next ``&`` or ``;`` that starts a ``name=`` parameter (a piece without ``=`` cannot
#: be one: it is the rest of a password holding a raw ``&``), or to the end of the text.
_SECRET_VALUE = r"(?:\*\*\*(?=$|[\s&;'\"),:\]}])|[^&;]*(?:[&;](?![A-Za-z_][\w.\-]*=)[^&;]*)*)"
#: The names of the query parameters whose values are secrets.
_SECRET_NAME = (
    r"(?:[a-z_]*_)?(?:password|passwd|pwd|api_?key|token|secret|access_?key|"
    r"authMechanismProperties|tlsCertificateKeyFilePassword|sslPassword)"
)
_QUERY_SECRETS = re.compile(rf"(?P<key>[?&;]{_SECRET_NAME}=){_SECRET_VALUE}", re.IGNORECASE)
#: The fix for a user name or password that a URL parser would cut short. (It writes no raw at
#: sign: after a URL in a message, :func:`redact` would take one for the end of a userinfo.)
PERCENT_ENCODE = (
    "percent-encode the user name and password (urllib.parse.quote(password, safe='')):"
    " `#` as %23, `/` as %2F, `?` as %3F, an at sign as %40, `%` as %25, `,` as %2C, `&` as"
    " %26, a space as %20"
)


def _userinfo(userinfo: str) -> str:
    user, colon, _ = userinfo.partition(":")
    return f"{user}:{MASK}" if colon else MASK


def _host_shaped_at(text: str, start: int, end: int) -> int:
    """The index of the last ``@`` in ``text[start:end]`` followed by a host, or -1."""
    found = -1
    for match in _HOST_AFTER_AT.finditer(text, start, end):
        found = match.start()
    return found


def _end_of_userinfo(text: str, start: int, end: int) -> int:
    """The index of the ``@`` that ends the userinfo of the URL at ``text[start:end]``, or -1."""
    found = _host_shaped_at(text, start, end)
    if found < 0:  # no host-shaped tail: hide up to the last '@' anyway
        found = text.rfind("@", start, end)
    return found


def _end_across_lines(text: str, start: int, end: int) -> int:
    """:func:`_end_of_userinfo` for the URL at ``text[start:end]``; when a line end ends it, its
    password may hold that line end (and ``user:a@b`` on the first line be only part of it), so
    the host is looked for on the lines after it too, up to where another URL starts."""
    found = _host_shaped_at(text, start, end)
    if text.startswith("\n", end):
        nxt = _NEXT_SCHEME.search(text, start)
        found = max(found, _host_shaped_at(text, end, len(text) if nxt is None else nxt.start()))
    return found if found >= 0 else text.rfind("@", start, end)


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
        at = _end_across_lines(text, start, end)
        if at < 0:
            continue
        out.append(text[pos:start])
        out.append(_userinfo(text[start:at]))
        pos = at
    out.append(text[pos:])
    return "".join(out)


#: A secret query parameter and everything after it.
_SECRET_TO_THE_END = re.compile(rf"(?P<key>[?&;]{_SECRET_NAME}=).*", re.IGNORECASE | re.DOTALL)


def redact_refused(url: str) -> str:
    """What to show of a URL a parser refused: :func:`redact`, and everything after the first
    secret query parameter's ``=`` hidden too. (In a URL that parses, what follows a secret's
    value are parameters; in a refused one, a later ``&name=value`` may be a piece of the
    password that a raw ``&`` cut off.)"""
    return redact(_SECRET_TO_THE_END.sub(lambda m: f"{m['key']}{MASK}", url, count=1))


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


def cut_short(url: str, ends: str = "/?#") -> str:
    """What to say of a URL :func:`userinfo_cut_short` refused (with the same ``ends``): the URL
    redacted, and the fix. A ``,`` among ``ends`` is a list's separator (``es_url``)."""
    raw = [f"`{c}`" for c in ends]
    which = f"{', '.join(raw[:-1])} or {raw[-1]}" if len(raw) > 1 else raw[0]
    if "," in ends:
        which += ": a comma starts the next URL of the list"
    return (
        f"the user name or password in {redact_refused(url)!r} holds a character that ends a"
        f" URL's host part (a raw {which}), so the rest of it would be read as host, port or"
        f" path: {PERCENT_ENCODE}"
    )


#: How :func:`control_character` names the usual ones, with their percent-encoding.
_CONTROL_NAMES = {"\n": "line end (%0A)", "\r": "carriage return (%0D)", "\t": "tab (%09)"}


def control_character(text: str) -> str | None:
    """``None``, or what to call the first raw control character in ``text`` (a line end, a
    tab, any other C0 or C1 control, DEL, a Unicode line or paragraph separator) with its
    percent-encoding: no URL holds one raw, and no message can show one safely (a line end
    splits a password over two log lines, where no redaction can be sure to find it). Callers
    refuse the value without showing it."""
    for char in text:
        if unicodedata.category(char) in ("Cc", "Zl", "Zp"):
            code = "".join(f"%{b:02X}" for b in char.encode())
            return _CONTROL_NAMES.get(char, f"control character U+{ord(char):04X} ({code})")
    return None


def refuse_control_characters(where: str, text: str) -> None:
    """Raise :class:`ConfigurationError` naming ``where`` (never ``text``) if ``text`` holds a
    raw control character (:func:`control_character`)."""
    what = control_character(text)
    if what is not None:
        raise ConfigurationError(
            f"{where} holds a raw {what}, which no URL holds (the value is not shown: it may be"
            f" in a password): remove it, or {PERCENT_ENCODE}"
        )


def is_secret_parameter(name: str) -> bool:
    """Whether a query parameter called ``name`` holds a secret (its value is hidden)."""
    return re.fullmatch(_SECRET_NAME, name, re.IGNORECASE) is not None
