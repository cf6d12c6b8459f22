"""Spark's own Delta Lake and Avro, from the jars `make install` put in .venv/jars (lakehouse.runtime.jvm):
a Delta table written, read and described by Spark, an Avro round trip, and a spark-submit with
the platform's settings (and one without the jars, refused)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from lakehouse.runtime import jvm
from lakehouse.runtime.spark import conf_args, submit_conf

pytestmark = pytest.mark.integration

JOB = """\
import sys
from lakehouse.errors import JarsError
from lakehouse.runtime.spark import get_session
try:
    spark = get_session(app_name="lakehouse-delta-check")
except JarsError as exc:
    print("refused:", exc)
    sys.exit(2)
spark.range(3).write.format("delta").save(sys.argv[1])
print("rows", spark.read.format("delta").load(sys.argv[1]).count())
"""


def _jar_of(spark: Any, class_name: str) -> str:
    """The jar the driver loaded a class from."""
    loader = spark._jvm.Thread.currentThread().getContextClassLoader()
    cls = spark._jvm.Class.forName(class_name, False, loader)
    return str(cls.getProtectionDomain().getCodeSource().getLocation().getPath())


def test_spark_writes_reads_and_describes_a_delta_table(spark: Any, tmp_path: Path) -> None:
    path = str(tmp_path / "people")
    df = spark.createDataFrame([(1, "alice"), (2, "bob")], "id INT, name STRING")
    df.write.format("delta").save(path)
    spark.createDataFrame([(3, "carol")], "id INT, name STRING").write.format("delta").mode(
        "append"
    ).save(path)

    back = spark.read.format("delta").load(path)
    assert sorted(tuple(row) for row in back.collect()) == [(1, "alice"), (2, "bob"), (3, "carol")]
    assert (tmp_path / "people" / "_delta_log" / "00000000000000000001.json").is_file()

    history = spark.sql(f"DESCRIBE HISTORY delta.`{path}`").orderBy("version").collect()
    assert [(row.version, row.operation) for row in history] == [(0, "WRITE"), (1, "WRITE")]
    assert [row.operationParameters["mode"] for row in history] == ["ErrorIfExists", "Append"]
    for row in history:
        assert row.engineInfo.startswith("Apache-Spark/4.2.0"), row.engineInfo
        assert "Delta-Lake/4.4.0" in row.engineInfo, row.engineInfo

    # Delta's Python API (the delta-spark package) over the same JVM classes.
    from delta.tables import DeltaTable

    assert DeltaTable.forPath(spark, path).history().count() == 2
    # The classes come from the installed jar, once (no copy elsewhere on the class path).
    delta_jar = _jar_of(spark, "io.delta.sql.DeltaSparkSessionExtension")
    assert delta_jar == str(jvm.jars_dir() / "delta-spark_4.2_2.13-4.4.0.jar")


def test_spark_encodes_and_decodes_avro(spark: Any) -> None:
    from pyspark.sql.avro.functions import from_avro, to_avro
    from pyspark.sql.functions import col, struct

    schema = (
        '{"type": "record", "name": "Person", "fields": ['
        '{"name": "id", "type": "int"}, {"name": "name", "type": "string"}]}'
    )
    df = spark.createDataFrame([(1, "alice"), (2, "bob")], "id INT, name STRING")
    encoded = df.select(to_avro(struct("id", "name"), schema).alias("value"))
    decoded = encoded.select(from_avro(col("value"), schema).alias("p")).select("p.*")
    assert sorted(tuple(row) for row in decoded.collect()) == [(1, "alice"), (2, "bob")]
    avro_jar = _jar_of(spark, "org.apache.spark.sql.avro.AvroDataToCatalyst")
    assert avro_jar == str(jvm.jars_dir() / "spark-avro_2.13-4.2.0.jar")


def _submit(tmp_path: Path, conf: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """JOB through this interpreter's spark-submit, with ``conf``."""
    job = tmp_path / "job.py"
    job.write_text(JOB)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LAKEHOUSE_", "PYSPARK_"))}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    return subprocess.run(
        [
            str(Path(sys.executable).parent / "spark-submit"),
            *("--master", "local[1]"),
            *conf_args(conf),
            str(job),
            str(tmp_path / "table"),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def test_a_spark_submit_with_the_platforms_settings_has_delta(tmp_path: Path) -> None:
    done = _submit(tmp_path, submit_conf())
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "rows 3" in done.stdout.splitlines()


def test_a_spark_submit_without_the_jars_is_refused_naming_them(tmp_path: Path) -> None:
    """Its JVM's class path is fixed when it starts: the job says so instead of failing on a
    missing Delta class."""
    conf = {key: value for key, value in submit_conf().items() if key != "spark.jars"}
    done = _submit(tmp_path, conf)
    assert done.returncode == 2, done.stdout[-3000:] + done.stderr[-3000:]
    refused = [line for line in done.stdout.splitlines() if line.startswith("refused: ")]
    assert refused == [
        "refused: spark-submit started this job without the JVM jars "
        + ", ".join(path.name for path in jvm.spark_jars())
        + " (submit it with lakehouse.runtime.spark.submit_conf()'s settings, as the Airflow operator "
        "does: `--conf spark.jars=...`)"
    ]
    assert not (tmp_path / "table").exists()


def test_threads_sharing_a_session_keep_their_own_merge_metadata(
    spark: Any, tmp_path: Path
) -> None:
    """MERGE takes its commit metadata from session settings, which every thread of the session
    sees: two threads releasing rows from two tables at once each commit their own metadata,
    and the session keeps none of it afterwards."""
    from concurrent.futures import ThreadPoolExecutor

    from deltalake import DeltaTable

    from lakehouse.storage import delta_spark
    from lakehouse.storage.log import commit_metadata

    tables = [tmp_path / f"t{i}" for i in range(4)]
    rows = spark.createDataFrame([(k,) for k in range(20)], "k long")
    for table in tables:
        delta_spark.append(rows, table, create=rows.schema)

    def release(i: int) -> int:
        keys = spark.createDataFrame([(k,) for k in range(i, 20, 4)], "k long")
        return delta_spark.delete_matching(
            keys, tables[i], on=["k"], metadata={"lakehouse.release": {"by": i}}
        )

    with ThreadPoolExecutor(max_workers=len(tables)) as pool:
        assert list(pool.map(release, range(len(tables)))) == [5] * len(tables)
    for i, table in enumerate(tables):
        (newest,) = DeltaTable(str(table)).history(1)
        assert newest["operation"] == "MERGE"
        assert commit_metadata(newest, "lakehouse.release") == {"by": i}
        assert DeltaTable(str(table)).to_pyarrow_table().num_rows == 15
    assert spark.conf.get("spark.databricks.delta.commitInfo.userMetadata", None) is None


def _sum_table(spark: Any, path: Path) -> None:
    from pyspark.sql import types as T

    from lakehouse.storage import delta_spark

    schema = T.StructType(
        [T.StructField("k", T.StringType(), False), T.StructField("n", T.LongType(), True)]
    )
    delta_spark.create_table(spark, path, schema)


def _fold(
    spark: Any,
    path: Path,
    rows: list[tuple[str, int, bool]],
    version: int,
    gate: Any = None,
    *,
    update: str = "t.n + s.n",
    insert_when: str = "NOT s.gone",
) -> Any:
    """Merge (key, amount, delete) rows: a delete removes the key, others add to its sum (or
    set it to ``update``) or are inserted where ``insert_when`` holds; ``gate`` judges the
    merge."""
    from lakehouse.storage import Txn, delta_spark

    batch = spark.createDataFrame(rows, "k string, n long, gone boolean")
    return delta_spark.merge(
        batch,
        path,
        on=["k"],
        update={"n": update},
        insert={"k": "s.k", "n": "s.n"},
        delete_when="s.gone",
        insert_when=insert_when,
        txn=Txn("silver.s", version),
        metadata={"lakehouse.source": {"table": "silver.s", "versions": [version, version]}},
        gate=gate,
    )


def _rows(path: Path) -> dict[str, int]:
    from deltalake import DeltaTable

    return {r["k"]: r["n"] for r in DeltaTable(str(path)).to_pyarrow_table().to_pylist()}


def test_a_merge_records_its_position_once_and_commits_even_when_nothing_changes(
    spark: Any, tmp_path: Path
) -> None:
    from deltalake import DeltaTable

    from lakehouse.storage import changes_arrow
    from lakehouse.storage.log import commit_metadata, table_rows

    path = tmp_path / "sums"
    _sum_table(spark, path)
    first = _fold(spark, path, [("a", 1, False), ("b", 2, False), ("x", 0, True)], 0)
    assert (first.committed, first.table_version, first.source_rows) == (True, 1, 2)
    again = _fold(spark, path, [("a", 1, False)], 0)  # a retry of version 0: skipped
    assert not again.committed and again.table_version == 1
    assert _rows(path) == {"a": 1, "b": 2}

    empty = _fold(spark, path, [], 1)
    assert (empty.committed, empty.table_version, empty.source_rows) == (True, 2, 0)
    changed = _fold(spark, path, [("a", 5, False), ("b", 0, True), ("c", 3, False)], 2)
    assert (changed.committed, changed.source_rows) == (True, 3)
    assert _rows(path) == {"a": 6, "c": 3}

    table = DeltaTable(str(path))
    # The rows a gate may collect without counting them: from the log's record counts.
    assert table_rows(table) == 2 and table_rows(DeltaTable(str(path), version=1)) == 2
    assert table.transaction_version("silver.s") == 2
    history = table.history()  # newest first
    assert [c["operation"] for c in history[:3]] == ["MERGE"] * 3
    assert [commit_metadata(c, "lakehouse.source")["versions"] for c in history[:3]] == [
        [2, 2],
        [1, 1],
        [0, 0],
    ]
    feed = changes_arrow(path, 3, 3).to_pylist()
    assert sorted((r["k"], r["_change_type"]) for r in feed) == [
        ("a", "update_postimage"),
        ("a", "update_preimage"),
        ("b", "delete"),
        ("c", "insert"),
    ]


def test_a_gate_collects_a_batch_within_its_bound_and_leaves_a_big_one_in_spark(
    spark: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import pyarrow as pa

    from lakehouse.quality.gate import collect_if_small

    batch = spark.range(5).selectExpr("id", "id * 2 AS twice")
    table, rows = collect_if_small(batch, ["twice"], at_most=10)
    assert isinstance(table, pa.Table) and rows == 5
    assert table.to_pydict() == {"twice": [0, 2, 4, 6, 8]}
    monkeypatch.setenv("LAKEHOUSE_GX_PANDAS_MAX_ROWS", "3")
    # A bound over the limit is no promise: the batch is counted, and stays in Spark.
    kept, rows = collect_if_small(batch, ["twice"], at_most=10)
    assert not isinstance(kept, pa.Table) and rows == 5
    small, rows = collect_if_small(batch.limit(2), None, at_most=10)
    assert isinstance(small, pa.Table) and rows == 2 and small.column_names == ["id"]


def test_threads_sharing_a_session_merge_with_their_own_positions(
    spark: Any, tmp_path: Path
) -> None:
    """A MERGE takes its app transaction from session settings: threads merging into four
    tables at once each commit their own table's position and metadata."""
    from concurrent.futures import ThreadPoolExecutor

    from deltalake import DeltaTable

    from lakehouse.storage.log import commit_metadata

    tables = [tmp_path / f"t{i}" for i in range(4)]
    for table in tables:
        _sum_table(spark, table)

    def fold(i: int) -> bool:
        return bool(_fold(spark, tables[i], [(f"k{i}", i, False)], 10 * i + 3).committed)

    with ThreadPoolExecutor(max_workers=len(tables)) as pool:
        assert all(pool.map(fold, range(len(tables))))
    for i, table in enumerate(tables):
        dt = DeltaTable(str(table))
        assert dt.transaction_version("silver.s") == 10 * i + 3
        (newest,) = dt.history(1)
        assert commit_metadata(newest, "lakehouse.source")["versions"] == [10 * i + 3] * 2
        assert _rows(table) == {f"k{i}": i}
    assert spark.conf.get("spark.databricks.delta.write.txnAppId", None) is None


class RecordingGate:
    """A gate that records what a merge asks it to judge, and refuses a row over 100."""

    columns = None

    def __init__(self, needs_whole_table: bool = True) -> None:
        self.needs_whole_table = needs_whole_table
        self.seen: dict[str, Any] = {}

    def check(
        self,
        batch: Any,
        rows: Any = None,
        *,
        whole: Any,
        lineage: Any,
        at_most: Any,
        marker: str | None,
    ) -> str:
        self.seen = {
            "post": sorted(tuple(r) for r in batch.collect()),
            "rows": rows,
            "whole": None
            if whole is None
            else sorted(tuple(r) for r in whole.select("k", "n", marker).collect()),
            "lineage": lineage,
            "at_most": at_most,
        }
        if any(n > 100 for _, n in self.seen["post"]):
            raise ValueError("too big")
        return "ok"

    def commit_metadata(self, verdict: str) -> dict[str, Any]:
        return {"lakehouse.verdict": verdict}

    def record(self, verdict: str, *, table_version: Any, published: bool) -> None:
        self.seen["recorded"] = (verdict, table_version, published)


def test_a_gated_merge_is_judged_on_the_rows_it_would_publish(spark: Any, tmp_path: Path) -> None:
    """The gate sees each merged row as the table would hold it (the stored sum plus the
    batch's), deleted keys not at all, and the whole table after the merge; a refusal writes
    nothing."""
    path = tmp_path / "sums"
    _sum_table(spark, path)
    _fold(spark, path, [("a", 1, False), ("b", 2, False), ("c", 4, False)], 0)

    gate = RecordingGate()
    _fold(spark, path, [("a", 10, False), ("b", 0, True), ("d", 7, False)], 1, gate)
    assert gate.seen["post"] == [("a", 11), ("d", 7)]
    # Each row is written or deleted whether or not its key is stored: the survey of the source
    # counted the rows written (their values read the table).
    assert gate.seen["rows"] == 2
    # The table after the merge, its merged rows marked: the batch can be read out of it.
    assert gate.seen["whole"] == [("a", 11, True), ("c", 4, False), ("d", 7, True)]
    assert gate.seen["lineage"] == {"table": "silver.s", "versions": [1, 1]}
    # Bounds on both: the source's 3 rows, and the table's 3 with them.
    assert gate.seen["at_most"] == (3, 6)
    assert gate.seen["recorded"] == ("ok", 2, True)
    assert _rows(path) == {"a": 11, "c": 4, "d": 7}

    with pytest.raises(ValueError, match="too big"):
        _fold(spark, path, [("c", 200, False)], 2, gate)
    assert _rows(path) == {"a": 11, "c": 4, "d": 7}


def _replace(spark: Any, path: Path, *args: Any, **kwargs: Any) -> Any:
    """:func:`_fold` as a latest table merges: a row replaces the stored value."""
    return _fold(spark, path, *args, update="s.n", **kwargs)


def test_a_merge_whose_rows_do_not_depend_on_the_table_is_judged_off_its_source(
    spark: Any, tmp_path: Path
) -> None:
    """A merge whose every source row meets the same fate, and is stored with the same values,
    whether or not the table holds its key (a latest table's: a row replaces the stored one or
    is inserted, a delete removes the key or nothing) gives its gate the same rows and the same
    table after it, and the number of rows it writes, counted with the source (the gate has
    nothing to count). Once a row's fate depends on its key being stored, the rows come from
    the source joined with the table, and the gate counts them itself."""
    path = tmp_path / "latest"
    _sum_table(spark, path)
    _replace(spark, path, [("a", 1, False), ("b", 2, False), ("c", 4, False)], 0)

    gate = RecordingGate()
    batch = [("a", 10, False), ("b", 0, True), ("d", 7, False), ("x", 0, True)]
    _replace(spark, path, batch, 1, gate)
    assert gate.seen["post"] == [("a", 10), ("d", 7)]
    assert gate.seen["rows"] == 2
    assert gate.seen["whole"] == [("a", 10, True), ("c", 4, False), ("d", 7, True)]
    assert gate.seen["at_most"] == (4, 7)
    assert gate.seen["recorded"] == ("ok", 2, True)
    assert _rows(path) == {"a": 10, "c": 4, "d": 7}

    # Inserted only where the value is positive, always updated: "a" (stored) takes -1, "e"
    # (not stored) is left out.
    gate = RecordingGate(needs_whole_table=False)
    batch = [("a", -1, False), ("e", -1, False), ("f", 5, False)]
    _replace(spark, path, batch, 2, gate, insert_when="s.n > 0")
    assert gate.seen["post"] == [("a", -1), ("f", 5)]
    assert gate.seen["rows"] is None and gate.seen["whole"] is None
    assert _rows(path) == {"a": -1, "c": 4, "d": 7, "f": 5}
    with pytest.raises(ValueError, match="too big"):
        _replace(spark, path, [("c", 200, False)], 3, gate)
    assert _rows(path) == {"a": -1, "c": 4, "d": 7, "f": 5}
