"""Gold's driver fold of a stream aggregate (lakehouse.tables_arrow.partial_aggregates, run by
DuckDB) on hand-written stream files: what the files' layout can throw at it. Its agreement with
Spark on random histories is tests/integration/test_gold_arrow.py's."""

from __future__ import annotations

import math
import threading
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lakehouse.contracts import Catalog, Contract, TableSpec
from lakehouse.tables_arrow import Unclean, duckdb_connection, partial_aggregates

CONTRACT = """\
topic: rides
partitions: 2
key: {format: string, name: rider}
value:
  format: json
  fields:
    - {name: fare, type: long}
    - {name: tip, type: double}
    - {name: order, type: string}
stream: {name: rides_stream}
tables:
  - name: per_rider
    kind: aggregate
    aggregations:
      - {name: n, fn: count}
      - {name: fares, fn: count, field: fare}
      - {name: fare_sum, fn: sum, field: fare}
      - {name: fare_avg, fn: avg, field: fare}
      - {name: tip_max, fn: max, field: tip}
      - {name: first_order, fn: earliest, field: order}
      - {name: last_order, fn: latest, field: order}
  - name: per_order
    kind: aggregate
    group_by: order
    aggregations:
      - {name: n, fn: count}
"""


@pytest.fixture
def source(tmp_path: Path) -> Contract:
    contracts = tmp_path / "contracts"
    contracts.mkdir()
    (contracts / "rides.yaml").write_text(CONTRACT)
    return Catalog.load(contracts).topic("rides")


def _stream_schema(source: Contract) -> pa.Schema:
    from pyspark.sql.pandas.types import to_arrow_schema

    from lakehouse.streams import stream_schema

    return to_arrow_schema(stream_schema(source), timezone="UTC")


def _spec(source: Contract, name: str) -> TableSpec:
    return next(t for t in source.tables if t.name == name)


def _file(path: Path, rows: list[dict[str, Any]], drop: tuple[str, ...] = ()) -> str:
    """A stream file of ``rows`` (rider, fare, tip, order, tombstone, partition, offset), without
    the columns ``drop``: a file written before the contract had them."""
    columns: dict[str, pa.Array] = {
        "rider": pa.array([r.get("rider") for r in rows], pa.string()),
        "fare": pa.array([r.get("fare") for r in rows], pa.int64()),
        "tip": pa.array([r.get("tip") for r in rows], pa.float64()),
        "order": pa.array([r.get("order") for r in rows], pa.string()),
        "tombstone": pa.array([r.get("tombstone", False) for r in rows], pa.bool_()),
        "partition": pa.array([r.get("partition", 0) for r in rows], pa.int32()),
        "offset": pa.array([r["offset"] for r in rows], pa.int64()),
    }
    pq.write_table(pa.table({k: v for k, v in columns.items() if k not in drop}), path)
    return str(path)


def _by_group(table: pa.Table, group: str) -> dict[Any, dict[str, Any]]:
    return {row.pop(group): row for row in table.to_pylist()}


def test_counts_sums_averages_and_arrival_order_across_files(
    source: Contract, tmp_path: Path
) -> None:
    # Listed newest first: arrival follows the commit versions, then partition and offset.
    newer = _file(
        tmp_path / "v7.parquet",
        [
            {"rider": "a", "fare": 5, "order": "o3", "offset": 0},
            {"rider": "a", "fare": None, "order": None, "offset": 1},  # a null skipped by latest
            {"rider": "a", "tombstone": True, "offset": 2},  # a tombstone: not counted
            {"rider": None, "fare": 100, "order": "x", "offset": 3},  # a null key: ignored
        ],
    )
    older = _file(
        tmp_path / "v3.parquet",
        [
            {"rider": "a", "fare": 1, "tip": 2.5, "order": "o2", "partition": 1, "offset": 0},
            {"rider": "a", "fare": 2, "order": "o1", "partition": 0, "offset": 9},
            {"rider": "b", "offset": 1},
        ],
    )
    got = _by_group(
        partial_aggregates(
            [(newer, 7), (older, 3)], _stream_schema(source), source, _spec(source, "per_rider")
        ),
        "rider",
    )
    assert got["a"] == {
        "n": 4,
        "fares": 3,
        "fare_sum": 8,
        "__fare_avg_sum": 8.0,
        "__fare_avg_count": 3,
        "tip_max": 2.5,
        "first_order": "o1",  # version 3, partition 0 comes before version 3, partition 1
        "last_order": "o3",
        "fare_avg": 8 / 3,
    }
    # A group whose values are all null: counted, but its sum, average and picks are null.
    assert got["b"]["n"] == 1 and got["b"]["fares"] == 0
    assert got["b"]["fare_sum"] is None and got["b"]["fare_avg"] is None
    assert got["b"]["first_order"] is None and got["b"]["tip_max"] is None
    assert set(got) == {"a", "b"}


def test_a_column_some_or_all_files_lack_is_null(source: Contract, tmp_path: Path) -> None:
    old = _file(tmp_path / "old.parquet", [{"rider": "a", "offset": 0}], drop=("tip", "order"))
    new = _file(tmp_path / "new.parquet", [{"rider": "a", "tip": 1.5, "order": "o", "offset": 1}])
    schema, spec = _stream_schema(source), _spec(source, "per_rider")
    both = _by_group(partial_aggregates([(old, 1), (new, 2)], schema, source, spec), "rider")
    assert (both["a"]["n"], both["a"]["tip_max"], both["a"]["first_order"]) == (2, 1.5, "o")
    alone = _by_group(partial_aggregates([(old, 1)], schema, source, spec), "rider")
    assert (alone["a"]["n"], alone["a"]["tip_max"], alone["a"]["last_order"]) == (1, None, None)
    # Re-keyed by a field no file has yet: every group is null, so nothing is counted.
    grouped = partial_aggregates([(old, 1)], schema, source, _spec(source, "per_order"))
    assert grouped.num_rows == 0 and grouped.column_names == ["order", "n"]


def test_no_files_give_no_groups(source: Contract) -> None:
    got = partial_aggregates([], _stream_schema(source), source, _spec(source, "per_rider"))
    assert got.num_rows == 0
    assert got.column_names[0] == "rider" and "fare_avg" in got.column_names


def test_batches_spark_could_fold_otherwise_are_refused(source: Contract, tmp_path: Path) -> None:
    schema, spec = _stream_schema(source), _spec(source, "per_rider")
    nan = _file(tmp_path / "nan.parquet", [{"rider": "a", "tip": math.nan, "offset": 0}])
    with pytest.raises(Unclean, match="NaN in 'tip', whose max is taken"):
        partial_aggregates([(nan, 1)], schema, source, spec)
    big = [{"rider": "a", "fare": 2**61, "offset": i} for i in range(2)]
    risky = _file(tmp_path / "big.parquet", big)
    with pytest.raises(Unclean, match="the sum of 'fare' might overflow"):
        partial_aggregates([(risky, 1)], schema, source, spec)
    # Proven safe by other means (the files' statistics), the same sum is computed exactly.
    got = _by_group(partial_aggregates([(risky, 1)], schema, source, spec, {"fare"}), "rider")
    assert got["a"]["fare_sum"] == 2**62


def test_each_thread_has_its_own_connection() -> None:
    mine = duckdb_connection()
    assert duckdb_connection() is mine
    theirs: list[Any] = []
    thread = threading.Thread(target=lambda: theirs.append(duckdb_connection()))
    thread.start()
    thread.join()
    assert theirs and theirs[0] is not mine
    assert mine.sql("SELECT current_setting('TimeZone')").fetchall() == [("UTC",)]
