"""The SQL endpoint (HiveServer2's protocol, in the Spark server's JVM) and the readers' credential,
with real clients: Hive's beeline and PyHive on the endpoint, pyspark on Spark Connect, after a
pipeline run through the server (which the pipeline's token still writes).

A reader reads every table by name; each kind of write to a pipeline table, and each way around
the check (files outside the lake, reflection, Python code, jars, functions), is refused on both
protocols with the read-only message, and the table's Delta history is what it was; a reader
creates and drops views and tables in a schema of its own.

Connect clients run in their own processes (a Connect session switches its whole process to
Connect, see test_spark_server.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lakehouse.runtime import server
from lakehouse.runtime.config import Settings
from lakehouse.runtime.jvm import pyspark_jars_dir
from lakehouse.runtime.process import free_port
from lakes import DEMO_TABLES, shipped_topic

pytestmark = pytest.mark.integration

READ_ONLY = "this credential is read-only"
GOLD = "gold.user_latest_location"


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Settings]:
    """A lakehouse whose JSON topic ran through every layer on its running server (a client with
    the pipeline's token), the SQL endpoint on a port of its own."""
    root = tmp_path_factory.mktemp("sql")
    contracts = shipped_topic(root / "contracts", "user-locations", DEMO_TABLES)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LAKEHOUSE_HOME", str(root / "lakehouse"))
        mp.setenv("LAKEHOUSE_CONTRACTS", str(contracts))
        mp.setenv(server.PORT_ENV, str(free_port()))
        mp.setenv(server.SQL_PORT_ENV, str(free_port()))
        mp.delenv("LAKEHOUSE_METASTORE", raising=False)
        mp.delenv(server.SQL_ADDRESS_ENV, raising=False)
        settings = Settings.from_env()
        _lakehouse("sample")
        server.start(settings)
        try:
            _lakehouse("run", "--topic", "user-locations")
            yield settings
        finally:
            server.stop(settings)


def _process(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != server.TOKEN_ENV}
    return subprocess.run(
        [sys.executable, *args],
        env=env,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def _lakehouse(*args: str) -> subprocess.CompletedProcess[str]:
    done = _process("-m", "lakehouse.cli", *args)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def _beeline(
    reader: server.Reader, password: str, *statements: str
) -> subprocess.CompletedProcess[str]:
    """Hive's own beeline (pyspark ships its jars), as a person at a terminal runs it."""
    command = [
        "java",
        "-cp",
        f"{pyspark_jars_dir()}/*",
        "org.apache.hive.beeline.BeeLine",
        "-u",
        reader.jdbc_url,
        "-n",
        reader.user,
        "-p",
        password,
        "--outputformat=csv2",
        "--silent=true",
    ]
    for statement in statements:
        command += ["-e", statement]
    return subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)


def _hive(reader: server.Reader) -> Any:
    from pyhive import hive

    return hive.connect(
        host=reader.host,
        port=reader.port,
        username=reader.user,
        password=reader.password,
        auth="CUSTOM",
    )


def _rows(cursor: Any, statement: str) -> list[tuple[Any, ...]]:
    cursor.execute(statement)
    return [tuple(row) for row in cursor.fetchall()]


def _history(reader: server.Reader) -> list[tuple[Any, ...]]:
    with _hive(reader) as conn:
        return [(row[0], row[4]) for row in _rows(conn.cursor(), f"DESCRIBE HISTORY {GOLD}")]


# Run with the token on standard input: each operation (SQL, or a DataFrame call) in its own
# try, its outcome (None, or the error's text) printed as JSON.
_CONNECT = """
import json, sys
from pyspark.sql import SparkSession, functions as F
url, token, ops = sys.argv[1], sys.stdin.readline().strip(), json.loads(sys.argv[2])
spark = SparkSession.builder.remote(f"{url}/;token={token}").getOrCreate()
out = {}
for label, op in ops.items():
    try:
        if op.startswith("py:"):
            exec(op[3:], {"spark": spark, "F": F})
        else:
            spark.sql(op).collect()
        out[label] = None
    except Exception as e:
        out[label] = f"{type(e).__name__}: {e}"
print(json.dumps(out))
"""


def _connect(lake: Settings, token: str, ops: dict[str, str]) -> dict[str, str | None]:
    url = f"sc://localhost:{server.status(lake).port}"
    done = _process("-c", _CONNECT, url, json.dumps(ops), stdin=token + "\n")
    assert done.returncode == 0, done.stderr[-3000:]
    return dict(json.loads(done.stdout.splitlines()[-1]))


def test_tools_read_gold_by_name_with_the_readers_credential(lake: Settings) -> None:
    """`lakehouse spark reader` says how to log in; beeline and PyHive read the gold tables by
    name with it; a wrong password is refused; status names the endpoint; neither token is in
    the server's environment."""
    printed = dict(
        line.split(": ", 1) for line in _lakehouse("spark", "reader").stdout.splitlines()
    )
    reader = server.reader(lake)
    assert printed["user"] == "reader" and printed["password"] == reader.password
    assert (
        printed["jdbc_url"] == f"jdbc:hive2://127.0.0.1:{os.environ[server.SQL_PORT_ENV]}/default"
    )
    assert reader.password != server.token(lake)
    token_file = server.state_dir(lake) / "reader-token"
    assert token_file.stat().st_mode & 0o777 == 0o600

    done = _beeline(
        reader,
        reader.password,
        "SHOW TABLES IN gold",
        f"SELECT username, location FROM {GOLD} ORDER BY username",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    # (beeline puts its prompt before a statement's first line)
    assert any(line.endswith("gold,user_latest_location,false") for line in lines), lines
    assert lines[-3].endswith("username,location") and lines[-2:] == ["alice,Berlin", "bob,Lima"]

    with _hive(reader) as conn:
        cursor = conn.cursor()
        assert _rows(cursor, f"SELECT username, location FROM {GOLD} ORDER BY username") == [
            ("alice", "Berlin"),
            ("bob", "Lima"),
        ]
        assert ("gold", "user_location_counts", False) in _rows(cursor, "SHOW TABLES IN gold")

    wrong = _beeline(reader, "not-the-password", "SHOW TABLES IN gold")
    assert wrong.returncode != 0
    assert "Error validating the login" in wrong.stdout + wrong.stderr
    from thrift.transport.TTransport import TTransportException

    with pytest.raises(TTransportException, match="Error validating the login"):
        _hive(server.Reader(reader.host, reader.port, "reader", server.token(lake), 0))

    assert f"jdbc:hive2://127.0.0.1:{reader.port}/default" in _lakehouse("spark", "status").stdout
    environment = Path(f"/proc/{server.status(lake).pid}/environ").read_bytes()
    for secret in (reader.password, server.token(lake)):
        assert secret.encode() not in environment


def test_every_write_and_escape_of_a_reader_is_refused_on_both_protocols(lake: Settings) -> None:
    """Each write to a pipeline table (by name and by path) and each way around the check is
    refused on the SQL endpoint and on Spark Connect with the read-only message; the table's
    history and rows are what they were; the pipeline's token still writes."""
    reader = server.reader(lake)
    gold = lake.gold_path("user_latest_location")
    token_file = server.state_dir(lake) / "token"
    # A CHECK constraint for a reader to try to drop (the pipeline's token adds it).
    added = _connect(
        lake,
        server.token(lake),
        {"constraint": f"ALTER TABLE {GOLD} ADD CONSTRAINT named CHECK (username IS NOT NULL)"},
    )
    assert added == {"constraint": None}
    before = _history(reader)
    assert before[0][1] == "ADD CONSTRAINT"
    with _hive(reader) as conn:
        rows = _rows(conn.cursor(), f"SELECT * FROM {GOLD} ORDER BY username")

    writes = {
        "insert": f"INSERT INTO {GOLD} SELECT * FROM {GOLD}",
        "merge": (
            f"MERGE INTO {GOLD} t USING (SELECT * FROM {GOLD}) s ON t.username = s.username "
            "WHEN MATCHED THEN UPDATE SET *"
        ),
        "update": f"UPDATE {GOLD} SET location = 'Nowhere'",
        "delete": f"DELETE FROM {GOLD}",
        "alter": f"ALTER TABLE {GOLD} ADD COLUMNS (extra INT)",
        "properties": f"ALTER TABLE {GOLD} SET TBLPROPERTIES ('note' = 'mine')",
        "drop constraint": f"ALTER TABLE {GOLD} DROP CONSTRAINT named",
        "drop": f"DROP TABLE {GOLD}",
        "truncate": f"TRUNCATE TABLE {GOLD}",
        "create in gold": "CREATE TABLE gold.mine (a INT) USING delta",
        "view in gold": "CREATE VIEW gold.mine AS SELECT 1 AS a",
        "drop schema": "DROP SCHEMA gold CASCADE",
        "by path": f"INSERT INTO delta.`{gold}` SELECT * FROM {GOLD}",
        "own name, lake's place": (
            f"CREATE TABLE analytics_x.t USING delta LOCATION '{gold}' AS SELECT * FROM {GOLD}"
        ),
        "token file": f"SELECT * FROM text.`{token_file}`",
        "reflect": "SELECT reflect('java.lang.System', 'getenv', 'HOME')",
        "add jar": f"ADD JAR {pyspark_jars_dir() / 'hive-exec-2.3.10-core.jar'}",
        "function": "CREATE FUNCTION f AS 'org.apache.hadoop.hive.ql.udf.UDFSubstr'",
    }
    refused_sql: dict[str, str] = {}
    with _hive(reader) as conn:
        cursor = conn.cursor()
        for label, statement in writes.items():
            try:
                cursor.execute(statement)
                refused_sql[label] = "went through"
            except Exception as e:  # PyHive's OperationalError, with the server's message
                refused_sql[label] = str(e)
    assert {label: READ_ONLY in text for label, text in refused_sql.items()} == dict.fromkeys(
        writes, True
    ), refused_sql
    assert "on gold.user_latest_location" in refused_sql["insert"]

    connect_only = {
        "save by path": (
            f"py:spark.table('{GOLD}').write.format('delta').mode('append').save('{gold}')"
        ),
        "overwrite by name": f"py:spark.table('{GOLD}').write.mode('overwrite').saveAsTable('{GOLD}')",
        "writeTo": f"py:spark.table('{GOLD}').writeTo('{GOLD}').append()",
        "read token": f"py:spark.read.text('{token_file}').collect()",
        "python udf": "py:spark.range(1).select(F.udf(lambda x: x)('id')).collect()",
        "mapInPandas": "py:spark.range(1).mapInPandas(lambda it: it, 'id long').collect()",
        "artifact": f"py:spark.addArtifacts('{token_file}', file=True)",
    }
    refused_connect = _connect(lake, reader.password, {**writes, **connect_only})
    assert {
        label: READ_ONLY in str(text) for label, text in refused_connect.items()
    } == dict.fromkeys({**writes, **connect_only}, True), refused_connect
    assert "AnalysisException" in str(refused_connect["delete"])

    assert _history(reader) == before
    with _hive(reader) as conn:
        assert _rows(conn.cursor(), f"SELECT * FROM {GOLD} ORDER BY username") == rows

    # The pipeline's token writes as before.
    dropped = _connect(
        lake, server.token(lake), {"drop": f"ALTER TABLE {GOLD} DROP CONSTRAINT named"}
    )
    assert dropped == {"drop": None}
    assert _history(reader)[0][1] == "DROP CONSTRAINT"


def test_a_reader_builds_views_and_tables_in_a_schema_of_its_own(lake: Settings) -> None:
    """What a dbt project does with the readers' credential: its own schema, views and tables on
    gold, the change feed and the history, SHOW, DESCRIBE, EXPLAIN, SET and USE; then drops them."""
    reader = server.reader(lake)
    with _hive(reader) as conn:
        cursor = conn.cursor()
        for statement in (
            "CREATE SCHEMA IF NOT EXISTS analytics",
            f"CREATE OR REPLACE VIEW analytics.latest AS SELECT username, location FROM {GOLD}",
            "CREATE OR REPLACE TABLE analytics.places USING delta AS "
            f"SELECT location, count(*) AS users FROM {GOLD} GROUP BY location",
            "INSERT INTO analytics.places VALUES ('Oslo', 0)",
            "SET spark.sql.shuffle.partitions = 2",
            "USE analytics",
        ):
            cursor.execute(statement)
        assert _rows(cursor, "SELECT * FROM places ORDER BY location") == [
            ("Berlin", 1),
            ("Lima", 1),
            ("Oslo", 0),
        ]
        assert _rows(cursor, "SELECT * FROM latest ORDER BY username")[0] == ("alice", "Berlin")
        assert ("analytics", "latest", False) in _rows(cursor, "SHOW TABLES")
        assert _rows(cursor, f"DESCRIBE {GOLD}")[0][0] == "username"
        assert "Scan" in _rows(cursor, f"EXPLAIN SELECT * FROM {GOLD}")[0][0]
        changes = _rows(cursor, f"SELECT username, _change_type FROM table_changes('{GOLD}', 1)")
        assert ("alice", "insert") in changes
        assert _rows(cursor, "DESCRIBE HISTORY analytics.places")[0][4] == "WRITE"
        # Its tables are in the metastore's warehouse, not in the lake.
        detail = _rows(cursor, "DESCRIBE DETAIL analytics.places")[0]
        assert str(detail[4]).startswith(f"file:{lake.home / 'metastore' / 'warehouse'}/")
        for statement in (
            "DROP VIEW analytics.latest",
            "DROP TABLE analytics.places",
            "USE default",
            "DROP SCHEMA analytics",
        ):
            cursor.execute(statement)
        assert "analytics" not in [row[0] for row in _rows(cursor, "SHOW SCHEMAS")]

    made = _connect(
        lake,
        reader.password,
        {
            "schema": "CREATE SCHEMA IF NOT EXISTS mine",
            "view": f"CREATE OR REPLACE VIEW mine.v AS SELECT * FROM {GOLD}",
            "table": f"py:spark.table('{GOLD}').write.format('delta').saveAsTable('mine.t')",
            "read": "py:assert spark.table('mine.t').count() == 2",
            "drop view": "DROP VIEW mine.v",
            "drop table": "DROP TABLE mine.t",
            "drop schema": "DROP SCHEMA mine",
        },
    )
    assert made == dict.fromkeys(made, None), made
