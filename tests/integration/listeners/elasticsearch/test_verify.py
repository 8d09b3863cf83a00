"""``singleton verify [--repair]`` against real SecantusDB and osmem-server: it names missing,
stale and extra ids, exits 1 until they are fixed, and a repair never regresses a document the
stream wrote from a newer event."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pymongo

from listeners.elasticsearch.documents import doc_id, source_of
from listeners.elasticsearch.transport import connect
from singleton.service.cli import main

FAR_FUTURE = 2**62  # a version no repair can beat: "the stream already wrote something newer"


def test_verify_names_the_differences_and_repair_fixes_them_without_regressing(
    mongo_url: str, es_url: str, unique: str, tmp_path: Path, capsys: Any
) -> None:
    db, index = f"v{unique}", f"verify-{unique}"
    client: Any = pymongo.MongoClient(mongo_url)
    coll = client[db]["orders"]
    coll.insert_many([{"_id": i, "qty": i} for i in range(1, 6)])
    es = connect(es_url)
    try:

        def put(key: Any, qty: int, version: int) -> None:
            source = source_of({"_id": key, "qty": qty})  # the listener's own mapping
            assert source is not None
            path = f"/{index}/_doc/{doc_id(key)}?version={version}&version_type=external"
            status, body = es.request("PUT", path, source)
            assert status in (200, 201), body

        put(1, 1, 1)  # equal
        put(2, 999, 1)  # stale
        put(3, 999, FAR_FUTURE)  # stale, but "newer": a repair must not touch it
        put(99, 0, 1)  # extra; 4 and 5 are missing
        config = tmp_path / "singleton.toml"
        config.write_text(
            f'mongo_url = "{mongo_url}"\nes_url = "{es_url}"\n\n[[listeners]]\n'
            f'use = "elasticsearch"\nname = "orders"\ndatabase = "{db}"\n'
            f'collection = "orders"\nindex = "{index}"\n'
        )
        capsys.readouterr()
        assert main(["verify", "--config", str(config), "--json"]) == 1
        [report] = json.loads(capsys.readouterr().out)
        assert report["missing"] == sorted([doc_id(4), doc_id(5)])
        assert report["stale"] == sorted([doc_id(2), doc_id(3)])
        assert report["extra"] == [doc_id(99)]
        # A sample as large as the collection finds the same differences, but cannot see extras.
        assert main(["verify", "--config", str(config), "--sample", "50", "--json"]) == 1
        [sampled] = json.loads(capsys.readouterr().out)
        assert sampled["missing"] == report["missing"] and sampled["stale"] == report["stale"]
        assert sampled["extra"] == [] and sampled["documents"] == 5

        assert main(["verify", "--config", str(config), "--repair", "--json"]) == 1
        [after] = json.loads(capsys.readouterr().out)
        assert after["refused_as_newer"] == 1 and after["repaired"] == 4
        assert after["stale"] == [doc_id(3)] and not after["missing"] and not after["extra"]
        _, body = es.request("GET", f"/{index}/_doc/{doc_id(3)}")
        assert body["_source"]["qty"] == 999  # the newer write stayed

        coll.update_one({"_id": 3}, {"$set": {"qty": 999}})  # the collection catches up
        assert main(["verify", "--config", str(config), "--listener", "orders"]) == 0
        assert "equal" in capsys.readouterr().out
    finally:
        es.close()
        client.close()


def test_verify_refuses_a_configuration_without_that_listener(
    mongo_url: str, tmp_path: Path, capsys: Any
) -> None:
    config = tmp_path / "singleton.toml"
    config.write_text(f'mongo_url = "{mongo_url}"\n')
    assert main(["verify", "--config", str(config), "--listener", "nope"]) == 2
    assert "no elasticsearch listener named 'nope'" in capsys.readouterr().err
