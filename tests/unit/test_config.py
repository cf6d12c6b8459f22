from __future__ import annotations

from pathlib import Path

import pytest

from lakehouse.errors import ConfigError
from lakehouse.runtime.config import Settings, validate_table_name, validate_topic_name


def test_every_path_derives_from_the_root(tmp_path: Path) -> None:
    s = Settings.from_env(tmp_path / "root", tmp_path / "contracts")
    assert s.topic_dir("user-locations") == tmp_path / "root/landing/topics/user-locations"
    assert s.bronze_path("user-locations") == tmp_path / "root/tables/bronze/user-locations"
    assert s.silver_path("user_locations") == tmp_path / "root/tables/silver/user_locations"
    assert s.gold_path("counts") == tmp_path / "root/tables/gold/counts"
    assert s.quarantine_path("silver", "s") == tmp_path / "root/tables/quarantine/silver/s"
    assert s.airflow_home == tmp_path / "root/airflow"


def test_root_comes_from_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LAKEHOUSE_HOME", str(tmp_path / "elsewhere"))
    assert Settings.from_env().home == tmp_path / "elsewhere"


@pytest.mark.parametrize("name", ["..", ".", "../etc", "a/b", "", "x" * 250, "a b", "é"])
def test_bad_topic_names_are_refused(name: str) -> None:
    with pytest.raises(ConfigError, match="invalid topic name"):
        validate_topic_name(name)


@pytest.mark.parametrize("name", ["../x", "Upper", "with-dash", "1starts_with_digit", "a;drop"])
def test_bad_table_names_are_refused(name: str) -> None:
    with pytest.raises(ConfigError, match="invalid stream or table name"):
        validate_table_name(name)


def test_names_cannot_escape_the_root(tmp_path: Path) -> None:
    s = Settings.from_env(tmp_path / "root", tmp_path)
    with pytest.raises(ConfigError):
        s.bronze_path("..")
    with pytest.raises(ConfigError):
        s.gold_path("../../etc")


def test_the_notification_connection_comes_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("LAKEHOUSE_NOTIFY_CONN", raising=False)
    assert Settings.from_env(tmp_path).notify_conn_id == "lakehouse_notify"
    monkeypatch.setenv("LAKEHOUSE_NOTIFY_CONN", "dq_mail")
    assert Settings.from_env(tmp_path).notify_conn_id == "dq_mail"


@pytest.mark.parametrize("conn_id", ["with space", "mail/alerts", "x" * 251])
def test_a_notification_connection_that_is_no_connection_id_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, conn_id: str
) -> None:
    monkeypatch.setenv("LAKEHOUSE_NOTIFY_CONN", conn_id)
    with pytest.raises(ConfigError) as info:
        Settings.from_env(tmp_path)
    assert str(info.value) == (
        f"LAKEHOUSE_NOTIFY_CONN={conn_id!r} is not an Airflow connection id: use 1-250 "
        "characters from [A-Za-z0-9_.-]"
    )
