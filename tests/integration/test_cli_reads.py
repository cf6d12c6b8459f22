"""``lakehouse show`` and ``lakehouse changes`` read with delta-rs (no JVM for a one-off command):
they must print exactly what Spark reads. The pipeline writes a small topic's tables with
delta-spark (strings, longs, doubles, booleans, timestamps given with time zones, nulls, arrays,
updates and deletes over several commits); the CLI's printed text is compared, character for
character and in both formats, with Spark's rows of the same table (``spark.read`` with
``versionAsOf`` / ``timestampAsOf``, ``readChangeFeed``) put through the CLI's own formatter,
``cli.render``. Spark's side chooses its columns and orders its rows itself, as the CLI
promises: by the table's key (partition and offset for a stream), and the changelog by commit,
then key, a pre-image before its post-image. On local files and on the test S3 API (``s3``),
where Delta dates commits by the objects' times, to the second."""

from __future__ import annotations

import io
import json
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark.errors import AnalysisException

from lakehouse import cli
from lakehouse.contracts.catalog import Catalog
from lakehouse.pipeline import reads
from lakehouse.runtime.config import Settings
from lakehouse.runtime.objectstore import Location
from lakehouse.storage.store import table_version
from lakes import STORAGES, S3Store, lake_with, produce, record, run_pipeline

pytestmark = pytest.mark.integration

CONTRACT = """\
topic: rides
partitions: 2
event_time: at
key: {format: string, name: rider}
value:
  format: json
  fields:
    - {name: city, type: string}
    - {name: km, type: long}
    - {name: fare, type: double}
    - {name: paid, type: boolean}
    - {name: at, type: timestamp}
stream: {name: rides_stream}
tables:
  - name: last_ride
    kind: latest
  - name: rider_totals
    kind: aggregate
    aggregations:
      - {name: rides, fn: count}
      - {name: km_total, fn: sum, field: km}
      - {name: mean_fare, fn: avg, field: fare}
      - {name: top_fare, fn: max, field: fare}
      - {name: first_at, fn: earliest, field: at}
      - {name: last_paid, fn: latest, field: paid}
      - {name: cities, fn: collect, field: city}
  - name: city_5m
    kind: aggregate
    group_by: city
    window: {type: tumbling, size: 5m, grace: 1m}
    aggregations:
      - {name: rides, fn: count}
      - {name: fares, fn: collect, field: fare}
"""


def _ride(
    city: str | None, km: int | None, fare: float | None, paid: bool | None, at: str | None
) -> dict[str, Any]:
    return {"city": city, "km": km, "fare": fare, "paid": paid, "at": at}


# (key, value or None for a tombstone, partition), one list per micro-batch.
BATCHES: list[list[tuple[str, dict[str, Any] | None, int]]] = [
    [
        ("ann", _ride("Oslo", 3, 12.5, True, "2026-01-01T10:00:00Z"), 0),
        ("bob", _ride("Rome", None, 7.25, False, "2026-01-01T11:01:30.123456+01:00"), 1),
        ("cy", _ride(None, 10, 0.1, None, None), 0),
        ("dee", _ride("Lima", 9007199254740993, 1e-7, True, "2026-01-01T10:02:00.5Z"), 1),
        ("zoë", _ride("Zürich", 1, 2.0, True, "2026-01-01T05:01:00-05:00"), 1),
        ("gus", _ride("Oslo", 2, 4.0, True, "2026-01-01T09:00:00Z"), 0),  # late for city_5m
    ],
    [
        ("ann", _ride("Rome", 5, 1 / 3, True, "2026-01-01T10:03:00Z"), 0),  # an update
        ("bob", None, 1),  # a delete
        ("eve", _ride("Oslo", -4, -0.0, False, "2026-01-01T10:04:59.999Z"), 0),
        ("fay", _ride("Rome", 6, 9.5, False, "2026-01-01T09:30:00Z"), 1),  # late for city_5m
    ],
    [
        ("ann", _ride("Lima", 7, 2.5e20, False, "2026-01-01T10:09:00Z"), 0),
        ("dee", None, 1),
        ("cy", _ride("Oslo", None, None, True, "2026-01-01T10:09:30Z"), 0),
        ("eve", _ride("Oslo", 1, 3.0, None, "2026-01-01T09:00:00Z"), 0),  # late for city_5m
    ],
]

# Every table the CLI can show for the topic, with the order it promises for its rows.
TABLES = {
    "last_ride": ["rider"],
    "rider_totals": ["rider"],
    "city_5m": ["city", "window_start", "window_end"],
    "late.city_5m": ["partition", "offset"],
    "silver.rides_stream": ["partition", "offset"],
    "bronze.rides": ["partition", "offset"],
}
FORMATS = ("table", "json")


def _build(spark: Any, root: Path, data: str | None = None) -> Settings:
    """The topic's tables after three micro-batches of the real pipeline."""
    lake = lake_with(root, CONTRACT, data=data)
    for batch in BATCHES:
        produce(lake, "rides", [record(k, v, partition=p) for k, v, p in batch])
        run_pipeline(spark, lake)
    return lake


@pytest.fixture(scope="module")
def local_lake(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> Settings:
    """The tables on local files."""
    return _build(spark, tmp_path_factory.mktemp("cli_reads"))


@pytest.fixture(scope="module", params=STORAGES)
def lake(request: pytest.FixtureRequest, spark: Any, tmp_path_factory: Any) -> Settings:
    """The tables on local files, and in the test bucket (the session's Spark started with the
    store's settings)."""
    if request.param == "local":
        lake: Settings = request.getfixturevalue("local_lake")
        return lake
    store: S3Store = request.getfixturevalue("s3_server")
    assert os.environ.get("LAKEHOUSE_S3_ENDPOINT") == store.endpoint
    return _build(spark, tmp_path_factory.mktemp("cli_reads_s3"), f"s3://{store.bucket}/cli_reads")


def _path(lake: Settings, name: str) -> Location:
    if name.startswith("late."):
        return lake.late_path(name.removeprefix("late."))
    if name.startswith("silver."):
        return lake.silver_path(name.removeprefix("silver."))
    if name.startswith("bronze."):
        return lake.bronze_path(name.removeprefix("bronze."))
    return lake.gold_path(name)


def _cli(lake: Settings, *argv: str) -> int:
    """``lakehouse ARGV`` on this lake, run in this process as the ``lakehouse`` script runs it
    (with the lake's data root as its ``LAKEHOUSE_DATA``)."""
    with pytest.MonkeyPatch.context() as env:
        env.setenv("LAKEHOUSE_DATA", str(lake.data_root))
        return cli.main(["--home", str(lake.home), "--contracts", str(lake.contracts_dir), *argv])


def _rendered(table: pa.Table, fmt: str) -> str:
    out = io.StringIO()
    reads.render(table, fmt, out)
    return out.getvalue()


def _same(
    lake: Settings, capsys: pytest.CaptureFixture[str], expected: pa.Table, *argv: str
) -> None:
    """``lakehouse ARGV --format F`` prints Spark's rows ``expected`` exactly, for each format."""
    for fmt in FORMATS:
        want = _rendered(expected, fmt)
        assert _cli(lake, *argv, "--format", fmt) == 0, capsys.readouterr().err
        got = capsys.readouterr().out
        assert got == want, (
            f"lakehouse {' '.join(argv)} --format {fmt} printed\n{got}\nSpark reads\n{want}"
        )


def _spark_snapshot(spark: Any, path: Location, order: list[str], **options: Any) -> pa.Table:
    """The table as Spark reads it (``versionAsOf`` / ``timestampAsOf`` if given), without the
    hidden aggregation state, ordered by ``order``."""
    reader = spark.read.format("delta")
    for key, value in options.items():
        reader = reader.option(key, value)
    df = reader.load(str(path))
    df = df.select(*(f"`{c}`" for c in df.columns if not c.startswith("__")))
    return df.orderBy(*order).toArrow()


def _spark_changes(spark: Any, path: Location, order: list[str], start: int, end: int) -> pa.Table:
    """Spark's change feed of versions ``start..end``, by commit, then key, with a row's
    pre-image before its post-image."""
    from pyspark.sql import functions as F

    kind = F.col("_change_type")
    rank = (
        F.when(kind == "delete", 0)
        .when(kind == "update_preimage", 1)
        .when(kind == "update_postimage", 2)
        .when(kind == "insert", 3)
    )
    df = (
        spark.read.format("delta")
        .option("readChangeFeed", "true")
        .option("startingVersion", start)
        .option("endingVersion", end)
        .load(str(path))
    )
    return df.orderBy("_commit_version", *order, rank).toArrow()


def _iso(instant: datetime) -> str:
    return instant.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def test_the_tables_hold_what_the_comparison_must_cover(spark: Any, lake: Settings) -> None:
    """Not vacuous: the compared tables have every kind of value and of change."""
    kinds: set[str] = set()
    for name in TABLES:
        schema = spark.read.format("delta").load(str(_path(lake, name))).schema
        kinds |= {f.dataType.simpleString() for f in schema.fields}
    assert {"string", "bigint", "double", "boolean", "timestamp", "binary"} <= kinds
    assert {"array<string>", "array<double>"} <= kinds
    path = _path(lake, "last_ride")
    feed = _spark_changes(spark, path, ["rider"], 0, table_version(path) or 0)
    changes = set(feed.column("_change_type").to_pylist())
    assert changes == {"insert", "update_preimage", "update_postimage", "delete"}
    assert all(feed.column(c).null_count for c in ("city", "km", "fare", "paid", "at"))
    # A late record in each batch: the late table has a version for each.
    assert _spark_snapshot(spark, _path(lake, "late.city_5m"), ["offset"]).num_rows == 3


@pytest.mark.parametrize("name", list(TABLES))
def test_show_prints_what_spark_reads_at_every_version(
    spark: Any, lake: Settings, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    path, order = _path(lake, name), TABLES[name]
    latest = table_version(path)
    assert latest is not None and latest >= 3
    for version in range(latest + 1):
        expected = _spark_snapshot(spark, path, order, versionAsOf=version)
        _same(lake, capsys, expected, "show", name, "--version", str(version))
    _same(lake, capsys, expected, "show", name)  # the latest


@pytest.mark.parametrize("name", list(TABLES))
def test_changes_prints_what_spark_reads(
    spark: Any, lake: Settings, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    path, order = _path(lake, name), TABLES[name]
    latest = table_version(path)
    assert latest is not None
    for start in (0, latest - 1):
        expected = _spark_changes(spark, path, order, start, latest)
        assert expected.num_rows > 0
        _same(lake, capsys, expected, "changes", name, "--from-version", str(start))


def test_show_as_of_a_time_prints_what_spark_reads(
    spark: Any, lake: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    """At each commit's time as Spark dates it (its history), and a millisecond before: the
    version before, or, before the first commit, no table for either."""
    name, order = "last_ride", TABLES["last_ride"]
    path = _path(lake, name)
    history = spark.sql(f"DESCRIBE HISTORY delta.`{path}`")
    for version, ms in sorted(history.selectExpr("version", "unix_millis(timestamp)").collect()):
        when = datetime.fromtimestamp(ms / 1000, UTC)
        for instant in (when, when - timedelta(milliseconds=1)):
            if version == 0 and instant < when:
                with pytest.raises(AnalysisException, match="DELTA_TIMESTAMP_EARLIER_THAN_COMMIT"):
                    _spark_snapshot(spark, path, order, timestampAsOf=_iso(instant))
                assert _cli(lake, "show", name, "--as-of", _iso(instant)) == 1
                assert "did not exist yet" in capsys.readouterr().err
                continue
            expected = _spark_snapshot(spark, path, order, timestampAsOf=_iso(instant))
            _same(lake, capsys, expected, "show", name, "--as-of", _iso(instant))


def test_commits_dated_out_of_order_are_read_as_spark_reads_them(
    spark: Any, local_lake: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    """A commit file whose time is not after the one before (a copied or restored log, a
    clock set back) is dated 1 ms after it, by the CLI as by Spark: in the changelog and in
    time travel. The files' times are put back afterwards. (Local files only: S3 sets an
    object's time itself, to the second; commits in the same second are the bucket's case of
    this, which the tests above cover there.)"""
    lake = local_lake
    name, order = "rider_totals", TABLES["rider_totals"]
    path = _path(lake, name)
    assert isinstance(path, Path)
    log = path / "_delta_log"
    files = {v: log / f"{v:020d}.json" for v in range(1, (table_version(path) or 0) + 1)}
    kept = {v: f.stat().st_mtime_ns for v, f in files.items()}
    one = kept[1] // 1_000_000 * 1_000_000  # commit 1's time, in whole ms
    try:
        os.utime(files[2], ns=(one - 5_000_000_000, one - 5_000_000_000))  # 5 s before commit 1
        os.utime(files[3], ns=(one, one))  # the same millisecond as commit 1
        expected = _spark_changes(spark, path, order, 0, max(files))
        _same(lake, capsys, expected, "changes", name)
        first = datetime.fromtimestamp(one // 1_000_000 / 1000, UTC)
        for ms in (0, 1, 2):  # commits 1, 2 and 3 as both date them
            instant = _iso(first + timedelta(milliseconds=ms))
            expected = _spark_snapshot(spark, path, order, timestampAsOf=instant)
            _same(lake, capsys, expected, "show", name, "--as-of", instant)
    finally:
        for v, ns in kept.items():
            os.utime(files[v], ns=(ns, ns))


def test_a_time_after_the_last_commit_shows_the_latest_where_spark_refuses(
    spark: Any, lake: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    """The one difference kept on purpose: Spark refuses a time after the table's last commit
    (a commit could still come dated before it); the CLI shows the latest version."""
    name, order = "last_ride", TABLES["last_ride"]
    path = _path(lake, name)
    later = "2999-01-01T00:00:00Z"
    with pytest.raises(AnalysisException, match="DELTA_TIMESTAMP_GREATER_THAN_COMMIT"):
        _spark_snapshot(spark, path, order, timestampAsOf=later)
    _same(lake, capsys, _spark_snapshot(spark, path, order), "show", name, "--as-of", later)


def test_show_reaches_every_table_the_pipeline_wrote(
    spark: Any, local_lake: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    """`lakehouse tables` lists every table the runs wrote, by the name `show` takes: the
    layers', the late records', the schema registry and the quality ledger (which has a row for
    every batch, though the contract has no expectations); each shows what Spark reads, in its
    order, with its row count and version, under that name and under its name in the
    catalog."""
    from lakehouse.pipeline import lake
    from lakehouse.storage import metastore

    assert _cli(local_lake, "tables", "--format", "json") == 0
    listed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    kinds = {r["kind"] for r in listed}
    assert kinds == {"bronze", "silver", "gold", "late", "registry", "ledger"}, listed
    catalog = Catalog.load(local_lake.contracts_dir)
    for row in listed:
        table = lake.resolve(local_lake, catalog, row["name"])
        # Its name in the catalog reaches the same table.
        named = metastore.table_name(local_lake.data_root, table.path)
        assert named is not None and lake.resolve(local_lake, catalog, str(named)) == table
        expected = _spark_snapshot(spark, table.path, list(table.order))
        assert (row["version"], row["rows"]) == (table_version(table.path), expected.num_rows)
        _same(local_lake, capsys, expected, "show", row["name"])


def test_run_keeps_sparks_log_off_the_terminal_and_lag_counts_versions(
    spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`lakehouse run` in a Spark of its own prints the tool's words only: Spark's WARN lines
    (`CaseInsensitiveStringMap: Converting duplicated key`, `RDD ... was locally checkpointed`)
    and the JVM's go to the log it names. Then `lakehouse lag` says how many versions of its
    input each table has still to read."""
    import subprocess
    import sys

    from lakehouse.runtime.spark import session_log

    lake = lake_with(tmp_path, CONTRACT)
    produce(lake, "rides", [record(k, v, partition=p) for k, v, p in BATCHES[0] if v is not None])
    env = {**os.environ, "LAKEHOUSE_HOME": str(lake.home), "LAKEHOUSE_DATA": str(lake.data_root)}
    env["LAKEHOUSE_CONTRACTS"] = str(lake.contracts_dir)
    ran = subprocess.run(
        [sys.executable, "-m", "lakehouse.cli", "run"],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert ran.returncode == 0, ran.stderr
    assert [line for line in ran.stderr.splitlines() if "WARN" in line] == []
    log = session_log(lake.home)
    assert ran.stderr.splitlines() == [f"in a Spark of its own (its log: {log})"]
    assert "gold last_ride: stream versions 0..1 committed" in ran.stdout
    assert " WARN " in log.read_text()  # where they went

    # One more batch, through bronze only: silver is a version behind, gold is not (yet).
    produce(lake, "rides", [("fay", BATCHES[1][0][1])], partition=None)
    run_pipeline(spark, lake, ("bronze",))
    capsys.readouterr()
    assert _cli(lake, "lag", "--layer", "silver", "--layer", "gold", "--format", "json") == 0
    behind = {
        (r["table"], r["input"]): r["lag_versions"]
        for r in map(json.loads, capsys.readouterr().out.splitlines())
    }
    assert behind == {
        ("silver.rides_stream", "bronze.rides"): 1,
        ("last_ride", "silver.rides_stream"): 0,
        ("rider_totals", "silver.rides_stream"): 0,
        ("city_5m", "silver.rides_stream"): 0,
    }
    assert _cli(lake, "lag", "--layer", "silver") == 0
    assert "| silver.rides_stream | bronze.rides | 2             | 1                  | 1" in (
        capsys.readouterr().out
    )
