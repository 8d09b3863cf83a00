"""The HTTP boundary to Elasticsearch / OpenSearch: plain ``application/json`` requests, one
status-and-body answer, driver errors translated into :class:`singleton.errors.SinkError`.

elasticsearch-py 8/9 rewrite ``application/json`` into ``application/vnd.elasticsearch+json;
compatible-with=N``, which OpenSearch and some proxies refuse (406). Every server this listener
supports (Elasticsearch 7-9, OpenSearch) accepts plain JSON, so requests go either straight through
urllib3 (given a URL) or through the user's client's *transport*, below the compat rewrite.

Credentials never appear in messages: URLs are redacted to ``scheme://host:port``.
"""

from __future__ import annotations

import base64
import json
from typing import Any, Protocol
from urllib.parse import quote, urlsplit

import urllib3

from singleton.errors import ConfigurationError, SinkError

JSON = "application/json"
NDJSON = "application/x-ndjson"


class EsUnavailableError(SinkError):
    """Elasticsearch could not be reached or did not answer in time (transient)."""


class EsRequestError(SinkError):
    """Elasticsearch refused a whole request (not per item); ``status`` and ``body`` say why."""

    def __init__(self, message: str, status: int, body: Any) -> None:
        super().__init__(message)
        self.status = status
        self.body = body


def redact(url: str) -> str:
    """``scheme://host:port`` of ``url``: no user, password, path or query."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or "?"
        port = f":{parts.port}" if parts.port else ""
        return f"{parts.scheme or 'http'}://{host}{port}"
    except ValueError:
        return "<invalid url>"


class Transport(Protocol):
    """What the listener needs from an Elasticsearch connection."""

    description: str

    def request(
        self, method: str, path: str, body: bytes | None = None, *, ndjson: bool = False
    ) -> tuple[int, Any]:
        """Send one request; return ``(status, decoded JSON body or None)`` for any HTTP status.
        Raises :class:`EsUnavailableError` when there is no answer."""
        ...

    def close(self) -> None: ...


def _decode(status: int, data: bytes) -> Any:
    if not data:
        return None
    try:
        return json.loads(data)
    except ValueError:
        return {"error": {"type": "unparseable_response", "reason": data[:200].decode("latin-1")}}


class UrllibTransport:
    """A connection pool we create and own, for a URL."""

    def __init__(
        self,
        url: str,
        *,
        api_key: str | tuple[str, str] | None = None,
        basic_auth: tuple[str, str] | None = None,
        ca_certs: str | None = None,
        verify_certs: bool = True,
        request_timeout: float = 30.0,
        maxsize: int = 8,
    ) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigurationError(
                f"Elasticsearch URL must be http(s)://host:port, got {redact(url)!r}"
            )
        self.description = redact(url)
        self._base = f"{parts.scheme}://{parts.hostname}" + (f":{parts.port}" if parts.port else "")
        self._prefix = parts.path.rstrip("/")
        self._headers = {"Accept": JSON, "Content-Type": JSON}
        if parts.username and basic_auth is None:
            basic_auth = (parts.username, parts.password or "")
        if basic_auth is not None:
            user, password = basic_auth
            self._headers.update(urllib3.make_headers(basic_auth=f"{user}:{password}"))
        if api_key is not None:
            if isinstance(api_key, tuple):
                api_key = base64.b64encode(f"{api_key[0]}:{api_key[1]}".encode()).decode()
            self._headers["Authorization"] = f"ApiKey {api_key}"
        kwargs: dict[str, Any] = {}
        if parts.scheme == "https":
            kwargs["cert_reqs"] = "CERT_REQUIRED" if verify_certs else "CERT_NONE"
            if ca_certs:
                kwargs["ca_certs"] = ca_certs
        self._timeout = urllib3.Timeout(connect=min(10.0, request_timeout), read=request_timeout)
        self._pool = urllib3.PoolManager(maxsize=maxsize, block=False, retries=False, **kwargs)

    def request(
        self, method: str, path: str, body: bytes | None = None, *, ndjson: bool = False
    ) -> tuple[int, Any]:
        headers = self._headers if not ndjson else {**self._headers, "Content-Type": NDJSON}
        try:
            resp = self._pool.request(
                method,
                self._base + self._prefix + path,
                body=body,
                headers=headers,
                timeout=self._timeout,
                retries=False,
                redirect=False,
            )
        except urllib3.exceptions.HTTPError as exc:
            raise EsUnavailableError(
                f"{method} {path.split('?')[0]} on {self.description}: {type(exc).__name__}"
            ) from exc
        return resp.status, _decode(resp.status, resp.data)

    def close(self) -> None:
        self._pool.clear()


class ClientTransport:
    """Requests through a user's ``elasticsearch.Elasticsearch`` client (not closed by us): its
    nodes, auth and TLS settings, but plain JSON media types and no client-side retries."""

    def __init__(self, client: Any, request_timeout: float = 30.0) -> None:
        self._client = client
        self._transport = client.transport
        headers = dict(getattr(client, "_headers", {}) or {})
        headers = {k: v for k, v in headers.items() if k.lower() not in ("accept", "content-type")}
        self._headers = {**headers, "accept": JSON, "content-type": JSON}
        self._timeout = request_timeout
        nodes = [redact(str(getattr(n, "base_url", n))) for n in self._transport.node_pool.all()]
        self.description = ",".join(nodes) or "elasticsearch client"

    def request(
        self, method: str, path: str, body: bytes | None = None, *, ndjson: bool = False
    ) -> tuple[int, Any]:
        from elastic_transport import TransportError

        headers = self._headers if not ndjson else {**self._headers, "content-type": NDJSON}
        try:
            meta, resp_body = self._transport.perform_request(
                method,
                path,
                headers=headers,
                body=body,
                request_timeout=self._timeout,
                max_retries=0,
                retry_on_timeout=False,
            )
        except TransportError as exc:
            raise EsUnavailableError(
                f"{method} {path.split('?')[0]} on {self.description}: {type(exc).__name__}"
            ) from exc
        if isinstance(resp_body, (bytes, str)):
            resp_body = _decode(
                meta.status, resp_body.encode() if isinstance(resp_body, str) else resp_body
            )
        elif resp_body is not None and not isinstance(resp_body, (dict, list)):
            resp_body = None
        return int(meta.status), resp_body

    def close(self) -> None:
        """The client is the caller's: we do not close it."""


def make_transport(
    es: Any,
    *,
    api_key: str | tuple[str, str] | None = None,
    basic_auth: tuple[str, str] | None = None,
    ca_certs: str | None = None,
    request_timeout: float = 30.0,
    maxsize: int = 8,
) -> tuple[Transport, bool]:
    """A transport for a URL (created, so owned: ``True``) or for a client (``False``)."""
    if isinstance(es, str):
        return (
            UrllibTransport(
                es,
                api_key=api_key,
                basic_auth=basic_auth,
                ca_certs=ca_certs,
                request_timeout=request_timeout,
                maxsize=maxsize,
            ),
            True,
        )
    if hasattr(es, "transport") and hasattr(es.transport, "perform_request"):
        return ClientTransport(es, request_timeout), False
    if hasattr(es, "request") and hasattr(es, "description"):
        return es, False  # already a Transport (tests, proxies)
    raise ConfigurationError(f"es must be an Elasticsearch URL or client, got {type(es).__name__}")


def error_text(body: Any) -> str:
    """A short reason from an Elasticsearch error body (never the request)."""
    if isinstance(body, dict):
        err = body.get("error", body)
        if isinstance(err, dict):
            return f"{err.get('type', 'error')}: {err.get('reason', '')}"[:500]
        return str(err)[:500]
    return str(body)[:500]


def path_index(index: str) -> str:
    return quote(index, safe="")
