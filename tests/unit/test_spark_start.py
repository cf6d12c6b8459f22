"""How a job's Spark starts: the driver JVM's options, the conf a spark-submit passes, and the
job's own imports (no Spark here; tests/integration/test_jvm_start.py starts JVMs)."""

from __future__ import annotations

import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from lakehouse import jvm, spark
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


def _jvm_conf() -> dict[str, str]:
    """The installed jars as spark.jars, and Delta's session extension and catalog."""
    jars = ",".join(str(jvm.jars_dir() / name) for name in jvm.read_lock())
    return {
        "spark.jars": jars,
        "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
        "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
    }


def test_submit_conf_names_this_interpreter_the_jars_and_the_jvm_options(archive: Path) -> None:
    assert spark.submit_conf() == {
        "spark.pyspark.python": sys.executable,
        "spark.pyspark.driver.python": sys.executable,
        **_jvm_conf(),
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
    for conf in (long, short, inside):
        assert _jvm_conf().items() <= conf.items()


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
            **_jvm_conf(),
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


# -- bytecode for Spark's Python zips ----------------------------------------------------------


def _zip(path: Path, entries: dict[str, bytes]) -> Path:
    import zipfile

    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in entries.items():
            z.writestr(name, data)
    return path


def _entries(path: Path) -> dict[str, bytes]:
    import zipfile

    with zipfile.ZipFile(path) as z:
        return {n: z.read(n) for n in z.namelist()}


def _imported_value(zipped: Path) -> str:
    import subprocess

    done = subprocess.run(
        [sys.executable, "-c", "import pkg.m; print(pkg.m.VALUE)"],
        env={"PYTHONPATH": str(zipped), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.strip()


SOURCES = {
    "pkg/__init__.py": b"",
    "pkg/m.py": b"VALUE = 'source'\n",
    "pkg/data.txt": b"not python",
}


def test_a_python_zip_gets_bytecode_once_and_keeps_its_sources(tmp_path: Path) -> None:
    import importlib.util

    zipped = _zip(tmp_path / "lib.zip", SOURCES)
    assert spark.compile_python_zip(zipped) is True
    assert spark.compile_python_zip(zipped) is False  # already done: left as it is
    entries = _entries(zipped)
    assert {n: entries[n] for n in SOURCES} == SOURCES
    assert sorted(set(entries) - set(SOURCES)) == ["pkg/__init__.pyc", "pkg/m.pyc"]
    header = entries["pkg/m.pyc"][:16]
    assert header[:4] == importlib.util.MAGIC_NUMBER
    assert header[8:] == importlib.util.source_hash(SOURCES["pkg/m.py"])
    assert _imported_value(zipped) == "source"
    assert not list(tmp_path.glob("*.tmp"))


def test_the_zip_importer_uses_the_bytecode_and_refuses_it_once_the_source_changed(
    tmp_path: Path,
) -> None:
    """Proof that imports read the added .pyc: bytecode of other code under the source's hash is
    what runs. And the safety net: under a changed source the .pyc is ignored, not trusted."""
    import marshal

    zipped = _zip(tmp_path / "lib.zip", SOURCES)
    spark.compile_python_zip(zipped)
    entries = _entries(zipped)
    other = marshal.dumps(compile("VALUE = 'bytecode'\n", "pkg/m.py", "exec"))
    entries["pkg/m.pyc"] = entries["pkg/m.pyc"][:16] + other
    assert _imported_value(_zip(tmp_path / "swapped.zip", entries)) == "bytecode"

    entries["pkg/m.py"] = b"VALUE = 'changed source'\n"
    assert _imported_value(_zip(tmp_path / "stale.zip", entries)) == "changed source"


def test_bytecode_of_another_interpreter_is_replaced(tmp_path: Path) -> None:
    zipped = _zip(tmp_path / "lib.zip", SOURCES)
    spark.compile_python_zip(zipped)
    entries = _entries(zipped)
    entries["pkg/m.pyc"] = b"\x00\x00\r\n" + entries["pkg/m.pyc"][4:]
    entries["pkg/__init__.pyc"] = b"\x00\x00\r\n" + entries["pkg/__init__.pyc"][4:]
    _zip(zipped, entries)
    assert spark.compile_python_zip(zipped) is True
    assert _imported_value(zipped) == "source"
    assert _entries(zipped)["pkg/m.pyc"][:4] != b"\x00\x00\r\n"


def test_spark_python_zips_are_pyspark_and_py4j() -> None:
    names = [p.name for p in spark.python_zips()]
    assert "pyspark.zip" in names and any(n.startswith("py4j-") for n in names)


def test_spark_archive_goes_on_when_the_zip_cannot_be_rewritten(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A read-only install: a warning, and the class archive is still written."""
    from lakehouse import cli

    def read_only(path: Path) -> bool:
        raise PermissionError(13, "Permission denied", str(path))

    archive = tmp_path / "spark-classes.jsa"
    archive.write_bytes(b"x" * 2048)
    monkeypatch.setattr(spark, "python_zips", lambda: [tmp_path / "pyspark.zip"])
    monkeypatch.setattr(spark, "compile_python_zip", read_only)
    monkeypatch.setattr(spark, "build_class_archive", lambda: archive)
    assert cli.main(["spark-archive"]) == 0
    captured = capsys.readouterr()
    assert "warning: " in captured.err and "left without bytecode: " in captured.err
    assert "Permission denied" in captured.err
    assert captured.out.startswith(f"Spark class archive: {archive}")


def test_a_lazy_session_starts_once_on_first_use_and_only_then_stops() -> None:
    class Session:
        stopped = 0
        version = "4"

        def stop(self) -> None:
            self.stopped += 1

    made: list[Session] = []

    def start() -> Any:
        made.append(Session())
        return made[-1]

    unused = spark.LazySession(start)
    unused.stop()  # nothing to stop: no session is made for it
    assert (unused.started, made) == (False, [])

    lazy = spark.LazySession(start)
    assert lazy.version == "4" and lazy.version == "4"
    assert lazy.started and len(made) == 1
    lazy.stop()
    assert made[0].stopped == 1


def test_code_generation_is_a_setting_refused_when_misspelt(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from lakehouse.errors import ConfigError
    from lakehouse.spark import codegen_conf

    monkeypatch.setenv("LAKEHOUSE_SPARK_CODEGEN", "of")
    with pytest.raises(ConfigError, match="LAKEHOUSE_SPARK_CODEGEN must be 'on' or 'off'"):
        codegen_conf()
    monkeypatch.setenv("LAKEHOUSE_SPARK_CODEGEN", "off")
    assert codegen_conf()["spark.sql.codegen.wholeStage"] == "false"
    monkeypatch.delenv("LAKEHOUSE_SPARK_CODEGEN")
    assert codegen_conf() == {}
