"""The replica's own CPU per change event, in process and without servers: what ``bench stream``
measures through a running replica, split into the parts this project decides.

On ``N`` small inserts shaped as SecantusDB sends them (a BSON resume token, ``clusterTime``,
a tz-aware ``wallTime``, ``ns``, ``documentKey`` and a ~100-byte ``fullDocument``), packed into
``getMore`` replies of 1,000 events:

* ``decode_us.full``: decoding a reply and freeing its events, per event, with every field;
* ``decode_us.stream``: the same with :data:`listeners.elasticsearch.fragments.UNUSED_FIELDS`
  left out, as ElasticsearchSync's stream has them;
* ``sync_us``: what ElasticsearchSync does per event of such a stream (join fragments, id,
  version from the resume token, JSON source, the encoded bulk lines).

Each figure is the best of several passes of ``time.process_time`` (the box's other work only
ever makes a pass slower).

    python -m bench decode
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable
from typing import Any

import bson
from bson.codec_options import CodecOptions
from bson.timestamp import Timestamp

from listeners.elasticsearch import fragments
from listeners.elasticsearch.items import ItemMaker
from listeners.elasticsearch.versioning import EventVersioner

N = 20_000
PASSES = 7
BATCH = 1000
#: As :func:`singleton.drivers.mongo.client` decodes (tz-aware datetimes).
CODEC = CodecOptions(tz_aware=True)


def _event(i: int) -> dict[str, Any]:
    at = Timestamp(1_796_000_000 + i // 1000, i % 1000 + 1)
    token = bson.encode({"s": 1000 + i, "t": at, "n": "bench.s100", "k": {"_id": i}})
    return {
        "_id": {"_data": token.hex()},
        "operationType": "insert",
        "clusterTime": at,
        "wallTime": datetime.datetime(2026, 12, 1, tzinfo=datetime.timezone.utc),
        "fullDocument": {
            "_id": i,
            "n": i,
            "name": f"item {i}",
            "price": i * 0.25,
            "tags": ["a", f"t{i % 50}"],
        },
        "ns": {"db": "bench", "coll": "s100"},
        "documentKey": {"_id": i},
    }


def _replies(events: list[dict[str, Any]]) -> list[bytes]:
    return [
        bson.encode({"cursor": {"nextBatch": events[lo : lo + BATCH], "id": 1}, "ok": 1})
        for lo in range(0, len(events), BATCH)
    ]


def _best_us(work: Callable[[], object]) -> float:
    best = float("inf")
    for _ in range(PASSES):
        started = time.process_time()
        work()
        best = min(best, time.process_time() - started)
    return round(best / N * 1e6, 3)


def main() -> dict[str, Any]:
    full = [_event(i) for i in range(N)]
    unused = set(fragments.UNUSED_FIELDS["$project"])
    stream = [{k: v for k, v in e.items() if k not in unused} for e in full]
    replies = {"full": _replies(full), "stream": _replies(stream)}

    def decode(kind: str) -> Callable[[], None]:
        def run() -> None:
            for reply in replies[kind]:
                bson.decode_all(reply, CODEC)  # decoded, then freed: as each getMore's batch

        return run

    decoded = [
        e for r in replies["stream"] for e in bson.decode_all(r, CODEC)[0]["cursor"]["nextBatch"]
    ]
    maker = ItemMaker(None, lambda _dead: None, lambda _key: None)
    versioner = EventVersioner()

    def sync() -> None:
        for lo in range(0, N, BATCH):
            batch = fragments.join(decoded[lo : lo + BATCH])
            items = [maker.event_item(e, versioner, "bench") for e in batch]
            b"".join(item.encoded() for item in items if item is not None)

    return {
        "events": N,
        "decode_us": {"full": _best_us(decode("full")), "stream": _best_us(decode("stream"))},
        "sync_us": _best_us(sync),
        "unused_fields": sorted(unused),
    }


if __name__ == "__main__":
    import json

    print(json.dumps(main(), indent=2))
