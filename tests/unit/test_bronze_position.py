"""The bronze position: how a batch moves it (pure, no Spark)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import cast

import pytest

from lakehouse.contracts.model import Contract
from lakehouse.pipeline import runner
from lakehouse.quality.ledger import BLOCKED, BatchOutcome, RunInfo
from lakehouse.runtime.config import Settings
from lakehouse.tables.common import GoldResult
from lakehouse.topics.bronze_table import BronzeResult, Position
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


def test_a_batch_knows_its_lag_from_the_end_offsets_it_planned_with() -> None:
    result = BronzeResult(
        "t",
        3,
        records=5,
        next_offsets={0: 15, 1: 6},
        committed=True,
        end_offsets={0: 15, 1: 9, 2: 0},  # partition 1 had 3 records past what was read
    )
    outcome = result.batch()
    assert outcome is not None
    assert (outcome.lag, outcome.lag_unit) == (3, "records")
    unplanned = BronzeResult("t", 3, records=5, next_offsets={0: 15}, committed=True).batch()
    assert unplanned is not None and (unplanned.lag, unplanned.lag_unit) == (None, None)


def test_the_ledger_rows_keep_a_known_lag_and_measure_only_the_others(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Bronze's published batch keeps the lag it planned with (the topic is not asked again);
    a blocked one, which knows none, has its lag read once for the layer."""
    asked: list[set[str]] = []

    def measured(settings: object, contract: object, catalog: object, layer: str, tables: set[str]):
        asked.append(set(tables))
        return dict.fromkeys(tables, 4)

    monkeypatch.setattr(runner, "_lags", measured)
    batches = runner._Batches("bronze")
    batches.add(
        BronzeResult("t", 3, 5, next_offsets={0: 5}, committed=True, end_offsets={0: 5}).batch()
    )
    said: list[str] = []
    topic = cast(Contract, SimpleNamespace(topic="t"))
    rows = batches.rows(cast(Settings, None), topic, None, RunInfo(), said.append)
    assert [(r["lag"], r["lag_unit"]) for r in rows] == [(0, "records")]
    assert asked == [] and said == []

    batches.add(BatchOutcome("bronze", "u", BLOCKED, 5))
    rows = batches.rows(cast(Settings, None), topic, None, RunInfo(), said.append)
    assert [(r["table"], r["lag"]) for r in rows] == [("t", 0), ("u", 4)]
    assert asked == [{"u"}]


def test_a_gold_batch_knows_its_lag_and_the_logs_are_not_read_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A gold batch read each input to the head it planned with: its row says 0 versions behind
    and the layer's logs are not read again; a result that does not know (a capped rebuild)
    is measured."""
    asked: list[set[str]] = []

    def measured(settings: object, contract: object, catalog: object, layer: str, tables: set[str]):
        asked.append(set(tables))
        return dict.fromkeys(tables, 2)

    monkeypatch.setattr(runner, "_lags", measured)
    batches = runner._Batches("gold")
    batches.add(GoldResult("moves", (3, 4), 6, committed=True, table_version=9, lag=0).batch())
    topic = cast(Contract, SimpleNamespace(topic="t"))
    rows = batches.rows(cast(Settings, None), topic, None, RunInfo(), [].append)
    assert [(r["table"], r["lag"], r["lag_unit"]) for r in rows] == [("moves", 0, "versions")]
    assert asked == []

    batches.add(GoldResult("counts", (0, 4), 2, committed=True, table_version=1).batch())
    rows = batches.rows(cast(Settings, None), topic, None, RunInfo(), [].append)
    assert [(r["table"], r["lag"]) for r in rows] == [("moves", 0), ("counts", 2)]
    assert asked == [{"counts"}]
