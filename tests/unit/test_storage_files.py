"""Executor-side file writing and the commit-log reader, without Spark."""

from __future__ import annotations

import json
from datetime import UTC, date, datetime
from pathlib import Path

import pyarrow as pa
import pytest

from lakehouse.storage.files import (
    HIVE_NULL,
    TableFileWriter,
    fs_path,
    partition_dir,
    partition_string,
)
from lakehouse.storage.log import LogUnavailableError, changes_between, version_changes

SCHEMA = pa.schema(
    [
        ("n", pa.int64()),
        ("s", pa.string()),
        ("ts", pa.timestamp("us", tz="UTC")),
        ("tags", pa.list_(pa.string())),
        ("day", pa.date32()),
    ]
)


def _batch(rows: list[tuple]) -> pa.RecordBatch:
    cols = list(zip(*rows, strict=True))
    return pa.RecordBatch.from_arrays(
        [pa.array(c, f.type) for c, f in zip(cols, SCHEMA, strict=True)], schema=SCHEMA
    )


def test_files_carry_delta_statistics(tmp_path: Path) -> None:
    t0 = datetime(2026, 1, 1, 0, 0, 0, 123456, tzinfo=UTC)
    rows = [
        (5, "b", t0, ["x"], date(2026, 1, 1)),
        (1, None, t0.replace(second=9), [], date(2026, 1, 1)),
    ]
    (f,) = TableFileWriter(str(tmp_path), SCHEMA).write_batches([_batch(rows)])
    stats = json.loads(f.stats)
    assert f.num_records == stats["numRecords"] == 2
    assert stats["minValues"]["n"] == 1 and stats["maxValues"]["n"] == 5
    assert stats["minValues"]["s"] == stats["maxValues"]["s"] == "b"
    assert stats["nullCount"]["s"] == 1
    # millisecond bounds, rounded outwards
    assert stats["minValues"]["ts"] == "2026-01-01T00:00:00.123Z"
    assert stats["maxValues"]["ts"] == "2026-01-01T00:00:09.124Z"
    assert "tags" not in stats["nullCount"]  # nested columns: no statistics rather than wrong ones
    assert fs_path(tmp_path, f.path).stat().st_size == f.size


def test_partitioned_files_leave_partition_columns_in_folders(tmp_path: Path) -> None:
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    rows = [
        (1, "a b/c%", t0, [], date(2026, 1, 1)),
        (2, None, t0, [], date(2026, 1, 2)),
        (3, "a b/c%", t0, [], date(2026, 1, 1)),
    ]
    files = TableFileWriter(str(tmp_path), SCHEMA, partition_by=["s", "day"]).write_batches(
        [_batch(rows)]
    )
    by_values = {tuple(sorted(f.partition_values.items(), key=str)): f for f in files}
    assert len(files) == 2
    ab = by_values[(("day", "2026-01-01"), ("s", "a b/c%"))]
    assert ab.num_records == 2
    assert "%" not in ab.path and " " not in ab.path  # Spark-readable folder names
    null_part = by_values[(("day", "2026-01-02"), ("s", None))]
    assert null_part.path.startswith(f"s={HIVE_NULL}/day=2026-01-02/")
    import pyarrow.parquet as pq

    assert pq.read_schema(fs_path(tmp_path, ab.path)).names == ["n", "ts", "tags"]


def test_files_roll_over_and_failed_writes_leave_nothing(tmp_path: Path) -> None:
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    rows = [(i, "x", t0, [], date(2026, 1, 1)) for i in range(10)]
    files = TableFileWriter(str(tmp_path), SCHEMA, max_rows_per_file=4).write_batches(
        [_batch(rows)]
    )
    assert [f.num_records for f in files] == [4, 4, 2]

    def exploding() -> object:
        yield _batch(rows)
        raise RuntimeError("task killed")

    with pytest.raises(RuntimeError):
        TableFileWriter(str(tmp_path / "other"), SCHEMA).write_batches(exploding())  # type: ignore[arg-type]
    assert list((tmp_path / "other").glob("*.parquet")) == []


def test_partition_folder_names_are_unique_and_safe() -> None:
    a = partition_dir(["k"], {"k": "a/b"})
    b = partition_dir(["k"], {"k": "a:b"})
    assert a != b and a.startswith("k=a_b-h") and b.startswith("k=a_b-h")
    assert partition_dir(["k"], {"k": "plain-1.0"}) == "k=plain-1.0"
    assert (
        partition_string(datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)) == "2026-01-02 03:04:05.000000"
    )
    assert partition_string(True) == "true" and partition_string(None) is None


def _commit(root: Path, version: int, *actions: dict) -> None:
    log = root / "_delta_log"
    log.mkdir(parents=True, exist_ok=True)
    lines = [
        json.dumps({"commitInfo": {"timestamp": 1_700_000_000_000 + version}}),
        *map(json.dumps, actions),
    ]
    (log / f"{version:020d}.json").write_text("\n".join(lines) + "\n")


def test_change_files_follow_the_protocol(tmp_path: Path) -> None:
    _commit(tmp_path, 1, {"add": {"path": "a.parquet", "partitionValues": {}, "dataChange": True}})
    _commit(
        tmp_path,
        2,
        {"remove": {"path": "a.parquet", "dataChange": True}},
        {"add": {"path": "p=x/b.parquet", "partitionValues": {"p": "x"}, "dataChange": True}},
    )
    _commit(  # a merge: described by its cdc files alone
        tmp_path,
        3,
        {"add": {"path": "c.parquet", "partitionValues": {}, "dataChange": True}},
        {"cdc": {"path": "_change_data/c1.parquet", "partitionValues": {}, "dataChange": False}},
    )
    _commit(  # compaction: no data change
        tmp_path,
        4,
        {"remove": {"path": "c.parquet", "dataChange": False}},
        {"add": {"path": "d.parquet", "partitionValues": {}, "dataChange": False}},
    )
    got = [
        (f.version, f.kind, f.path.name, f.partition_values)
        for f in changes_between(tmp_path, 1, 4)
    ]
    assert got == [
        (1, "insert", "a.parquet", {}),
        (2, "insert", "b.parquet", {"p": "x"}),
        (2, "delete", "a.parquet", {}),
        (3, "cdc", "c1.parquet", {}),
    ]
    assert version_changes(tmp_path, 3)[0].timestamp_ms == 1_700_000_000_003
    with pytest.raises(LogUnavailableError, match="version 9 is not in the log"):
        version_changes(tmp_path, 9)


def test_latest_metadata_looks_past_the_recent_commits(tmp_path: Path) -> None:
    from deltalake import CommitProperties, write_deltalake

    from lakehouse.storage.store import latest_metadata

    table = pa.table({"n": [1]})
    write_deltalake(
        str(tmp_path),
        table,
        commit_properties=CommitProperties(custom_metadata={"pos": '{"p": 1}'}),
    )
    for _ in range(20):  # more commits than the first, bounded look covers
        write_deltalake(str(tmp_path), table, mode="append")
    assert latest_metadata(tmp_path, "pos") == {"p": 1}
    write_deltalake(
        str(tmp_path),
        table,
        mode="append",
        commit_properties=CommitProperties(custom_metadata={"pos": '{"p": 2}'}),
    )
    assert latest_metadata(tmp_path, "pos") == {"p": 2}
    assert latest_metadata(tmp_path, "absent") is None
