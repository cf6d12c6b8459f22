"""Every table by name in the metastore (`lakehouse catalog list | sync | drop`), read on the
Spark server: names given when the server creates a table, and by `catalog sync` to a lake made
without them; a column a write adds is in the named table; names outlive a server restart.

Clients run in their own processes (see test_spark_server.py: a Connect session switches its
whole process to Connect)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from lakehouse.contracts.catalog import Catalog
from lakehouse.pipeline.lake import tables
from lakehouse.runtime import server
from lakehouse.runtime.config import REPO_ROOT, Settings
from lakehouse.runtime.postgres import Cluster
from lakehouse.runtime.process import free_port
from lakehouse.storage import is_table, metastore
from lakes import DEMO_TABLES, shipped_topic

pytestmark = pytest.mark.integration

# What a reader's session does: names, rows, history, changes.
_READER = """
import json
from lakehouse.runtime import server
from lakehouse.runtime.config import Settings
spark = server.connect(Settings.from_env())
out = {{
    "schemas": sorted(r[0] for r in spark.sql("SHOW SCHEMAS").collect()),
    "gold": sorted(r["tableName"] for r in spark.sql("SHOW TABLES IN gold").collect()),
    "rows": sorted([r["username"], r["location"]]
                   for r in spark.table("gold.user_latest_location").collect()),
    "history": [r["operation"] for r in
                spark.sql("DESCRIBE HISTORY gold.user_latest_location").collect()],
    "changes": sorted([r["username"], r["_change_type"]] for r in
                      spark.sql("SELECT * FROM table_changes('gold.user_latest_location', 1)")
                      .collect()),
    "bronze": spark.table("bronze.user_locations").count(),
    "ledger": spark.table("quality.ledger").count() > 0,
    "extra": {extra!r},
}}
for name in {extra!r}:
    out[name] = spark.table(name).count()
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Settings]:
    """A lakehouse whose JSON topic ran through every layer in a Spark of its own (an in-memory
    catalog: a lake as it was before the metastore), with the Avro topic's records waiting, and
    no server running yet."""
    root = tmp_path_factory.mktemp("catalog")
    contracts = shipped_topic(root / "contracts", "user-locations", DEMO_TABLES)
    shipped_topic(contracts, "user-profiles", ("user_profiles",))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LAKEHOUSE_HOME", str(root / "lakehouse"))
        mp.setenv("LAKEHOUSE_CONTRACTS", str(contracts))
        mp.setenv(server.PORT_ENV, str(free_port()))
        mp.delenv("LAKEHOUSE_METASTORE", raising=False)
        settings = Settings.from_env()
        _lakehouse(settings, "sample")
        done = _lakehouse(settings, "run", "--topic", "user-locations")
        assert "in a Spark of its own" in done.stderr
        try:
            yield settings
        finally:
            server.stop(settings)


def _process(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != server.TOKEN_ENV}
    return subprocess.run(
        [sys.executable, *args], env=env, capture_output=True, text=True, timeout=600, check=False
    )


def _lakehouse(settings: Settings, *args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
    done = _process("-m", "lakehouse.cli", *args)
    if ok:
        assert done.returncode == 0, done.stderr[-3000:]
    return done


def _read(extra: tuple[str, ...] = ()) -> dict[str, object]:
    done = _process("-c", _READER.format(extra=list(extra)))
    assert done.returncode == 0, done.stderr[-3000:]
    return dict(json.loads(done.stdout.splitlines()[-1]))


def _names(settings: Settings) -> dict[str, str]:
    done = _lakehouse(settings, "catalog", "list")
    return dict(line.split("  ", 1) for line in done.stdout.splitlines())


def test_names_through_sync_pipeline_runs_schema_changes_restarts_and_drop(
    lake: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    server.start(lake, only="pipeline")
    # A lake made before the catalog has no names yet.
    assert _names(lake) == {}

    synced = _lakehouse(lake, "catalog", "sync").stdout
    gold = lake.gold_path("user_latest_location")
    assert f"registered  gold.user_latest_location  {gold}" in synced
    names = _names(lake)
    assert names["bronze.user_locations"] == f"file:{lake.bronze_path('user-locations')}"
    assert names["silver.user_locations"] == f"file:{lake.silver_path('user_locations')}"
    # Every table on storage, and only those (no record was quarantined: no quarantine table).
    on_storage = [
        t.path for t in tables(lake, Catalog.load(lake.contracts_dir)) if is_table(t.path)
    ]
    assert sorted(names) == sorted(str(metastore.table_name(lake.data_root, p)) for p in on_storage)
    assert names["quality.ledger"] == f"file:{lake.ledger_path}"

    seen = _read()
    assert {"bronze", "silver", "gold", "quality"} <= set(seen["schemas"])  # type: ignore[arg-type]
    assert seen["gold"] == sorted(DEMO_TABLES)
    assert seen["rows"] == [["alice", "Berlin"], ["bob", "Lima"]]
    assert seen["history"][-1] == "CREATE TABLE"  # type: ignore[index]
    assert ["alice", "insert"] in seen["changes"]  # type: ignore[operator]
    assert seen["bronze"] == 5 and seen["ledger"] is True

    # A second sync finds every name in place.
    again = _lakehouse(lake, "catalog", "sync").stdout.splitlines()
    assert again and all(line.startswith("kept") for line in again)

    # A pipeline run on the server names the tables it creates, with no sync.
    _lakehouse(lake, "run", "--topic", "user-profiles")
    names = _names(lake)
    assert {"bronze.user_profiles", "silver.user_profile_changes", "gold.user_profiles"} <= set(
        names
    )
    assert names["schemas.registry"] == f"file:{lake.registry_path}"

    # A column a write adds is in the named table (Delta reads its schema from the log).
    evolve = """
from pyspark.sql import functions as F
from lakehouse.runtime import server
from lakehouse.runtime.config import Settings
from lakehouse.storage import delta_spark
spark = server.connect(Settings.from_env())
path = Settings.from_env().gold_path("user_profiles")
rows = spark.table("gold.user_profiles").limit(1).withColumn("nickname", F.lit("al"))
delta_spark.append(rows, path, schema_mode="add_columns")
print(spark.table("gold.user_profiles").columns[-1])
"""
    done = _process("-c", evolve)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines()[-1] == "nickname"

    # The names outlive the server (restarted on a port of its own: the old one may have been
    # taken meanwhile by any process of the machine).
    server.stop(lake)
    monkeypatch.setenv(server.PORT_ENV, str(free_port()))
    server.start(lake, only="pipeline")
    seen = _read(("gold.user_profiles", "silver.user_profile_changes"))
    assert seen["rows"] == [["alice", "Berlin"], ["bob", "Lima"]]
    assert seen["gold.user_profiles"] == 3  # two users and the row the column came with

    # Drop removes the name only.
    dropped = _lakehouse(lake, "catalog", "drop", "gold.user_location_counts").stdout
    assert str(lake.gold_path("user_location_counts")) in dropped
    assert "gold.user_location_counts" not in _names(lake)
    assert is_table(lake.gold_path("user_location_counts"))
    unknown = _lakehouse(lake, "catalog", "drop", "gold.user_location_counts", ok=False)
    assert unknown.returncode == 1
    assert "no table gold.user_location_counts in the metastore" in unknown.stderr
    # ... and a sync gives it back.
    assert "registered  gold.user_location_counts" in _lakehouse(lake, "catalog", "sync").stdout


def test_a_name_taken_by_a_table_elsewhere_stops_the_creation(lake: Settings) -> None:
    """A name the metastore gives to a table at another location (a lake moved, or two topics
    whose names become one identifier) is not taken over by a new table: the creation stops
    with a message saying where the name points and what to run."""
    server.start(lake, only="pipeline")
    elsewhere = lake.home / "elsewhere" / "t"
    code = f"""
from pathlib import Path
from lakehouse.errors import LakehouseError
from lakehouse.runtime import server
from lakehouse.runtime.config import Settings
from lakehouse.storage import delta_spark, metastore
settings = Settings.from_env()
spark = server.connect(settings)
rows = spark.range(3).withColumnRenamed("id", "n")
delta_spark.create_table(spark, Path({str(elsewhere)!r}), rows.schema)
metastore.register(spark, metastore.TableName("gold", "taken"), Path({str(elsewhere)!r}))
try:
    delta_spark.create_table(spark, settings.gold_path("taken"), rows.schema)
except metastore.CatalogError as e:
    print("refused:", e)
"""
    done = _process("-c", code)
    assert done.returncode == 0, done.stderr[-3000:]
    line = done.stdout.splitlines()[-1]
    assert line.startswith(f"refused: gold.taken in the metastore is the table at file:{elsewhere}")
    assert "lakehouse catalog sync" in line
    assert not is_table(lake.gold_path("taken"))


@pytest.fixture
def on_postgres() -> Iterator[Settings]:
    """A lakehouse whose metastore is on its own PostgreSQL (running), in a root outside pytest's
    temporary folders (run as root, the server runs as the user postgres, which must enter it);
    the Spark server and the cluster are stopped at the end."""
    home = Path(tempfile.mkdtemp(prefix="lakehouse-catalog-pg-"))
    home.chmod(0o711)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LAKEHOUSE_HOME", str(home))
        mp.setenv("LAKEHOUSE_CONTRACTS", str(REPO_ROOT / "contracts"))
        mp.setenv(server.PORT_ENV, str(free_port()))
        mp.setenv("LAKEHOUSE_POSTGRES_PORT", str(free_port()))
        mp.setenv("LAKEHOUSE_METASTORE", "postgres")
        settings = Settings.from_env()
        try:
            yield settings
        finally:
            try:
                server.stop(settings)
            finally:
                Cluster.of(settings).stop()
                shutil.rmtree(home, ignore_errors=True)


def test_on_postgres_two_processes_see_the_same_names(on_postgres: Settings) -> None:
    settings = on_postgres
    refused = _lakehouse(settings, "catalog", "list", ok=False)
    assert refused.returncode == 1
    assert "which is not running: start it with `lakehouse postgres start`" in refused.stderr

    _lakehouse(settings, "postgres", "start")
    server.start(settings, only="pipeline")
    password = Cluster.of(settings).password()
    assert password not in Path(f"/proc/{server.status(settings).pid}/cmdline").read_text()
    create = """
from lakehouse.runtime import server
from lakehouse.runtime.config import Settings
from lakehouse.storage import delta_spark
settings = Settings.from_env()
spark = server.connect(settings)
rows = spark.createDataFrame([("alice", 1)], "username string, n long")
delta_spark.append(rows, settings.gold_path("visits"), create=rows.schema)
"""
    done = _process("-c", create)
    assert done.returncode == 0, done.stderr[-3000:]

    # Another process, with a JVM of its own, opens the same metastore while the server has it.
    other = """
import json
from lakehouse.runtime.config import Settings
from lakehouse.runtime.metastore import session_conf
from lakehouse.runtime.spark import get_session
spark = get_session("local[1]", extra=session_conf(Settings.from_env()))
print(json.dumps([
    [r["tableName"] for r in spark.sql("SHOW TABLES IN gold").collect()],
    [list(r) for r in spark.table("gold.visits").collect()],
]))
spark.sql("CREATE SCHEMA IF NOT EXISTS scratch")
"""
    done = _process("-c", other)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.splitlines()[-1]) == [["visits"], [["alice", 1]]]
    # ... and what that process wrote, the server sees.
    seen = _process(
        "-c",
        "from lakehouse.runtime import server\n"
        "from lakehouse.runtime.config import Settings\n"
        "spark = server.connect(Settings.from_env())\n"
        "print(sorted(r[0] for r in spark.sql('SHOW SCHEMAS').collect()))\n",
    )
    assert seen.returncode == 0, seen.stderr[-3000:]
    assert "'scratch'" in seen.stdout.splitlines()[-1]
    assert _names(settings) == {"gold.visits": f"file:{settings.gold_path('visits')}"}
