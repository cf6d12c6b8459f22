"""The bronze position: how a batch moves it (pure, no Spark)."""

from __future__ import annotations

from lakehouse.topics.bronze_table import Position
from lakehouse.topics.from_kafka import kafka_plan
from lakehouse.topics.from_landing import advance, offset_gaps


def _file(p: int, start: int, end: int | None, kept: int, max_kept: int | None) -> dict:
    path = f"/landing/t+{p}+{start:010d}.json"
    return {"file": {"path": path, "partition": p, "start_offset": start}, "end": end,
            "kept": kept, "max_kept": max_kept}  # fmt: skip


def test_position_moves_past_records_and_remembers_files_that_did_not_move_it() -> None:
    old = Position(next={0: 10}, skip={0: ["t+0+0000000010.json"]}, listed_at_ms=1)
    files = [
        _file(0, 10, 15, 5, 14),  # a normal segment: 10..14
        _file(0, 15, None, 0, None),  # all bad: no offsets known
        _file(1, 0, 3, 2, 2),  # offsets 0 and 2 present: one gap
    ]
    new = advance(old, files, listed_at_ms=99)
    assert new.next == {0: 15, 1: 3}
    # the old skip entry (start 10) is now below the position; the all-bad file is remembered
    assert new.skip == {0: ["t+0+0000000015.json"]}
    assert new.listed_at_ms == 99
    assert offset_gaps(old, new, files) == {1: 1}
    assert Position.from_json(new.to_json()) == new


def test_kafka_plan_reads_from_the_position_to_the_end_and_names_what_retention_deleted() -> None:
    pos = Position(next={0: 10, 1: 4, 2: 7})
    # (earliest the broker still has, end offset) per partition
    marks = {0: (0, 15), 1: (6, 9), 2: (7, 7), 3: (0, 2)}
    read, lost, after = kafka_plan(pos, marks)
    assert read == {0: (10, 15), 1: (6, 9), 3: (0, 2)}  # partition 2 has nothing new
    assert lost == {1: (4, 6)}  # offsets 4 and 5 were deleted before bronze read them
    assert after == {0: 15, 1: 9, 2: 7, 3: 2}


def test_kafka_plan_of_a_partition_emptied_by_retention_only_loses() -> None:
    assert kafka_plan(Position(next={0: 3}), {0: (8, 8)}) == ({}, {0: (3, 8)}, {0: 8})
