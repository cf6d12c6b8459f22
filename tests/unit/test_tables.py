"""Pure gold transforms on tiny inline streams (Kafka Streams semantics)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pytest

from lakehouse.contracts.catalog import Catalog
from lakehouse.contracts.model import Aggregation, Contract, TableSpec
from lakehouse.runtime.config import REPO_ROOT
from lakehouse.tables.aggregations import _combine, aggregate_per_key
from lakehouse.tables.keyed import latest_per_key

pytestmark = pytest.mark.integration  # needs the shared SparkSession

COLS = "username string, location string, tombstone boolean, partition int, offset long, timestamp timestamp"


@pytest.fixture(scope="module")
def contract() -> Contract:
    return Catalog.load(REPO_ROOT / "contracts").topic("user-locations")


def _events(spark: Any, rows: list[tuple[Any, ...]]) -> Any:
    t0 = datetime(2026, 1, 1)
    full = [(u, loc, loc is None, p, o, t0.replace(second=o % 60)) for u, loc, p, o in rows]
    return spark.createDataFrame(full, COLS)


def test_latest_follows_offset_order_not_arrival_order(spark: Any, contract: Contract) -> None:
    df = _events(spark, [("alice", "Rome", 0, 5), ("alice", "Paris", 0, 1), ("bob", "Lima", 0, 3)])
    got = sorted(tuple(r) for r in latest_per_key(df, contract).collect())
    assert got == [("alice", "Rome", False), ("bob", "Lima", False)]


def test_latest_keeps_tombstones_and_drops_null_keys(spark: Any, contract: Contract) -> None:
    df = _events(spark, [("bob", "Lima", 0, 1), ("bob", None, 0, 2), (None, "Nowhere", 1, 0)])
    got = [tuple(r) for r in latest_per_key(df, contract).collect()]
    assert got == [("bob", None, True)]


def test_latest_of_a_key_in_several_partitions_is_the_later_timestamped_partition_latest(
    spark: Any, contract: Contract
) -> None:
    # Timestamps are offset % 60 seconds. alice: partition 0 ends at offset 65 (second 5),
    # partition 1 at offset 7 (second 7): partition 1's latest is the later one, despite the
    # smaller offset. bob: both partitions end at second 4; the higher partition wins the tie.
    df = _events(
        spark,
        [
            ("alice", "Paris", 0, 1),
            ("alice", "Rome", 0, 65),
            ("alice", "Lima", 1, 2),
            ("alice", "Oslo", 1, 7),
            ("bob", "A", 0, 4),
            ("bob", "B", 1, 4),
            ("bob", "C", 0, 3),
        ],
    )
    got = sorted(tuple(r) for r in latest_per_key(df, contract).collect())
    assert got == [("alice", "Oslo", False), ("bob", "B", False)]


def test_count_ignores_null_keys_and_tombstones(spark: Any, contract: Contract) -> None:
    spec = contract.table("user_location_counts")
    df = _events(
        spark,
        [
            ("alice", "Paris", 0, 0),
            ("alice", "Rome", 0, 1),
            ("alice", None, 0, 2),
            (None, "X", 1, 0),
        ],
    )
    assert [tuple(r) for r in aggregate_per_key(df, contract, spec).collect()] == [("alice", 2)]


def test_sum_min_max_of_a_field(spark: Any) -> None:
    from lakehouse.contracts.fields import Field

    c = Contract(
        topic="payments",
        partitions=1,
        key_format="string",
        key_name="account",
        value_format="json",
        fields=(Field("amount", "long"),),
        stream="payments",
    )
    spec = TableSpec(
        "totals",
        "aggregate",
        (
            Aggregation("total", "sum", "amount"),
            Aggregation("smallest", "min", "amount"),
            Aggregation("largest", "max", "amount"),
            Aggregation("n", "count", "amount"),
        ),
    )
    df = spark.createDataFrame(
        [("a", 2, False), ("a", 5, False), ("a", None, False), ("b", 1, False), ("b", None, True)],
        "account string, amount long, tombstone boolean",
    )
    got = sorted(tuple(r) for r in aggregate_per_key(df, c, spec).collect())
    assert got == [("a", 7, 2, 5, 2), ("b", 1, 1, 1, 1)]


def test_combine_expressions_fold_partials() -> None:
    assert _combine(Aggregation("n", "count"))["n"].endswith("ELSE t.n + s.n END")
    assert "s.m < t.m" in _combine(Aggregation("m", "min", "x"))["m"]
    assert "s.m > t.m" in _combine(Aggregation("m", "max", "x"))["m"]
    avg = _combine(Aggregation("a", "avg", "x"))
    assert sorted(avg) == ["__a_count", "__a_sum", "a"]
    assert avg["__a_sum"].endswith("ELSE t.__a_sum + s.__a_sum END")
    assert avg["a"].startswith("CASE WHEN (") and "THEN NULL ELSE" in avg["a"]
