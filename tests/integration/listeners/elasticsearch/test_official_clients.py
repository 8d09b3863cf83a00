"""A user's own client object as ``es=``: ``elasticsearch.Elasticsearch`` 9.x (the dev extras)
and 8.x (a throwaway virtualenv, in a subprocess: two major versions of one package cannot share
a virtualenv), and ``opensearchpy.OpenSearch``, each syncing for real into osmem-server: the
initial copy, streaming a random workload, a resync that swaps the alias, and verify, all
through the client. The client stays the user's: open and usable afterwards.

osmem-server answers 406 to elasticsearch-py's ``compatible-with`` media types on a request
body (as some proxies do): that the sync works through those clients at all shows it sends
plain ``application/json``.

The 8.x virtualenv is made once under ``~/.cache/singleton-test/`` (``SINGLETON_TEST_CACHE``)
and reused while its requirements stay the same; making it needs the package index.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import socket
import subprocess
import sys
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pymongo
import pytest

from listeners.elasticsearch import ElasticsearchSync
from listeners.elasticsearch.transport import describe, make_transport
from listeners.elasticsearch.verify import compare
from singleton.drivers.mongo import cluster_time
from tests.integration import es_support

ROOT = Path(__file__).resolve().parents[4]
CACHE = Path(os.environ.get("SINGLETON_TEST_CACHE", Path.home() / ".cache" / "singleton-test"))
ES8 = "elasticsearch>=8,<9"
MODULE = "tests.integration.listeners.elasticsearch.test_official_clients"


def scenario(es: Any, mongo_url: str) -> dict[str, Any]:
    """Copy, stream, resync and verify through ``es``; what was seen, as JSON-ready data."""
    client: pymongo.MongoClient[dict[str, Any]] = pymongo.MongoClient(mongo_url)
    db = f"clients{uuid.uuid4().hex[:10]}"
    coll = client[db]["docs"]
    coll.insert_many([{"_id": i, "n": i, "tag": f"t{i % 7}"} for i in range(200)])
    tenures = es_support.Tenures(f"{db}.docs")
    first = ElasticsearchSync(database=db, collection="docs", es=es)
    alias = first.index_name
    first.initial_sync(tenures.next(client))
    copied = compare(coll, es, alias)

    ctx = tenures.next(client)
    start = cluster_time(client)
    es_support.random_workload(client, coll, 400, seed=31, ids=250)
    es_support.put_marker(coll)
    events = es_support.handle_until_marker(first, ctx, coll, start)
    streamed = compare(coll, es, alias)
    before = _alias_targets(es, alias)
    first.close()

    coll.delete_many({"_id": {"$lt": 20}})  # while nobody streams: only a resync drops them
    second = ElasticsearchSync(database=db, collection="docs", es=es)
    second.initial_sync(tenures.next(client))
    resynced = compare(coll, es, alias)
    after = _alias_targets(es, alias)
    second.close()
    client.drop_database(db)
    client.close()
    return {
        "copied": [copied.ok, copied.mongo_count, copied.es_count],
        "events": events,
        "streamed": [streamed.ok, streamed.mongo_count],
        "resynced": [resynced.ok, resynced.mongo_count, resynced.es_count],
        "aliases": [before, after],
        "still_open": _alias_targets(es, alias) == after,  # the user's client, after close()
        "describe": describe(es),
        "written": second.stats.written,
    }


def _alias_targets(es: Any, alias: str) -> list[str]:
    transport, owned = make_transport(es)
    assert not owned
    status, body = transport.request("GET", f"/_alias/{alias}")
    return sorted(body) if status == 200 else []


def _check(seen: dict[str, Any], es_url: str) -> None:
    copied, streamed, resynced = seen["copied"], seen["streamed"], seen["resynced"]
    assert copied == [True, 200, 200], seen
    assert streamed[0] and seen["events"] >= 200, seen
    assert resynced[0] and resynced[1] == resynced[2] <= streamed[1], seen  # ids < 20 gone
    (before,), (after,) = seen["aliases"]
    assert before != after, "the resync did not copy into a fresh index and swap the alias"
    assert seen["still_open"], seen
    host = es_url.split("://", 1)[1].rstrip("/")
    assert host in seen["describe"], seen


def test_elasticsearch_9_client(es_url: str, mongo_url: str) -> None:
    import elasticsearch

    assert version("elasticsearch").startswith("9."), version("elasticsearch")
    es = elasticsearch.Elasticsearch(es_url, request_timeout=20)
    with pytest.raises(elasticsearch.ApiError) as refused:
        # The client's own media type on a body: the stand-in refuses it.
        es.index(index=f"refused{uuid.uuid4().hex[:8]}", id="1", document={"a": 1})
    assert refused.value.meta.status == 406
    _check(scenario(es, mongo_url), es_url)
    es.close()


def test_opensearch_py_client(es_url: str, mongo_url: str) -> None:
    import opensearchpy

    es = opensearchpy.OpenSearch([es_url], timeout=20)
    _check(scenario(es, mongo_url), es_url)
    assert es.transport.perform_request("GET", "/_cluster/health")["status"] in ("green", "yellow")
    es.close()


def _project_requirements() -> list[str]:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib  # type: ignore[import-not-found,unused-ignore]
    with open(ROOT / "pyproject.toml", "rb") as f:
        project = tomllib.load(f)["project"]
    return [*project["dependencies"], ES8, "pytest>=8"]


def _es8_python() -> Path:
    """The python of a virtualenv holding elasticsearch 8.x and this project's dependencies
    (the source tree comes in by ``PYTHONPATH``), made once per set of requirements."""
    requirements = _project_requirements()
    digest = hashlib.sha256("\n".join(requirements).encode()).hexdigest()[:12]
    venv = CACHE / f"es8-venv-{digest}"
    python = venv / "bin" / "python"
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / "es8-venv.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another test worker may be making it
        if not (venv / ".complete").exists():
            subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
            subprocess.run(
                [str(python), "-m", "pip", "install", "-q", *requirements],
                check=True,
                capture_output=True,
                timeout=900,
            )
            (venv / ".complete").touch()
    return python


def test_elasticsearch_8_client(es_url: str, mongo_url: str, tmp_path: Path) -> None:
    python = _es8_python()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [str(python), "-m", MODULE, es_url, mongo_url],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-4000:]
    seen = json.loads(out.stdout.splitlines()[-1])
    assert seen["version"].startswith("8."), seen
    assert seen["body_status"] == 406, seen
    _check(seen, es_url)


def _main(es_url: str, mongo_url: str) -> None:
    """The 8.x run, in the throwaway virtualenv: one JSON line on stdout."""
    import elasticsearch

    es = elasticsearch.Elasticsearch(es_url, request_timeout=20)
    try:
        es.index(index=f"refused{uuid.uuid4().hex[:8]}", id="1", document={"a": 1})
        body_status = 200
    except elasticsearch.ApiError as exc:
        body_status = exc.meta.status
    seen = scenario(es, mongo_url)
    es.close()
    seen.update(version=version("elasticsearch"), body_status=body_status)
    print(json.dumps(seen))  # noqa: T201


if __name__ == "__main__":
    _main(sys.argv[1], sys.argv[2])


class _Recorder:
    """An HTTP server on a free port that records each request's headers and answers ``{}``."""

    def __init__(self) -> None:
        self.seen: list[dict[str, str]] = []
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                recorder.seen.append({k.lower(): v for k, v in self.headers.items()})
                body = b"{}"
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.send_header("x-elastic-product", "Elasticsearch")
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _dead_url() -> str:
    """A URL where nothing listens (a port just freed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


@pytest.mark.parametrize("kind", ["elasticsearch", "opensearch"])
def test_the_clients_auth_goes_with_plain_json(kind: str) -> None:
    recorder = _Recorder()
    try:
        if kind == "elasticsearch":
            import elasticsearch

            es: Any = elasticsearch.Elasticsearch(
                recorder.url, basic_auth=("app", "pw"), headers={"x-opaque-id": "mine"}
            )
        else:
            import opensearchpy

            es = opensearchpy.OpenSearch([recorder.url], http_auth=("app", "pw"))
        transport, owned = make_transport(es)
        assert transport.request("GET", "/_alias/x") == (200, {})
        assert not owned
        (headers,) = recorder.seen
        assert headers["authorization"] == "Basic YXBwOnB3"  # app:pw
        assert headers["accept"] == "application/json"
        assert "compatible-with" not in json.dumps(headers)
        if kind == "elasticsearch":
            assert headers["x-opaque-id"] == "mine"
        transport.close()
        es.close()
    finally:
        recorder.close()


def test_an_opensearch_node_that_refuses_is_set_aside() -> None:
    import opensearchpy

    recorder = _Recorder()
    try:
        es = opensearchpy.OpenSearch([_dead_url(), recorder.url], timeout=5)
        transport, _ = make_transport(es)
        for _ in range(4):  # round robin: the dead node is tried at most once, then skipped
            assert transport.request("GET", "/_alias/x")[0] == 200
        assert len(recorder.seen) == 4
        assert len(es.transport.connection_pool.dead_count) == 1
    finally:
        recorder.close()
