"""The environment Airflow runs in: repo-local AIRFLOW_HOME under the lakehouse root, SQLite,
the project's DAG folder, and a ``spark_default`` connection in local mode.

Anything the user already set wins, so pointing ``AIRFLOW_CONN_SPARK_DEFAULT`` at a Spark
standalone master runs the same DAGs on a cluster.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path

from lakehouse.config import REPO_ROOT, Settings


def airflow_environment(
    settings: Settings, base: Mapping[str, str] | None = None
) -> dict[str, str]:
    env = dict(os.environ if base is None else base)
    bin_dir = str(Path(sys.executable).parent)
    defaults = {
        "LAKEHOUSE_HOME": str(settings.home),
        "LAKEHOUSE_CONTRACTS": str(settings.contracts_dir),
        "AIRFLOW_HOME": str(settings.airflow_home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(REPO_ROOT / "dags"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "True",
        "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",
        "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps(
            {"conn_type": "spark", "host": settings.spark_master}
        ),
        # Executors and the driver run the project's interpreter.
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
    }
    for key, value in defaults.items():
        env.setdefault(key, value)
    # spark-submit and airflow live beside this interpreter.
    path = env.get("PATH", "")
    if bin_dir not in path.split(os.pathsep):
        env["PATH"] = os.pathsep.join([bin_dir, path]) if path else bin_dir
    return env
