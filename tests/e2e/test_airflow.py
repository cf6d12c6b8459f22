"""Airflow itself: the DAG folder parses cleanly and cheaply, and the pipeline DAG runs end to end
through `airflow dags test` (SparkSubmitOperator -> spark-submit -> jobs/run_layer.py)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from lakehouse.airflow_env import airflow_environment
from lakehouse.config import REPO_ROOT, Settings
from lakehouse.storage import changes_arrow, read_arrow

pytestmark = pytest.mark.e2e

HEAVY = ("pyspark", "deltalake", "great_expectations", "polars", "pyarrow")

INSPECT_DAGS = Path(__file__).with_name("inspect_dags.py")


def _env(settings: Settings) -> dict[str, str]:
    return airflow_environment(settings)


def _lakehouse(
    settings: Settings, *args: str, timeout: int = 600
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(Path(sys.executable).parent / "lakehouse"), *args],
        env=_env(settings),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_dag_folder_parses_without_heavy_imports(settings: Settings) -> None:
    proc = subprocess.run(
        [sys.executable, str(INSPECT_DAGS), str(REPO_ROOT / "dags"), *HEAVY],
        env=_env(settings),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.split("RESULT", 1)[1])
    print(f"DAG folder parse time: {result['seconds']:.2f} s")
    assert result["errors"] == {}
    assert result["heavy"] == [], "DAG parsing must not import Spark, Delta or GX"
    dag = result["dags"]["pipeline__user-locations"]
    assert dag["tags"] == ["lakehouse", "topic:user-locations"]
    assert dag["max_active_runs"] == 1
    assert dag["doc"]
    tasks = dag["tasks"]
    assert tasks["bronze"]["downstream"] == ["silver", "watcher"]
    assert tasks["silver"]["downstream"] == ["gold", "watcher"]
    assert tasks["gold"]["downstream"] == ["report", "watcher"]
    assert tasks["report"]["downstream"] == ["watcher"]
    assert tasks["watcher"]["downstream"] == []
    jobs = [tasks[layer] for layer in ("bronze", "silver", "gold")]
    assert all(t["retries"] >= 1 and "SparkSubmitOperator" in t["bases"] for t in jobs)
    assert tasks["report"]["type"] == tasks["watcher"]["type"] == "PythonOperator"
    assert tasks["report"]["trigger_rule"] == "all_done"
    assert tasks["watcher"]["trigger_rule"] == "one_failed"
    assert tasks["bronze"]["outlets"] == ["bronze.user-locations"]
    assert tasks["silver"]["inlets"] == ["bronze.user-locations"]
    # The joins read the profiles stream too.
    assert tasks["gold"]["inlets"] == ["silver.user_locations", "silver.user_profile_changes"]
    assert sorted(tasks["gold"]["outlets"]) == [
        "gold.checkins_10m_every_5m",
        "gold.checkins_5m",
        "gold.checkins_near_profile_changes",
        "gold.checkins_with_profile",
        "gold.user_latest_location",
        "gold.user_location_counts",
        "gold.user_location_profile",
        "gold.user_moves",
        "gold.user_places",
        "gold.user_sessions",
    ]
    upkeep = result["dags"]["lakehouse__maintenance"]
    assert upkeep["schedule"] == "@daily" and upkeep["max_active_runs"] == 1
    assert upkeep["tags"] == ["lakehouse", "maintenance"]
    assert sorted(upkeep["tasks"]) == [
        "maintain__quality_ledger",
        "maintain__user-locations",
        "maintain__user-profiles",
    ]
    assert all(t["retries"] >= 1 for t in upkeep["tasks"].values())
    profiles = result["dags"]["pipeline__user-profiles"]["tasks"]
    assert profiles["silver"]["outlets"] == ["silver.user_profile_changes"]
    assert sorted(profiles["gold"]["outlets"]) == [
        "gold.user_profile_updates",
        "gold.user_profiles",
        "gold.users_per_city",
    ]


def test_pipeline_dag_runs_through_airflow(settings: Settings) -> None:
    assert _lakehouse(settings, "sample").returncode == 0
    migrate = _lakehouse(settings, "airflow", "db", "migrate")
    assert migrate.returncode == 0, migrate.stderr[-3000:]
    run = _lakehouse(settings, "airflow", "dags", "test", "pipeline__user-locations", timeout=900)
    log = run.stdout + run.stderr
    assert run.returncode == 0, log[-5000:]
    assert "state=success" in log
    for layer in (
        "bronze user-locations: batch 0 committed",
        "silver user_locations:",
        "gold user_latest_location:",
        # the gates' per-run summary, from the jobs and from the report task
        "quality silver.user_locations: 3/3 checks met on 5 rows",
        f"data quality of run {_run_id(log)}:",
    ):
        assert layer in log
    assert (settings.data_docs_root / "index.html").is_file()

    latest = read_arrow(settings.gold_path("user_latest_location")).to_pylist()
    assert sorted((r["username"], r["location"]) for r in latest) == [
        ("alice", "Berlin"),
        ("bob", "Lima"),
    ]
    counts = read_arrow(settings.gold_path("user_location_counts")).to_pylist()
    assert sorted((r["username"], r["count"]) for r in counts) == [("alice", 3), ("bob", 2)]
    feed = changes_arrow(settings.gold_path("user_location_counts")).to_pylist()
    assert sorted((r["_change_type"], r["username"]) for r in feed) == [
        ("insert", "alice"),
        ("insert", "bob"),
    ]

    shown = _lakehouse(settings, "show", "user_latest_location", "--format", "json")
    assert shown.returncode == 0, shown.stderr
    assert [json.loads(x) for x in shown.stdout.splitlines()] == [
        {"username": "alice", "location": "Berlin"},
        {"username": "bob", "location": "Lima"},
    ]


def test_maintenance_dag_runs_through_airflow(settings: Settings) -> None:
    """The daily DAG's tasks run `lakehouse maintain` per topic and for the ledger (on an empty
    lakehouse they find nothing to do, and succeed)."""
    assert _lakehouse(settings, "airflow", "db", "migrate").returncode == 0
    run = _lakehouse(settings, "airflow", "dags", "test", "lakehouse__maintenance", timeout=600)
    log = run.stdout + run.stderr
    assert run.returncode == 0, log[-5000:]
    assert re.search(r"DagRun Finished: dag_id=lakehouse__maintenance.*state=success", log)
    for task in ("maintain__user-locations", "maintain__user-profiles", "maintain__quality_ledger"):
        assert task in log


def _run_id(log: str) -> str:
    found = re.search(r"run_id=(\S+?),", log)
    assert found, log[-3000:]
    return found.group(1)


def test_failed_gate_fails_the_dag_run_and_publishes_nothing(
    settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A `fail` expectation on silver: the silver task fails naming the table, the expectation
    and the observed value; silver publishes nothing, gold does not run, the report is still
    built, and the DAG run ends failed."""
    contracts = tmp_path / "contracts"
    shutil.copytree(REPO_ROOT / "contracts", contracts)
    doc = (contracts / "user-locations.yaml").read_text()
    doc = doc.replace(
        "  silver:\n",
        "  silver:\n    - {name: berlin_only, expect: in_set, column: location, "
        "values: [Berlin], severity: fail}\n",
        1,
    )
    (contracts / "user-locations.yaml").write_text(doc)
    monkeypatch.setenv("LAKEHOUSE_CONTRACTS", str(contracts))
    settings = Settings.from_env(settings.home, contracts)
    assert _lakehouse(settings, "sample").returncode == 0
    assert _lakehouse(settings, "airflow", "db", "migrate").returncode == 0
    run = _lakehouse(settings, "airflow", "dags", "test", "pipeline__user-locations", timeout=900)
    log = run.stdout + run.stderr
    (settings.home / "dags-test.log").write_text(log)  # the whole log, for a failing assert
    assert re.search(r"DagRun Finished: .*state=failed", log), log[-5000:]
    assert re.search(
        r"silver table user_locations: quality gate failed, nothing published: berlin_only "
        r"\(in_set location\): 4 of 5 rows unexpected, e\.g\. Paris, Sydney, Rome",
        log,
    ), log[-5000:]
    assert read_arrow(settings.bronze_path("user-locations")).num_rows == 5
    assert not (settings.silver_path("user_locations") / "_delta_log").exists()
    assert not (settings.gold_path("user_latest_location") / "_delta_log").exists()
    assert f"data quality of run {_run_id(log)}:" in log
    assert "AirflowFailException" in log  # failed at once: the same batch would fail again
    assert (settings.data_docs_root / "index.html").is_file()


def test_avro_pipeline_dag_runs_through_airflow(settings: Settings) -> None:
    """The Avro topic under spark-submit: fastavro decodes in Spark's Python workers."""
    assert _lakehouse(settings, "sample", "--topic", "user-profiles").returncode == 0
    migrate = _lakehouse(settings, "airflow", "db", "migrate")
    assert migrate.returncode == 0, migrate.stderr[-3000:]
    run = _lakehouse(settings, "airflow", "dags", "test", "pipeline__user-profiles", timeout=900)
    log = run.stdout + run.stderr
    (settings.home / "dags-test.log").write_text(log)  # the whole log, for a failing assert
    assert run.returncode == 0, log[-5000:]
    summary = r"silver user_profile_changes: bronze versions \d+\.\.\d+ committed: 6 records"
    assert re.search(summary + ", 0 quarantined", log), log[-5000:]
    shown = _lakehouse(settings, "show", "user_profiles", "--format", "json")
    assert shown.returncode == 0, shown.stderr
    rows = [json.loads(x) for x in shown.stdout.splitlines()]
    assert [(r["username"], r["city"], r["email"]) for r in rows] == [
        ("alice", "Berlin", "alice@example.org"),
        ("bob", "Lima", None),
    ]
