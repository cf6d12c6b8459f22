"""The one place a SparkSession is built. Jobs and tests receive it; nothing builds its own."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

from lakehouse.runtime import ensure_java

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def spark_conf(master: str, app_name: str) -> dict[str, str]:
    """Settings every job runs with, whatever the master."""
    return {
        "spark.master": master,
        "spark.app.name": app_name,
        # Event times and offsets are compared across machines: always UTC.
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.shuffle.partitions": os.environ.get("LAKEHOUSE_SHUFFLE_PARTITIONS", "8"),
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.sql.sources.partitionOverwriteMode": "dynamic",
        # Executors must run the project's interpreter, which has the `lakehouse` package.
        "spark.pyspark.python": sys.executable,
        "spark.pyspark.driver.python": sys.executable,
        "spark.ui.showConsoleProgress": "false",
        "spark.ui.enabled": os.environ.get("LAKEHOUSE_SPARK_UI", "false"),
        "spark.driver.memory": os.environ.get("LAKEHOUSE_DRIVER_MEMORY", "2g"),
        # HotSpot does not JIT-compile methods over 8000 bytes of bytecode; a whole-stage
        # method larger than that (silver's decoding with its per-field diagnosis) would run
        # interpreted, several times slower. Spark's documentation suggests this limit on
        # HotSpot: larger stages fall back to smaller, compiled pieces.
        "spark.sql.codegen.hugeMethodLimit": "8000",
    }


def get_session(master: str | None = None, app_name: str = "lakehouse") -> SparkSession:
    """Return the process's SparkSession, creating it with the platform's settings."""
    from pyspark.sql import SparkSession

    ensure_java()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    builder = SparkSession.builder
    conf = spark_conf(master or os.environ.get("LAKEHOUSE_SPARK_MASTER", "local[2]"), app_name)
    if master is None and "PYSPARK_GATEWAY_PORT" in os.environ:
        # Launched by spark-submit: its --master/--name/--driver-memory are the ones to keep.
        for key in ("spark.master", "spark.app.name", "spark.driver.memory"):
            conf.pop(key)
    for key, value in conf.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel(os.environ.get("LAKEHOUSE_SPARK_LOG_LEVEL", "WARN"))
    return session
