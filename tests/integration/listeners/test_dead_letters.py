"""Dead letters you can work with (SecantusDB): one record per document that accumulates its
attempts (each time proven poison by a later event handled right after it);
``singleton dead-letters list|replay|purge``; a replay goes through the running
leader's normal path and a record that succeeds disappears, one that fails again stays."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from listeners.base import ChangeEvent
from singleton.service.cli import main
from singleton.service.dev.embedded import wait_until
from tests.integration.listener_support import Scene, wait_state


def _config(tmp_path: Path, scene: Scene, collection: str) -> str:
    path = tmp_path / "singleton.toml"
    path.write_text(
        f'mongo_url = "{scene.url}"\nnamespace = "{scene.db}"\n\n[[listeners]]\n'
        f'use = "logging"\ndatabase = "{scene.db}"\ncollection = "{collection}"\n'
    )
    return str(path)


def test_one_record_per_document_replay_and_purge(
    mongo_url: str, unique: str, tmp_path: Path, capsys: Any
) -> None:
    scene = Scene.on(mongo_url, unique)
    listener = scene.listener("p", max_retries=1)
    broken = {"on": True}

    def poisoned(event: ChangeEvent) -> bool:
        return broken["on"] and event["documentKey"]["_id"] == 7

    listener.fail = poisoned
    runner = scene.runner(listener).start()
    config = _config(tmp_path, scene, "p")
    name = listener.lease_name
    letters = scene.coll("dead_letters")
    try:
        wait_state(runner, "streaming")
        scene.coll("p").insert_many([{"_id": i} for i in range(10)])
        wait_until(lambda: runner.status().dead_lettered == 1, 10, what="dead-lettered")
        scene.coll("p").update_one({"_id": 7}, {"$set": {"v": 1}})  # fails again,
        scene.coll("p").insert_one({"_id": 100})  # and a later event proves it poison
        wait_until(lambda: runner.status().dead_lettered == 2, 10, what="dead-lettered again")
        [letter] = list(letters.find())
        assert letter["_id"] == {"listener": name, "key": 7}
        assert letter["attempts"] == 4 and letter["first_seen"] < letter["last_seen"]
        assert letter["event"]["operationType"] == "update"

        capsys.readouterr()
        assert main(["dead-letters", "list", "--config", config, "--listener", name]) == 0
        assert "7: " in capsys.readouterr().out

        # Still broken: the replay fails again, and the record stays (updated, mark cleared).
        assert main(["dead-letters", "replay", "--config", config, "--listener", name]) == 0
        wait_until(lambda: letters.find_one({"replay": True}) is None, 20, what="replayed once")
        assert letters.count_documents({}) == 1
        assert letters.find_one()["attempts"] > 4

        broken["on"] = False  # the sink is fixed: the replay succeeds and the record goes
        assert main(["dead-letters", "replay", "--config", config, "--listener", name]) == 0
        wait_until(lambda: letters.count_documents({}) == 0, 20, what="replayed")
        assert 7 in [e["documentKey"]["_id"] for _k, _t, e in listener.handled]

        listener.fail = lambda e: e["documentKey"]["_id"] == 70
        scene.coll("p").insert_many([{"_id": 70}, {"_id": 71}])
        wait_until(lambda: letters.count_documents({}) == 1, 10, what="another letter")
        capsys.readouterr()
        assert main(["dead-letters", "list", "--json", "--config", config, "--listener", name]) == 0
        assert [r["_id"]["key"] for r in json.loads(capsys.readouterr().out)] == [70]
        assert main(["dead-letters", "purge", "--config", config, "--listener", name]) == 0
        assert letters.count_documents({}) == 0
    finally:
        runner.stop()


def test_an_unknown_listener_is_bad_input(mongo_url: str, unique: str, tmp_path: Path) -> None:
    scene = Scene.on(mongo_url, unique)
    config = _config(tmp_path, scene, "p")
    assert main(["dead-letters", "list", "--config", config, "--listener", "nope"]) == 2


def test_a_record_that_is_no_change_event_is_kept_for_verify_repair(
    mongo_url: str, unique: str
) -> None:
    from listeners.deadletters import DeadLetterStore, Replayer
    from singleton.testing import FakeClock

    scene = Scene.on(mongo_url, unique)
    store = DeadLetterStore(scene.client, database=scene.db)
    copy_rejection = {"operationType": "index", "documentKey": {"_id": 5}, "status": 400}
    store.dead_letters.insert_one(
        {"_id": {"listener": "l", "key": 5}, "event": copy_rejection, "replay": True}
    )
    delivered: list[Any] = []
    assert Replayer(store, "l", clock=FakeClock()).poll(delivered.extend) == 0
    assert delivered == []  # nothing to re-deliver, and nothing deleted
    [kept] = list(store.dead_letters.find())
    assert "replay" not in kept and "verify --repair" in kept["note"]


def test_a_dead_letter_holds_no_document_values_and_replays_the_current_document(
    mongo_url: str, unique: str, tmp_path: Path, capsys: Any
) -> None:
    """By default (``dead_letter_source = false``) a dead letter keeps the event's position,
    operation and key but none of the document's values (``fullDocument``,
    ``updateDescription``): ``dead-letters list --json`` cannot show a card number. Its replay
    delivers the document as it is now, looked up by ``_id``."""
    scene = Scene.on(mongo_url, unique)
    listener = scene.listener("s", max_retries=0)
    broken = {"on": True}
    listener.fail = lambda e: broken["on"] and e["documentKey"]["_id"] == 7
    runner = scene.runner(listener).start()
    config = _config(tmp_path, scene, "s")
    name = listener.lease_name
    letters = scene.coll("dead_letters")
    try:
        wait_state(runner, "streaming")
        scene.coll("s").insert_one({"_id": 6, "card": "4111-0000"})
        scene.coll("s").insert_one({"_id": 7, "card": "4111-1111"})
        scene.coll("s").update_one({"_id": 7}, {"$set": {"card": "4111-2222"}})
        scene.coll("s").insert_one({"_id": 8})  # handled right after: 7 is proven poison
        wait_until(lambda: runner.status().dead_lettered >= 1, 10, what="dead-lettered")
        [letter] = list(letters.find())
        event = letter["event"]
        assert event["documentKey"] == {"_id": 7} and "_id" in event and "ns" in event
        assert not {"fullDocument", "updateDescription", "fullDocumentBeforeChange"} & set(event)

        capsys.readouterr()
        assert main(["dead-letters", "list", "--json", "--config", config, "--listener", name]) == 0
        out = capsys.readouterr().out
        assert "7" in out and "4111" not in out

        scene.coll("s").update_one({"_id": 7}, {"$set": {"card": "4111-3333", "fixed": True}})
        broken["on"] = False
        before = len(listener.handled)
        assert main(["dead-letters", "replay", "--config", config, "--listener", name]) == 0
        wait_until(lambda: letters.count_documents({}) == 0, 20, what="replayed")
        replayed = [
            e
            for _k, _t, e in listener.handled[before:]
            if e["documentKey"]["_id"] == 7 and e["_id"] == event["_id"]
        ]
        assert replayed and replayed[0]["fullDocument"] == {
            "_id": 7,
            "card": "4111-3333",
            "fixed": True,
        }
    finally:
        runner.stop()


def test_dead_letter_source_keeps_the_event_whole(
    mongo_url: str, unique: str, tmp_path: Path
) -> None:
    scene = Scene.on(mongo_url, unique)
    listener = scene.listener("k", max_retries=0, dead_letter_source=True)
    listener.fail = lambda e: e["documentKey"]["_id"] == 7
    runner = scene.runner(listener).start()
    letters = scene.coll("dead_letters")
    try:
        wait_state(runner, "streaming")
        scene.coll("k").insert_one({"_id": 7, "card": "4111-1111"})
        scene.coll("k").insert_one({"_id": 8})
        wait_until(lambda: runner.status().dead_lettered >= 1, 10, what="dead-lettered")
        [letter] = list(letters.find())
        assert letter["event"]["fullDocument"] == {"_id": 7, "card": "4111-1111"}
    finally:
        runner.stop()
