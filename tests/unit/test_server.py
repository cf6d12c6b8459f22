"""The pipeline's Spark server's settings and its credential, and what a reader is told (the
servers themselves, with real clients: tests/integration/test_spark_server.py,
tests/integration/test_readers.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from lakehouse.runtime import readers, server
from lakehouse.runtime.config import Settings
from lakehouse.runtime.metastore import PIPELINE_SCHEMAS


def test_the_readers_token_is_its_own_kept_secret(settings: Settings) -> None:
    reader = server.reader_token(settings, create=True)
    assert reader == server.reader_token(settings)  # kept, not made anew
    assert reader != server.token(settings, create=True)
    path = server.state_dir(settings) / "reader-token"
    assert path.stat().st_mode & 0o777 == 0o600


def test_no_readers_token_before_the_server_made_one(settings: Settings) -> None:
    with pytest.raises(server.ServerDown, match="lakehouse spark start"):
        server.reader_token(settings)


def test_what_a_reader_needs_is_refused_while_the_readers_server_is_down(
    settings: Settings,
) -> None:
    with pytest.raises(
        server.ServerDown, match=r"Readers' server: not running.*lakehouse spark start"
    ):
        server.reader(settings)


def test_a_reader_is_told_the_jdbc_url_the_login_and_the_connect_address() -> None:
    reader = server.Reader("127.0.0.1", 10000, "reader", "secret", 15003)
    assert reader.jdbc_url == "jdbc:hive2://127.0.0.1:10000/default"
    assert reader.connect_url == "sc://localhost:15003/;token=secret"
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
    """Readers read the lake's folders of data: never the home beside them (its tokens, its
    metastore), even when the data lies in the home (the default)."""
    folders = [str(folder) for folder in server.lake_folders(settings)]
    assert str(settings.tables_root) in folders
    for secret in (server.state_dir(settings) / "token", settings.home / "metastore"):
        assert not any(str(secret).startswith(folder + os.sep) for folder in folders)


def test_the_pipelines_server_serves_no_reader(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pipeline's server has no SQL endpoint and no readers' check: no reader's query runs
    in the committing driver. It serves the readers' catalog on the port it is given, with the
    schemas only the pipeline changes."""
    monkeypatch.setenv("LAKEHOUSE_METASTORE", "none")
    conf = server.server_conf(settings, 15002, 9099)
    assert not any(key.startswith("spark.hadoop.hive.server2.") for key in conf)
    assert "lakehouse.server.ReadOnlyExtension" not in conf["spark.sql.extensions"]
    assert conf["spark.lakehouse.catalog.port"] == "9099"
    assert conf["spark.lakehouse.pipelineSchemas"].split(",") == list(PIPELINE_SCHEMAS)
    assert conf["spark.connect.grpc.binding.address"] == "127.0.0.1"
    assert "spark.lakehouse.catalog.port" not in server.server_conf(settings, 15002)


def test_a_stopped_server_says_how_to_start_it(settings: Settings) -> None:
    assert server.status(settings).describe() == (
        "Spark server: not running (port 15002); start it with `lakehouse spark start`"
    )
    assert readers.of(settings).status().describe() == (
        "Readers' server: not running; it starts with `lakehouse spark start`"
    )


def test_the_event_log_is_the_pipelines_server_only(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """LAKEHOUSE_SPARK_EVENT_LOG turns on Spark's event log in the pipeline's server, in the folder
    it names; unset, there is none. The readers' server, which writes no file outside its
    warehouse, never gets one (it would refuse to start)."""
    from lakehouse.runtime.spark import EVENT_LOG_ENV

    monkeypatch.setenv("LAKEHOUSE_METASTORE", "none")
    monkeypatch.delenv(EVENT_LOG_ENV, raising=False)
    assert "spark.eventLog.enabled" not in server.server_conf(settings, 15002)
    monkeypatch.setenv(EVENT_LOG_ENV, str(tmp_path / "events"))
    conf = server.server_conf(settings, 15002)
    assert conf["spark.eventLog.enabled"] == "true"
    assert conf["spark.eventLog.dir"] == (tmp_path / "events").as_uri()
    assert (tmp_path / "events").is_dir()
    ports = {"port": 15003, "sql_port": 10000}
    assert "spark.eventLog.enabled" not in readers.of(settings).conf(ports)


def test_adaptive_execution_stays_on_the_pipelines_server_unless_turned_off(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pipeline's server plans with adaptive execution (Spark's default) under
    LAKEHOUSE_SPARK_ADAPTIVE=auto (the default, which turns it off per small batch) and on,
    and without it under off; another value is refused with the variable's name. The readers'
    server is never changed."""
    from lakehouse.errors import ConfigError
    from lakehouse.runtime.spark import ADAPTIVE_ENV

    monkeypatch.setenv("LAKEHOUSE_METASTORE", "none")
    monkeypatch.delenv(ADAPTIVE_ENV, raising=False)
    assert server.server_conf(settings, 15002)["spark.sql.adaptive.enabled"] == "true"
    monkeypatch.setenv(ADAPTIVE_ENV, "on")
    assert server.server_conf(settings, 15002)["spark.sql.adaptive.enabled"] == "true"
    monkeypatch.setenv(ADAPTIVE_ENV, "off")
    assert server.server_conf(settings, 15002)["spark.sql.adaptive.enabled"] == "false"
    readers_conf = readers.of(settings).conf({"port": 15003, "sql_port": 10000})
    assert "spark.sql.adaptive.enabled" not in readers_conf
    monkeypatch.setenv(ADAPTIVE_ENV, "yes")
    with pytest.raises(ConfigError, match=ADAPTIVE_ENV):
        server.server_conf(settings, 15002)


def test_a_warm_up_setting_it_cannot_follow_stops_the_start_before_anything_runs(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """LAKEHOUSE_SPARK_WARMUP is background (the default), wait or off, in any case; another
    value is refused, naming the variable, before a server process or a record exists."""
    from lakehouse.errors import ConfigError
    from lakehouse.runtime import warmup

    monkeypatch.delenv(warmup.WARMUP_ENV, raising=False)
    assert warmup.mode() == "background"
    monkeypatch.setenv(warmup.WARMUP_ENV, " Wait ")
    assert warmup.mode() == "wait"
    monkeypatch.setenv(warmup.WARMUP_ENV, "later")
    with pytest.raises(ConfigError, match=warmup.WARMUP_ENV):
        server.start(settings)
    assert not (settings.home / "spark").exists()
    assert warmup.state(settings) is None
