"""The dbt project in ``analytics/`` as its users run it: the pipeline fills gold from the shipped
sample topic, then the real dbt CLI (``.venv-dbt``, ``make dbt``) builds and tests the models
through the SQL endpoint (HiveServer2 protocol) with dbt-spark's ``thrift`` method; the models
are read back through the endpoint and compared with the gold tables. Bad data that reaches gold
then makes ``dbt build`` fail on the test that guards against it.

The endpoint is the platform's (:func:`sql_endpoint`): the readers' server's HiveServer2 service,
logged in to with the readers' credential, which may build in dbt's own schema and change
nothing of the pipeline's; host, port, user and password are the four things dbt's profile takes
from the environment."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import openlineage_spec
from lakehouse.runtime import readers, server
from lakehouse.runtime.config import REPO_ROOT, Settings
from lakehouse.runtime.metastore import PIPELINE_SCHEMAS
from lakehouse.runtime.process import free_port
from lakehouse.runtime.spark import OPENLINEAGE_URL_ENV
from lakes import lakehouse, row_order, rows, shipped_topic

pytestmark = pytest.mark.integration

PROJECT = REPO_ROOT / "analytics"
DBT_VENV = REPO_ROOT / ".venv-dbt"
DBT = DBT_VENV / "bin" / "dbt"
DBT_OL = DBT_VENV / "bin" / "dbt-ol"  # openlineage-dbt: dbt, then its OpenLineage events
# The gold tables the project's models read.
GOLD = ("user_latest_location", "user_location_counts", "user_places")
SCHEMA = "analytics"


@dataclass(frozen=True)
class Endpoint:
    """Where a HiveServer2 client reaches the lakehouse's tables, and as whom."""

    host: str
    port: int
    user: str
    password: str


@contextlib.contextmanager
def sql_endpoint(settings: Settings) -> Iterator[Endpoint]:
    """The platform's own SQL endpoint on the lakehouse of ``settings``, for the length of the
    ``with``: the readers' server that ``lakehouse spark start`` starts beside the pipeline's
    (a JVM of its own, reading the pipeline server's catalog), logged in to with the readers'
    credential (``lakehouse spark reader``), as a person or a BI tool would. The servers are
    stopped on the way out, whatever happened."""
    from lakehouse.runtime import server

    server.start(settings)
    try:
        reader = server.reader(settings)
        yield Endpoint(reader.host, reader.port, reader.user, reader.password)
    finally:
        server.stop(settings)


@dataclass(frozen=True)
class Build:
    """One dbt command's outcome: its exit code, its output, and its run_results.json."""

    returncode: int
    output: str
    results: dict[str, dict[str, Any]]  # by node id: status, failures, message

    def statuses(self) -> dict[str, str]:
        """Each node's status (success, pass, fail, error, skipped), by node id."""
        return {node: result["status"] for node, result in self.results.items()}


def dbt(
    endpoint: Endpoint,
    target: Path,
    *args: str,
    env: Mapping[str, str] | None = None,
    command: Path = DBT,
) -> Build:
    """Run the real dbt CLI (or ``command``, e.g. dbt-ol) on the project against ``endpoint``,
    its artifacts and logs under ``target``, and read what its run_results.json says of every
    node."""
    target.mkdir(parents=True, exist_ok=True)
    run_results = target / "target" / "run_results.json"
    run_results.unlink(missing_ok=True)
    environment = {
        # dbt's environment first, as after `source .venv-dbt/bin/activate` (dbt-ol runs `dbt`).
        "PATH": os.pathsep.join((str(DBT_VENV / "bin"), os.environ.get("PATH", ""))),
        "HOME": str(target),
        "LAKEHOUSE_SQL_HOST": endpoint.host,
        "LAKEHOUSE_SQL_PORT": str(endpoint.port),
        "LAKEHOUSE_SQL_USER": endpoint.user,
        "LAKEHOUSE_SQL_PASSWORD": endpoint.password,
        **(env or {}),
    }
    done = subprocess.run(
        [
            str(command),
            *args,
            "--project-dir",
            str(PROJECT),
            "--profiles-dir",
            str(PROJECT),
            "--target-path",
            str(target / "target"),
            "--log-path",
            str(target / "logs"),
        ],
        env=environment,
        cwd=target,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    output = done.stdout + done.stderr
    results = {}
    if run_results.exists():
        results = {r["unique_id"]: r for r in json.loads(run_results.read_text())["results"]}
    return Build(done.returncode, output, results)


def query(endpoint: Endpoint, sql: str) -> list[tuple[Any, ...]]:
    """``sql``'s rows through the endpoint, read by PyHive (dbt-spark's own client, in
    ``.venv-dbt``) in a process of its own, in :func:`lakes.row_order` (values a JSON document
    holds: a timestamp as its text)."""
    code = """
import json, sys
from pyhive import hive
host, port, user, password, sql = json.loads(sys.argv[1])
with hive.connect(host=host, port=port, username=user, password=password, auth="CUSTOM") as c:
    cursor = c.cursor()
    cursor.execute(sql)
    print(json.dumps(cursor.fetchall(), default=str))
"""
    given = json.dumps([endpoint.host, endpoint.port, endpoint.user, endpoint.password, sql])
    done = subprocess.run(
        [str(DBT_VENV / "bin" / "python"), "-c", code, given],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return sorted((tuple(r) for r in json.loads(done.stdout)), key=row_order)


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Settings]:
    """The shipped user-locations topic's sample through every layer (a Spark of its own), its
    three gold tables the models read, and every table named in the embedded metastore."""
    if not DBT.exists():
        pytest.fail(f"{DBT} is missing: `make dbt` installs the dbt project's environment")
    root = tmp_path_factory.mktemp("dbt")
    contracts = shipped_topic(root / "contracts", "user-locations", GOLD)
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("LAKEHOUSE_METASTORE", raising=False)  # the embedded Derby
        mp.setenv("LAKEHOUSE_HOME", str(root / "lakehouse"))
        mp.setenv("LAKEHOUSE_CONTRACTS", str(contracts))
        # A server of this lake's own, on ports of its own.
        mp.setenv(server.PORT_ENV, str(free_port()))
        mp.setenv(readers.PORT_ENV, str(free_port()))
        mp.setenv(readers.SQL_PORT_ENV, str(free_port()))
        settings = Settings.from_env()
        assert _lakehouse(settings, "sample").returncode == 0
        # The batch with OpenLineage's Spark listener turned on, as a deployment may.
        with openlineage_spec.Receiver() as spark_lineage:
            mp.setenv(OPENLINEAGE_URL_ENV, spark_lineage.url)
            done = _lakehouse(settings, "run", "--topic", "user-locations")
            assert done.returncode == 0, done.stderr[-3000:]
            mp.delenv(OPENLINEAGE_URL_ENV)
        SPARK_EVENTS[:] = spark_lineage.events
        done = _lakehouse(settings, "catalog", "sync")
        assert done.returncode == 0, done.stderr[-3000:]
        yield settings


# What OpenLineage's Spark listener sent during the lake's batch.
SPARK_EVENTS: list[dict[str, Any]] = []


def test_sparks_own_listener_reports_each_write_by_location_but_not_by_task(
    lake: Settings,
) -> None:
    """The option docs/airflow.md describes: with LAKEHOUSE_SPARK_OPENLINEAGE_URL, every Spark
    action of the batch is an OpenLineage run (valid by the published schemas), whose outputs
    name the tables by location as the layer tasks' events do; its jobs are named after the
    Spark application and the operation, not after any DAG task (a Spark session has no task
    identity), and the ledger shows up beside the contract's tables."""
    from lakehouse.contracts.catalog import Catalog
    from lakehouse.orchestration.lineage import LayerLineage

    assert SPARK_EVENTS, "the listener sent nothing"
    for event in SPARK_EVENTS:
        openlineage_spec.validate(event, known_only=False)
    written = {(o["namespace"], o["name"]) for e in SPARK_EVENTS for o in e.get("outputs") or []}
    found = LayerLineage(lake, Catalog.load(lake.contracts_dir))
    # Appends are named by location (bronze and silver, the ledger the contracts' graph leaves
    # out); a Delta MERGE is a run without datasets (seen here: openlineage-spark 1.53 on Spark
    # 4.2 and Delta 4.4), so the gold tables, written by MERGE, are missing from its graph, and
    # nothing it names is named otherwise than the layer tasks name it.
    appended = {found.naming.of(n) for n in ("bronze.user-locations", "silver.user_locations")}
    assert appended <= written, (appended - written, written)
    assert ("file", str(lake.ledger_path)) in written
    merges = [e for e in SPARK_EVENTS if ".execute_merge_into_command" in e["job"]["name"]]
    assert merges and not [e for e in merges if e.get("outputs")], merges
    gold = {found.naming.of(t) for t in found.graph.nodes if found.graph.nodes[t].kind == "gold"}
    assert not {w for w in written if "/tables/gold/" in w[1]} - gold
    jobs = {e["job"]["name"] for e in SPARK_EVENTS}
    assert not [j for j in jobs if j.startswith(("pipeline__", "joins__"))], jobs


def _lakehouse(settings: Settings, *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    env = {"LAKEHOUSE_CONTRACTS": str(settings.contracts_dir)}
    for name in ("LAKEHOUSE_SHUFFLE_PARTITIONS", "LAKEHOUSE_SPARK_CODEGEN", OPENLINEAGE_URL_ENV):
        if name in os.environ:
            env[name] = os.environ[name]
    if not stdin:
        return lakehouse(settings.home, *args, env=env, timeout=600)
    clean = {k: v for k, v in os.environ.items() if not k.startswith("LAKEHOUSE_")}
    return subprocess.run(
        [sys.executable, "-m", "lakehouse.cli", "--home", str(settings.home), *args],
        env=clean | env,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def _named(statuses: Mapping[str, str]) -> dict[str, str]:
    """``statuses`` by node name (a test's without the hash dbt ends its id with), the
    project's hooks left out."""
    return {
        (node.rsplit(".", 1)[0] if node.startswith("test.") else node).split(".", 2)[-1]: status
        for node, status in statuses.items()
        if not node.startswith("operation.")
    }


MODELS = {"user_summary", "users_by_location"}
# Every test of the project, by name: on the gold source and on the models.
TESTS = {
    "source_unique_gold_user_latest_location_username",
    "source_not_null_gold_user_latest_location_username",
    "unique_user_summary_username",
    "not_null_user_summary_username",
    "relationships_user_summary_username__username__source_gold_user_latest_location_",
    "not_null_user_summary_current_location",
    "accepted_values_user_summary_mobility__resident__traveller",
    "unique_users_by_location_location",
    "not_null_users_by_location_location",
}
SUMMARY = (
    "SELECT username, current_location, checkins, distinct_places, first_place, mobility "
    f"FROM {SCHEMA}.user_summary"
)


def _check_dbt_lineage(
    lake: Settings, endpoint: Endpoint, lineage: openlineage_spec.Receiver
) -> None:
    """dbt-ol's events are valid OpenLineage; each model's run reads the gold tables and models
    its SQL names, named as the pipeline's own events name those tables in their symlinks, so
    that a backend joins the two graphs at the gold tables."""
    from lakehouse.contracts.catalog import Catalog
    from lakehouse.orchestration.lineage import LayerLineage

    for event in lineage.events:
        openlineage_spec.validate(event, known_only=False)
    found = LayerLineage(lake, Catalog.load(lake.contracts_dir))
    where = f"spark://{endpoint.host}:{endpoint.port}"
    read: dict[str, set[tuple[str, str]]] = {}
    for event in lineage.events:
        if event["eventType"] != "COMPLETE":
            continue
        for output in event.get("outputs") or []:
            ins = {(i["namespace"], i["name"]) for i in event.get("inputs") or []}
            read.setdefault(output["name"], set()).update(ins)
    summary = next(v for k, v in read.items() if k.endswith("user_summary"))
    assert summary == {found.naming.symlink(t) for t in GOLD}, summary
    assert {n for n, _ in summary} == {where}
    by_location = next(v for k, v in read.items() if k.endswith("users_by_location"))
    assert by_location == {(where, f"{SCHEMA}.user_summary")}, by_location


def test_dbt_builds_and_tests_its_models_on_gold_then_fails_on_bad_data(
    lake: Settings, tmp_path: Path
) -> None:
    with sql_endpoint(lake) as endpoint, openlineage_spec.Receiver() as lineage:
        # Through openlineage-dbt's wrapper, as a deployment that reports lineage runs it.
        built = dbt(
            endpoint,
            tmp_path / "dbt",
            "build",
            env={"OPENLINEAGE_URL": lineage.url, "OPENLINEAGE_NAMESPACE": "analytics"},
            command=DBT_OL,
        )
        assert built.returncode == 0, built.output[-5000:]
        _check_dbt_lineage(lake, endpoint, lineage)
        # Every model built and every test passed.
        assert _named(built.statuses()) == {
            **dict.fromkeys(MODELS, "success"),
            **dict.fromkeys(TESTS, "pass"),
        }

        # The models, read back through the endpoint, say what the gold tables say.
        latest = dict(rows(lake.gold_path("user_latest_location"), "username", "location"))
        counts = dict(rows(lake.gold_path("user_location_counts"), "username", "count"))
        places = {
            user: (n, first)
            for user, n, first in rows(
                lake.gold_path("user_places"), "username", "places", "first_place"
            )
        }
        assert latest == {"alice": "Berlin", "bob": "Lima"}
        assert query(endpoint, SUMMARY) == sorted(
            (
                user,
                at,
                counts[user],
                *places[user],
                "traveller" if places[user][0] > 1 else "resident",
            )
            for user, at in latest.items()
        )
        by_location = f"SELECT location, users FROM {SCHEMA}.users_by_location"
        assert query(endpoint, by_location) == [("Berlin", 1), ("Lima", 1)]
        # Both in dbt's own schema: the table a Delta table (its history is Delta's).
        assert query(endpoint, f"SHOW TABLES IN {SCHEMA}") == [
            (SCHEMA, "user_summary", False),
            (SCHEMA, "users_by_location", False),
        ]
        history = query(endpoint, f"DESCRIBE HISTORY {SCHEMA}.user_summary")
        assert [r[4] for r in history] == ["CREATE OR REPLACE TABLE AS SELECT"], history

        # A profile that names a pipeline schema is refused before anything is written.
        gold_history = query(endpoint, "DESCRIBE HISTORY gold.user_latest_location")
        refused = dbt(endpoint, tmp_path / "dbt", "build", env={"LAKEHOUSE_DBT_SCHEMA": "gold"})
        assert refused.returncode != 0
        assert (
            "the lakehouse's pipeline owns the schemas " + ", ".join(PIPELINE_SCHEMAS)
            in refused.output
        )
        assert "Set LAKEHOUSE_DBT_SCHEMA to another name" in refused.output
        assert query(endpoint, "SHOW TABLES IN gold") == [
            ("gold", table, False) for table in sorted(GOLD)
        ]
        assert query(endpoint, "DESCRIBE HISTORY gold.user_latest_location") == gold_history

        # Bad data reaches gold: a check-in without a location (the contract lets it through:
        # the field is nullable). The pipeline runs while the endpoint serves.
        bad = '{"key": "carol", "value": {"location": null}}\n'
        for args, stdin in (
            (("produce", "user-locations"), bad),
            (("run", "--topic", "user-locations"), ""),
        ):
            done = _lakehouse(lake, *args, stdin=stdin)
            assert done.returncode == 0, done.stderr[-3000:]
        gold_rows = rows(lake.gold_path("user_latest_location"), "username", "location")
        assert ("carol", None) in gold_rows

        failed = dbt(endpoint, tmp_path / "dbt", "build")
        assert failed.returncode == 1, failed.output[-5000:]
        statuses = _named(failed.statuses())
        assert statuses.pop("not_null_user_summary_current_location") == "fail"
        # What comes after the failed test is not built; everything else passed as before.
        for downstream in (
            "users_by_location",
            "unique_users_by_location_location",
            "not_null_users_by_location_location",
        ):
            assert statuses.pop(downstream) == "skipped"
        assert set(statuses.values()) == {"pass", "success"}, statuses
        (failure,) = (
            r for n, r in failed.results.items() if "not_null_user_summary_current_location" in n
        )
        assert failure["failures"] == 1
        # dbt tests a model after building it: the table has the row its test refused, in a
        # second version of its history.
        assert [r[:2] for r in query(endpoint, SUMMARY)] == gold_rows
        history = query(endpoint, f"DESCRIBE HISTORY {SCHEMA}.user_summary")
        assert sorted(r[0] for r in history) == [0, 1]
