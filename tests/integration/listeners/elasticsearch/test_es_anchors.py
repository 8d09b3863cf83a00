"""Transaction anchors on SecantusDB (BSON resume tokens): reading on from an earlier event's
token finds the same first sequence as opening the stream at the cluster time, for every
transaction, between writes to other collections, and the versions stay those of the seek."""

from __future__ import annotations

from typing import Any

from bson.timestamp import Timestamp

from listeners.elasticsearch.versioning import (
    EventVersioner,
    decode,
    first_seq_at,
    first_seqs,
)
from listeners.stream.tokens import event_time


def _transaction(client: Any, docs: Any, other: Any, n: int, base: int) -> None:
    with client.start_session() as session, session.start_transaction():
        other.insert_one({"_id": base}, session=session)  # not in the watched collection
        for i in range(n):
            docs.insert_one({"_id": base + 1 + i}, session=session)


def _time(event: Any) -> Timestamp:
    at = event_time(event)
    assert at is not None
    return at


def test_anchors_read_on_from_an_earlier_token_equal_the_seek(client: Any, docs: Any) -> None:
    other = docs.database[f"{docs.name}_other"]
    start = client.admin.command("ping")["$clusterTime"]["clusterTime"]
    for t in range(6):
        docs.insert_one({"_id": f"plain{t}"})
        other.insert_one({"_id": f"other{t}"})
        _transaction(client, docs, other, 2 + t, 100 * (t + 1))
    with docs.watch(start_at_operation_time=start) as stream:
        events = [stream.next() for _ in range(6 + sum(2 + t for t in range(6)))]
    txn_times = sorted({_time(e) for e in events if "txnNumber" in e})
    assert len(txn_times) == 6
    plain = next(e for e in events if "txnNumber" not in e)
    seek = {ts: first_seq_at(client, ts) for ts in txn_times}
    # From one early token, a single read answers for every transaction up to the one asked.
    found = first_seqs(client, txn_times[-1], plain["_id"])
    assert found == {ts: seek[ts] for ts in txn_times if _time(plain) < ts}
    # A versioner reading on gives the versions of one that seeks every transaction.
    calls: list[Any] = []

    def reading_on(ts: Any, after: Any) -> Any:
        calls.append(after)
        return first_seqs(client, ts, after)

    by_seek = EventVersioner(lambda ts, after: {ts: s} if (s := seek.get(ts)) else {})
    versioner = EventVersioner(reading_on)
    versions = [versioner.version(e) for e in events]
    assert versions == [by_seek.version(e) for e in events]
    assert any(decode(x)[2] > 0 for x in versions)  # (positions within transactions)
    assert len(calls) == 6 and all(after is not None for after in calls)  # (never a seek)
