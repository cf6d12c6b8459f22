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

from lakehouse.runtime import readers, server
from lakehouse.runtime.config import REPO_ROOT, Settings
from lakehouse.runtime.metastore import PIPELINE_SCHEMAS
from lakehouse.runtime.process import free_port
from lakes import lakehouse, row_order, rows, shipped_topic

pytestmark = pytest.mark.integration

PROJECT = REPO_ROOT / "analytics"
DBT_VENV = REPO_ROOT / ".venv-dbt"
DBT = DBT_VENV / "bin" / "dbt"
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
    endpoint: Endpoint, target: Path, *args: str, env: Mapping[str, str] | None = None
) -> Build:
    """Run the real dbt CLI on the project against ``endpoint``, its artifacts and logs under
    ``target``, and read what its run_results.json says of every node."""
    target.mkdir(parents=True, exist_ok=True)
    run_results = target / "target" / "run_results.json"
    run_results.unlink(missing_ok=True)
    environment = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": str(target),
        "LAKEHOUSE_SQL_HOST": endpoint.host,
        "LAKEHOUSE_SQL_PORT": str(endpoint.port),
        "LAKEHOUSE_SQL_USER": endpoint.user,
        "LAKEHOUSE_SQL_PASSWORD": endpoint.password,
        **(env or {}),
    }
    done = subprocess.run(
        [
            str(DBT),
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
        for args in (("sample",), ("run", "--topic", "user-locations"), ("catalog", "sync")):
            done = _lakehouse(settings, *args)
            assert done.returncode == 0, done.stderr[-3000:]
        yield settings


def _lakehouse(settings: Settings, *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    env = {"LAKEHOUSE_CONTRACTS": str(settings.contracts_dir)}
    for name in ("LAKEHOUSE_SHUFFLE_PARTITIONS", "LAKEHOUSE_SPARK_CODEGEN"):
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


def test_dbt_builds_and_tests_its_models_on_gold_then_fails_on_bad_data(
    lake: Settings, tmp_path: Path
) -> None:
    with sql_endpoint(lake) as endpoint:
        built = dbt(endpoint, tmp_path / "dbt", "build")
        assert built.returncode == 0, built.output[-5000:]
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
