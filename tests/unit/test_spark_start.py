"""How a job's Spark starts: the driver JVM's options, the conf a spark-submit passes, and the
job's own imports (no Spark here; tests/integration/test_jvm_start.py starts JVMs)."""

from __future__ import annotations

import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from lakehouse import spark
from lakehouse.config import REPO_ROOT
from lakehouse.contracts import Catalog
from lakehouse.errors import ConfigError

LOCATIONS = Catalog.load(REPO_ROOT / "contracts").topic("user-locations")


@pytest.fixture
def archive(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Where the class archive would be; nothing there yet; no option from the environment."""
    path = tmp_path / "var" / "spark-classes.jsa"
    monkeypatch.setattr(spark, "class_archive", lambda: path)
    monkeypatch.delenv(spark.JAVA_OPTIONS_ENV, raising=False)
    monkeypatch.delenv(spark.COMPILER_ENV, raising=False)
    return path


def _write(archive: Path) -> None:
    archive.parent.mkdir(parents=True, exist_ok=True)
    archive.write_bytes(b"archive")


def test_a_one_batch_job_compiles_with_c1_a_long_session_with_both(archive: Path) -> None:
    assert spark.driver_java_options(short_lived=True) == "-XX:TieredStopAtLevel=1"
    assert spark.driver_java_options(short_lived=False) == ""


def test_the_class_archive_is_used_once_written(archive: Path) -> None:
    _write(archive)
    assert spark.driver_java_options(short_lived=True).split() == [
        "-XX:TieredStopAtLevel=1",
        f"-XX:SharedArchiveFile={archive}",
    ]
    assert spark.driver_java_options(short_lived=False) == f"-XX:SharedArchiveFile={archive}"


@pytest.mark.parametrize(("value", "short", "long"), [("c2", "", ""), (" C1 ", "c1", "c1")])
def test_the_compiler_can_be_chosen_for_every_process(
    archive: Path, monkeypatch: pytest.MonkeyPatch, value: str, short: str, long: str
) -> None:
    """E.g. C2 for a backfill of millions of records through Airflow."""
    c1 = {"": "", "c1": "-XX:TieredStopAtLevel=1"}
    monkeypatch.setenv(spark.COMPILER_ENV, value)
    assert spark.driver_java_options(short_lived=True) == c1[short]
    assert spark.driver_java_options(short_lived=False) == c1[long]


def test_an_unknown_compiler_is_a_configuration_error(
    archive: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(spark.COMPILER_ENV, "graal")
    with pytest.raises(ConfigError, match=r"LAKEHOUSE_JVM_COMPILER='graal': expected c1 or c2"):
        spark.submit_conf()


def test_the_environment_replaces_the_options_whole(
    archive: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _write(archive)
    monkeypatch.setenv(spark.COMPILER_ENV, "nonsense")  # not consulted
    monkeypatch.setenv(spark.JAVA_OPTIONS_ENV, " -Xss4m -XX:+UseSerialGC ")
    assert spark.driver_java_options(short_lived=True) == "-Xss4m -XX:+UseSerialGC"
    monkeypatch.setenv(spark.JAVA_OPTIONS_ENV, "")
    assert spark.driver_java_options(short_lived=True) == ""
    assert "spark.driver.extraJavaOptions" not in spark.submit_conf()


def test_submit_conf_names_this_interpreter_and_the_jvm_options(archive: Path) -> None:
    assert spark.submit_conf() == {
        "spark.pyspark.python": sys.executable,
        "spark.pyspark.driver.python": sys.executable,
        "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1",
    }
    _write(archive)
    long = spark.spark_conf("local[1]", "app")  # a session this process starts and keeps
    assert long["spark.driver.extraJavaOptions"] == f"-XX:SharedArchiveFile={archive}"
    assert long["spark.pyspark.python"] == sys.executable
    short = spark.spark_conf("local[1]", "app", short_lived=True)
    assert short["spark.driver.extraJavaOptions"].startswith("-XX:TieredStopAtLevel=1 ")
    inside = spark.spark_conf("local[1]", "app", jvm_options=False)  # spark-submit's JVM
    assert "spark.driver.extraJavaOptions" not in inside
    assert inside["spark.pyspark.python"] == sys.executable


def test_the_operator_takes_the_options_when_it_runs(
    archive: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The DAG is parsed once and runs for days: an archive written since, or options changed
    since, reach the next spark-submit; a conf the DAG sets itself wins."""
    from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
    from airflow.sdk.exceptions import AirflowFailException

    from lakehouse.orchestration import LayerJobOperator

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
        conf={"spark.sql.shuffle.partitions": "4"},
    )
    _write(archive)  # after the DAG was parsed
    operator.execute({"params": {}, "run_id": "manual__1"})
    operator.execute({"params": {}, "run_id": "manual__1"})  # a retry: nothing piles up
    assert (
        sent[0]
        == sent[1]
        == {
            "spark.pyspark.python": sys.executable,
            "spark.pyspark.driver.python": sys.executable,
            "spark.driver.extraJavaOptions": f"-XX:TieredStopAtLevel=1 -XX:SharedArchiveFile={archive}",
            "spark.sql.shuffle.partitions": "4",
        }
    )
    operator.conf = None
    operator.base_conf = {"spark.driver.extraJavaOptions": "-Xmx1g"}
    operator.execute({"params": {}, "run_id": "manual__2"})
    assert sent[2]["spark.driver.extraJavaOptions"] == "-Xmx1g"
    monkeypatch.setenv(spark.COMPILER_ENV, "graal")
    with pytest.raises(AirflowFailException, match="LAKEHOUSE_JVM_COMPILER='graal'"):
        operator.execute({"params": {}, "run_id": "manual__3"})
    assert len(sent) == 3  # nothing submitted


def test_the_job_imports_the_installed_pyspark_not_spark_submits_zip(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, layer_job: ModuleType
) -> None:
    """spark-submit puts the pyspark package's own zips first on the path; the job drops those
    (the package has the same code, compiled) and keeps any other zip."""
    import pyspark

    installed = Path(pyspark.__file__).parent
    own = [
        str(installed / "python" / "lib" / "pyspark.zip"),
        str(installed / "python" / "lib" / "py4j-src.zip"),
    ]
    other = str(tmp_path / "deps.zip")
    monkeypatch.setattr(sys, "path", [*own, other, *sys.path])
    layer_job._prefer_installed_pyspark()
    assert not set(own) & set(sys.path)
    assert other in sys.path


def test_the_job_keeps_the_zip_when_pyspark_is_not_installed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, layer_job: ModuleType
) -> None:
    """A Spark distribution's spark-submit with an interpreter without pyspark: the zip is the
    only pyspark there is."""
    import importlib.machinery

    zipped = str(tmp_path / "spark" / "python" / "lib" / "pyspark.zip")
    monkeypatch.setattr(importlib.machinery.PathFinder, "find_spec", lambda *_a, **_k: None)
    monkeypatch.setattr(sys, "path", [zipped, *sys.path])
    layer_job._prefer_installed_pyspark()
    assert sys.path[0] == zipped
