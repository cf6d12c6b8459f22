"""The Spark class archive (`lakehouse spark-archive`, which make runs): written by running the
sample pipeline once, and mapped by the next job's JVM instead of loading Spark from its jars
(bench/airflow_trigger.py and bench/end_to_end.py measure what it saves)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from lakehouse import spark

pytestmark = pytest.mark.integration

JOB = """\
from pyspark.sql import SparkSession
session = SparkSession.builder.getOrCreate()
print("rows", session.range(1000).selectExpr("id % 7 AS k").groupBy("k").count().count())
session.stop()
"""


def test_a_class_archive_is_written_and_the_next_job_maps_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    archive = tmp_path / "var" / "spark-classes.jsa"
    monkeypatch.setattr(spark, "class_archive", lambda: archive)
    assert spark.build_class_archive(records=200) == archive
    assert archive.stat().st_size > 20 << 20  # Spark's classes, not an empty shell
    assert list(archive.parent.iterdir()) == [archive]  # no partial file left behind

    job = tmp_path / "job.py"
    job.write_text(JOB)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LAKEHOUSE_", "PYSPARK_"))}
    # spark-submit finds Spark through the interpreter on the PATH: this one, with pyspark.
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    done = subprocess.run(
        [
            str(Path(sys.executable).parent / "spark-submit"),
            *("--master", "local[1]"),
            *("--conf", f"spark.pyspark.python={sys.executable}"),
            # -Xshare:on: a JVM that cannot map the archive refuses to start instead of
            # quietly loading everything from the jars.
            "--driver-java-options",
            f"-Xshare:on -XX:SharedArchiveFile={archive} -Xlog:class+load=info",
            str(job),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "rows 7" in done.stdout
    # Spark's classes, but not the lambda classes the JVM generates as it runs (only some of
    # those can be archived): from the archive, or else from a jar (``source: file:...``).
    loaded = [
        line.rsplit(" source: ", 1)[1]
        for line in done.stdout.splitlines()
        if "[class,load] org.apache.spark." in line and "$$Lambda" not in line
    ]
    mapped = sum(source == "shared objects file (top)" for source in loaded)
    assert len(loaded) > 1000
    assert mapped > 0.95 * len(loaded), (mapped, len(loaded))


def test_a_failed_workload_says_why_and_leaves_no_archive(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    archive = tmp_path / "spark-classes.jsa"
    monkeypatch.setattr(spark, "class_archive", lambda: archive)
    with pytest.raises(
        RuntimeError, match=r"lakehouse sample failed:[\s\S]*--records: -1 is below 1"
    ):
        spark.build_class_archive(records=-1)
    assert list(tmp_path.iterdir()) == []
