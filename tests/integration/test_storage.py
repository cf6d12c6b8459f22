"""The storage interface: round trips, exactly-once app transactions, merge and change feed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from lakehouse.errors import TableNotFoundError
from lakehouse.storage import DeltaStore, Txn, changes_arrow, read_arrow

pytestmark = pytest.mark.integration


def test_append_round_trip_and_plain_delta(spark: Any, tmp_path: Path) -> None:
    from deltalake import DeltaTable

    store = DeltaStore(spark)
    path = tmp_path / "t"
    df = spark.createDataFrame(
        [("a", 1, b"\x00", [("h", b"v")])],
        "k string, n long, raw binary, headers array<struct<key:string,value:binary>>",
    )
    store.append(df, path, metadata={"lakehouse.note": {"x": 1}})
    back = store.read(path)
    assert back.schema == df.schema
    assert [tuple(r) for r in back.collect()] == [tuple(r) for r in df.collect()]
    assert store.latest_metadata(path, "lakehouse.note") == {"x": 1}
    dt = DeltaTable(str(path))
    assert dt.metadata().configuration["delta.enableChangeDataFeed"] == "true"


def test_same_txn_version_applies_once(spark: Any, tmp_path: Path) -> None:
    store = DeltaStore(spark)
    path = tmp_path / "t"
    df = spark.createDataFrame([("a", 1)], "k string, n long")
    assert store.append(df, path, txn=Txn("app", 1)).committed
    assert not store.append(df, path, txn=Txn("app", 1)).committed
    assert not store.append(df, path, txn=Txn("app", 0)).committed
    assert store.append(df, path, txn=Txn("app", 2)).committed
    assert store.transaction_version(path, "app") == 2
    assert store.transaction_version(path, "other") is None
    assert read_arrow(path).num_rows == 2


def test_merge_upserts_and_deletes_with_change_images(spark: Any, tmp_path: Path) -> None:
    store = DeltaStore(spark)
    path = tmp_path / "t"
    store.create(
        path,
        spark.createDataFrame([], "k string, v string").schema,
        properties={"delta.enableChangeDataFeed": "true"},
    )
    rules = {
        "on": ["k"],
        "update": {"v": "s.v"},
        "insert": {"k": "s.k", "v": "s.v"},
        "delete_when": "s.gone",
        "insert_when": "NOT s.gone",
    }
    first = spark.createDataFrame(
        [("a", "1", False), ("b", "2", False)], "k string, v string, gone boolean"
    )
    store.merge(first, path, txn=Txn("m", 1), **rules)
    second = spark.createDataFrame(
        [("a", "9", False), ("b", None, True), ("c", None, True)],
        "k string, v string, gone boolean",
    )
    store.merge(second, path, txn=Txn("m", 2), **rules)
    assert not store.merge(second, path, txn=Txn("m", 2), **rules).committed
    assert sorted(tuple(r.values()) for r in read_arrow(path).to_pylist()) == [("a", "9")]
    feed = changes_arrow(path, 2).to_pylist()
    assert sorted((r["_change_type"], r["k"], r["v"]) for r in feed) == [
        ("delete", "b", "2"),
        ("update_postimage", "a", "9"),
        ("update_preimage", "a", "1"),
    ]
    spark_feed = store.changes(path, 2).collect()
    assert len(spark_feed) == 3


def test_missing_table_is_a_typed_error(spark: Any, tmp_path: Path) -> None:
    with pytest.raises(TableNotFoundError, match="no Delta table at"):
        DeltaStore(spark).read(tmp_path / "nothing")
