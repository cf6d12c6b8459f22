"""The Airflow environment's generated secrets: made once per lakehouse, private, never shipped."""

from __future__ import annotations

import stat
import subprocess
from pathlib import Path

import pytest
from cryptography.fernet import Fernet

from lakehouse.errors import ConfigError
from lakehouse.orchestration.airflow_env import (
    SECRETS_FILE,
    SPARK_CONN_ENV,
    airflow_environment,
    airflow_secrets,
    database_choice,
    describe_database,
    kafka_conn_id,
    record_database,
)
from lakehouse.orchestration.operators import SPARK_CONN_ID
from lakehouse.runtime import server
from lakehouse.runtime.config import REPO_ROOT, Settings
from lakehouse.runtime.postgres import PostgresError


def test_secrets_are_generated_once_private_and_per_lakehouse(tmp_path: Path) -> None:
    first = airflow_secrets(tmp_path / "a")
    assert airflow_secrets(tmp_path / "a") == first  # stable across calls
    other = airflow_secrets(tmp_path / "b")
    assert all(first[k] != other[k] for k in first)  # each lakehouse has its own
    Fernet(first["fernet_key"].encode())  # a valid Fernet key
    assert len(first["secret_key"]) >= 32 and len(first["jwt_secret"]) >= 32
    mode = stat.S_IMODE((tmp_path / "a" / SECRETS_FILE).stat().st_mode)
    assert mode == 0o600
    assert [p.name for p in (tmp_path / "a").iterdir()] == [SECRETS_FILE]  # no temp file left


def test_environment_requires_login_with_generated_keys(tmp_path: Path) -> None:
    settings = Settings.from_env(tmp_path / "home", REPO_ROOT / "contracts")
    env = airflow_environment(settings, base={})
    secrets = airflow_secrets(settings.airflow_home)
    assert env["AIRFLOW__CORE__FERNET_KEY"] == secrets["fernet_key"]
    assert env["AIRFLOW__API__SECRET_KEY"] == secrets["secret_key"]
    assert env["AIRFLOW__API_AUTH__JWT_SECRET"] == secrets["jwt_secret"]
    assert env["AIRFLOW__CORE__AUTH_MANAGER"].endswith("SimpleAuthManager")
    assert env["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS"] == "False"
    # What the user set wins.
    assert (
        airflow_environment(settings, base={"AIRFLOW__CORE__FERNET_KEY": "mine"})[
            "AIRFLOW__CORE__FERNET_KEY"
        ]
        == "mine"
    )


def test_the_ui_listens_on_this_machine_only_unless_opened(tmp_path: Path) -> None:
    settings = Settings.from_env(tmp_path / "home", REPO_ROOT / "contracts")
    assert airflow_environment(settings, base={})["AIRFLOW__API__HOST"] == "127.0.0.1"
    opened = airflow_environment(settings, base={"AIRFLOW__API__HOST": "0.0.0.0"})
    assert opened["AIRFLOW__API__HOST"] == "0.0.0.0"


def test_a_placeholder_secret_is_refused_naming_it(tmp_path: Path) -> None:
    settings = Settings.from_env(tmp_path / "home", REPO_ROOT / "contracts")
    base = {"AIRFLOW__API__SECRET_KEY": "change-me", "HOME": "/root", "NOTE": "change-me"}
    with pytest.raises(ConfigError, match=r"^AIRFLOW__API__SECRET_KEY still holds the placeholder"):
        airflow_environment(settings, base=base)


def test_layer_tasks_connect_to_the_spark_server_with_its_token(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ``lakehouse_spark`` connection is of the provider's Spark Connect type, at
    ``localhost`` (the only host Spark's client sends a token to without TLS) on the server's
    port, with the server's token; the provider's hook makes the URL a client connects with. A
    connection the user set wins (e.g. a ``spark`` master, for spark-submit)."""
    from airflow.models import Connection
    from airflow.providers.apache.spark.hooks.spark_connect import SparkConnectHook

    monkeypatch.setenv(server.PORT_ENV, "15123")
    settings = Settings.from_env(tmp_path / "home", REPO_ROOT / "contracts")
    env = airflow_environment(settings, base={})
    connection = Connection.from_json(env[SPARK_CONN_ENV], conn_id=SPARK_CONN_ID)
    assert connection.conn_type == SparkConnectHook.conn_type
    token = server.token(settings)  # generated with the environment, before any server ran
    assert (connection.host, connection.port, connection.password) == ("localhost", 15123, token)
    stat_mode = stat.S_IMODE((server.state_dir(settings) / "token").stat().st_mode)
    assert stat_mode == 0o600
    monkeypatch.setenv(f"AIRFLOW_CONN_{SPARK_CONN_ID.upper()}", env[SPARK_CONN_ENV])
    assert SparkConnectHook(SPARK_CONN_ID).get_connection_url() == (
        f"sc://localhost:15123/;token={token}"
    )
    mine = '{"conn_type": "spark", "host": "spark://cluster:7077"}'
    assert airflow_environment(settings, base={SPARK_CONN_ENV: mine})[SPARK_CONN_ENV] == mine


def test_no_secret_is_committed() -> None:
    """No secrets file, generated password file or Airflow config is tracked by git."""
    tracked = subprocess.run(
        ["git", "ls-files"], cwd=REPO_ROOT, capture_output=True, text=True, check=True
    ).stdout.splitlines()
    assert tracked, "not a git checkout"
    names = {Path(p).name for p in tracked}
    assert not names & {SECRETS_FILE, "simple_auth_manager_passwords.json.generated", "airflow.cfg"}


def test_metadata_database_choice_is_checked(tmp_path: Path) -> None:
    settings = Settings.from_env(tmp_path / "home", REPO_ROOT / "contracts")
    with pytest.raises(ConfigError, match="LAKEHOUSE_AIRFLOW_DB must be one of sqlite, postgres"):
        airflow_environment(settings, base={"LAKEHOUSE_AIRFLOW_DB": "mysql"})
    # PostgreSQL is used only when its cluster runs: no silent fallback to SQLite.
    with pytest.raises(PostgresError, match="not running: start it with `lakehouse postgres"):
        airflow_environment(settings, base={"LAKEHOUSE_AIRFLOW_DB": "postgres"})


def test_airflow_commands_use_the_database_make_airflow_runs_on_and_say_so(
    tmp_path: Path,
) -> None:
    """`lakehouse airflow ...` after `make airflow` (`lakehouse airflow standalone` on
    PostgreSQL) uses PostgreSQL without being told; before it, SQLite; the variable wins."""
    settings = Settings.from_env(tmp_path / "home", REPO_ROOT / "contracts")
    assert database_choice(settings, {}) == ("sqlite", "the default")
    assert "SQLite at " in describe_database(settings, {})
    record_database(settings, {"LAKEHOUSE_AIRFLOW_DB": "postgres"})  # as make airflow runs it
    assert database_choice(settings, {}) == (
        "postgres",
        "the one `lakehouse airflow standalone` (make airflow) last ran on",
    )
    said = describe_database(settings, {})
    assert said.startswith("Airflow's metadata database: PostgreSQL of ")
    assert "(not running: `lakehouse postgres start`)" in said
    assert "LAKEHOUSE_AIRFLOW_DB=sqlite or postgres chooses another" in said
    # Not running: the command fails saying how to start it, instead of using SQLite.
    with pytest.raises(PostgresError, match="not running: start it with `lakehouse postgres"):
        airflow_environment(settings, base={})
    assert database_choice(settings, {"LAKEHOUSE_AIRFLOW_DB": "sqlite"}) == (
        "sqlite",
        "set by LAKEHOUSE_AIRFLOW_DB",
    )
    assert "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN" not in airflow_environment(
        settings, base={"LAKEHOUSE_AIRFLOW_DB": "sqlite"}
    )


def test_the_execution_api_follows_the_api_servers_port(tmp_path: Path) -> None:
    settings = Settings.from_env(tmp_path / "home", REPO_ROOT / "contracts")
    url = "AIRFLOW__CORE__EXECUTION_API_SERVER_URL"
    assert airflow_environment(settings, base={})[url] == "http://127.0.0.1:8080/execution/"
    moved = airflow_environment(settings, base={"AIRFLOW__API__PORT": "18080"})
    assert moved[url] == "http://127.0.0.1:18080/execution/"


KAFKA_CONTRACT = """\
topic: {topic}
partitions: 2
key: {{format: string, name: id}}
value: {{format: json, fields: [{{name: amount, type: long}}]}}
stream: {{name: {stream}}}
kafka:
  topic: payments-v1
  bootstrap_servers: 'broker-1:9092,broker-2:9092'
  properties: {{security.protocol: SASL_SSL, sasl.mechanism: PLAIN, sasl.username: lakehouse}}
  secrets: {{sasl.password: TEST_KAFKA_PASSWORD}}
"""


def _kafka_lake(tmp_path: Path, *topics: str) -> Settings:
    contracts = tmp_path / "contracts"
    contracts.mkdir(parents=True)
    for i, topic in enumerate(topics):
        text = KAFKA_CONTRACT.format(topic=topic, stream=f"stream_{i}")
        (contracts / f"{topic}.yaml").write_text(text)
    return Settings.from_env(tmp_path / "home", contracts)


def test_a_kafka_topics_trigger_gets_a_connection_with_its_client_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The trigger's connection (type kafka): the contract's servers and settings, the secret
    from the variable the contract names, the trigger's own consumer group; the provider's
    consumer hook reads exactly that. A connection the user set wins."""
    from airflow.models import Connection
    from airflow.providers.apache.kafka.hooks.consume import KafkaConsumerHook

    monkeypatch.setenv("TEST_KAFKA_PASSWORD", "s3cret")
    settings = _kafka_lake(tmp_path, "payments")
    env = airflow_environment(settings, base={})
    conn_id = kafka_conn_id("payments")
    key = f"AIRFLOW_CONN_{conn_id.upper()}"
    assert key == "AIRFLOW_CONN_LAKEHOUSE_KAFKA__PAYMENTS"
    connection = Connection.from_json(env[key], conn_id=conn_id)
    assert connection.conn_type == "kafka"
    monkeypatch.setenv(key, env[key])
    assert KafkaConsumerHook(["payments-v1"], conn_id)._build_config() == {
        "bootstrap.servers": "broker-1:9092,broker-2:9092",
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "PLAIN",
        "sasl.username": "lakehouse",
        "sasl.password": "s3cret",
        "group.id": "lakehouse-trigger.payments",
        "auto.offset.reset": "earliest",
        "enable.auto.commit": "false",
    }
    mine = '{"conn_type": "kafka", "extra": {"bootstrap.servers": "elsewhere:9092"}}'
    assert airflow_environment(settings, base={key: mine})[key] == mine


def test_a_kafka_topics_connection_needs_its_secret_and_an_id_of_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TEST_KAFKA_PASSWORD", raising=False)
    settings = _kafka_lake(tmp_path / "a", "payments")
    with pytest.raises(ConfigError, match=r"TEST_KAFKA_PASSWORD.*not set"):
        airflow_environment(settings, base={})
    monkeypatch.setenv("TEST_KAFKA_PASSWORD", "s3cret")
    # Topics whose names differ only where a connection id cannot: refused, naming both.
    settings = _kafka_lake(tmp_path / "b", "pay-ments", "pay.ments")
    with pytest.raises(ConfigError, match=r"'pay\.ments' and topic 'pay-ments'.*rename one"):
        airflow_environment(settings, base={})
    # Landing topics get none.
    landing = Settings.from_env(tmp_path / "home", REPO_ROOT / "contracts")
    assert not [k for k in airflow_environment(landing, base={}) if "KAFKA" in k]
