"""Where data lives: local folders and S3 locations behind one set of names, and the settings
that reach a bucket (never its credentials)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path, PurePosixPath

import pytest

from lakehouse.errors import ConfigError
from lakehouse.runtime import objectstore
from lakehouse.runtime.config import Settings
from lakehouse.runtime.objectstore import ObjectPath, S3Settings, location

SECRET = "wJalrXUtnFEMI-not-a-real-secret"


@pytest.fixture(autouse=True)
def _store_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in (
        "LAKEHOUSE_DATA",
        "LAKEHOUSE_S3_ENDPOINT",
        "LAKEHOUSE_S3_PATH_STYLE",
        "LAKEHOUSE_S3_REGION",
        "AWS_REGION",
        "AWS_DEFAULT_REGION",
    ):
        monkeypatch.delenv(name, raising=False)
    objectstore.reset()
    yield
    objectstore.reset()


def test_an_object_path_joins_and_names_like_a_path() -> None:
    root = ObjectPath.parse("s3://lake/prefix/")
    assert str(root) == "s3://lake/prefix"
    table = root / "tables/bronze" / "user-locations"
    assert str(table) == "s3://lake/prefix/tables/bronze/user-locations"
    assert table.name == "user-locations"
    assert table.parent == root / "tables" / "bronze"
    assert table.with_name("other") == root / "tables/bronze/other"
    assert table.is_relative_to(root) and not root.is_relative_to(table)
    assert not (ObjectPath.parse("s3://lake/prefix2") / "t").is_relative_to(root)
    assert not table.is_relative_to(ObjectPath.parse("s3://other/prefix"))
    assert table.relative_to(root) == PurePosixPath("tables/bronze/user-locations")
    assert (root / "a.json.gz").suffix == ".gz"
    assert table.store_path == "lake/prefix/tables/bronze/user-locations"
    assert str(ObjectPath.parse("s3a://lake")) == "s3a://lake"


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        ("gs://lake/prefix", "not gs://"),
        ("hdfs://namenode/lake", "not hdfs://"),
        ("s3://Lake_Bucket/prefix", "not an S3 bucket name"),
        ("s3://lake/../escape", "no '.' or '..'"),
        ("s3://lake/prefix?versionId=1", "no ?, # or @"),
        ("s3://key:secret@lake/prefix", "no ?, # or @"),
    ],
)
def test_a_data_root_the_platform_cannot_use_is_refused_with_what_and_why(
    raw: str, says: str
) -> None:
    with pytest.raises(ConfigError, match="LAKEHOUSE_DATA") as caught:
        location(raw)
    assert says in str(caught.value)


def test_a_join_cannot_climb_out_of_the_bucket_prefix() -> None:
    with pytest.raises(ConfigError, match=r"no '\.' or '\.\.'"):
        ObjectPath.parse("s3://lake/prefix") / "../other"


def test_a_home_in_a_bucket_is_refused_and_points_at_the_data_setting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("LAKEHOUSE_HOME", "s3://lake/home")
    with pytest.raises(ConfigError, match="LAKEHOUSE_DATA=s3://bucket/prefix"):
        Settings.from_env()


def test_data_in_a_bucket_keeps_this_machines_state_local(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LAKEHOUSE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("LAKEHOUSE_DATA", "s3a://lake/prod")
    s = Settings.from_env()
    root = ObjectPath.parse("s3a://lake/prod")
    assert s.remote and s.data_root == root
    assert s.bronze_path("user-locations") == root / "tables/bronze/user-locations"
    assert s.gold_path("user_places") == root / "tables/gold/user_places"
    assert s.topic_dir("user-locations") == root / "landing/topics/user-locations"
    assert s.registry_path == root / "schemas"
    assert s.ledger_path == root / "quality/ledger"
    # This machine's: Airflow, validation files, locks.
    assert s.airflow_home == tmp_path / "home" / "airflow"
    assert s.validations_root == tmp_path / "home" / "quality" / "validations"
    lock = s.lock_path(s.bronze_path("user-locations"))
    assert lock == tmp_path / "home" / "locks" / "lake" / "prod/tables/bronze/user-locations.lock"


def test_local_data_defaults_to_the_home_and_tables_keep_their_locks_beside_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LAKEHOUSE_HOME", str(tmp_path))
    s = Settings.from_env()
    assert not s.remote and s.data_root == tmp_path
    assert s.bronze_path("t") == tmp_path / "tables" / "bronze" / "t"
    assert s.lock_path(s.bronze_path("t")) == tmp_path / "tables" / "bronze" / ".t.lock"
    monkeypatch.setenv("LAKEHOUSE_DATA", str(tmp_path / "elsewhere"))
    assert Settings.from_env().silver_path("s") == tmp_path / "elsewhere/tables/silver/s"


@pytest.mark.parametrize(
    ("endpoint", "says"),
    [
        ("minio:9000", "http(s)://host[:port]"),
        ("ftp://minio:9000", "http(s)://host[:port]"),
        ("http://minio:9000/bucket", "with no path"),
        ("http://key:secret@minio:9000", "must not carry credentials"),
    ],
)
def test_an_endpoint_the_platform_cannot_use_is_refused(
    endpoint: str, says: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LAKEHOUSE_S3_ENDPOINT", endpoint)
    with pytest.raises(ConfigError, match="LAKEHOUSE_S3_ENDPOINT") as caught:
        S3Settings.from_env()
    assert says in str(caught.value)
    assert "secret" not in str(caught.value).replace("must not carry credentials", "")


def test_path_style_follows_the_endpoint_unless_set(monkeypatch: pytest.MonkeyPatch) -> None:
    assert S3Settings.from_env() == S3Settings(None, False, "us-east-1")
    monkeypatch.setenv("AWS_REGION", "eu-west-1")
    monkeypatch.setenv("LAKEHOUSE_S3_ENDPOINT", "http://minio:9000")
    assert S3Settings.from_env() == S3Settings("http://minio:9000", True, "eu-west-1")
    monkeypatch.setenv("LAKEHOUSE_S3_PATH_STYLE", "false")
    assert not S3Settings.from_env().path_style
    monkeypatch.setenv("LAKEHOUSE_S3_PATH_STYLE", "yes")
    with pytest.raises(ConfigError, match="LAKEHOUSE_S3_PATH_STYLE must be true or false"):
        S3Settings.from_env()


def test_spark_and_delta_rs_get_the_store_settings_and_no_credentials(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from lakehouse.runtime.spark import spark_conf

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIA-not-a-real-key")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    assert "spark.hadoop.fs.s3a.endpoint" not in spark_conf("local[1]", "t")  # no store named
    monkeypatch.setenv("LAKEHOUSE_S3_ENDPOINT", "http://127.0.0.1:19000")
    assert spark_conf("local[1]", "t")["spark.hadoop.fs.s3a.endpoint"] == "http://127.0.0.1:19000"
    monkeypatch.setenv("LAKEHOUSE_DATA", "s3://lake/p")
    conf = spark_conf("local[1]", "t")
    assert conf["spark.hadoop.fs.s3a.endpoint"] == "http://127.0.0.1:19000"
    assert conf["spark.hadoop.fs.s3a.path.style.access"] == "true"
    assert conf["spark.hadoop.fs.s3a.connection.ssl.enabled"] == "false"
    assert conf["spark.hadoop.fs.s3.impl"] == "org.apache.hadoop.fs.s3a.S3AFileSystem"
    assert conf["spark.executorEnv.LAKEHOUSE_DATA"] == "s3://lake/p"
    assert conf["spark.executorEnv.LAKEHOUSE_S3_ENDPOINT"] == "http://127.0.0.1:19000"
    assert not [k for k, v in conf.items() if SECRET in v or "AKIA" in v or "AWS_" in k]
    options = objectstore.storage_options("s3a://lake/p/t")
    assert options == {
        "AWS_REGION": "us-east-1",
        "AWS_VIRTUAL_HOSTED_STYLE_REQUEST": "false",
        "AWS_ENDPOINT_URL": "http://127.0.0.1:19000",
        "AWS_ALLOW_HTTP": "true",
    }
    assert objectstore.storage_options(Path("/tmp/t")) is None


def test_local_files_go_through_the_same_functions(tmp_path: Path) -> None:
    objectstore.write_bytes(tmp_path / "a" / "b.json", b"{}\n")
    assert [e.name for e in objectstore.listdir(tmp_path)] == ["a"]
    assert objectstore.is_dir(tmp_path / "a") and not objectstore.exists(tmp_path / "zz")
    assert objectstore.read_bytes(tmp_path / "a" / "b.json") == b"{}\n"
    assert [e.name for e in objectstore.walk_files(tmp_path)] == ["b.json"]
    assert objectstore.listdir(tmp_path / "missing") == []
    objectstore.remove_tree(tmp_path / "a")
    assert not objectstore.exists(tmp_path / "a")


def test_a_driver_per_task_may_commit_to_a_bucket_only_under_the_multi_driver_log_store(
    tmp_path: Path,
) -> None:
    bucket = ObjectPath.parse("s3a://lake/prod")
    objectstore.check_commit_safety(tmp_path, {})  # local files: this machine's locks
    with pytest.raises(ConfigError, match="spark_connect") as caught:
        objectstore.check_commit_safety(bucket, {"spark.master": "spark://host:7077"})
    assert "spark.delta.logStore.s3a.impl=io.delta.storage.S3DynamoDBLogStore" in str(caught.value)
    with pytest.raises(ConfigError):  # the key is per scheme: s3:// is not s3a://
        objectstore.check_commit_safety(
            bucket, {"spark.delta.logStore.s3.impl": objectstore.MULTI_DRIVER_LOG_STORE}
        )
    objectstore.check_commit_safety(
        bucket, {"spark.delta.logStore.s3a.impl": objectstore.MULTI_DRIVER_LOG_STORE}
    )


def test_another_environment_in_the_same_process_gets_its_own_store(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A store's settings and client follow the environment they were read from: a second
    endpoint or key set in the same process is used as it is, not the first one cached."""
    monkeypatch.setenv("LAKEHOUSE_S3_ENDPOINT", "http://127.0.0.1:9001")
    first = objectstore.storage_options("s3://lake/t")
    client = objectstore._filesystem()
    assert first is not None and first["AWS_ENDPOINT_URL"] == "http://127.0.0.1:9001"
    assert objectstore._filesystem() is client  # the same environment: the same client

    monkeypatch.setenv("LAKEHOUSE_S3_ENDPOINT", "http://127.0.0.1:9002")
    second = objectstore.storage_options("s3://lake/t")
    assert second is not None and second["AWS_ENDPOINT_URL"] == "http://127.0.0.1:9002"
    assert objectstore._filesystem() is not client
    moved = objectstore._filesystem()
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAOTHERDEPLOYMENT")
    assert objectstore._filesystem() is not moved
