"""A partitioned ElasticsearchSync (``partitions = 4``) over three real ``singleton run``
replicas, with a crash, a rotation and a restart under a random workload with transactions: the
index must end equal to the collection (the partitions share one index; each copies and streams
only its own documents, in place)."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pymongo
import pytest

from listeners.elasticsearch import ElasticsearchSync, partitioned
from listeners.elasticsearch.ids import doc_id
from listeners.elasticsearch.transport import connect
from listeners.elasticsearch.verify import compare, es_documents
from listeners.stream.partition import Partition, partition_of
from singleton.errors import SinkUnavailableError
from singleton.service.dev.embedded import wait_until
from tests.integration import es_support
from tests.integration.cluster import TIMINGS, ReplicaProc, status_json

K = 4


def _config(path: Path, redis_url: str, mongo_url: str, es_url: str, db: str, ns: str) -> Path:
    path.write_text(
        f"""
backend = "redis"
redis_url = "{redis_url}"
mongo_url = "{mongo_url}"
es_url = "{es_url}"
namespace = "{ns}"

[[listeners]]
use = "elasticsearch"
name = "pes"
database = "{db}"
collection = "docs"
index = "{db}"
partitions = {K}
""",
        encoding="utf-8",
    )
    return path


@pytest.fixture
def mongo(mongo_url: str) -> Iterator[pymongo.MongoClient[dict[str, Any]]]:
    client: pymongo.MongoClient[dict[str, Any]] = pymongo.MongoClient(mongo_url)
    yield client
    client.close()


def _marker(p: int) -> str:
    """An ``_id`` of partition ``p``: once it is indexed, that partition read everything
    written before it (events of one document arrive in order, and so do a stream's)."""
    n = 0
    while partition_of(f"~end{n}", K) != p:
        n += 1
    return f"~end{n}"


def test_partitioned_sync_stays_exact_through_kills_and_rotations(
    redis_url: str,
    mongo_url: str,
    es_url: str,
    unique: str,
    tmp_path: Path,
    mongo: pymongo.MongoClient[dict[str, Any]],
) -> None:
    db = f"pes{unique}"
    coll = mongo[db]["docs"]
    coll.insert_many([{"_id": i, "seed": True} for i in range(200)])
    coll.insert_many([{"_id": f"s{i}", "seed": True} for i in range(100)])
    cfg = _config(tmp_path / "s.toml", redis_url, mongo_url, es_url, db, f"pes{unique}")
    args = ["--config", str(cfg), *TIMINGS]
    replicas = {i: ReplicaProc(f"r{i}", args, tmp_path) for i in (1, 2, 3)}
    http = connect(es_url)

    def held() -> set[str]:
        leases = status_json(args)["leases"]
        assert isinstance(leases, list)
        return {lease["name"] for lease in leases if lease["identity"] is not None}

    def indexed(key: str) -> bool:
        path = f"/{db}/_doc/{quote(doc_id(key), safe='')}?realtime=true"
        return http.request("GET", path)[0] == 200

    try:
        for r in replicas.values():
            r.start()
        every = {f"pes.{i}-of-{K}" for i in range(K)}
        wait_until(lambda: held() == every, 60, what="every partition has a leader")
        es_support.random_workload(mongo, coll, 300, seed=41, ids=260)
        replicas[1].signal(signal.SIGKILL)  # a crash: its partitions wait out the ttl
        replicas[1].wait(10)
        es_support.random_workload(mongo, coll, 300, seed=42, ids=260)
        replicas[1] = ReplicaProc("r1", args, tmp_path).start()
        replicas[2].signal(signal.SIGUSR1)  # a rotation of everything r2 leads
        es_support.random_workload(mongo, coll, 300, seed=43, ids=260)
        replicas[3].stop()  # a planned stop, then back
        replicas[3] = ReplicaProc("r3", args, tmp_path).start()
        es_support.random_workload(mongo, coll, 300, seed=44, ids=260)
        markers = [_marker(p) for p in range(K)]
        coll.insert_many([{"_id": m} for m in markers])
        for m in markers:
            wait_until(lambda m=m: indexed(m), 120, interval=0.2, what=f"{m} indexed")
        diff = compare(coll, es_url, db)
    finally:
        for r in replicas.values():
            r.stop()
        http.close()
    logs = "".join(r.log() for r in replicas.values())
    assert diff.ok, (diff, logs[-4000:])
    assert diff.mongo_count > 200
    assert "Traceback" not in logs


def test_a_partition_copies_its_own_documents_in_place_and_never_swaps(
    client: pymongo.MongoClient[dict[str, Any]],
    es_url: str,
    docs: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(partitioned, "CREATE_WAIT", 0.5)  # (30 s by default)
    coll, db = docs, docs.database.name
    ids: list[Any] = [*range(120), *(f"k{i}" for i in range(80))]
    coll.insert_many([{"_id": i, "n": 1} for i in ids])

    def partition(p: int) -> ElasticsearchSync:
        listener = ElasticsearchSync(database=db, collection="docs", es=es_url)
        listener.partition = Partition(p, 2)
        return listener

    first, second = partition(1), partition(0)
    tenures = [es_support.Tenures(p.lease_name) for p in (first, second)]
    alias = first.index_name
    with pytest.raises(SinkUnavailableError, match="waits for partition 0"):
        first.initial_sync(tenures[0].next(client))  # no index yet: partition 0 makes it
    second.initial_sync(tenures[1].next(client))
    http = connect(es_url)
    try:
        status, body = http.request("GET", f"/_alias/{alias}")
        assert status == 200
        [physical] = list(body)
        mine = {str(k) for k in ids if partition_of(k, 2) == 0}
        assert 0 < len(mine) < len(ids)
        assert set(es_documents(es_url, alias)) == {
            doc_id(k) for k in ids if partition_of(k, 2) == 0
        }
        first.initial_sync(tenures[0].next(client))  # now in place, beside partition 0's
        status, body = http.request("GET", f"/_alias/{alias}")
        assert list(body) == [physical]  # never swapped: partition 0's documents stay
        second.initial_sync(tenures[1].next(client))  # a resync of partition 0: in place too
        assert compare(coll, es_url, alias).ok
        status, body = http.request("GET", f"/_alias/{alias}")
        assert list(body) == [physical]
    finally:
        http.close()
        first.close()
        second.close()
