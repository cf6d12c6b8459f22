"""The Spark server's settings for its SQL endpoint and its two credentials (the server itself,
with real clients: tests/integration/test_sql_endpoint.py)."""

from __future__ import annotations

import os

import pytest

from lakehouse.errors import ConfigError
from lakehouse.runtime import server
from lakehouse.runtime.config import Settings
from lakehouse.runtime.metastore import PIPELINE_SCHEMAS


def test_the_sql_port_and_address_default_to_10000_on_loopback(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(server.SQL_PORT_ENV, raising=False)
    monkeypatch.delenv(server.SQL_ADDRESS_ENV, raising=False)
    assert (server.sql_port(), server.sql_address()) == (10000, "127.0.0.1")
    monkeypatch.setenv(server.SQL_PORT_ENV, "10001")
    monkeypatch.setenv(server.SQL_ADDRESS_ENV, "0.0.0.0")
    assert (server.sql_port(), server.sql_address()) == (10001, "0.0.0.0")


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        (server.SQL_PORT_ENV, "ten"),
        (server.SQL_PORT_ENV, "70000"),
        (server.SQL_ADDRESS_ENV, "localhost"),
        (server.SQL_ADDRESS_ENV, "10.0.0"),
    ],
)
def test_a_bad_sql_setting_names_its_variable(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigError, match=variable):
        server.sql_port() if variable == server.SQL_PORT_ENV else server.sql_address()


def test_the_readers_token_is_its_own_kept_secret(settings: Settings) -> None:
    reader = server.reader_token(settings, create=True)
    assert reader == server.reader_token(settings)  # kept, not made anew
    assert reader != server.token(settings, create=True)
    path = server.state_dir(settings) / "reader-token"
    assert path.stat().st_mode & 0o777 == 0o600


def test_no_readers_token_before_the_server_made_one(settings: Settings) -> None:
    with pytest.raises(server.ServerDown, match="lakehouse spark start"):
        server.reader_token(settings)


def test_what_a_reader_needs_is_refused_while_the_server_is_down(settings: Settings) -> None:
    with pytest.raises(server.ServerDown, match="lakehouse spark start"):
        server.reader(settings)


def test_a_reader_is_told_the_jdbc_url_the_login_and_the_connect_address() -> None:
    reader = server.Reader("127.0.0.1", 10000, "reader", "secret", 15002)
    assert reader.jdbc_url == "jdbc:hive2://127.0.0.1:10000/default"
    assert reader.connect_url == "sc://localhost:15002/;token=secret"
    printed = dict(line.split(": ", 1) for line in reader.describe().splitlines())
    assert printed == {
        "host": "127.0.0.1",
        "port": "10000",
        "user": "reader",
        "password": "secret",
        "jdbc_url": reader.jdbc_url,
        "connect_url": reader.connect_url,
    }


def test_the_lakes_folders_leave_out_the_homes_secrets(settings: Settings) -> None:
    """The readers' check lets them read the lake's folders of data: never the home beside them
    (its tokens, its metastore), even when the data lies in the home (the default)."""
    folders = [str(folder) for folder in server.lake_folders(settings)]
    assert str(settings.tables_root) in folders
    for secret in (server.state_dir(settings) / "token", settings.home / "metastore"):
        assert not any(str(secret).startswith(folder + os.sep) for folder in folders)


def test_the_server_names_the_pipelines_schemas_and_its_sql_endpoint(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the server's own code reads from its settings: the schemas the readers' credential
    may not change (the catalog's), and where the endpoint listens."""
    monkeypatch.setenv("LAKEHOUSE_METASTORE", "none")
    monkeypatch.delenv(server.SQL_ADDRESS_ENV, raising=False)
    conf = server.server_conf(settings, 15002, 10005)
    assert conf["spark.lakehouse.pipelineSchemas"].split(",") == list(PIPELINE_SCHEMAS)
    assert conf["spark.hadoop.hive.server2.thrift.port"] == "10005"
    assert conf["spark.hadoop.hive.server2.thrift.bind.host"] == "127.0.0.1"
    assert conf["spark.hadoop.hive.server2.authentication"] == "CUSTOM"
    # Delta's extension stays, and comes first.
    assert conf["spark.sql.extensions"].startswith("io.delta.sql.DeltaSparkSessionExtension,")
