"""The readers' server (its own JVM, apart from the pipeline's committing driver) attacked as an
attacker would, with real clients: Hive's beeline and PyHive on the SQL endpoint, pyspark on Spark
Connect, with the readers' token, after a pipeline run through the pipeline's server.

Every statement of a hostile corpus (the issue's two: a reader's own table moved onto a gold
table's folder, then truncated or dropped; locations with ``..``, ``file:`` and scheme variants;
clones, CONVERT TO DELTA, LOAD DATA, ANALYZE, MSCK, CACHE, table properties, Delta's maintenance,
session settings of the file systems, scripts, reflection, JDBC; Spark Connect's catalog API,
DataFrameWriter and DataFrameWriterV2, UDFs, artifacts, configuration calls) leaves every
pipeline table's files, Delta versions and catalog entry as they were, on both protocols; and so
does the corpus again with the SQL check turned off, refused by the layers below it (the readers'
file system, the catalog's allow-list, the operating system's read-only mounts). A reader's
query that exceeds its bounds fails alone, and a pipeline batch commits while a heavy one runs.

Connect clients run in their own processes (a Connect session switches its whole process to
Connect, see test_spark_server.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lakehouse.runtime import readers, sandbox, server
from lakehouse.runtime.config import Settings
from lakehouse.runtime.jvm import pyspark_jars_dir
from lakehouse.runtime.process import free_port
from lakes import DEMO_TABLES, produce, shipped_topic
from readers_corpus import GOLD, READ_ONLY, connect_corpus, corpus, refused

pytestmark = pytest.mark.integration

TIMEOUT_S = 90  # the readers' statement timeout in this module


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Settings]:
    """A lakehouse whose JSON topic ran through every layer on its pipeline's server; the
    readers' server beside it with small bounds, on ports of its own."""
    root = tmp_path_factory.mktemp("readers")
    contracts = shipped_topic(root / "contracts", "user-locations", DEMO_TABLES)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LAKEHOUSE_HOME", str(root / "lakehouse"))
        mp.setenv("LAKEHOUSE_CONTRACTS", str(contracts))
        mp.setenv(server.PORT_ENV, str(free_port()))
        mp.setenv(readers.PORT_ENV, str(free_port()))
        mp.setenv(readers.SQL_PORT_ENV, str(free_port()))
        mp.setenv(readers.RESULT_SIZE_ENV, "32m")
        mp.setenv(readers.TIMEOUT_ENV, str(TIMEOUT_S))
        mp.delenv("LAKEHOUSE_METASTORE", raising=False)
        mp.delenv(readers.SQL_ADDRESS_ENV, raising=False)
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
        timeout=900,
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


def _hive(reader: server.Reader, configuration: dict[str, str] | None = None) -> Any:
    from pyhive import hive

    return hive.connect(
        host=reader.host,
        port=reader.port,
        username=reader.user,
        password=reader.password,
        auth="CUSTOM",
        configuration=configuration,
    )


def _rows(cursor: Any, statement: str) -> list[tuple[Any, ...]]:
    cursor.execute(statement)
    return [tuple(row) for row in cursor.fetchall()]


def _sql(reader: server.Reader, statements: dict[str, str], **login: Any) -> dict[str, str | None]:
    """Each statement on the SQL endpoint, in order: None, or its error's text."""
    out: dict[str, str | None] = {}
    with _hive(reader, **login) as conn:
        cursor = conn.cursor()
        for label, statement in statements.items():
            try:
                cursor.execute(statement)
                if cursor.description:
                    cursor.fetchmany(5)
                out[label] = None
            except Exception as e:  # PyHive's OperationalError, with the server's message
                out[label] = str(e)
    return out


# Run with the token on standard input: each operation (SQL, or Python with `spark` and `F`) in
# its own try, its outcome (None, or the error's text) printed as JSON.
_CONNECT = """
import json, sys
from pyspark.sql import SparkSession, functions as F
url, token, ops = sys.argv[1], sys.stdin.readline().strip(), json.loads(sys.argv[2])
from pyspark.sql.connect.client.retries import DefaultPolicy
spark = SparkSession.builder.remote(f"{url}/;token={token}").getOrCreate()
# A few seconds of retries, not the client's ten minutes: a server that went away says so.
spark.client.set_retry_policies([DefaultPolicy(max_retries=3, max_backoff=2000)])
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


def _connect(port: int, token: str, ops: dict[str, str]) -> dict[str, str | None]:
    done = _process("-c", _CONNECT, f"sc://localhost:{port}", json.dumps(ops), stdin=token + "\n")
    assert done.returncode == 0, done.stderr[-3000:]
    return dict(json.loads(done.stdout.splitlines()[-1]))


def _state(lake: Settings) -> dict[str, object]:
    """What a reader must not change: every file of the lake (path, size, modification time),
    each pipeline table's Delta version, and every catalog entry (name and location)."""
    from deltalake import DeltaTable

    files: dict[str, tuple[int, int]] = {}
    versions: dict[str, int] = {}
    for folder in server.lake_folders(lake):
        root = Path(str(folder))
        for path in sorted(root.rglob("*")) if root.exists() else []:
            stat = path.lstat()
            files[str(path)] = (stat.st_size, stat.st_mtime_ns)
            if path.name == "_delta_log":
                versions[str(path.parent)] = DeltaTable(str(path.parent)).version()
    names = _lakehouse("catalog", "list").stdout.splitlines()
    return {"files": files, "versions": versions, "names": names}


def _wait_until_answering(lake: Settings, timeout: float = 240.0) -> None:
    """Wait for the readers' server to answer (its supervisor may be starting it again)."""
    deadline = time.monotonic() + timeout
    while not readers.of(lake).status().running:
        assert time.monotonic() < deadline, readers.of(lake).log_end()
        time.sleep(1)


def _prepare_own_table(reader: server.Reader) -> None:
    assert _sql(
        reader,
        {
            "schema": "CREATE SCHEMA IF NOT EXISTS mine",
            "drop": "DROP TABLE IF EXISTS mine.p",
            "table": "CREATE TABLE mine.p (a INT) USING parquet",
        },
    ) == {"schema": None, "drop": None, "table": None}


def test_tools_read_gold_by_name_with_the_readers_credential(lake: Settings) -> None:
    """`lakehouse spark reader` says how to log in; beeline and PyHive read the gold tables by
    name with it, and Spark Connect reads them, their history and their change feed; a wrong
    password, and the pipeline's token, are refused; each server takes only its own token,
    which is in neither's environment; status names both servers."""
    printed = dict(
        line.split(": ", 1) for line in _lakehouse("spark", "reader").stdout.splitlines()
    )
    reader = server.reader(lake)
    sql_port = os.environ[readers.SQL_PORT_ENV]
    assert printed["user"] == "reader" and printed["password"] == reader.password
    assert printed["jdbc_url"] == f"jdbc:hive2://127.0.0.1:{sql_port}/default"
    assert printed["connect_url"] == (
        f"sc://localhost:{os.environ[readers.PORT_ENV]}/;token={reader.password}"
    )
    assert reader.password != server.token(lake)

    done = _beeline(
        reader,
        reader.password,
        "SHOW TABLES IN gold",
        f"SELECT username, location FROM {GOLD} ORDER BY username",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert any(line.endswith("gold,user_latest_location,false") for line in lines), lines
    assert lines[-3].endswith("username,location") and lines[-2:] == ["alice,Berlin", "bob,Lima"]
    with _hive(reader) as conn:
        assert _rows(conn.cursor(), f"SELECT username, location FROM {GOLD} ORDER BY username") == [
            ("alice", "Berlin"),
            ("bob", "Lima"),
        ]
    read = _connect(
        reader.connect_port,
        reader.password,
        {
            "rows": f"py:assert sorted(spark.table('{GOLD}').collect())[0].location == 'Berlin'",
            "history": f"py:assert spark.sql('DESCRIBE HISTORY {GOLD}').count() >= 1",
            "changes": f"py:assert spark.sql(\"SELECT * FROM table_changes('{GOLD}', 0)\").count() >= 2",
            "ledger": "py:assert spark.table('quality.ledger').count() > 0",
        },
    )
    assert read == dict.fromkeys(read, None), read

    wrong = _beeline(reader, "not-the-password", "SHOW TABLES IN gold")
    assert wrong.returncode != 0 and "Error validating the login" in wrong.stdout + wrong.stderr
    from thrift.transport.TTransport import TTransportException

    with pytest.raises(TTransportException, match="Error validating the login"):
        _hive(server.Reader(reader.host, reader.port, "reader", server.token(lake), 0))
    # Each server takes its own token only.
    crossed = _connect(reader.connect_port, server.token(lake), {"read": "SELECT 1"})
    assert "no valid token" in str(crossed["read"])
    crossed = _connect(server.status(lake).port, reader.password, {"read": "SELECT 1"})
    assert "no valid token" in str(crossed["read"])

    status = _lakehouse("spark", "status").stdout
    assert "Spark server: running" in status and "Readers' server: running" in status
    assert f"jdbc:hive2://127.0.0.1:{sql_port}/default" in status
    for pid in (server.status(lake).pid, readers.of(lake).status().pid):
        environment = Path(f"/proc/{pid}/environ").read_bytes()
        for secret in (reader.password, server.token(lake)):
            assert secret.encode() not in environment


def test_the_readers_server_sees_the_lake_read_only_and_no_secret(lake: Settings) -> None:
    """The operating system's layer: in the readers' server's mount namespace the lakehouse's
    home is mounted read-only, its own folder and the warehouse writable, the tokens' folder an
    empty tmpfs; the process holds no capability."""
    assert sandbox.available() is None  # Linux with unshare: these machines
    status = readers.of(lake).status()
    assert status.sandbox == "the operating system (read-only mounts)"
    java = [p for p in _family(int(str(status.pid))) if _program(p).endswith("/java")]
    assert java, "the readers' JVM"
    mounts = {
        line.split()[4]: line.split()
        for line in Path(f"/proc/{java[0]}/mountinfo").read_text().splitlines()
    }
    home = str(lake.home)
    assert "ro" in mounts[home][5].split(",")
    assert "rw" in mounts[str(lake.home / "readers")][5].split(",")
    assert "rw" in mounts[str(lake.home / "metastore" / "warehouse")][5].split(",")
    assert mounts[str(server.state_dir(lake))][8] == "tmpfs"
    capabilities = dict(
        line.split(":\t")
        for line in Path(f"/proc/{java[0]}/status").read_text().splitlines()
        if ":\t" in line
    )
    assert int(capabilities["CapEff"], 16) == 0 and int(capabilities["CapBnd"], 16) == 0


def _program(pid: int) -> str:
    try:
        return os.readlink(f"/proc/{pid}/exe")
    except OSError:  # it has ended
        return ""


def _family(pid: int) -> list[int]:
    found, todo = [pid], [pid]
    while todo:
        parent = todo.pop()
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == parent:
                found.append(int(stat.parent.name))
                todo.append(int(stat.parent.name))
    return found


def test_every_hostile_statement_is_refused_and_changes_nothing(lake: Settings) -> None:
    """The corpus on both protocols: each statement is refused with the read-only message, and
    every pipeline table's files, versions and names are what they were; a login that brings a
    file system setting has every statement refused; the reader's own table is still its own."""
    reader = server.reader(lake)
    _prepare_own_table(reader)
    before = _state(lake)
    statements = corpus(lake)

    on_sql = _sql(reader, statements)
    assert {k: refused(k, v) for k, v in on_sql.items()} == dict.fromkeys(statements, True), {
        k: str(v)[:300] for k, v in on_sql.items() if not refused(k, v)
    }
    assert "on gold.user_latest_location" in str(on_sql["insert"])

    both = {**statements, **connect_corpus(lake)}
    on_connect = _connect(reader.connect_port, reader.password, both)
    assert {k: refused(k, v) for k, v in on_connect.items()} == dict.fromkeys(both, True), {
        k: str(v)[:300] for k, v in on_connect.items() if not refused(k, v)
    }

    from pyhive.exc import OperationalError

    with pytest.raises(OperationalError, match=r"the session setting fs\.file\.impl is refused"):
        _hive(reader, {"set:hiveconf:fs.file.impl": "org.apache.hadoop.fs.RawLocalFileSystem"})

    assert _state(lake) == before
    # What a reader may do goes on: its own table, REFRESH, reading.
    fine = _sql(
        reader,
        {
            "insert own": "INSERT INTO mine.p VALUES (1)",
            "truncate own": "TRUNCATE TABLE mine.p",
            "refresh": f"REFRESH TABLE {GOLD}",
            "read": f"SELECT count(*) FROM {GOLD}",
        },
    )
    assert fine == dict.fromkeys(fine, None), fine
    assert _state(lake) == before


def test_with_the_sql_check_off_the_layers_below_refuse_the_same(lake: Settings) -> None:
    """The readers' server started without its SQL-level check: the corpus is refused by its file
    system (changes to the lake's files), the catalog's allow-list (names and locations of the
    pipeline's schemas) and the operating system (a script writing into the lake, reading the
    tokens); every pipeline table's files, versions and names are what they were."""
    reader = server.reader(lake)
    pipeline = server.status(lake)
    unchecked = readers.ReadersServer(
        lake, catalog_port=pipeline.catalog_port, token=server.reader_token(lake), sql_check=False
    )
    readers.of(lake).stop()
    unchecked.start()
    try:
        _prepare_own_table(reader)
        before = _state(lake)
        gold = str(lake.gold_path("user_latest_location"))
        token = server.state_dir(lake) / "token"
        attacks = {
            **{
                k: v
                for k, v in corpus(lake).items()
                if k.startswith(("set location", "create at", "schema at", "serde"))
                or k
                in {
                    "insert",
                    "merge",
                    "update",
                    "delete",
                    "truncate",
                    "drop",
                    "drop schema",
                    "add columns",
                    "properties",
                    "rename out",
                    "rename in",
                    "schema location",
                    "create in gold",
                    "by path",
                    "delete by path",
                    "optimize",
                    "restore",
                    "into directory",
                    "machine file",
                    "http",
                }
            },
            "truncate own after": "TRUNCATE TABLE mine.p",
            "drop own after": "DROP TABLE mine.p",
            "script writes": f"SELECT TRANSFORM(a) USING 'touch {gold}/pwned' FROM VALUES (1) t(a)",
            "script reads token": f"SELECT TRANSFORM(a) USING 'cat {token}' FROM VALUES (1) t(a)",
        }
        outcome = _sql(reader, attacks)
        went = {k for k, v in outcome.items() if v is None}
        # What goes changes nothing of the pipeline's: the reader's own table; OPTIMIZE of a
        # table with nothing to compact (it writes nothing); a serde 'path', which Spark
        # overwrites with the table's own location when it stores a data source table.
        assert went <= {"truncate own after", "drop own after", "optimize", "serde path"}, {
            k: str(v)[:200] for k, v in outcome.items() if v is None
        }
        assert {"truncate own after", "drop own after"} <= went
        for label in ("insert", "delete", "truncate", "by path", "delete by path", "restore"):
            assert "changes no file of the lake" in str(outcome[label]), (
                label,
                outcome[label][:500],
            )
        for label in (
            "set location",
            "set location ..",
            "drop",
            "create in gold",
            "schema location",
        ):
            assert READ_ONLY in str(outcome[label]), (label, str(outcome[label])[:500])
        assert "Read-only file system" in str(outcome["script writes"])
        # cat fails (the tokens' folder is not in the sandbox); Spark reports its stderr only when
        # the pipe has delivered it before the exit status, so either message may come.
        read_token = str(outcome["script reads token"])
        assert outcome["script reads token"] is not None and server.token(lake) not in read_token
        assert "No such file or directory" in read_token or "exited with status 1" in read_token
        assert _state(lake) == before
    finally:
        unchecked.stop()
        readers.ReadersServer(
            lake, catalog_port=pipeline.catalog_port, token=server.reader_token(lake)
        ).start()


def test_a_runaway_reader_fails_alone_while_the_pipeline_commits(lake: Settings) -> None:
    """A result over the readers' bounds fails, the pipeline's server is not touched, and the
    readers' server answers again (its supervisor starts it anew if the statement exhausted its
    heap); the issue's 20 GB result, fetched a partition at a time by the SQL endpoint, fails on
    the bound; a heavy statement runs while a pipeline batch commits on the pipeline's server,
    and is cancelled at the readers' timeout."""
    reader = server.reader(lake)
    pipeline_pid = server.status(lake).pid
    big = _connect(
        reader.connect_port,
        reader.password,
        {"big": "py:spark.range(3_000_000).selectExpr('id', \"repeat('x', 100) AS x\").collect()"},
    )
    assert big["big"] is not None, "the statement over the bounds failed"
    out = (lake.home / "readers" / "server.out").read_text()
    assert "spark.driver.maxResultSize" in str(big["big"]) or "ended out of memory" in out, big
    _wait_until_answering(lake)
    after = _connect(reader.connect_port, reader.password, {"next": "SELECT 1"})
    assert after == {"next": None}
    assert server.status(lake).pid == pipeline_pid and server.status(lake).running
    # The statement: 20 GB of results, which filled the committing driver's heap. Its
    # first partition (compressed, about 95 MiB here) is over this module's bound: the reader
    # gets the bound's error, and the next statement is answered.
    from pyhive.exc import OperationalError

    with _hive(reader) as conn:
        cursor = conn.cursor()
        cursor.execute("SELECT id, repeat('x', 1000) FROM range(20000000)")
        with pytest.raises(OperationalError, match=r"spark\.driver\.maxResultSize"):
            cursor.fetchmany(1000)
        assert _rows(cursor, "SELECT 1") == [(1,)]

    heavy: dict[str, Any] = {}

    def run_heavy() -> None:
        heavy["started"] = time.monotonic()
        heavy["outcome"] = _sql(
            reader,
            {
                "heavy": "SELECT count(*) FROM range(200000) a CROSS JOIN range(2000000) b WHERE (a.id + b.id) % 7 = 3"
            },
        )["heavy"]
        heavy["ended"] = time.monotonic()

    thread = threading.Thread(target=run_heavy)
    thread.start()
    time.sleep(5)  # its first job starts (the order of the two is asserted below)
    gold = lake.gold_path("user_latest_location")
    from deltalake import DeltaTable

    version = DeltaTable(str(gold)).version()
    produce(lake, "user-locations", [("carol", {"location": "Quito"})])
    batch_started = time.monotonic()
    _lakehouse("run", "--topic", "user-locations")
    batch_ended = time.monotonic()
    thread.join(timeout=600)
    assert DeltaTable(str(gold)).version() > version
    assert heavy["started"] < batch_ended and heavy["ended"] > batch_started
    assert "readers' limit of 90 s" in str(heavy["outcome"]), heavy
    assert readers.of(lake).status().running and server.status(lake).running
