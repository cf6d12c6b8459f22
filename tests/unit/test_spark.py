"""The settings a job's Spark starts with (lakehouse.runtime.spark) and the conf a spark-submit of a
layer job passes (no Spark here)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from lakehouse.contracts.catalog import Catalog
from lakehouse.errors import ConfigError
from lakehouse.runtime import jvm, spark
from lakehouse.runtime.config import REPO_ROOT, Settings

LOCATIONS = Catalog.load(REPO_ROOT / "contracts").topic("user-locations")


def _jvm_conf() -> dict[str, str]:
    """The installed jars as spark.jars, but the local file system's and PostgreSQL's JDBC
    driver, on the class path; Delta's session extension and catalog; the local file system and
    log store."""
    launched = ("hadoop-bare-naked-local-fs-0.1.0.jar", "postgresql-42.7.14.jar")
    jars = ",".join(str(jvm.jars_dir() / name) for name in jvm.read_lock() if name not in launched)
    class_path = ":".join(str(jvm.jars_dir() / name) for name in launched)
    return {
        "spark.jars": jars,
        "spark.driver.extraClassPath": class_path,
        "spark.executor.extraClassPath": class_path,
        "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
        "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
        "spark.hadoop.fs.file.impl": "com.globalmentor.apache.hadoop.fs.BareLocalFileSystem",
        "spark.delta.logStore.file.impl": "io.delta.storage.LocalLogStore",
        "spark.sql.streaming.checkpointFileManagerClass": "org.apache.spark.sql.execution."
        "streaming.checkpointing.FileSystemBasedCheckpointFileManager",
    }


def test_submit_conf_names_this_interpreter_and_the_jars() -> None:
    assert spark.submit_conf() == {
        "spark.pyspark.python": sys.executable,
        "spark.pyspark.driver.python": sys.executable,
        **_jvm_conf(),
    }
    conf = spark.spark_conf("local[1]", "app")
    assert conf["spark.master"] == "local[1]" and conf["spark.app.name"] == "app"
    assert spark.submit_conf().items() <= conf.items()


def test_the_operator_takes_the_conf_when_it_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a ``spark`` connection each layer is a spark-submit. The DAG is parsed once and runs
    for days: the conf is the machine's when the task runs; a conf the DAG sets itself wins; a
    jar missing then fails the task without a submit (every retry would fail alike)."""
    from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
    from airflow.sdk.exceptions import AirflowFailException

    from lakehouse.orchestration.operators import SPARK_CONN_ID, LayerJobOperator

    monkeypatch.setenv(
        f"AIRFLOW_CONN_{SPARK_CONN_ID.upper()}", json.dumps({"conn_type": "spark", "host": "local"})
    )

    sent: list[dict[str, Any]] = []
    monkeypatch.setattr(
        SparkSubmitOperator, "execute", lambda self, context: sent.append(dict(self.conf))
    )
    operator = LayerJobOperator(
        task_id="silver",
        layer="silver",
        contract=LOCATIONS,
        tables=None,
        application="run_layer.py",
        application_args=["--topic", LOCATIONS.topic, "--layer", "silver"],
        conf={"spark.sql.shuffle.partitions": "4", "spark.pyspark.python": "/opt/python"},
        settings=Settings.from_env(tmp_path / "lakehouse", REPO_ROOT / "contracts"),
        conn_id=SPARK_CONN_ID,
    )
    operator.execute({"params": {}, "run_id": "manual__1"})
    operator.execute({"params": {}, "run_id": "manual__1"})  # a retry: nothing piles up
    assert (
        sent[0]
        == sent[1]
        == {
            "spark.pyspark.python": "/opt/python",
            "spark.pyspark.driver.python": sys.executable,
            **_jvm_conf(),
            "spark.sql.shuffle.partitions": "4",
        }
    )
    monkeypatch.setattr(jvm, "jars_dir", lambda: tmp_path)  # the jars gone since the parse
    with pytest.raises(AirflowFailException, match="JVM jars missing from"):
        operator.execute({"params": {}, "run_id": "manual__2"})
    assert len(sent) == 2  # nothing submitted


def test_code_generation_is_a_setting_refused_when_misspelt(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("LAKEHOUSE_SPARK_CODEGEN", "of")
    with pytest.raises(ConfigError, match="LAKEHOUSE_SPARK_CODEGEN must be 'on' or 'off'"):
        spark.codegen_conf()
    monkeypatch.setenv("LAKEHOUSE_SPARK_CODEGEN", "off")
    assert spark.codegen_conf()["spark.sql.codegen.wholeStage"] == "false"
    monkeypatch.delenv("LAKEHOUSE_SPARK_CODEGEN")
    assert spark.codegen_conf() == {}


class _Conf:
    """A session's runtime settings, as ``spark.conf`` holds them."""

    def __init__(self) -> None:
        self.values = {"spark.sql.adaptive.enabled": "true", "spark.sql.shuffle.partitions": "8"}
        self.sets: list[tuple[str, str]] = []

    def get(self, key: str) -> str | None:
        return self.values.get(key)

    def set(self, key: str, value: str) -> None:
        self.sets.append((key, value))
        self.values[key] = value

    def unset(self, key: str) -> None:
        self.sets.append((key, "(unset)"))
        self.values.pop(key, None)


def test_a_small_batch_is_planned_without_adaptive_execution_and_the_setting_comes_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Under LAKEHOUSE_SPARK_ADAPTIVE=auto a batch of at most LAKEHOUSE_SPARK_SMALL_BATCH_ROWS
    input rows runs with the small-batch settings (adaptive execution off), and the session's
    settings are put back after (one it did not have is unset again), also when the batch fails; an unknown or bigger input, or on/off, leaves it alone. A bad
    threshold is refused with its name."""
    from types import SimpleNamespace

    monkeypatch.delenv(spark.ADAPTIVE_ENV, raising=False)
    monkeypatch.setenv(spark.SMALL_BATCH_ENV, "20")
    session: Any = SimpleNamespace(conf=_Conf())
    shipped = dict(session.conf.values)
    seen = []
    for rows in (0, 20, 21, None):
        with spark.adaptive_for(session, rows):
            seen.append(dict(session.conf.values))
    small = shipped | spark.SMALL_BATCH_CONF
    assert small["spark.sql.adaptive.enabled"] == "false"
    assert seen == [small, small, shipped, shipped]
    assert session.conf.values == shipped
    with pytest.raises(RuntimeError, match="the batch failed"), spark.adaptive_for(session, 3):
        raise RuntimeError("the batch failed")
    assert session.conf.values == shipped
    for mode in ("on", "off"):
        monkeypatch.setenv(spark.ADAPTIVE_ENV, mode)
        before = len(session.conf.sets)
        with spark.adaptive_for(session, 3):
            pass
        assert len(session.conf.sets) == before
    monkeypatch.setenv(spark.ADAPTIVE_ENV, "auto")
    for bad in ("-1", "many", "1.5"):
        monkeypatch.setenv(spark.SMALL_BATCH_ENV, bad)
        with pytest.raises(
            ConfigError, match=f"{spark.SMALL_BATCH_ENV} must be a whole number of rows"
        ):
            spark.small_batch_rows()


@pytest.mark.parametrize(
    ("name", "key", "default"),
    [
        ("LAKEHOUSE_SHUFFLE_PARTITIONS", "spark.sql.shuffle.partitions", "8"),
        ("LAKEHOUSE_SNAPSHOT_PARTITIONS", "spark.databricks.delta.snapshotPartitions", "1"),
    ],
)
def test_partition_counts_are_settings_refused_unless_positive(
    monkeypatch: pytest.MonkeyPatch, name: str, key: str, default: str
) -> None:
    for bad in ("0", "-2", "eight", "1.5"):
        monkeypatch.setenv(name, bad)
        match = f"{name} must be a whole number of partitions \\(at least 1\\), not '{bad}'"
        with pytest.raises(ConfigError, match=match):
            spark.spark_conf("local[1]", "t")
    monkeypatch.setenv(name, "3")
    assert spark.spark_conf("local[1]", "t")[key] == "3"
    monkeypatch.delenv(name)
    assert spark.spark_conf("local[1]", "t")[key] == default
