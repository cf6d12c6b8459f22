"""The storage interface: round trips, modes, schema evolution, exactly-once app transactions,
conflicts, merge, change feed and maintenance."""

from __future__ import annotations

import random
import threading
import time
from datetime import UTC, date, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from delta_log import added_files

from lakehouse.errors import ConcurrentWriteError, SchemaMismatchError, TableNotFoundError
from lakehouse.storage import (
    DeltaStore,
    ReplaceWhereError,
    Txn,
    changes_arrow,
    read_arrow,
)
from lakehouse.storage.maintenance import Consumer, maintain

pytestmark = pytest.mark.integration

ALL_TYPES = (
    "s string, l long, i int, sh short, d double, f float, b boolean, dt date, ts timestamp, "
    "bin binary, dec decimal(10,2), tags array<string>, "
    "headers array<struct<key:string,value:binary>>, attrs map<string,string>, "
    "point struct<x:double,y:double>"
)
ROWS = [
    (
        "a",
        1,
        2,
        3,
        1.5,
        2.5,
        True,
        date(2026, 1, 2),
        datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC),
        b"\x00\xff",
        Decimal("12.34"),
        ["x", "y"],
        [("h", b"v")],
        {"k": "v"},
        (1.0, 2.0),
    ),
    (None,) * 15,
    (
        "ünïcode",
        -(2**62),
        -(2**31),
        -(2**15),
        -0.0,
        1e30,
        False,
        date(1970, 1, 1),
        datetime(1999, 12, 31, 23, 59, 59, tzinfo=UTC),
        b"",
        Decimal("-0.01"),
        [],
        [],
        {},
        (None, -1.0),
    ),
]


# Upsert by key `k`; a source row with `gone` set deletes the key (a tombstone).
UPSERT: dict[str, Any] = {
    "on": ["k"],
    "update": {"v": "s.v"},
    "insert": {"k": "s.k", "v": "s.v"},
    "delete_when": "s.gone",
    "insert_when": "NOT s.gone",
}


def _sorted(rows: list[Any]) -> list[tuple[Any, ...]]:
    return sorted((tuple(r) for r in rows), key=repr)


def _ints(spark: Any, start: int, n: int, **extra: Any) -> Any:
    from pyspark.sql import functions as F

    df = spark.range(start, start + n).withColumnRenamed("id", "n")
    for name, value in extra.items():
        df = df.withColumn(name, F.lit(value))
    return df


def test_round_trip_every_type(spark: Any, tmp_path: Path) -> None:
    store = DeltaStore(spark)
    df = spark.createDataFrame(ROWS, ALL_TYPES)
    store.write(df, tmp_path / "t")
    back = store.read(tmp_path / "t")
    assert back.schema == df.schema
    assert _sorted(back.collect()) == _sorted(df.collect())
    # delta-rs alone reads the same rows: the table is plain Delta.
    assert read_arrow(tmp_path / "t").num_rows == 3


def test_partitioned_round_trip_restores_partition_columns(spark: Any, tmp_path: Path) -> None:
    store = DeltaStore(spark)
    rows = [
        (1, "a b/c%", date(2026, 1, 1)),
        (2, None, date(2026, 1, 1)),
        (3, "x", date(2026, 1, 2)),
    ]
    df = spark.createDataFrame(rows, "n long, cat string, day date")
    store.write(df, tmp_path / "t", partition_by=["cat", "day"])
    back = store.read(tmp_path / "t")
    assert back.schema == df.schema
    assert _sorted(back.collect()) == _sorted(rows)
    assert _sorted(read_arrow(tmp_path / "t").select(["n", "cat", "day"]).to_pylist()) == _sorted(
        [
            {"n": 1, "cat": "a b/c%", "day": date(2026, 1, 1)},
            {"n": 2, "cat": None, "day": date(2026, 1, 1)},
            {"n": 3, "cat": "x", "day": date(2026, 1, 2)},
        ]
    )
    with pytest.raises(SchemaMismatchError, match="partitioned by"):
        store.write(df, tmp_path / "t", partition_by=["day"])


def test_partition_values_of_each_type_come_back_from_snapshot_and_change_feed(
    spark: Any, tmp_path: Path
) -> None:
    """The reader maps each data file to its partition values as text and casts them back:
    typed values from delta-rs's add actions (snapshot) and the log's text (change feed)."""
    store = DeltaStore(spark)
    schema = "n long, i int, b boolean, day date, ts timestamp, dec decimal(10,2)"
    rows = [
        (
            1,
            7,
            True,
            date(2026, 1, 1),
            datetime(2026, 1, 1, 12, 30, 5, tzinfo=UTC),
            Decimal("1.50"),
        ),
        (
            2,
            -3,
            False,
            date(2026, 2, 28),
            datetime(2026, 2, 28, 0, 0, 0, tzinfo=UTC),
            Decimal("0.01"),
        ),
        (3, None, None, None, None, None),
    ]
    df = spark.createDataFrame(rows, schema)
    table = tmp_path / "t"
    store.write(df, table, partition_by=["i", "b", "day", "ts", "dec"])
    expected = _sorted(df.collect())
    assert _sorted(store.read(table).collect()) == expected
    feed = store.changes(table, 0).drop("_change_type", "_commit_version", "_commit_timestamp")
    assert _sorted(feed.select(*df.columns).collect()) == expected


def test_plain_delta_with_protocol_properties_and_stats(spark: Any, tmp_path: Path) -> None:
    from deltalake import DeltaTable

    store = DeltaStore(spark)
    store.write(
        _ints(spark, 0, 100, s="x"),
        tmp_path / "t",
        properties={"delta.enableChangeDataFeed": "true", "delta.appendOnly": "false"},
    )
    dt = DeltaTable(str(tmp_path / "t"))
    assert dt.metadata().configuration["delta.enableChangeDataFeed"] == "true"
    p = dt.protocol()
    assert (p.min_reader_version, p.min_writer_version) == (1, 4)  # 4: change data feed
    adds = pa.table(dt.get_add_actions(flatten=True)).to_pylist()
    assert sum(a["num_records"] for a in adds) == 100
    assert min(a["min.n"] for a in adds) == 0 and max(a["max.n"] for a in adds) == 99


def test_overwrite_and_replace_where(spark: Any, tmp_path: Path) -> None:
    store = DeltaStore(spark)
    path = tmp_path / "t"
    store.write(_ints(spark, 0, 10), path)
    store.write(_ints(spark, 100, 5), path, mode="overwrite")
    assert sorted(r.n for r in store.read(path).collect()) == list(range(100, 105))
    # Replace the rows n >= 103 (not aligned with files: rows 100..102 of the same file stay).
    store.write(_ints(spark, 200, 2), path, mode="replace_where", replace_where="n >= 103")
    assert sorted(r.n for r in store.read(path).collect()) == [100, 101, 102, 200, 201]
    before = store.version(path)
    with pytest.raises(ReplaceWhereError, match=r"1 row\(s\) of the new data do not match"):
        store.write(_ints(spark, 5, 1), path, mode="replace_where", replace_where="n >= 100")
    assert store.version(path) == before


def test_replace_where_on_a_partition(spark: Any, tmp_path: Path) -> None:
    store = DeltaStore(spark)
    path = tmp_path / "t"
    store.write(
        _ints(spark, 0, 4, p="a").unionByName(_ints(spark, 10, 4, p="b")), path, partition_by=["p"]
    )
    store.write(_ints(spark, 50, 2, p="b"), path, mode="replace_where", replace_where="p = 'b'")
    got = sorted((r.p, r.n) for r in store.read(path).collect())
    assert got == [("a", 0), ("a", 1), ("a", 2), ("a", 3), ("b", 50), ("b", 51)]
    feed = store.changes(path, store.version(path)).collect()
    assert sorted((r._change_type, r.n) for r in feed) == [
        ("delete", 10),
        ("delete", 11),
        ("delete", 12),
        ("delete", 13),
        ("insert", 50),
        ("insert", 51),
    ]


def test_schema_evolution_is_additive_and_on_request(spark: Any, tmp_path: Path) -> None:
    store = DeltaStore(spark)
    path = tmp_path / "t"
    store.write(spark.createDataFrame([("a", 1)], "k string, v long"), path)
    wider = spark.createDataFrame([("b", 2, "new")], "k string, v long, extra string")
    with pytest.raises(
        SchemaMismatchError, match=r"new column.*'extra'.*schema_mode='add_columns'"
    ):
        store.write(wider, path)
    store.write(wider, path, schema_mode="add_columns")
    assert _sorted(store.read(path).collect()) == [("a", 1, None), ("b", 2, "new")]
    with pytest.raises(
        SchemaMismatchError, match=r"column 'v' is .*string.* in the data but .*long"
    ):
        store.write(spark.createDataFrame([("c", "x")], "k string, v string"), path)
    store.write(spark.createDataFrame([("d",)], "k string"), path)  # missing nullable columns: null
    assert sorted(r.k for r in store.read(path).collect()) == ["a", "b", "d"]


def test_time_travel_by_version_and_timestamp(spark: Any, tmp_path: Path) -> None:
    store = DeltaStore(spark)
    path = tmp_path / "t"
    store.write(_ints(spark, 0, 3), path)
    v1 = store.version(path)
    time.sleep(0.05)
    middle = datetime.now(UTC)
    time.sleep(0.05)
    store.write(_ints(spark, 3, 3), path)
    assert store.read(path, version=v1).count() == 3
    assert store.read(path, as_of=middle).count() == 3
    assert store.read(path).count() == 6


def test_same_txn_version_applies_once(spark: Any, tmp_path: Path) -> None:
    store = DeltaStore(spark)
    path = tmp_path / "t"
    df = spark.createDataFrame([("a", 1)], "k string, n long")
    assert store.append(
        df, path, txn=Txn("app", 1), metadata={"lakehouse.pos": {"p0": 7}}
    ).committed
    assert not store.append(df, path, txn=Txn("app", 1)).committed
    assert not store.append(df, path, txn=Txn("app", 0)).committed
    assert store.append(df, path, txn=Txn("app", 2)).committed
    assert store.transaction_version(path, "app") == 2
    assert store.transaction_version(path, "other") is None
    assert store.latest_metadata(path, "lakehouse.pos") == {"p0": 7}
    assert read_arrow(path).num_rows == 2


def _with_concurrent_commit(
    monkeypatch: pytest.MonkeyPatch, store: DeltaStore, concurrent: Any
) -> None:
    """Make the next write see `concurrent()` commit after it planned on its snapshot."""
    original = DeltaStore._conform_schema
    fired = []

    def planned(self: DeltaStore, dt: Any, *args: Any) -> Any:
        result = original(self, dt, *args)
        if not fired:
            fired.append(True)
            concurrent()
        return result

    monkeypatch.setattr(DeltaStore, "_conform_schema", planned)


def test_conflicting_overwrites_raise_a_typed_error(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = DeltaStore(spark)
    path = tmp_path / "t"
    store.write(_ints(spark, 0, 5), path)
    _with_concurrent_commit(
        monkeypatch, store, lambda: store.write(_ints(spark, 10, 1), path, mode="overwrite")
    )
    with pytest.raises(ConcurrentWriteError, match="concurrent write conflict"):
        store.write(_ints(spark, 20, 1), path, mode="overwrite")
    assert [r.n for r in store.read(path).collect()] == [10]
    # The losing write deleted its own files: every data file on disk is in some commit.
    assert {p.name for p in path.glob("*.parquet")} == added_files(path)


def test_racing_writes_of_one_txn_apply_once(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = DeltaStore(spark)
    path = tmp_path / "t"
    store.write(_ints(spark, 0, 1), path)
    _with_concurrent_commit(
        monkeypatch, store, lambda: store.write(_ints(spark, 1, 1), path, txn=Txn("job", 5))
    )
    with pytest.raises(ConcurrentWriteError):
        store.write(_ints(spark, 1, 1), path, txn=Txn("job", 5))
    monkeypatch.undo()
    assert not store.write(_ints(spark, 1, 1), path, txn=Txn("job", 5)).committed  # the retry
    assert sorted(r.n for r in store.read(path).collect()) == [0, 1]


def test_concurrent_appends_in_threads_lose_nothing(spark: Any, tmp_path: Path) -> None:
    store = DeltaStore(spark)
    path = tmp_path / "t"
    store.write(_ints(spark, 0, 1), path)
    errors: list[BaseException] = []

    def append(i: int) -> None:
        try:
            store.write(_ints(spark, 1000 * (i + 1), 100), path)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=append, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert store.read(path).count() == 401


def test_merge_upserts_and_deletes_with_change_images(spark: Any, tmp_path: Path) -> None:
    store = DeltaStore(spark)
    path = tmp_path / "t"
    store.create(path, spark.createDataFrame([], "k string, v string").schema)
    schema = "k string, v string, gone boolean"
    store.merge(
        spark.createDataFrame([("a", "1", False), ("b", "2", False)], schema),
        path,
        txn=Txn("m", 1),
        **UPSERT,
    )
    second = spark.createDataFrame(
        [("a", "9", False), ("b", None, True), ("c", None, True)], schema
    )
    store.merge(second, path, txn=Txn("m", 2), **UPSERT)
    assert not store.merge(second, path, txn=Txn("m", 2), **UPSERT).committed
    assert sorted(tuple(r.values()) for r in read_arrow(path).to_pylist()) == [("a", "9")]
    expected = [("delete", "b", "2"), ("update_postimage", "a", "9"), ("update_preimage", "a", "1")]
    feed = changes_arrow(path, 2).to_pylist()
    assert sorted((r["_change_type"], r["k"], r["v"]) for r in feed) == expected
    spark_feed = store.changes(path, 2).collect()
    assert sorted((r._change_type, r.k, r.v) for r in spark_feed) == expected
    assert {r._commit_version for r in spark_feed} == {2}


def test_a_merge_reports_its_own_commit_and_a_merge_that_changes_nothing_still_advances(
    spark: Any, tmp_path: Path
) -> None:
    """A merge's commit carries its position and no second, empty commit follows it; a merge
    that changes no row (delta-rs then commits nothing) gets one empty commit for the position."""
    from deltalake import DeltaTable

    store = DeltaStore(spark)
    path = tmp_path / "t"
    store.create(path, spark.createDataFrame([], "k string, v string").schema)
    batch = spark.createDataFrame(
        [("a", "1", False), ("b", "2", False)], "k string, v string, gone boolean"
    )
    first = store.merge(batch, path, txn=Txn("m", 1), **UPSERT)
    assert (first.committed, first.table_version) == (True, 1)
    same = store.merge(batch, path, txn=Txn("m", 2), update_when="t.v <> s.v", **UPSERT)
    assert (same.committed, same.table_version) == (True, 2)
    dt = DeltaTable(str(path))
    assert (dt.version(), dt.transaction_version("m")) == (2, 2)
    operations = [c["operation"] for c in dt.history()]
    assert operations[:2] == ["WRITE", "MERGE"]  # newest first: the empty commit, the merge
    assert sorted(tuple(r.values()) for r in read_arrow(path).to_pylist()) == [
        ("a", "1"),
        ("b", "2"),
    ]


def test_merge_skips_tombstones_of_keys_the_table_does_not_have(spark: Any, tmp_path: Path) -> None:
    # delta-rs alone, when no source row matches but some are inserted, writes an all-null row
    # for an unmatched tombstone (and fails on the key's NOT NULL check).
    from pyspark.sql import types as T

    store = DeltaStore(spark)
    path = tmp_path / "t"
    schema = T.StructType(
        [T.StructField("k", T.StringType(), False), T.StructField("v", T.StringType(), True)]
    )
    store.create(path, schema)
    rows = "k string, v string, gone boolean"
    assert store.merge(
        spark.createDataFrame([("a", "1", False), ("c", None, True)], rows), path, **UPSERT
    ).committed
    assert store.merge(
        spark.createDataFrame([("d", "4", False), ("e", None, True)], rows), path, **UPSERT
    ).committed
    assert store.merge(
        spark.createDataFrame([("a", None, True), ("f", None, True)], rows), path, **UPSERT
    ).committed
    assert sorted(tuple(r.values()) for r in read_arrow(path).to_pylist()) == [("d", "4")]
    feed = changes_arrow(path, 1).to_pylist()
    assert sorted((r["_change_type"], r["k"]) for r in feed) == [
        ("delete", "a"),
        ("insert", "a"),
        ("insert", "d"),
    ]


def test_change_feed_after_random_rounds(spark: Any, tmp_path: Path) -> None:
    """Random inserts/updates/deletes: inserts - deletes == rows; every update has both images;
    Spark's change feed equals delta-rs' own."""
    rng = random.Random(7)
    store = DeltaStore(spark)
    path = tmp_path / "t"
    store.create(path, spark.createDataFrame([], "k long, v long").schema)
    for _ in range(8):
        keys = rng.sample(range(40), 12)
        batch = [(k, rng.randrange(1000), rng.random() < 0.3) for k in keys]
        store.merge(spark.createDataFrame(batch, "k long, v long, gone boolean"), path, **UPSERT)
    feed = store.changes(path, 0).collect()
    kinds = [r._change_type for r in feed]
    assert kinds.count("insert") - kinds.count("delete") == len(read_arrow(path))
    for version in {r._commit_version for r in feed}:
        pre = sorted(
            r.k
            for r in feed
            if r._commit_version == version and r._change_type == "update_preimage"
        )
        post = sorted(
            r.k
            for r in feed
            if r._commit_version == version and r._change_type == "update_postimage"
        )
        assert pre == post
    native = changes_arrow(path, 0).to_pylist()
    assert sorted(
        (r["_change_type"], r["k"], r["v"], r["_commit_version"]) for r in native
    ) == sorted((r._change_type, r.k, r.v, r._commit_version) for r in feed)


def test_maintenance_during_appends_keeps_exact_rows(spark: Any, tmp_path: Path) -> None:
    store = DeltaStore(spark)
    path = tmp_path / "t"
    store.write(_ints(spark, 0, 10), path)
    stop = threading.Event()
    failures: list[BaseException] = []

    def keep_maintaining() -> None:
        while not stop.is_set():
            try:
                maintain(path, retention_hours=1)
            except ConcurrentWriteError:
                pass  # compaction lost a race with an append: retried on the next round
            except BaseException as exc:
                failures.append(exc)
                return

    worker = threading.Thread(target=keep_maintaining)
    worker.start()
    try:
        for i in range(1, 9):
            store.write(_ints(spark, i * 10, 10), path)
    finally:
        stop.set()
        worker.join()
    assert failures == []
    report = maintain(path, retention_hours=1)
    assert report.checkpoint == store.version(path)
    rows = sorted(r.n for r in store.read(path).collect())
    assert rows == list(range(90))


def test_vacuum_keeps_what_consumers_still_need(spark: Any, tmp_path: Path) -> None:
    store = DeltaStore(spark)
    source = tmp_path / "source"
    sink = tmp_path / "sink"
    store.write(_ints(spark, 0, 5), source)  # v1
    store.write(_ints(spark, 5, 5), source, mode="overwrite")  # v2: removes v1's file
    consumer_position = store.version(source)
    store.write(spark.createDataFrame([(1,)], "x long"), sink, txn=Txn("source", consumer_position))
    store.write(_ints(spark, 10, 5), source, mode="overwrite")  # v3: removes v2's file
    consumer = Consumer("sink", sink, "source")
    first_files = added_files(source, 1)
    report = maintain(
        source, [consumer], retention_hours=0, allow_unsafe_retention=True, compact=False
    )
    assert report.kept_from_version == consumer_position
    # Only version 1's files go: no consumer needs them any more.
    assert {Path(p).name for p in report.vacuumed} == first_files
    assert all(not (source / name).exists() for name in first_files)
    # The consumer can still read what it has not consumed: v3 deletes v2's rows.
    feed = store.changes(source, consumer_position + 1).collect()
    assert sorted((r._change_type, r.n) for r in feed) == sorted(
        [("delete", n) for n in range(5, 10)] + [("insert", n) for n in range(10, 15)]
    )
    with pytest.raises(Exception, match="below 1 h"):
        maintain(source, retention_hours=0)


def test_missing_table_is_a_typed_error(spark: Any, tmp_path: Path) -> None:
    with pytest.raises(TableNotFoundError, match="no Delta table at"):
        DeltaStore(spark).read(tmp_path / "nothing")


def test_task_rows_take_contiguous_slices_of_the_items_one_task_per_core(spark: Any) -> None:
    """Bronze parses its work items (one per topic partition) in one Python task per core, each
    taking neighbouring items in order; their rows and side facts both come back."""
    from pyspark import TaskContext

    from lakehouse.storage.tasks import rows_from_tasks

    schema = pa.schema([("n", pa.int64())])

    def task(item: dict[str, Any], emit: Any) -> Any:
        context = TaskContext.get()
        assert context is not None
        emit({"item": item["i"], "task": context.partitionId()})
        yield pa.table({"n": [item["i"]]}, schema=schema)

    def by_task(**kwargs: Any) -> list[list[int]]:
        items = [{"i": i} for i in range(5)]
        with rows_from_tasks(spark, items, task, schema, **kwargs) as (rows, side):
            assert sorted(r["n"] for r in rows.collect()) == [0, 1, 2, 3, 4]
        tasks: dict[int, list[int]] = {}
        for fact in side:
            tasks.setdefault(fact["task"], []).append(fact["item"])
        return [tasks[t] for t in sorted(tasks)]

    cores = spark.sparkContext.defaultParallelism
    assert cores == 2
    assert by_task() == [[0, 1], [2, 3, 4]]
    assert by_task(parallelism=5) == [[0], [1], [2], [3], [4]]


def test_a_small_append_of_known_size_is_written_by_the_driver_with_the_same_guarantees(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``rows`` at most LOCAL_WRITE_ROWS: the driver writes the files and commits them. Every
    type comes back, the app transaction is honoured, new columns need add_columns, partitions
    go to their folders, and the change feed sees the inserts."""
    from pyspark.sql import functions as F

    from lakehouse.storage.store import LOCAL_WRITE_ROWS

    store = DeltaStore(spark)
    local_writes: list[Path] = []
    write_local = store._write_local

    def spy(df: Any, path: Path, *args: Any) -> Any:
        local_writes.append(path)
        return write_local(df, path, *args)

    monkeypatch.setattr(store, "_write_local", spy)
    df = spark.createDataFrame(ROWS, ALL_TYPES)
    local, spread = tmp_path / "local", tmp_path / "spread"
    assert store.write(df, local, txn=Txn("app", 1), rows=len(ROWS)).committed
    store.write(df, spread, txn=Txn("app", 1))
    store.write(df, spread, rows=LOCAL_WRITE_ROWS + 1)  # too many: Spark's tasks write it
    assert local_writes == [local]
    assert _sorted(store.read(local).collect()) == _sorted(df.collect())
    assert not store.write(df, local, txn=Txn("app", 1), rows=len(ROWS)).committed
    with pytest.raises(SchemaMismatchError):
        store.write(_ints(spark, 0, 3, s="x"), local, rows=3)

    table = tmp_path / "parts"
    store.write(_ints(spark, 0, 4, day="d1"), table, partition_by=["day"], rows=4)
    wider = _ints(spark, 4, 2, day="d2").withColumn("extra", F.lit(1))
    store.write(wider, table, schema_mode="add_columns", rows=2)
    assert local_writes == [local, table, table]
    folders = sorted(p.name for p in table.iterdir() if p.is_dir())
    assert folders == ["_delta_log", "day=d1", "day=d2"]
    back = sorted((r["n"], r["day"], r["extra"]) for r in store.read(table).collect())
    assert back == [(n, "d1", None) for n in range(4)] + [(4, "d2", 1), (5, "d2", 1)]
    feed = store.changes(table, 0).select("n", "_change_type").collect()
    assert sorted((r["n"], r["_change_type"]) for r in feed) == [(n, "insert") for n in range(6)]
