"""The storage layer: delta-spark's writes read back by the platform's reader (every type,
partitions, time travel), schema evolution, exactly-once positions (app transactions, and
positions kept in commit metadata), merge, change feed and maintenance."""

from __future__ import annotations

import os
import random
import threading
import time
from datetime import UTC, date, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from delta_log import added_files, checkpoints, operations
from pyspark.errors import AnalysisException

from lakehouse.errors import ConfigError, TableNotFoundError
from lakehouse.runtime import objectstore
from lakehouse.runtime.config import Settings
from lakehouse.runtime.objectstore import Location, ObjectPath
from lakehouse.storage import DeltaStore, Txn, changes_arrow, delta_spark, maintenance, read_arrow
from lakehouse.storage.log import load
from lakehouse.storage.maintenance import Consumer, maintain
from lakes import STORAGES, S3Store

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


@pytest.fixture(params=STORAGES)
def where(request: pytest.FixtureRequest, tmp_path: Path) -> Location:
    """A folder for a test's tables: local, or a prefix of its own in the test bucket."""
    if request.param == "local":
        return tmp_path
    request.getfixturevalue("spark")  # started with the store's settings
    store: S3Store = request.getfixturevalue("s3_server")
    return ObjectPath.parse(f"s3://{store.bucket}/storage/{tmp_path.name}")


def _write(df: Any, path: Location, **kwargs: Any) -> Any:
    return delta_spark.append(df, path, create=df.schema, **kwargs)


def test_round_trip_every_type(spark: Any, tmp_path: Path) -> None:
    store = DeltaStore(spark)
    df = spark.createDataFrame(ROWS, ALL_TYPES)
    _write(df, tmp_path / "t")
    back = store.read(tmp_path / "t")
    assert back.schema == df.schema
    assert _sorted(back.collect()) == _sorted(df.collect())
    # delta-rs alone reads the same rows: the table is plain Delta.
    assert read_arrow(tmp_path / "t").num_rows == 3


def test_partition_values_of_each_type_come_back_from_snapshot_and_change_feed(
    spark: Any, tmp_path: Path
) -> None:
    """A table partitioned by another Delta writer: the reader maps each data file to its
    partition values and casts them back, in the snapshot and in the change feed."""
    store = DeltaStore(spark)
    schema = "n long, i int, b boolean, day date, cat string, dec decimal(10,2)"
    rows = [
        (1, 7, True, date(2026, 1, 1), "a b/c%", Decimal("1.50")),
        (2, -3, False, date(2026, 2, 28), "x", Decimal("0.01")),
        (3, None, None, None, None, None),
    ]
    df = spark.createDataFrame(rows, schema)
    table = tmp_path / "t"
    df.write.format("delta").option("delta.enableChangeDataFeed", "true").partitionBy(
        "i", "b", "day", "cat", "dec"
    ).save(str(table))
    expected = _sorted(df.collect())
    assert _sorted(store.read(table).select(*df.columns).collect()) == expected
    feed = store.changes(table, 0).drop("_change_type", "_commit_version", "_commit_timestamp")
    assert _sorted(feed.select(*df.columns).collect()) == expected


def test_a_created_table_has_the_platforms_properties_and_stats(spark: Any, tmp_path: Path) -> None:
    from deltalake import DeltaTable

    _write(_ints(spark, 0, 100, s="x"), tmp_path / "t")
    dt = DeltaTable(str(tmp_path / "t"))
    configuration = dt.metadata().configuration
    assert configuration["delta.enableChangeDataFeed"] == "true"
    assert configuration["delta.enableExpiredLogCleanup"] == "false"
    adds = pa.table(dt.get_add_actions(flatten=True)).to_pylist()
    assert sum(a["num_records"] for a in adds) == 100
    assert min(a["min.n"] for a in adds) == 0 and max(a["max.n"] for a in adds) == 99


def test_an_overwrite_replaces_the_rows_and_its_change_feed_says_so(
    spark: Any, tmp_path: Path
) -> None:
    store = DeltaStore(spark)
    path = tmp_path / "t"
    _write(_ints(spark, 0, 3), path)
    delta_spark.append(_ints(spark, 100, 2), path, mode="overwrite")
    assert sorted(r.n for r in store.read(path).collect()) == [100, 101]
    feed = store.changes(path, 2).collect()
    assert sorted((r._change_type, r.n) for r in feed) == [
        ("delete", 0),
        ("delete", 1),
        ("delete", 2),
        ("insert", 100),
        ("insert", 101),
    ]


def test_schema_evolution_is_additive_and_on_request(spark: Any, tmp_path: Path) -> None:
    store = DeltaStore(spark)
    path = tmp_path / "t"
    _write(spark.createDataFrame([("a", 1)], "k string, v long"), path)
    wider = spark.createDataFrame([("b", 2, "new")], "k string, v long, extra string")
    with pytest.raises(AnalysisException, match="schema mismatch"):
        delta_spark.append(wider, path)
    delta_spark.append(wider, path, schema_mode="add_columns")
    assert _sorted(store.read(path).collect()) == [("a", 1, None), ("b", 2, "new")]
    with pytest.raises(AnalysisException, match="DELTA_FAILED_TO_MERGE_FIELDS"):
        delta_spark.append(spark.createDataFrame([("c", "x")], "k string, v string"), path)
    delta_spark.append(spark.createDataFrame([("d",)], "k string"), path)  # missing: null
    assert sorted(r.k for r in store.read(path).collect()) == ["a", "b", "d"]


def test_time_travel_by_version_and_timestamp(spark: Any, tmp_path: Path) -> None:
    import time

    store = DeltaStore(spark)
    path = tmp_path / "t"
    _write(_ints(spark, 0, 3), path)
    v1 = store.version(path)
    time.sleep(0.05)
    middle = datetime.now(UTC)
    time.sleep(0.05)
    delta_spark.append(_ints(spark, 3, 3), path)
    assert store.read(path, version=v1).count() == 3
    assert store.read(path, as_of=middle).count() == 3
    assert store.read(path).count() == 6


def test_same_txn_version_applies_once(spark: Any, tmp_path: Path) -> None:
    store = DeltaStore(spark)
    path = tmp_path / "t"
    df = spark.createDataFrame([("a", 1)], "k string, n long")
    assert _write(df, path, txn=Txn("app", 1), metadata={"lakehouse.pos": {"p0": 7}}).committed
    assert not delta_spark.append(df, path, txn=Txn("app", 1)).committed
    assert not delta_spark.append(df, path, txn=Txn("app", 0)).committed
    assert delta_spark.append(df, path, txn=Txn("app", 2)).committed
    assert store.transaction_version(path, "app") == 2
    assert store.transaction_version(path, "other") is None
    assert store.latest_metadata(path, "lakehouse.pos") == {"p0": 7}
    assert read_arrow(path).num_rows == 2


def test_positions_move_to_commit_metadata_for_two_inputs_and_can_move_back(
    spark: Any, tmp_path: Path
) -> None:
    """A table keeps one reader's position as Delta's app transaction; a commit recording two
    (a join) or moving one back (a rebuild) puts every position in its metadata, with a fence
    app transaction counting such commits. Each commit still applies at most once."""
    from deltalake import DeltaTable

    from lakehouse.storage.log import FENCE_APP, POSITIONS_KEY, commit_metadata

    store = DeltaStore(spark)
    path = tmp_path / "t"
    df = spark.createDataFrame([("a", 1)], "k string, n long")
    assert _write(df, path, txn=Txn("left", 4)).committed
    assert DeltaTable(str(path)).transaction_version(FENCE_APP) is None

    both = [Txn("left", 6), Txn("right", 2)]
    assert delta_spark.append(df, path, txn=both).committed
    assert not delta_spark.append(df, path, txn=both).committed  # a retry
    assert not delta_spark.append(df, path, txn=[Txn("left", 5), Txn("right", 2)]).committed
    assert (store.transaction_version(path, "left"), store.transaction_version(path, "right")) == (
        6,
        2,
    )
    # One input moving on alone keeps the other's position.
    assert delta_spark.append(df, path, txn=Txn("right", 3)).committed
    assert store.transaction_version(path, "left") == 6
    # A rewind always commits, even to where the table already stands.
    back = [Txn("left", 1, rewind=True), Txn("right", 3, rewind=True)]
    assert delta_spark.append(df, path, txn=back, mode="overwrite").committed
    assert (store.transaction_version(path, "left"), store.transaction_version(path, "right")) == (
        1,
        3,
    )
    # ... and the batches after it, below the old position, apply again, once.
    assert delta_spark.append(df, path, txn=Txn("left", 2)).committed
    assert not delta_spark.append(df, path, txn=Txn("left", 2)).committed
    assert store.transaction_version(path, "left") == 2
    assert read_arrow(path).num_rows == 2

    dt = DeltaTable(str(path))
    assert dt.transaction_version(FENCE_APP) == 3  # four commits with positions: 0..3
    assert commit_metadata(dt.history(1)[0], POSITIONS_KEY) == {"left": 2, "right": 3}
    assert dt.transaction_version("left") == 4  # the app transaction, left where it was


def test_two_appends_planned_on_one_snapshot_commit_once(spark: Any, tmp_path: Path) -> None:
    """Two writers of a table that keeps positions in metadata plan the same commit (no lock:
    as on S3 with two drivers): Delta's fence lets the first in and skips the second."""
    from lakehouse.storage.delta_spark import _plan

    path = tmp_path / "t"
    df = spark.createDataFrame([("a", 1)], "k string, n long")
    _write(df, path, txn=[Txn("left", 0), Txn("right", 0)])
    txn = [Txn("left", 1), Txn("right", 0)]
    first = _plan(path, load(path, own=True), txn, {})
    second = _plan(path, load(path, own=True), txn, {})
    assert first is not None and second is not None and first.app == second.app
    assert delta_spark.append(df, path, txn=txn).committed
    # The second writer's commit carries the same fence version: Delta skips it.
    writer = df.write.format("delta").mode("append")
    writer.option("txnAppId", second.app[0]).option("txnVersion", second.app[1]).save(str(path))
    assert read_arrow(path).num_rows == 2


def test_concurrent_appends_in_threads_lose_nothing(spark: Any, tmp_path: Path) -> None:
    store = DeltaStore(spark)
    path = tmp_path / "t"
    _write(_ints(spark, 0, 1), path)
    errors: list[BaseException] = []

    def append(i: int) -> None:
        try:
            delta_spark.append(_ints(spark, 1000 * (i + 1), 100), path)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=append, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert store.read(path).count() == 401


def _kv_table(spark: Any, path: Path) -> None:
    from pyspark.sql import types as T

    schema = T.StructType(
        [T.StructField("k", T.StringType(), False), T.StructField("v", T.StringType(), True)]
    )
    delta_spark.create_table(spark, path, schema)


def test_merge_upserts_and_deletes_with_change_images(spark: Any, tmp_path: Path) -> None:
    store = DeltaStore(spark)
    path = tmp_path / "t"
    _kv_table(spark, path)
    schema = "k string, v string, gone boolean"
    delta_spark.merge(
        spark.createDataFrame([("a", "1", False), ("b", "2", False)], schema),
        path,
        txn=Txn("m", 1),
        **UPSERT,
    )
    second = spark.createDataFrame(
        [("a", "9", False), ("b", None, True), ("c", None, True)], schema
    )
    delta_spark.merge(second, path, txn=Txn("m", 2), **UPSERT)
    assert not delta_spark.merge(second, path, txn=Txn("m", 2), **UPSERT).committed
    assert sorted(tuple(r.values()) for r in read_arrow(path).to_pylist()) == [("a", "9")]
    expected = [("delete", "b", "2"), ("update_postimage", "a", "9"), ("update_preimage", "a", "1")]
    feed = changes_arrow(path, 2).to_pylist()
    assert sorted((r["_change_type"], r["k"], r["v"]) for r in feed) == expected
    spark_feed = store.changes(path, 2).collect()
    assert sorted((r._change_type, r.k, r.v) for r in spark_feed) == expected
    assert {r._commit_version for r in spark_feed} == {2}


def test_a_merge_that_changes_nothing_still_commits_its_position(
    spark: Any, tmp_path: Path
) -> None:
    from deltalake import DeltaTable

    path = tmp_path / "t"
    _kv_table(spark, path)
    batch = spark.createDataFrame(
        [("a", "1", False), ("b", "2", False)], "k string, v string, gone boolean"
    )
    first = delta_spark.merge(batch, path, txn=Txn("m", 1), **UPSERT)
    assert (first.committed, first.table_version) == (True, 1)
    same = delta_spark.merge(batch, path, txn=Txn("m", 2), update_when="t.v <> s.v", **UPSERT)
    assert (same.committed, same.table_version, same.source_rows) == (True, 2, 0)
    dt = DeltaTable(str(path))
    assert (dt.version(), dt.transaction_version("m")) == (2, 2)
    assert [c["operation"] for c in dt.history()][:2] == ["MERGE", "MERGE"]
    assert sorted(tuple(r.values()) for r in read_arrow(path).to_pylist()) == [
        ("a", "1"),
        ("b", "2"),
    ]


def test_merge_skips_tombstones_of_keys_the_table_does_not_have(spark: Any, tmp_path: Path) -> None:
    path = tmp_path / "t"
    _kv_table(spark, path)
    rows = "k string, v string, gone boolean"
    for batch in (
        [("a", "1", False), ("c", None, True)],
        [("d", "4", False), ("e", None, True)],
        [("a", None, True), ("f", None, True)],
    ):
        assert delta_spark.merge(spark.createDataFrame(batch, rows), path, **UPSERT).committed
    assert sorted(tuple(r.values()) for r in read_arrow(path).to_pylist()) == [("d", "4")]
    feed = changes_arrow(path, 1).to_pylist()
    assert sorted((r["_change_type"], r["k"]) for r in feed) == [
        ("delete", "a"),
        ("insert", "a"),
        ("insert", "d"),
    ]


def test_change_feed_after_random_rounds(spark: Any, tmp_path: Path) -> None:
    """Random inserts/updates/deletes: inserts - deletes == rows; every update has both images;
    the platform's change feed reader equals delta-rs' own."""
    from pyspark.sql import types as T

    rng = random.Random(7)
    store = DeltaStore(spark)
    path = tmp_path / "t"
    schema = T.StructType(
        [T.StructField("k", T.LongType(), False), T.StructField("v", T.LongType(), True)]
    )
    delta_spark.create_table(spark, path, schema)
    for _ in range(8):
        keys = rng.sample(range(40), 12)
        batch = [(k, rng.randrange(1000), rng.random() < 0.3) for k in keys]
        delta_spark.merge(
            spark.createDataFrame(batch, "k long, v long, gone boolean"), path, **UPSERT
        )
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


@pytest.mark.reliability  # maintenance racing writes: a fault round (CI runs it)
def test_maintenance_during_appends_keeps_exact_rows(spark: Any, where: Location) -> None:
    store = DeltaStore(spark)
    path = where / "t"
    _write(_ints(spark, 0, 10), path)
    stop = threading.Event()
    failures: list[BaseException] = []

    def keep_maintaining() -> None:
        while not stop.is_set():
            try:
                maintain(spark, Settings.from_env(), path, retention_hours=1)
            except BaseException as exc:
                failures.append(exc)
                return

    worker = threading.Thread(target=keep_maintaining)
    worker.start()
    try:
        for i in range(1, 9):
            # Appends hold the commit lock, as every writer does: a commit of maintenance's
            # (one changing table properties) fails a write committed beside it.
            with delta_spark.table_lock(Settings.from_env(), path):
                delta_spark.append(_ints(spark, i * 10, 10), path)
    finally:
        stop.set()
        worker.join()
    assert failures == []
    properties = dict(load(path).metadata().configuration)
    report = maintain(spark, Settings.from_env(), path, retention_hours=1)
    # The checkpoint is of maintenance's commit setting Delta's checkpoint interval to 1; the
    # commits after it only put the table's own properties back.
    assert report.checkpoint in checkpoints(path)
    assert operations(path, report.checkpoint)[report.checkpoint] == "SET TBLPROPERTIES"
    later = operations(path, report.checkpoint + 1)
    assert set(later) == set(range(report.checkpoint + 1, store.version(path) + 1))
    assert set(later.values()) <= {"SET TBLPROPERTIES", "UNSET TBLPROPERTIES"}
    assert dict(load(path).metadata().configuration) == properties
    rows = sorted(r.n for r in store.read(path).collect())
    assert rows == list(range(90))


def test_maintenance_killed_mid_checkpoint_is_undone_by_the_next_run(
    spark: Any, tmp_path: Path
) -> None:
    """A maintain run killed after its checkpoint commit (interval 1, log cleanup on) and before
    it put the table's values back: the commit recorded them, and the next run restores them
    before it decides anything, so Delta's cleanup is not left on for ordinary commits."""
    path = tmp_path / "t"
    _write(_ints(spark, 0, 10), path)
    own = dict(load(path).metadata().configuration)
    assert own[maintenance.LOG_CLEANUP] == "false"
    assert maintenance.CHECKPOINT_INTERVAL not in own
    # What the first ALTER of a run that decided to clean commits, and nothing after it.
    saved = '{"delta.checkpointInterval": null, "delta.enableExpiredLogCleanup": "false"}'
    spark.sql(
        f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ('delta.checkpointInterval' = '1', "
        f"'delta.enableExpiredLogCleanup' = 'true', '{maintenance.RESTORE}' = '{saved}')"
    )
    report = maintain(spark, Settings.from_env(), path, retention_hours=1)
    assert report.checkpoint in checkpoints(path)
    assert dict(load(path).metadata().configuration) == own
    assert sorted(r.n for r in DeltaStore(spark).read(path).collect()) == list(range(10))


def test_vacuum_keeps_what_consumers_still_need(spark: Any, where: Location) -> None:
    store = DeltaStore(spark)
    source = where / "source"
    sink = where / "sink"
    _write(_ints(spark, 0, 5), source)  # v1
    delta_spark.append(_ints(spark, 5, 5), source, mode="overwrite")  # v2: removes v1's file
    consumer_position = store.version(source)
    assert consumer_position is not None
    _write(spark.createDataFrame([(1,)], "x long"), sink, txn=Txn("source", consumer_position))
    delta_spark.append(_ints(spark, 10, 5), source, mode="overwrite")  # v3: removes v2's file
    consumer = Consumer("sink", sink, "source")
    first_files, second_files = added_files(source, 1), added_files(source, 2)
    report = maintain(
        spark,
        Settings.from_env(),
        source,
        [consumer],
        retention_hours=0,
        allow_unsafe_retention=True,
        compact=False,
    )
    # VACUUM's retention reaches past the consumer's position commit (whole hours, plus one).
    assert report.kept_from_version == consumer_position and report.retain_hours == 2
    assert report.vacuumed == []
    assert all(objectstore.exists(source / name) for name in first_files | second_files)
    # The consumer can still read what it has not consumed: v3 deletes v2's rows.
    feed = store.changes(source, consumer_position + 1).collect()
    assert sorted((r._change_type, r.n) for r in feed) == sorted(
        [("delete", n) for n in range(5, 10)] + [("insert", n) for n in range(10, 15)]
    )
    # Once the consumer has read it all, the removed files go.
    _write(spark.createDataFrame([(2,)], "x long"), sink, txn=Txn("source", 3))
    report = maintain(
        spark,
        Settings.from_env(),
        source,
        [consumer],
        retention_hours=0,
        allow_unsafe_retention=True,
        compact=False,
    )
    assert report.retain_hours == 0
    assert {Path(p).name for p in report.vacuumed} == first_files | second_files
    assert not any(objectstore.exists(source / name) for name in first_files | second_files)
    assert sorted(r.n for r in store.read(source).collect()) == list(range(10, 15))
    with pytest.raises(ConfigError, match="retention of 0 h is below 1 h"):
        maintain(spark, Settings.from_env(), source, retention_hours=0)


def _age_log(path: Path, days: float) -> None:
    """Make every commit and checkpoint of the table look ``days`` old to Delta's log cleanup (it
    goes by the log files' modification times)."""
    then = time.time() - days * 86400
    for entry in (path / "_delta_log").iterdir():
        if entry.name[:20].isdigit():
            os.utime(entry, (then, then))


def test_log_cleanup_waits_while_a_needed_commit_has_expired(spark: Any, tmp_path: Path) -> None:
    """Log cleanup deletes commits older than the log retention (30 days) that an expired
    checkpoint covers. A table keeping its positions in commit metadata whose last such commit is
    that old (a compaction came after it) keeps its log until a new batch commits its positions
    again. A consumer that old raises the table's retentions past its position."""
    path = tmp_path / "t"
    for i in range(3):  # three small files for compaction
        _write(_ints(spark, i, 1), path, txn=[Txn("left", i), Txn("right", 0)])
    _age_log(path, 40)
    report = maintain(spark, Settings.from_env(), path, retention_hours=1)
    # Compaction's commit is 4; the checkpoint is of the commit after it (maintenance's own).
    assert report.files_compacted == 3 and report.checkpoint == 5
    assert report.log_cleanup == (
        "postponed: version 3 is still needed and older than the log retention"
    )
    # Now the checkpoint has expired too: cleanup could delete the commits before it, and
    # Delta does not, as its log cleanup is off in the commit it checkpoints.
    _age_log(path, 40)
    report = maintain(spark, Settings.from_env(), path, retention_hours=1, compact=False)
    assert report.checkpoint == 7 and report.log_cleanup.startswith("postponed: version 3 ")
    assert (path / "_delta_log" / f"{0:020d}.json").exists()
    assert DeltaStore(spark).transaction_version(path, "left") == 2
    _write(_ints(spark, 9, 1), path, txn=[Txn("left", 3), Txn("right", 0)])
    written = DeltaStore(spark).version(path)
    report = maintain(spark, Settings.from_env(), path, retention_hours=1, compact=False)
    assert report.log_cleanup == "done"
    # The commits before the expired checkpoint (5) are gone; the table reads the same.
    assert min(operations(path)) >= 5
    assert DeltaStore(spark).transaction_version(path, "left") == 3
    assert sorted(r.n for r in DeltaStore(spark).read(path).collect()) == [0, 1, 2, 9]

    # A consumer whose position commit is that old: its commits stay, and so do the files its
    # versions removed (VACUUM's window, and the tombstones' retention, reach past it).
    sink = tmp_path / "sink"
    behind = written - 1  # compaction will remove the file written after it
    _write(spark.createDataFrame([(1,)], "x long"), sink, txn=Txn("t", behind))
    _age_log(path, 40)
    report = maintain(
        spark, Settings.from_env(), path, [Consumer("sink", sink, "t")], retention_hours=1
    )
    assert report.retain_hours is not None and report.retain_hours >= 40 * 24
    properties = spark.sql(f"DESCRIBE DETAIL delta.`{path}`").collect()[0]["properties"]
    assert properties["delta.deletedFileRetentionDuration"] == (
        f"interval {report.retain_hours} hours"
    )
    # Delta wants the log kept as long as removed files: the consumer's commits are inside it.
    assert (
        properties["delta.logRetentionDuration"] == properties["delta.deletedFileRetentionDuration"]
    )
    assert report.log_cleanup == "done"
    assert (path / "_delta_log" / f"{behind + 1:020d}.json").exists()
    feed = DeltaStore(spark).changes(path, behind + 1).collect()
    assert sorted(r.n for r in feed if r._change_type == "insert") == [9]


def test_log_retention_is_read_in_deltas_interval_syntax(spark: Any, tmp_path: Path) -> None:
    path = tmp_path / "t"
    _write(_ints(spark, 0, 1), path)

    def seconds_kept() -> float:
        return maintenance._interval_seconds(
            path, "delta.logRetentionDuration", maintenance.DEFAULT_LOG_RETENTION
        )

    assert seconds_kept() == 30 * 86400  # Delta's default
    for value, seconds in (
        ("interval 2 days", 172800),
        ("1 week 3 hours", 615600),
        ("interval 90 seconds 500 milliseconds", 90.5),
    ):
        # Delta wants the log kept at least as long as removed files.
        spark.sql(
            f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES "
            f"('delta.deletedFileRetentionDuration' = 'interval 1 second', "
            f"'delta.logRetentionDuration' = '{value}')"
        )
        assert seconds_kept() == seconds


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


def test_rows_a_reader_has_still_to_read_are_the_change_feeds_rows(
    spark: Any, tmp_path: Path
) -> None:
    """rows_after counts, from the newer commits' operation metrics, the rows a change-feed
    reader at each version still has to read: the rows delta-spark's own change feed gives
    from the next version on, after appends, upserts, tombstones, SQL UPDATE and DELETE and a
    property change. Unknown when the reader read nothing or too many commits are newer."""
    from lakehouse.storage.log import rows_after

    path = tmp_path / "t"
    _kv_table(spark, path)
    schema = "k string, v string, gone boolean"
    rng = random.Random(72)
    for batch in range(1, 7):
        rows = [
            (f"k{rng.randrange(8)}", str(rng.randrange(100)), rng.random() < 0.25)
            for _ in range(rng.randrange(1, 9))
        ]
        rows = list({r[0]: r for r in rows}.values())  # a MERGE takes one source row per key
        delta_spark.merge(spark.createDataFrame(rows, schema), path, txn=Txn("m", batch), **UPSERT)
        if batch == 2:
            spark.sql(f"UPDATE delta.`{path}` SET v = concat(v, '!') WHERE k < 'k4'")
        if batch == 4:
            spark.sql(f"DELETE FROM delta.`{path}` WHERE k > 'k5'")
            spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ('lakehouse.note' = 'x')")
    latest = load(path, own=True).version()
    for consumed in range(latest + 1):
        feed = (
            spark.read.format("delta")
            .option("readChangeFeed", "true")
            .option("startingVersion", consumed + 1)
            .load(str(path))
            .count()
            if consumed < latest
            else 0
        )
        assert rows_after(path, consumed) == feed, consumed
    assert rows_after(path, None) is None
    assert rows_after(path, 0, at_most=latest - 1) is None
    assert rows_after(path, 1, at_most=latest - 1) == rows_after(path, 1)
