"""The readers' server's settings: its ports and address, its bounds, its file systems, its
sandbox and its S3 credentials (the server itself, attacked by real clients:
tests/integration/test_readers.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from lakehouse.errors import ConfigError
from lakehouse.runtime import readers, sandbox
from lakehouse.runtime.config import Settings

PORTS = {"port": 15003, "sql_port": 10000}


def test_the_ports_and_address_default_to_15003_and_10000_on_loopback(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    for variable in (readers.PORT_ENV, readers.SQL_PORT_ENV, readers.SQL_ADDRESS_ENV):
        monkeypatch.delenv(variable, raising=False)
    assert readers.of(settings).ports() == {"port": 15003, "sql_port": 10000}
    assert readers.sql_address() == "127.0.0.1"
    monkeypatch.setenv(readers.SQL_PORT_ENV, "10001")
    monkeypatch.setenv(readers.SQL_ADDRESS_ENV, "0.0.0.0")
    assert readers.of(settings).ports()["sql_port"] == 10001
    assert readers.sql_address() == "0.0.0.0"


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        (readers.SQL_PORT_ENV, "ten"),
        (readers.PORT_ENV, "70000"),
        (readers.SQL_ADDRESS_ENV, "localhost"),
        (readers.SQL_ADDRESS_ENV, "10.0.0"),
        (readers.MEMORY_ENV, "lots"),
        (readers.RESULT_SIZE_ENV, "256"),
        (readers.TIMEOUT_ENV, "-1"),
    ],
)
def test_a_bad_setting_names_its_variable(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, variable: str, value: str
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigError, match=variable):
        server = readers.of(settings)
        server.conf(server.ports())
        readers.sql_address()


def test_its_bounds_come_from_the_settings(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(readers.MEMORY_ENV, "3g")
    monkeypatch.setenv(readers.RESULT_SIZE_ENV, "64m")
    monkeypatch.setenv(readers.TIMEOUT_ENV, "45")
    conf = readers.of(settings).conf(PORTS)
    assert conf["spark.driver.memory"] == "3g"
    assert conf["spark.driver.maxResultSize"] == "64m"
    assert conf["spark.lakehouse.readers.queryTimeout"] == "45"
    assert conf["spark.sql.thriftServer.incrementalCollect"] == "true"


def test_it_runs_locally_whatever_the_pipelines_master(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its file systems and its sandbox hold in its own process: its executors are its own."""
    monkeypatch.setenv("LAKEHOUSE_SPARK_MASTER", "spark://cluster:7077")
    settings = Settings.from_env(tmp_path / "home")
    assert readers.of(settings).conf(PORTS)["spark.master"] == "local[2]"


def test_its_file_systems_read_the_lake_and_write_only_the_warehouse(settings: Settings) -> None:
    server = readers.of(settings)
    conf = server.conf(PORTS)
    readable = conf["spark.hadoop.lakehouse.readers.readable"].split(",")
    writable = conf["spark.hadoop.lakehouse.readers.writable"].split(",")
    assert str(settings.tables_root) in readable and str(settings.landing_root) in readable
    assert writable == [str(server.warehouse), str(server.scratch)]
    assert not any(str(settings.tables_root).startswith(w) for w in writable)
    assert conf["spark.hadoop.fs.file.impl"] == "lakehouse.server.ReadersLocalFileSystem"
    assert conf["spark.hadoop.fs.s3a.impl"] == "lakehouse.server.ReadersFileSystem"
    assert conf["spark.hadoop.fs.http.impl"] == "lakehouse.server.RefusedFileSystem"


def test_its_catalog_is_the_pipeline_servers(settings: Settings) -> None:
    conf = readers.ReadersServer(settings, catalog_port=9099).conf(PORTS)
    assert conf["spark.hadoop.hive.metastore.uris"] == "thrift://127.0.0.1:9099"
    assert "javax.jdo.option.ConnectionURL" not in " ".join(conf)  # no login to the database
    assert "spark.hadoop.hive.metastore.uris" not in readers.of(settings).conf(PORTS)


def test_the_sql_check_is_on_unless_a_test_turns_it_off(settings: Settings) -> None:
    on = readers.ReadersServer(settings).conf(PORTS)["spark.sql.extensions"]
    off = readers.ReadersServer(settings, sql_check=False).conf(PORTS)["spark.sql.extensions"]
    assert on.split(",") == ["io.delta.sql.DeltaSparkSessionExtension", readers.EXTENSION_CLASS]
    assert off.split(",") == ["io.delta.sql.DeltaSparkSessionExtension"]


def test_the_sandbox_hides_the_secrets_and_keeps_the_warehouse_writable(
    settings: Settings,
) -> None:
    spec = readers.of(settings).spec()
    home = settings.home
    assert spec.read_only == (str(home),)  # the lake lies in the home by default
    assert str(home / "spark") in spec.hidden and str(home / "postgres") in spec.hidden
    assert str(home / "metastore" / "conf") in spec.hidden
    assert set(spec.writable) == {str(home / "readers"), str(home / "metastore" / "warehouse")}
    assert sandbox.Spec.from_json(spec.to_json()) == spec


def test_a_lake_outside_the_home_is_read_only_too(tmp_path: Path) -> None:
    settings = Settings.from_env(tmp_path / "home", data=tmp_path / "lake")
    spec = readers.of(settings).spec()
    assert spec.read_only[0] == str(tmp_path / "home")
    assert str(tmp_path / "lake" / "tables") in spec.read_only


def test_the_readers_own_s3_credentials_replace_the_pipelines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "pipeline-key")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "pipeline-secret")
    monkeypatch.setenv("AWS_SESSION_TOKEN", "pipeline-session")
    settings = Settings.from_env(tmp_path / "home", data="s3://bucket/lake")
    server = readers.ReadersServer(settings)
    env = {"AWS_ACCESS_KEY_ID": "pipeline-key", "AWS_SESSION_TOKEN": "pipeline-session"}
    assert "pipeline's credentials" in str(server._s3_credentials(dict(env)))
    monkeypatch.setenv("LAKEHOUSE_READERS_AWS_ACCESS_KEY_ID", "reader-key")
    monkeypatch.setenv("LAKEHOUSE_READERS_AWS_SECRET_ACCESS_KEY", "reader-secret")
    said = server._s3_credentials(env)
    assert env == {"AWS_ACCESS_KEY_ID": "reader-key", "AWS_SECRET_ACCESS_KEY": "reader-secret"}
    assert "readers' own credentials" in str(said)
