"""Split change events are joined again when their fragments share a batch; otherwise the
partial events that name a document are completed by a lookup."""

from __future__ import annotations

from typing import Any

from listeners.elasticsearch.fragments import join, needs_lookup


def frag(n: int, of: int, **fields: Any) -> dict[str, Any]:
    return {"_id": {"_data": f"t{n}"}, "splitEvent": {"fragment": n, "of": of}, **fields}


def test_consecutive_fragments_are_joined_with_the_last_token() -> None:
    plain = {"_id": {"_data": "p"}, "operationType": "delete", "documentKey": {"_id": 2}}
    events = [
        frag(1, 3, operationType="update", clusterTime=1),
        frag(2, 3, fullDocument={"big": "x"}),
        frag(3, 3, documentKey={"_id": 1}),
        plain,
    ]
    joined = join(events)
    assert joined[0] == {
        "_id": {"_data": "t3"},
        "operationType": "update",
        "clusterTime": 1,
        "fullDocument": {"big": "x"},
        "documentKey": {"_id": 1},
    }
    assert joined[1] is plain and len(joined) == 2
    assert not needs_lookup(joined[0])


def test_fragments_cut_by_a_batch_boundary_stay_partial() -> None:
    head, tail = (
        join([frag(1, 2, operationType="insert")]),
        join([frag(2, 2, documentKey={"_id": 1})]),
    )
    assert not needs_lookup(head[0])  # no document key: skipped, the other batch has it
    assert needs_lookup(tail[0])  # no operation type, no document: looked up


def test_what_needs_a_lookup() -> None:
    key = {"documentKey": {"_id": 1}}
    assert needs_lookup({"operationType": "update", **key})  # projected away
    assert not needs_lookup({"operationType": "update", "fullDocument": None, **key})
    assert not needs_lookup({"operationType": "delete", **key})


def test_the_unused_fields_are_dropped_once_and_before_the_split_stage() -> None:
    from listeners.elasticsearch.fragments import (
        SPLIT_STAGE,
        UNUSED_FIELDS,
        UNUSED_WITH_ID,
        without_unused,
    )

    match = {"$match": {"operationType": "insert"}}
    assert without_unused([match]) == [match, UNUSED_FIELDS]
    split = without_unused([match, SPLIT_STAGE])
    assert split == [match, UNUSED_FIELDS, SPLIT_STAGE]  # the split stage must stay last
    assert without_unused(split) == split
    # without a transform, the document's own _id too (in place of the first stage, once)
    no_id = without_unused(split, document_id=False)
    assert no_id == [match, UNUSED_WITH_ID, SPLIT_STAGE]
    assert without_unused(no_id, document_id=False) == no_id
    assert UNUSED_WITH_ID["$project"]["fullDocument._id"] == 0
