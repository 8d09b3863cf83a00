"""``singleton verify [--repair]`` against real SecantusDB and osmem-server: it names missing,
stale and extra ids, exits 1 until they are fixed, and a repair never regresses a document the
stream wrote from a newer event."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pymongo

from listeners.elasticsearch import ElasticsearchSync
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


def test_verify_compares_a_shaped_index_with_its_view_and_repairs_it(
    mongo_url: str, es_url: str, unique: str, tmp_path: Path, capsys: Any
) -> None:
    """A shaped listener (``[listeners.collections.*]`` tables): filter, routing and field
    rules are what the index is compared with; a copy under the wrong routing is stale there
    and extra where it is; ``--repair`` fixes both."""
    db = f"vs{unique}"
    client: Any = pymongo.MongoClient(mongo_url)
    client[db].orders.insert_many(
        [
            {"_id": 1, "status": "open", "customer_id": "c1"},
            {"_id": 2, "status": "draft", "customer_id": "c1"},  # filtered out
            {"_id": 3, "status": "open", "customer_id": "c2"},
        ]
    )
    client[db].customers.insert_one({"_id": "c1", "name": "Ada", "secret": "x"})
    es = connect(es_url)
    try:

        def put(index: str, es_id: str, source: dict[str, Any], routing: str | None) -> None:
            where = f"&routing={routing}" if routing else ""
            path = f"/{index}/_doc/{es_id}?version=1&version_type=external{where}"
            status, body = es.request("PUT", path, json.dumps(source).encode())
            assert status in (200, 201), body

        orders, customers = f"{db}-orders", f"{db}-customers"
        put(orders, doc_id(1), {"status": "open", "customer_id": "c1"}, "c1")  # equal
        put(orders, doc_id(2), {"status": "draft", "customer_id": "c1"}, "c1")  # out of filter
        put(orders, doc_id(3), {"status": "open", "customer_id": "c2"}, "c9")  # wrong routing
        put(customers, "c1", {"name": "Ada", "secret": "x"}, None)  # field rule not applied
        config = tmp_path / "singleton.toml"
        config.write_text(
            f'mongo_url = "{mongo_url}"\nes_url = "{es_url}"\n\n[[listeners]]\n'
            f'use = "elasticsearch"\nname = "shop-search"\ndatabase = "{db}"\n'
            f'index = "{db}-{{collection}}"\n\n'
            "[listeners.collections.orders]\n"
            'filter = { status = { "$ne" = "draft" } }\nrouting = "customer_id"\n\n'
            '[listeners.collections.customers]\ninclude = ["name"]\n'
        )
        capsys.readouterr()
        assert main(["verify", "--config", str(config), "--json"]) == 1
        reports = {r["index"]: r for r in json.loads(capsys.readouterr().out)}
        assert reports[orders]["stale"] == [doc_id(3)]
        assert reports[orders]["extra"] == sorted([doc_id(2), doc_id(3)])
        assert reports[orders]["documents"] == 2 and reports[orders]["indexed"] == 3
        assert reports[customers]["stale"] == ["c1"]
        # a sample of each collection (its filter applied) finds the same missing and stale
        # documents, fetched under their routing; extras it cannot see
        assert main(["verify", "--config", str(config), "--sample", "5", "--json"]) == 1
        sampled = {r["index"]: r for r in json.loads(capsys.readouterr().out)}
        assert sampled[orders]["stale"] == [doc_id(3)] and sampled[orders]["extra"] == []
        assert sampled[orders]["documents"] == 2 and sampled[customers]["stale"] == ["c1"]
        assert main(["verify", "--config", str(config), "--repair", "--json"]) == 0  # all fixed
        repaired = {
            r["index"]: r["repaired"] + r["refused_as_newer"]
            for r in json.loads(capsys.readouterr().out)
        }
        # (where both routings hash to one shard, the copy is one document: re-indexed under
        # its routing, and the delete of the old copy, versioned below it, refused)
        assert repaired == {orders: 3, customers: 1}
        assert main(["verify", "--config", str(config)]) == 0
        _, body = es.request("GET", f"/{orders}/_doc/{doc_id(3)}?routing=c2")
        assert body["found"] and body["_source"] == {"status": "open", "customer_id": "c2"}
        assert main(["verify", "--config", str(config), "--sample", "5"]) == 0
    finally:
        es.close()
        client.close()


def test_an_unknown_key_of_a_collection_table_exits_2_naming_it(
    mongo_url: str, es_url: str, tmp_path: Path, capsys: Any
) -> None:
    config = tmp_path / "singleton.toml"
    config.write_text(
        f'mongo_url = "{mongo_url}"\nes_url = "{es_url}"\n\n[[listeners]]\n'
        'use = "elasticsearch"\nname = "s"\ndatabase = "shop"\n\n'
        '[listeners.collections.orders]\nroutng = "customer_id"\n'
    )
    assert main(["verify", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert "unknown key routng in collections.orders" in err and "routing" in err


def test_verify_of_a_shaped_index_renames_reads_every_feeding_collection_and_never_regresses(
    mongo_url: str, es_url: str, unique: str, tmp_path: Path, capsys: Any
) -> None:
    """Two collections into one index (their ids prefixed by the collection) and a rename are
    what verify compares with; ``--repair`` fixes what differs, and leaves a document the
    stream wrote at a newer version as it is (refused as newer, never regressed)."""
    db = f"vr{unique}"
    client: Any = pymongo.MongoClient(mongo_url)
    client[db].orders.insert_many([{"_id": i, "city": f"c{i}", "n": i} for i in (1, 2, 3)])
    client[db].legacy_orders.insert_many([{"_id": i, "n": 10 + i} for i in (1, 2)])
    alias = f"{db}-orders"
    layout = {
        "orders": {"rename": {"city": "town"}},
        "legacy_orders": {"index": alias},
    }
    shape = ElasticsearchSync(
        name="s", database=db, index=f"{db}-{{collection}}", collections=layout, es=es_url
    ).shape
    assert shape is not None
    order, legacy = shape.collections["orders"].es_id, shape.collections["legacy_orders"].es_id
    assert order(1) != legacy(1)  # one index, two documents
    es = connect(es_url)
    try:

        def put(es_id: str, source: dict[str, Any], version: int = 1) -> None:
            path = f"/{alias}/_doc/{quote(es_id, safe='')}?version={version}&version_type=external"
            status, body = es.request("PUT", path, json.dumps(source).encode())
            assert status in (200, 201), body

        put(order(1), {"town": "c1", "n": 1})  # equal
        put(order(2), {"city": "c2", "n": 2})  # the rename not applied: stale
        put(order(3), {"town": "old", "n": 3}, FAR_FUTURE)  # stale, but newer: left as it is
        put(legacy(1), {"n": 11})  # equal; legacy 2 is missing
        config = tmp_path / "singleton.toml"
        config.write_text(
            f'mongo_url = "{mongo_url}"\nes_url = "{es_url}"\n\n[[listeners]]\n'
            f'use = "elasticsearch"\nname = "shop-search"\ndatabase = "{db}"\n'
            f'index = "{db}-{{collection}}"\n\n'
            '[listeners.collections.orders]\nrename = { city = "town" }\n\n'
            f'[listeners.collections.legacy_orders]\nindex = "{alias}"\n'
        )
        capsys.readouterr()
        assert main(["verify", "--config", str(config), "--json"]) == 1
        [report] = json.loads(capsys.readouterr().out)
        assert report["index"] == alias and report["documents"] == 5
        assert report["stale"] == sorted([order(2), order(3)])
        assert report["missing"] == [legacy(2)] and report["extra"] == []
        assert main(["verify", "--config", str(config), "--repair", "--json"]) == 1
        [after] = json.loads(capsys.readouterr().out)
        assert after["refused_as_newer"] == 1 and after["repaired"] == 2, after
        assert after["stale"] == [order(3)] and not after["missing"]
        _, body = es.request("GET", f"/{alias}/_doc/{quote(order(2), safe='')}")
        assert body["_source"] == {"town": "c2", "n": 2}
        _, body = es.request("GET", f"/{alias}/_doc/{quote(order(3), safe='')}")
        assert body["_source"]["town"] == "old"  # the newer write stayed
    finally:
        es.close()
        client.close()
