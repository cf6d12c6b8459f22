"""The names tables get in the metastore, and the metastore's settings (no Spark)."""

from __future__ import annotations

import pytest

from lakehouse.errors import ConfigError
from lakehouse.runtime import metastore as where
from lakehouse.runtime.config import Settings
from lakehouse.runtime.objectstore import location
from lakehouse.storage.metastore import TableName, table_name


@pytest.mark.parametrize(
    ("path_of", "name"),
    [
        (lambda s: s.bronze_path("user-locations"), "bronze.user_locations"),
        (lambda s: s.silver_path("user_locations"), "silver.user_locations"),
        (lambda s: s.gold_path("user_places"), "gold.user_places"),
        (lambda s: s.quarantine_path("bronze", "Clicks.v2"), "quarantine_bronze.clicks_v2"),
        (lambda s: s.quarantine_path("silver", "clicks"), "quarantine_silver.clicks"),
        (lambda s: s.late_path("user_sessions"), "late.user_sessions"),
        (lambda s: s.state_path("joined__other"), "state.joined__other"),
        (lambda s: s.gaps_path("orders-eu"), "gaps.orders_eu"),
        (lambda s: s.ledger_path, "quality.ledger"),
        (lambda s: s.registry_path, "schemas.registry"),
    ],
)
def test_each_kind_of_table_has_a_name_of_its_schema(
    settings: Settings, path_of: object, name: str
) -> None:
    path = path_of(settings)  # type: ignore[operator]
    assert str(table_name(settings.data_root, path)) == name


def test_the_same_names_for_a_lake_in_a_bucket(settings: Settings) -> None:
    bucket = Settings(settings.home, settings.contracts_dir, data=location("s3://lake-bucket/lake"))
    assert (
        str(table_name(bucket.data_root, bucket.bronze_path("user-locations")))
        == "bronze.user_locations"
    )
    assert str(table_name(bucket.data_root, bucket.ledger_path)) == "quality.ledger"


def test_places_that_are_no_pipeline_table_have_no_name(settings: Settings) -> None:
    assert table_name(settings.data_root, settings.home / "restored" / "user_places-1") is None
    assert table_name(settings.data_root, settings.tables_root / "scratch" / "x" / "y") is None
    assert table_name(settings.data_root, settings.tables_root / "gold") is None


def test_a_name_given_to_drop_is_one_of_the_platforms_schemas() -> None:
    assert TableName.parse("Gold.User_Places") == TableName("gold", "user_places")
    with pytest.raises(ConfigError, match=r"give <schema>\.<table>, the schema one of bronze"):
        TableName.parse("default.t")
    with pytest.raises(ConfigError, match="is not a name of the lakehouse's catalog"):
        TableName.parse("user_places")


def test_the_embedded_metastore_lives_under_the_home(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(where.METASTORE_ENV, raising=False)
    conf = where.session_conf(settings)
    assert conf["spark.sql.catalogImplementation"] == "hive"
    database = settings.home / "metastore" / "derby"
    assert conf["spark.hadoop.javax.jdo.option.ConnectionURL"].startswith(
        f"jdbc:derby:;databaseName={database};"
    )
    assert conf["spark.sql.warehouse.dir"] == str(settings.home / "metastore" / "warehouse")
    monkeypatch.setenv(where.METASTORE_ENV, "none")
    assert where.session_conf(settings) == {}


def test_an_unknown_metastore_is_refused_naming_the_variable(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(where.METASTORE_ENV, "mysql")
    with pytest.raises(ConfigError, match=r"LAKEHOUSE_METASTORE='mysql': expected one of derby"):
        where.metastore_conf(settings)


def test_a_postgres_server_of_the_deployments_is_named_by_a_url(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(where.METASTORE_ENV, "postgres")
    monkeypatch.setenv(where.URL_ENV, "postgresql://air%40flow:p%2Fw@db.internal/names")
    target = where.postgres_target(settings)
    assert target == where.PostgresTarget("db.internal", 5432, "air@flow", "p/w", "names")
    assert target.jdbc_url == "jdbc:postgresql://db.internal:5432/names"
    assert where.metastore_conf(settings)[where.LAKE_CONF] == str(settings.data_root)


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("mysql://u:p@h/db", r"expected postgresql://USER:PASSWORD@HOST:PORT/DATABASE, got mysql"),
        ("postgresql://u:p@h", r"got postgresql://h/\(no database\)"),
        ("postgresql://h:5432/db", r"names no USER:PASSWORD@"),
    ],
)
def test_a_malformed_metastore_url_is_refused_saying_what_is_missing(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, url: str, says: str
) -> None:
    monkeypatch.setenv(where.METASTORE_ENV, "postgres")
    monkeypatch.setenv(where.URL_ENV, url)
    with pytest.raises(ConfigError, match=rf"LAKEHOUSE_METASTORE_URL: .*{says}"):
        where.metastore_conf(settings)
