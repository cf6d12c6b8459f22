"""Airflow on PostgreSQL, as `make airflow` runs it: the metadata database is the lakehouse's
PostgreSQL cluster, and the LocalExecutor runs a DAG run's independent tasks at the same time.

Airflow 3 runs for real (see airflow_stack.py) with two small topic contracts, so the run DAG
(``lakehouse__run``) has two bronze jobs that depend on nothing but the plan. One run of it,
bronze only, triggered through the REST API, is what the tests look at.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest
from airflow_stack import AIRFLOW, Airflow, clean_environment, running_airflow

from lakehouse.orchestration.airflow_env import SPARK_CONN_ENV
from lakehouse.runtime.config import Settings
from lakehouse.runtime.postgres import Cluster

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

RUN_DAG = "lakehouse__run"  # (lakehouse.orchestration.dags.RUN_DAG; importing it loads Airflow)
TOPICS = ("pg-east", "pg-west")
NO_SCHEDULE = {"AIRFLOW__SCHEDULER__USE_JOB_SCHEDULE": "False"}


def _contract(topic: str) -> str:
    name = topic.replace("-", "_")
    return f"""\
topic: {topic}
description: Check-ins, for the PostgreSQL test.
partitions: 1
key: {{format: string, name: username}}
value:
  format: json
  fields:
    - {{name: location, type: string, nullable: true}}
stream: {{name: {name}}}
tables:
  - {{name: {name}_latest, kind: latest}}
"""


def _produce(settings: Settings, topic: str) -> None:
    lines = [
        json.dumps({"key": user, "value": {"location": place}, "timestamp": 1_700_000_000_000})
        for user, place in (("alice", "Paris"), ("bob", "Lima"))
    ]
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "lakehouse"), "produce", topic],
        input="\n".join(lines) + "\n",
        env=clean_environment(settings),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]


@dataclass
class Run:
    airflow: Airflow
    run_id: str
    state: str
    tasks: dict[str, dict[str, Any]]  # task id -> task instance, from the REST API


@pytest.fixture(scope="module")
def run(
    tmp_path_factory: pytest.TempPathFactory, postgres: Cluster, spark_server: str
) -> Iterator[Run]:
    """The run DAG triggered once for bronze, on a running Airflow whose layer tasks are clients
    of a Spark server, and finished."""
    root = tmp_path_factory.mktemp("airflow-postgres")
    contracts = root / "contracts"
    contracts.mkdir()
    for topic in TOPICS:
        (contracts / f"{topic}.yaml").write_text(_contract(topic))
    settings = Settings.from_env(home=root / "lakehouse", contracts_dir=contracts)
    for topic in TOPICS:
        _produce(settings, topic)
    extra = NO_SCHEDULE | {SPARK_CONN_ENV: spark_server}
    with running_airflow(
        settings, root / "airflow-logs", postgres=postgres, extra_env=extra
    ) as airflow:
        airflow.wait_for_dag(RUN_DAG)
        airflow.set_paused(RUN_DAG, False)
        run_id = str(airflow.trigger(RUN_DAG, {"layers": ["bronze"]})["dag_run_id"])
        finished = airflow.wait_for_run(RUN_DAG, run_id, timeout=600)
        tasks = {t["task_id"]: t for t in airflow.task_instances(RUN_DAG, run_id)}
        yield Run(airflow, run_id, finished["state"], tasks)


def test_the_metadata_database_is_postgres(run: Run, postgres: Cluster) -> None:
    proc = subprocess.run(
        [str(AIRFLOW), "config", "get-value", "database", "sql_alchemy_conn"],
        env=run.airflow.env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    url = proc.stdout.strip()
    port = postgres.status().port
    assert url.startswith("postgresql+psycopg://lakehouse:"), url.split(":")[0]
    assert f"@127.0.0.1:{port}/airflow_" in url
    # The run Airflow reports is a row of dag_run in that database.
    with psycopg.connect(url.replace("postgresql+psycopg:", "postgresql:")) as conn:
        row = conn.execute(
            "SELECT dag_id, state FROM dag_run WHERE run_id = %s", (run.run_id,)
        ).fetchone()
    assert row == (RUN_DAG, run.state)


def test_independent_tasks_of_a_run_overlap(run: Run) -> None:
    bronze = [run.tasks[f"bronze__{topic}"] for topic in TOPICS]
    assert run.state == "success", {t: ti["state"] for t, ti in run.tasks.items()}
    assert [ti["state"] for ti in bronze] == ["success", "success"]
    # Left out by the run's Params: skipped, not run.
    assert {run.tasks[f"silver__{topic}"]["state"] for topic in TOPICS} == {"skipped"}
    (start_a, end_a), (start_b, end_b) = [
        (datetime.fromisoformat(ti["start_date"]), datetime.fromisoformat(ti["end_date"]))
        for ti in bronze
    ]
    # Each of the two bronze jobs started before the other one ended.
    assert start_a < end_b and start_b < end_a, (start_a, end_a, start_b, end_b)
