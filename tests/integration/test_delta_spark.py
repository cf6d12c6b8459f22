"""Spark's own Delta Lake and Avro, from the jars `make install` put in .venv/jars (lakehouse.jvm):
a Delta table written, read and described by Spark, an Avro round trip, and a spark-submit with
the platform's settings (and one without the jars, refused)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from lakehouse import jvm
from lakehouse.spark import conf_args, submit_conf

pytestmark = pytest.mark.integration

JOB = """\
import sys
from lakehouse.errors import JarsError
from lakehouse.spark import get_session
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
        + ", ".join(jvm.read_lock())
        + " (submit it with lakehouse.spark.submit_conf()'s settings, as the Airflow operator "
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
    from lakehouse.storage.delta_spark import commit_metadata

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
