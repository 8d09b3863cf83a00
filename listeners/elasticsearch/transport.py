"""The HTTP boundary to Elasticsearch / OpenSearch: plain ``application/json`` requests, one
status-and-body answer, transport errors translated into :class:`singleton.errors.SinkError`.

Requests go through ``elastic_transport`` (the transport under elasticsearch-py): a node pool
over one or more URLs that sets a node that failed aside for a while, TLS with client
certificates, optional request compression. It sends exactly the headers it is given, so every
request says plain ``application/json``: elasticsearch-py's client layer would rewrite that into
``application/vnd.elasticsearch+json; compatible-with=N``, which OpenSearch and some proxies
refuse (406), while every server this listener supports (Elasticsearch 7-9, OpenSearch) accepts
plain JSON. A user's own ``elasticsearch.Elasticsearch`` client (8.x, 9.x) is used through its
transport, below that rewrite; an ``opensearchpy.OpenSearch`` client through its connection
pool (:class:`OpenSearchPyTransport`). Neither is ever closed here.

Failure model: a request either gets an HTTP answer (any status is returned, the caller
decides; :func:`request_error` says what a failed status means) or raises
:class:`EsUnavailableError` (a ``SinkUnavailableError``) within ``request_timeout``. The
transport itself retries nothing but a connection refused by one node, on the next node of
the pool: statuses and timeouts go back to the caller (the bulk writer), which retries with
:class:`singleton.retry.Backoff` under the tenure's deadline. Credentials never appear in
messages: a node is described as ``scheme://host:port``, built from the parsed URL.
"""

from __future__ import annotations

import base64
import dataclasses
import json
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Protocol
from urllib.parse import quote

import elastic_transport
import orjson
from elastic_transport.client_utils import url_to_node_config

from singleton.errors import (
    ConfigurationError,
    EsUnavailableError,
    SinkRejectedError,
    SinkUnavailableError,
)
from singleton.redact import redact

JSON = "application/json"
NDJSON = "application/x-ndjson"
_JSON_HEADERS = {"accept": JSON, "content-type": JSON}
_NDJSON_HEADERS = {"accept": JSON, "content-type": NDJSON}


#: Statuses of a whole request (or one bulk item) that say "not now": overload, gateway
#: trouble, unavailable shards. Retried; never a dead letter.
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})


def request_error(status: int, body: Any, what: str) -> SinkUnavailableError | SinkRejectedError:
    """The error for a whole request that failed with ``status``: :class:`SinkUnavailableError`
    for 429 and 5xx (the runner retries it), :class:`SinkRejectedError` for anything else
    (401, 403, a 400 about the request itself: retrying cannot help, the tenure fails)."""
    message = f"{what}: HTTP {status} {error_text(body)}"
    if status in RETRY_STATUSES or status >= 500:
        return SinkUnavailableError(message)
    return SinkRejectedError(message)


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


class _Bytes(elastic_transport.Serializer):
    """Bodies pass through as bytes both ways: requests are serialized already, and answers
    are decoded by :func:`_decode`, which also copes with a proxy's non-JSON error page."""

    mimetype: ClassVar[str] = JSON

    def loads(self, data: bytes) -> Any:
        return data

    def dumps(self, data: Any) -> bytes:
        if not isinstance(data, bytes):
            raise TypeError(f"request bodies are sent as bytes, got {type(data).__name__}")
        return data


_BYTES = _Bytes()
_SERIALIZERS = {m: _BYTES for m in (JSON, NDJSON, "application/*", "text/*")}


#: How a bulk answer with nothing but items' statuses (``filter_path``) begins when every item
#: was written.
_ALL_WRITTEN = b'{"errors":false,"items":['


def _decode(data: Any) -> Any:
    if isinstance(data, str):
        data = data.encode()
    if not isinstance(data, bytes):
        return data if isinstance(data, (dict, list)) else None
    if not data:
        return None
    if data.startswith(_ALL_WRITTEN) and data.find(b'"_index"') < 0:
        # Every item written: only their number is read (parsing an answer of 1,000 items
        # and freeing it cost ~0.3 us per item). One ``"status":`` per item, and none else:
        # ids and reasons are JSON strings, where a quote is always escaped.
        return {"errors": False, "items": [None] * data.count(b'"status":')}
    try:
        return orjson.loads(data)  # (a bulk answer has an item per document: the faster parser)
    except ValueError:
        pass
    try:
        return json.loads(data)  # what orjson refuses but json reads (NaN, Infinity)
    except ValueError:
        return {"error": {"type": "unparseable_response", "reason": data[:200].decode("latin-1")}}


class EsTransport:
    """Requests over an ``elastic_transport.Transport``: one we built (``owned``, closed by
    :meth:`close`; its nodes carry auth and timeouts) or a user's client's (left open; its
    client-level headers and our ``request_timeout`` go with every request)."""

    def __init__(
        self,
        transport: elastic_transport.Transport,
        description: str,
        *,
        owned: bool,
        headers: Mapping[str, str] | None = None,
        request_timeout: float | None = None,
        max_retries: int = 0,
    ) -> None:
        self._transport = transport
        self.description = description
        self._owned = owned
        base = {k: v for k, v in (headers or {}).items() if k.lower() not in _JSON_HEADERS}
        self._headers = {False: {**base, **_JSON_HEADERS}, True: {**base, **_NDJSON_HEADERS}}
        self._options: dict[str, Any] = {
            "max_retries": max_retries,
            "retry_on_status": (),
            "retry_on_timeout": False,
        }
        if request_timeout is not None:
            self._options["request_timeout"] = request_timeout

    def request(
        self, method: str, path: str, body: bytes | None = None, *, ndjson: bool = False
    ) -> tuple[int, Any]:
        try:
            meta, data = self._transport.perform_request(
                method, path, body=body, headers=self._headers[ndjson], **self._options
            )
        except elastic_transport.TransportError as exc:
            raise EsUnavailableError(
                f"{method} {path.split('?')[0]} on {self.description}: {type(exc).__name__}"
            ) from exc
        return int(meta.status), _decode(data)

    def close(self) -> None:
        if self._owned:
            self._transport.close()


class OpenSearchPyTransport:
    """Requests over an ``opensearchpy.OpenSearch`` client's connections (never closed here).

    Its ``Transport`` decodes bodies and raises on error statuses, so requests go one level
    below, to a connection of its pool (``get_connection``: its selector, its dead-node
    timeouts), which answers ``(status, headers, raw body)`` for every status we ``ignore``;
    a connection that fails is marked dead and the next one of the pool tried, once per node.
    The connection adds the client's auth, TLS and compression; the headers are plain JSON."""

    #: Every status comes back as an answer: the caller decides (:func:`request_error`).
    _ANY_STATUS = tuple(range(100, 600))

    def __init__(self, transport: Any, description: str, request_timeout: float | None) -> None:
        self._transport = transport
        self.description = description
        self._timeout = request_timeout
        self._tries = max(1, len(getattr(transport.connection_pool, "connections", ()) or ()))

    def request(
        self, method: str, path: str, body: bytes | None = None, *, ndjson: bool = False
    ) -> tuple[int, Any]:
        from opensearchpy.exceptions import TransportError  # the client's own: it is installed

        headers = _NDJSON_HEADERS if ndjson else _JSON_HEADERS
        failure: TransportError | None = None
        for _ in range(self._tries):
            connection = self._transport.get_connection()
            try:
                status, _headers, data = connection.perform_request(
                    method, path, None, body, self._timeout, self._ANY_STATUS, headers
                )
            except TransportError as exc:  # no answer: connection refused, reset, timed out
                failure = exc
                self._transport.mark_dead(connection)
                continue
            return int(status), _decode(data)
        raise EsUnavailableError(
            f"{method} {path.split('?')[0]} on {self.description}: {type(failure).__name__}"
        ) from failure

    def close(self) -> None:
        pass  # the user's client


def _opensearch_description(transport: Any) -> str:
    connections = getattr(transport.connection_pool, "connections", None) or []
    hosts = [redact(f"{c.host}{getattr(c, 'url_prefix', '')}") for c in connections]
    return ",".join(hosts) or "opensearch client"


def _describe(configs: Sequence[elastic_transport.NodeConfig]) -> str:
    return ",".join(f"{c.scheme}://{c.host}:{c.port}{c.path_prefix}" for c in configs)


def describe(es: Any) -> str:
    """``scheme://host:port`` of each node of ``es`` (URLs, a client or a transport), without
    credentials and without connecting: what :meth:`ElasticsearchSync.sink_identity` names."""
    if isinstance(es, str):
        es = [u for u in es.split(",") if u.strip()]
    if isinstance(es, Sequence) and all(isinstance(u, str) for u in es):
        return _describe([_node_config(str(u), {}) for u in es])
    inner = getattr(es, "transport", None)
    if isinstance(inner, elastic_transport.Transport):
        return _describe([n.config for n in inner.node_pool.all()]) or "elasticsearch client"
    if _is_opensearch_py(inner):
        return _opensearch_description(inner)
    return str(getattr(es, "description", type(es).__name__))


def _auth_header(
    api_key: str | tuple[str, str] | None, basic_auth: tuple[str, str] | None
) -> dict[str, str]:
    if api_key is not None:
        if isinstance(api_key, tuple):
            api_key = base64.b64encode(f"{api_key[0]}:{api_key[1]}".encode()).decode()
        return {"authorization": f"ApiKey {api_key}"}
    if basic_auth is not None:
        token = base64.b64encode(f"{basic_auth[0]}:{basic_auth[1]}".encode()).decode()
        return {"authorization": f"Basic {token}"}
    return {}


def _node_config(url: str, auth: Mapping[str, str], **options: Any) -> elastic_transport.NodeConfig:
    try:
        parsed = url_to_node_config(url.strip(), use_default_ports_for_scheme=True)
    except ValueError:
        parsed = None
    if parsed is None or parsed.scheme not in ("http", "https"):
        raise ConfigurationError(
            f"Elasticsearch URL must be http(s)://host:port, got {redact(url)!r}"
        )
    # URL userinfo counts only when no api_key / basic_auth option was given.
    headers = {**dict(parsed.headers), **auth}
    prefix = parsed.path_prefix.rstrip("/")
    return dataclasses.replace(parsed, path_prefix=prefix, headers=headers, **options)


# One keyword per connection option a user sets (``es_*`` config keys, elasticsearch-py's names).
def connect(  # noqa: PLR0913
    urls: str | Sequence[str],
    *,
    api_key: str | tuple[str, str] | None = None,
    basic_auth: tuple[str, str] | None = None,
    ca_certs: str | None = None,
    client_cert: str | None = None,
    client_key: str | None = None,
    http_compress: bool = False,
    request_timeout: float = 30.0,
    maxsize: int = 8,
) -> EsTransport:
    """An owned transport over ``urls`` (one URL, a comma-separated list, or a sequence)."""
    if isinstance(urls, str):
        urls = [u for u in urls.split(",") if u.strip()]
    if not urls:
        raise ConfigurationError("Elasticsearch needs at least one http(s)://host:port URL")
    auth = _auth_header(api_key, basic_auth)
    options = {
        "ca_certs": ca_certs,
        "client_cert": client_cert,
        "client_key": client_key,
        "http_compress": http_compress,
        "request_timeout": request_timeout,
        "connections_per_node": maxsize,
    }
    configs = [_node_config(str(url), auth, **options) for url in urls]
    transport = elastic_transport.Transport(
        configs, serializers=_SERIALIZERS, meta_header=False, max_retries=0
    )
    # A refused connection moves on to the next node at once; one pass over the pool at most.
    return EsTransport(transport, _describe(configs), owned=True, max_retries=len(configs) - 1)


def _is_opensearch_py(transport: Any) -> bool:
    """Whether ``transport`` is an ``opensearchpy`` client's (duck-typed: no import needed)."""
    return type(transport).__module__.startswith("opensearchpy") and hasattr(
        transport, "get_connection"
    )


def make_transport(es: Any, **options: Any) -> tuple[Transport, bool]:
    """A transport for ``es`` and whether the caller owns it: URLs give an owned
    :func:`connect` (``options`` are its keywords); an ``elasticsearch.Elasticsearch`` client,
    an ``opensearchpy.OpenSearch`` client or a ready :class:`Transport` (tests, proxies) stay
    the caller's."""
    if isinstance(es, str) or (isinstance(es, Sequence) and all(isinstance(u, str) for u in es)):
        return connect(es, **options), True
    inner = getattr(es, "transport", None)
    if isinstance(inner, elastic_transport.Transport):
        nodes = [n.config for n in inner.node_pool.all()]
        transport = EsTransport(
            inner,
            _describe(nodes) or "elasticsearch client",
            owned=False,
            # The client keeps its auth headers on itself, not on its nodes.
            headers=getattr(es, "_headers", None),
            request_timeout=options.get("request_timeout", 30.0),
        )
        return transport, False
    if _is_opensearch_py(inner):
        timeout = options.get("request_timeout", 30.0)
        return OpenSearchPyTransport(inner, _opensearch_description(inner), timeout), False
    if hasattr(es, "request") and hasattr(es, "description"):
        return es, False
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
