"""Airflow itself: the DAG folder parses cleanly and cheaply, and the pipeline DAG runs end to end
through `airflow dags test`: its layer tasks as clients of a Spark server (the ``lakehouse_spark``
connection of type ``spark_connect``), and, with that connection of type ``spark``, as
spark-submits of jobs/run_layer.py."""

from __future__ import annotations

import html
import itertools
import json
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import openlineage_spec
from lakehouse.orchestration.airflow_env import SPARK_CONN_ENV, airflow_environment, airflow_secrets
from lakehouse.quality.ledger import read_ledger
from lakehouse.runtime import server
from lakehouse.runtime.config import REPO_ROOT, Settings
from lakehouse.runtime.process import free_port
from lakehouse.storage import changes_arrow, read_arrow
from mail_server import SENDER, smtp_server

pytestmark = pytest.mark.e2e

HEAVY = ("pyspark", "deltalake", "great_expectations", "polars", "pyarrow")

INSPECT_DAGS = Path(__file__).with_name("inspect_dags.py")

# The ``migrated`` fixture (conftest.py): gives a lakehouse a migrated SQLite metadata database.
Migrated = Callable[[Settings], None]


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


@pytest.fixture
def served(spark_server: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """The layer tasks are clients of the test process's Spark server; the connection's JSON."""
    monkeypatch.setenv(SPARK_CONN_ENV, spark_server)
    return spark_server


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
    chain = ["plan", "bronze", "gate_bronze", "silver", "gate_silver", "gold", "gate_gold"]
    # Each job also leads to the next job: a gate is skipped with its job, and the next job
    # must not run after a skipped gate whose job never ran because of a failure.
    nexts = {"bronze": ["silver"], "silver": ["gold"]}
    for task, after in itertools.pairwise([*chain, "report"]):
        assert tasks[task]["downstream"] == sorted([after, "watcher", *nexts.get(task, [])])
    assert tasks["report"]["downstream"] == ["watcher"]
    assert tasks["watcher"]["downstream"] == []
    jobs = [tasks[layer] for layer in ("bronze", "silver", "gold")]
    assert all(t["retries"] >= 1 and "SparkSubmitOperator" in t["bases"] for t in jobs)
    assert all(tasks[t]["trigger_rule"] == "none_failed" for t in ("bronze", "silver", "gold"))
    # A gate runs once its job is done, succeeded or failed.
    assert all(
        tasks[f"gate_{t}"]["trigger_rule"] == "one_done" for t in ("bronze", "silver", "gold")
    )
    assert tasks["report"]["type"] == tasks["watcher"]["type"] == "PythonOperator"
    assert tasks["report"]["trigger_rule"] == "all_done"
    assert tasks["watcher"]["trigger_rule"] == "one_failed"
    # A layer task emits events through its alias for the tables its batch changed; its gate
    # names the tables (so they are the DAG's assets from its first parse).
    assert tasks["bronze"]["outlets"] == ["lakehouse.bronze.user-locations"]
    assert tasks["gate_bronze"]["inlets"] == [
        "bronze.user-locations",
        "quarantine.bronze.user-locations",
    ]
    assert tasks["silver"]["outlets"] == ["lakehouse.silver.user-locations"]
    assert tasks["gate_silver"]["inlets"] == [
        "silver.user_locations",
        "quarantine.silver.user_locations",
    ]
    assert tasks["silver"]["inlets"] == ["bronze.user-locations"]
    assert tasks["gold"]["inlets"] == ["silver.user_locations"]
    own = [
        "gold.checkins_10m_every_5m",
        "gold.checkins_5m",
        "gold.user_latest_location",
        "gold.user_location_counts",
        "gold.user_moves",
        "gold.user_places",
        "gold.user_sessions",
    ]
    late = ["late.checkins_10m_every_5m", "late.checkins_5m", "late.user_sessions"]
    assert tasks["gold"]["outlets"] == ["lakehouse.gold.user-locations"]
    assert sorted(tasks["gate_gold"]["inlets"]) == own + late
    # The form of a triggered run: every field has a default (a scheduled run takes them).
    params = dag["params"]
    assert params["layers"]["default"] == ["bronze", "silver", "gold"]
    assert params["layers"]["items"]["enum"] == ["bronze", "silver", "gold"]
    assert params["dry_run"]["default"] is False
    assert params["full_refresh"]["items"]["enum"] == [  # declaration order
        "user_latest_location",
        "user_location_counts",
        "user_places",
        "user_moves",
        "checkins_5m",
        "checkins_10m_every_5m",
        "user_sessions",
    ]
    assert params["reprocess_silver_from_version"]["type"] == ["null", "integer"]
    assert params["reprocess_silver_from_offsets"]["default"] is None
    assert params["reprocess_gold_from_version"]["default"] is None
    # The joins live in their own DAG, scheduled on both streams' assets.
    joins = result["dags"]["joins__user-locations"]
    assert "silver.user_locations" in joins["schedule"]
    assert "silver.user_profile_changes" in joins["schedule"]
    assert joins["max_active_runs"] == 1 and "joins" in joins["tags"]
    jt = joins["tasks"]
    assert jt["plan"]["downstream"] == ["gold", "watcher"]
    assert jt["gold"]["downstream"] == ["gate_gold", "watcher"]
    assert jt["gold"]["inlets"] == ["silver.user_locations", "silver.user_profile_changes"]
    assert jt["gold"]["outlets"] == ["lakehouse.gold.user-locations.joins"]
    assert sorted(jt["gate_gold"]["inlets"]) == [
        "gold.checkins_near_profile_changes",
        "gold.checkins_with_profile",
        "gold.user_location_profile",
    ]
    assert sorted(joins["params"]) == ["dry_run", "full_refresh"]
    manual = result["dags"]["lakehouse__run"]
    assert manual["schedule"] == "None" and sorted(manual["params"]) == [
        "dry_run",
        "layers",
        "topics",
    ]
    assert manual["params"]["topics"]["default"] == ["user-locations", "user-profiles"]
    assert manual["tasks"]["gate_bronze__user-profiles"]["downstream"] == [
        "silver__user-locations",
        "silver__user-profiles",
        "watcher",
    ]
    assert manual["tasks"]["bronze__user-profiles"]["downstream"] == [
        "gate_bronze__user-profiles",
        "silver__user-locations",
        "silver__user-profiles",
        "watcher",
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
    assert profiles["gate_silver"]["inlets"] == [
        "silver.user_profile_changes",
        "quarantine.silver.user_profile_changes",
    ]
    assert sorted(profiles["gate_gold"]["inlets"]) == [
        "gold.user_city_history",
        "gold.user_profile_updates",
        "gold.user_profiles",
        "gold.users_per_city",
        "late.user_city_history",
    ]


@pytest.mark.s3
def test_pipeline_dag_runs_through_airflow_with_its_data_in_a_bucket(
    tmp_path: Path,
    s3_server: Any,
    shared_spark_server: Any,
    monkeypatch: pytest.MonkeyPatch,
    migrated: Migrated,
) -> None:
    """The deployment shape: the data in the test bucket, the layer tasks clients of a Spark
    server started with the store's settings (the one committing driver), credentials only in
    the processes' environment. The pipeline DAG runs each layer on the server and the quality
    report; the tables are in the bucket and nowhere else; the joins' own DAG builds them; no
    secret of the deployment (the store's key, Airflow's, the server's token) is in any task
    output, server log or report."""
    from lakehouse.runtime import objectstore

    for name, value in s3_server.env.items():
        monkeypatch.setenv(name, value)
    secret = s3_server.secret  # in the Spark server's environment too (shared_spark_server)
    monkeypatch.setenv("LAKEHOUSE_HOME", str(tmp_path / "lakehouse"))
    monkeypatch.setenv("LAKEHOUSE_CONTRACTS", str(REPO_ROOT / "contracts"))
    monkeypatch.setenv("LAKEHOUSE_DATA", f"s3://{s3_server.bucket}/airflow/{tmp_path.name}")
    monkeypatch.setenv(SPARK_CONN_ENV, shared_spark_server.connection)
    objectstore.reset()
    settings = Settings.from_env()
    port, token = shared_spark_server.port, shared_spark_server.token
    lineage = openlineage_spec.Receiver()
    monkeypatch.setenv("AIRFLOW__OPENLINEAGE__TRANSPORT", lineage.transport)
    try:
        lineage.__enter__()
        assert _lakehouse(settings, "sample").returncode == 0
        migrated(settings)
        run = _lakehouse(
            settings, "airflow", "dags", "test", "pipeline__user-locations", timeout=900
        )
        log = run.stdout + run.stderr
        assert run.returncode == 0 and "state=success" in log, log[-5000:]
        assert log.count(f"on the Spark server at localhost:{port}") == 3  # each layer
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
        counted = _lakehouse(settings, "show", "user_location_counts", "--format", "json")
        assert counted.returncode == 0, counted.stderr
        assert sorted(json.loads(x)["count"] for x in counted.stdout.splitlines()) == [2, 3]

        # Every table in the bucket; none under the home, which keeps this machine's state.
        assert isinstance(settings.tables_root, objectstore.ObjectPath)
        assert objectstore.is_dir(settings.bronze_path("user-locations") / "_delta_log")
        assert objectstore.is_dir(settings.ledger_path / "_delta_log")
        assert not (settings.home / "tables").exists()
        assert not list(settings.home.rglob("_delta_log"))

        # The joins are not the pipeline's: its gold step left them alone. Their own DAG (which
        # Airflow's scheduler runs when either stream's asset is updated) builds them; the
        # profiles stream does not exist yet, so each check-in is enriched with nulls.
        joined = settings.gold_path("checkins_with_profile")
        assert not objectstore.is_dir(joined / "_delta_log")
        joins = _lakehouse(
            settings, "airflow", "dags", "test", "joins__user-locations", timeout=900
        )
        joins_log = joins.stdout + joins.stderr
        assert joins.returncode == 0 and "state=success" in joins_log, joins_log[-5000:]
        enriched = read_arrow(joined).to_pylist()
        assert len(enriched) == 5 and all(r["profile_city"] is None for r in enriched), enriched

        # No secret of the deployment reaches the tasks' output (`dags test` prints every
        # task's log; the browser test checks the log files a scheduler writes), the server's
        # log or the reports.
        outputs = log + joins_log + shown.stdout + shown.stderr + counted.stdout + counted.stderr
        server_log = shared_spark_server.log.read_text(errors="replace")
        secrets = airflow_secrets(settings.airflow_home) | {"spark": token, "s3": secret}
        assert [name for name, value in secrets.items() if value in outputs] == []
        assert secret not in server_log
        docs = [p for p in settings.data_docs_root.rglob("*") if p.is_file()]
        assert docs and not [p for p in docs if secret.encode() in p.read_bytes()]

        # OpenLineage: the provider sent each task's events to the transport the deployment
        # configured, each valid by OpenLineage's published schemas, and the layer tasks'
        # column lineage draws the contracts' edges of these two DAGs: every one, no other.
        _check_lineage(settings, lineage, ("pipeline__user-locations", "joins__user-locations"))
        assert secret not in json.dumps(lineage.events)
        (silver_gate,) = lineage.of("pipeline__user-locations.gate_silver", "COMPLETE")
        (judged,) = silver_gate["inputs"]
        assert judged["namespace"] == f"s3://{s3_server.bucket}"
        checks = judged["inputFacets"]["dataQualityAssertions"]["assertions"]
        # The contract's two checks and the volume and freshness checks, all met, as the ledger
        # recorded them for this run.
        ledger = read_ledger(settings, dag_run_id=_run_id(log), layer="silver").to_pylist()
        recorded = {r["expectation"]: r["success"] for r in ledger if r["kind"] != "batch"}
        assert {a["name"]: a["success"] for a in checks} == recorded, (checks, recorded)
        assert set(recorded) == {"username_present", "location_length", "volume", "freshness"}
        assert all(recorded.values())
    finally:
        lineage.__exit__()
        objectstore.reset()


def _check_lineage(
    settings: Settings, lineage: openlineage_spec.Receiver, dags: tuple[str, ...]
) -> None:
    """Every event is valid OpenLineage; each layer and gate task of ``dags`` sent a START and a
    COMPLETE; the layer tasks' column lineage gives exactly the contracts' edges of ``dags``."""
    from lakehouse.contracts.catalog import Catalog
    from lakehouse.orchestration.lineage import LayerLineage

    assert lineage.events, "no OpenLineage event was received"
    for event in lineage.events:
        openlineage_spec.validate(event)
    found = LayerLineage(settings, Catalog.load(settings.contracts_dir))
    tasks = {(e.dag, e.task) for e in found.graph.edges if e.dag in dags}
    for dag, task in tasks:
        for job in (f"{dag}.{task}", f"{dag}.gate_{task}"):
            assert {e["eventType"] for e in lineage.of(job)} >= {"START", "COMPLETE"}, job
    named = {n: "/".join(found.naming.of(n)) for n in found.graph.nodes}
    want = {(named[e.source], named[e.target]) for e in found.graph.edges if e.dag in dags}
    completes = [e for dag, task in tasks for e in lineage.of(f"{dag}.{task}", "COMPLETE")]
    assert openlineage_spec.edges(completes) == want
    # And their datasets are exactly those the edges join: nothing more is read or written.
    datasets = {
        f"{d['namespace']}/{d['name']}"
        for e in completes
        for d in (*(e.get("inputs") or []), *(e.get("outputs") or []))
    }
    assert datasets == {name for edge in want for name in edge}


def test_params_dry_run_changes_nothing_and_layers_skip(
    settings: Settings, served: str, migrated: Migrated
) -> None:
    """Params given to a run (as the UI's trigger form sends them): a dry run says what each
    layer would read and creates or changes no table, and a run of some topics skips the
    others; a run limited to bronze skips the other layers and their gates; bad Params fail the
    plan task before any job starts."""
    assert _lakehouse(settings, "sample", "--topic", "user-profiles").returncode == 0
    migrated(settings)
    dag = "pipeline__user-profiles"

    def test(conf: dict[str, object]) -> str:
        run = _lakehouse(
            settings, "airflow", "dags", "test", dag, "-c", json.dumps(conf), timeout=900
        )
        return run.stdout + run.stderr

    # A dry run, here of the run DAG (which takes several topics at once; here one): each layer
    # says what it would read, and no table is created or changed.
    log = _lakehouse(
        settings, "airflow", "dags", "test", "lakehouse__run", "-c",
        json.dumps({"topics": ["user-profiles"], "dry_run": True}), timeout=900,
    )  # fmt: skip
    text = log.stdout + log.stderr
    assert re.search(r"DagRun Finished: .*state=success", text), text[-5000:]
    assert "bronze user-profiles (dry run): would read 2 segment(s)" in text
    assert "silver user_profile_changes (dry run): bronze has no new versions" in text
    assert "gold user_profiles (dry run): silver.user_profile_changes has no new versions" in text
    skipped = re.findall(r"reason=\"the run's Param topics leaves out (\S+)\"", text)
    assert skipped == ["user-locations"] * 3  # its three jobs (a dry run skips every gate)
    made = list(settings.home.rglob("_delta_log"))
    assert made == [], f"a dry run created tables: {made}"

    log = test({"layers": ["bronze"]})
    assert re.search(r"DagRun Finished: .*state=success", log), log[-5000:]
    assert "bronze user-profiles: batch 0 committed" in log
    assert (settings.bronze_path("user-profiles") / "_delta_log").is_dir()
    assert not (settings.silver_path("user_profile_changes") / "_delta_log").exists()
    skipped = re.findall(
        r"Skipping task\..*reason=\"the run's Param layers leaves out (\w+)\"", log
    )
    assert skipped == ["silver", "gold"]  # each layer's job (and its gate with it)

    # Airflow checks each Param against its schema before the run exists ...
    log = test({"full_refresh": ["no_such_table"]})
    assert "Invalid input for param full_refresh: 'no_such_table' is not one of" in log
    # ... and the plan task checks them together, before any job starts.
    log = test({"reprocess_silver_from_version": 1, "reprocess_silver_from_offsets": "0:1"})
    assert re.search(r"DagRun Finished: .*state=failed", log), log[-5000:]
    assert "reprocess_silver_from_offsets: give one or the other" in log
    assert not (settings.silver_path("user_profile_changes") / "_delta_log").exists()


def test_maintenance_dag_runs_through_airflow(settings: Settings, migrated: Migrated) -> None:
    """The daily DAG's tasks run `lakehouse maintain` per topic and for the ledger (on an empty
    lakehouse they find nothing to do, and succeed)."""
    migrated(settings)
    run = _lakehouse(settings, "airflow", "dags", "test", "lakehouse__maintenance", timeout=600)
    log = run.stdout + run.stderr
    assert run.returncode == 0, log[-5000:]
    assert re.search(r"DagRun Finished: dag_id=lakehouse__maintenance.*state=success", log)
    for task in ("maintain__user-locations", "maintain__user-profiles", "maintain__quality_ledger"):
        assert task in log


def _run_id(log: str) -> str:
    found = re.search(r"run_id='?([^',\s]+)", log)  # (some lines quote it)
    assert found, log[-3000:]
    return found.group(1)


def test_failed_gate_fails_the_dag_run_publishes_nothing_and_notifies(
    settings: Settings,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    served: str,
    migrated: Migrated,
) -> None:
    """A `fail` expectation on silver: the silver task fails naming the table, the expectation
    and the observed value; silver publishes nothing, gold does not run, the report is still
    built, and the DAG run ends failed. The contract asks to be told of warnings too
    (``quality.notify: warn``) and bronze fails a `warn` check: the SMTP server of the Airflow
    connection ``lakehouse_notify`` receives one message per failed gate, bronze's and
    silver's, each naming its table, expectation and what was seen, with the report's link."""
    contracts = tmp_path / "contracts"
    shutil.copytree(REPO_ROOT / "contracts", contracts)
    doc = (contracts / "user-locations.yaml").read_text()
    doc = doc.replace(
        "  silver:\n",
        "  silver:\n    - {name: berlin_only, expect: in_set, column: location, "
        "values: [Berlin], severity: fail}\n",
        1,
    )
    doc = doc.replace(
        "  bronze:\n",
        "  bronze:\n    - {name: busy_topic, expect: row_count_between, min: 100, severity: warn}\n",
        1,
    )
    doc = doc.replace("quality:\n", "quality:\n  notify: warn\n", 1)
    (contracts / "user-locations.yaml").write_text(doc)
    monkeypatch.setenv("LAKEHOUSE_CONTRACTS", str(contracts))
    settings = Settings.from_env(settings.home, contracts)
    assert _lakehouse(settings, "sample").returncode == 0
    migrated(settings)
    with smtp_server() as mail, openlineage_spec.Receiver() as lineage:
        monkeypatch.setenv(
            "AIRFLOW_CONN_LAKEHOUSE_NOTIFY", mail.connection("data@example.com, oncall@example.com")
        )
        monkeypatch.setenv("AIRFLOW__OPENLINEAGE__TRANSPORT", lineage.transport)
        run = _lakehouse(
            settings, "airflow", "dags", "test", "pipeline__user-locations", timeout=900
        )
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
    run_id = _run_id(log)
    assert f"data quality of run {run_id}:" in log
    assert "AirflowFailException" in log  # failed at once: the same batch would fail again
    assert (settings.data_docs_root / "index.html").is_file()

    assert [m.recipients for m in mail.received] == [
        ["data@example.com", "oncall@example.com"]
    ] * 2, log[-5000:]
    bronze, silver = mail.received
    assert bronze.message["From"] == SENDER
    assert bronze.subject == (
        "Data quality WARN: bronze.user-locations (busy_topic) in pipeline__user-locations"
    )
    assert silver.subject == (
        "Data quality FAIL: silver.user_locations (berlin_only) in pipeline__user-locations"
    )
    assert "<td>warn</td><td>busy_topic (row_count_between): observed 5 rows</td>" in bronze.html
    # The batch's version, as bronze's gate task reports it.
    version = re.search(r"bronze\.user-locations: .* published version\(s\) \[(\d+)\]", log)
    assert version, log[-5000:]
    assert f"The batch was published as version {version.group(1)}." in bronze.html
    assert (
        "<td>fail</td><td>berlin_only (in_set location): 4 of 5 rows unexpected, "
        "e.g. Paris, Sydney, Rome</td>"
    ) in silver.html
    assert "Nothing of the batch was published." in silver.html

    # OpenLineage: the silver job and its gate each sent a FAIL event; the gate's names the
    # table it judged and the failed assertion; gold never started.
    for event in lineage.events:
        openlineage_spec.validate(event)
    assert lineage.of("pipeline__user-locations.silver", "FAIL")
    (failed,) = lineage.of("pipeline__user-locations.gate_silver", "FAIL")
    (judged,) = failed["inputs"]
    assert judged["name"] == str(settings.silver_path("user_locations"))
    checks = judged["inputFacets"]["dataQualityAssertions"]["assertions"]
    (berlin,) = [a for a in checks if a["name"] == "berlin_only"]
    assert {k: berlin.get(k) for k in ("assertion", "success", "column", "severity")} == {
        "assertion": "in_set",
        "success": False,
        "column": "location",
        "severity": "error",
    }, berlin
    ledger = read_ledger(settings, dag_run_id=run_id, layer="silver").to_pylist()
    (recorded,) = [r for r in ledger if r["expectation"] == "berlin_only"]
    assert berlin.get("actual") == recorded["observed_value"], (berlin, recorded)
    assert not lineage.of("pipeline__user-locations.gold")
    assert "silver gate: 1 `fail` expectation(s) failed" in log
    for mail_ in (bronze, silver):
        assert f"DAG run <code>{html.escape(run_id)}</code>" in mail_.html
        assert (
            "Data-quality report: <a href='http://localhost:8080/plugin/lakehouse/data-quality/'>"
        ) in mail_.html


def test_avro_pipeline_dag_runs_through_airflow(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, migrated: Migrated
) -> None:
    """The Avro topic with the ``lakehouse_spark`` connection of type ``spark``: each layer is a
    spark-submit of jobs/run_layer.py (SparkSubmitOperator), for a cluster or a big backfill;
    fastavro decodes in Spark's Python workers."""
    monkeypatch.setenv(SPARK_CONN_ENV, json.dumps({"conn_type": "spark", "host": "local[2]"}))
    assert _lakehouse(settings, "sample", "--topic", "user-profiles").returncode == 0
    migrated(settings)
    with openlineage_spec.Receiver() as lineage:
        monkeypatch.setenv("AIRFLOW__OPENLINEAGE__TRANSPORT", lineage.transport)
        run = _lakehouse(
            settings, "airflow", "dags", "test", "pipeline__user-profiles", timeout=900
        )
    # The spark-submit path reports the same lineage as the Spark Connect one.
    _check_lineage(settings, lineage, ("pipeline__user-profiles",))
    log = run.stdout + run.stderr
    (settings.home / "dags-test.log").write_text(log)  # the whole log, for a failing assert
    assert run.returncode == 0, log[-5000:]
    assert "on the Spark server" not in log
    assert log.count("Spark-Submit cmd:") == 3, log[-5000:]
    summary = r"silver user_profile_changes: bronze versions \d+\.\.\d+ committed: 6 records"
    assert re.search(summary + ", 0 quarantined", log), log[-5000:]
    shown = _lakehouse(settings, "show", "user_profiles", "--format", "json")
    assert shown.returncode == 0, shown.stderr
    rows = [json.loads(x) for x in shown.stdout.splitlines()]
    assert [(r["username"], r["city"], r["email"]) for r in rows] == [
        ("alice", "Berlin", "alice@example.org"),
        ("bob", "Lima", None),
    ]


def _test_dag_mended(
    settings: Settings, dag_id: str, failure: str, mend: Callable[[str], None]
) -> tuple[int, str]:
    """`airflow dags test` of ``dag_id``, read as it runs: at the first line holding ``failure``
    (a task's try failing), ``mend(line)`` puts back what was missing, and the run goes on to
    its end (Airflow's retries). Its exit code and its whole log (also in the home's
    dags-test.log)."""
    cli = str(Path(sys.executable).parent / "lakehouse")
    run = subprocess.Popen(
        [cli, "airflow", "dags", "test", dag_id],
        env=_env(settings),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: list[str] = []
    try:
        assert run.stdout is not None
        for line in run.stdout:
            lines.append(line)
            if failure in line:
                break
        else:
            pytest.fail("the run ended before its task failed:\n" + "".join(lines[-80:]))
        mend(lines[-1])
        rest, _ = run.communicate(timeout=900)
    finally:
        if run.poll() is None:
            run.kill()
    log = "".join(lines) + rest
    (settings.home / "dags-test.log").write_text(log)
    return run.returncode, log


@pytest.mark.reliability  # an outage: make reliability's
@pytest.mark.heavy  # a Spark server of its own and Airflow's retry delay: about 4.5 minutes
def test_a_task_whose_server_is_down_fails_at_once_and_its_retry_succeeds(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, migrated: Migrated
) -> None:
    """No Spark server answers the ``lakehouse_spark`` connection: the bronze task's try fails
    at once (no minutes of client retries) saying how to start the server; once the server is
    started, Airflow's retry takes the batch and the run succeeds."""
    port = free_port()
    monkeypatch.setenv(server.PORT_ENV, str(port))
    assert _lakehouse(settings, "sample", "--topic", "user-profiles").returncode == 0
    migrated(settings)

    def start_server(line: str) -> None:
        assert "start it with `lakehouse spark start`" in line
        server.start(settings, only="pipeline")

    # The connection is to this lakehouse's own server, which is not running.
    down = f"no Spark server answers at localhost:{port}"
    try:
        code, log = _test_dag_mended(settings, "pipeline__user-profiles", down, start_server)
    finally:
        server.stop(settings)
    assert code == 0 and re.search(r"DagRun Finished: .*state=success", log), log[-5000:]
    assert "bronze user-profiles: batch 0 committed" in log
    assert f"on the Spark server at localhost:{port}" in log
    assert read_arrow(settings.gold_path("user_profiles")).num_rows == 2


BROKER_TOPIC_CONTRACT = """\
topic: kb-orders
description: Orders from a Kafka broker that is down when the run starts.
partitions: 2
key: {{format: string, name: customer}}
value: {{format: json, fields: [{{name: amount, type: long}}]}}
stream: {{name: kb_orders}}
tables:
  - {{name: kb_order_totals, kind: aggregate, aggregations: [{{name: total, fn: sum, field: amount}}]}}
kafka: {{topic: kb-orders, bootstrap_servers: '{servers}'}}
"""


@pytest.mark.reliability  # an outage: make reliability's
@pytest.mark.heavy  # a broker of its own and Airflow's retry delay: about 3 minutes
def test_a_task_whose_broker_is_down_fails_and_its_retry_succeeds(
    settings: Settings,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    served: str,
    migrated: Migrated,
) -> None:
    """A Kafka-sourced topic whose broker stopped after records were produced: the bronze task's
    try fails naming the broker and how to start it, having committed nothing; once the broker
    is back on its storage, Airflow's retry ingests the records and the run succeeds."""
    from lakehouse.contracts.catalog import Catalog
    from lakehouse.runtime.broker import Broker
    from lakehouse.runtime.process import free_port
    from lakehouse.topics import kafka
    from lakehouse.topics.landing import Record

    servers = f"127.0.0.1:{free_port()}"
    contracts = tmp_path / "contracts"
    contracts.mkdir()
    (contracts / "kb-orders.yaml").write_text(BROKER_TOPIC_CONTRACT.format(servers=servers))
    monkeypatch.setenv("LAKEHOUSE_CONTRACTS", str(contracts))
    settings = Settings.from_env(settings.home, contracts)
    client = kafka.client(settings, Catalog.load(contracts).topic("kb-orders"))
    broker = Broker(tmp_path / "kafka")
    port = int(servers.rsplit(":", 1)[1])
    bronze = settings.bronze_path("kb-orders")

    def start_broker(line: str) -> None:
        assert "nothing was read or committed" in line and "lakehouse kafka start" in line, line
        assert not bronze.exists()
        broker.start(port)

    try:
        broker.start(port)
        kafka.create_topic(client, 2)
        records = [
            Record(f"c{i % 3}".encode(), json.dumps({"amount": i}).encode()) for i in range(10)
        ]
        kafka.Producer(client, 2).send_batch(records)
        broker.stop()
        migrated(settings)
        down = f"the broker at {servers} did not answer"
        code, log = _test_dag_mended(settings, "pipeline__kb-orders", down, start_broker)
    finally:
        broker.stop()
    assert code == 0 and re.search(r"DagRun Finished: .*state=success", log), log[-5000:]
    assert "BrokerUnavailableError" in log
    assert "bronze kb-orders: batch 0 committed: 10 records from Kafka topic kb-orders" in log
    offsets = read_arrow(bronze).select(["partition", "offset"]).to_pylist()
    assert len(offsets) == 10 and len({(r["partition"], r["offset"]) for r in offsets}) == 10
    totals = read_arrow(settings.gold_path("kb_order_totals")).to_pylist()
    assert sorted(r["total"] for r in totals) == [12, 15, 18]
