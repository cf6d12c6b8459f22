"""A Kafka-sourced contract as client settings: servers, secrets from the environment."""

from __future__ import annotations

from pathlib import Path

import pytest

from lakehouse.contracts.catalog import load_contract
from lakehouse.contracts.model import Contract, KafkaOrigin
from lakehouse.errors import BrokerUnavailableError, ConfigError
from lakehouse.runtime.config import Settings
from lakehouse.topics import kafka

CONTRACT = """\
topic: payments
partitions: 3
key: {format: string, name: id}
value: {format: json, fields: [{name: amount, type: long}]}
stream: {name: payments_stream}
kafka:
  topic: payments.v1
  bootstrap_servers: broker-1:9092
  properties: {security.protocol: SASL_SSL, sasl.mechanism: PLAIN}
  secrets: {sasl.password: TEST_KAFKA_PASSWORD}
"""


@pytest.fixture
def contract(tmp_path: Path) -> Contract:
    path = tmp_path / "payments.yaml"
    path.write_text(CONTRACT)
    return load_contract(path)


def test_secrets_come_from_the_environment_and_are_never_shown(
    contract: Contract, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TEST_KAFKA_PASSWORD", "s3cr3t-value")
    c = kafka.client(Settings(home=tmp_path, contracts_dir=tmp_path), contract)
    assert (c.topic, c.bootstrap_servers, c.group) == (
        "payments.v1",
        "broker-1:9092",
        "lakehouse-bronze.payments",
    )
    assert c.config["sasl.password"] == "s3cr3t-value"
    assert c.spark_options() == {
        "kafka.bootstrap.servers": "broker-1:9092",
        "kafka.security.protocol": "SASL_SSL",
        "kafka.sasl.mechanism": "PLAIN",
        "kafka.sasl.password": "s3cr3t-value",
    }
    assert "s3cr3t" not in repr(c)
    assert "s3cr3t" not in str(c.unavailable("reading", OSError("refused")))


def test_a_missing_secret_variable_is_refused_before_anything_runs(
    contract: Contract, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TEST_KAFKA_PASSWORD", raising=False)
    with pytest.raises(ConfigError, match=r"TEST_KAFKA_PASSWORD.*not set") as info:
        kafka.client(Settings(home=tmp_path, contracts_dir=tmp_path), contract)
    assert "payments.yaml" in str(info.value)


def test_servers_default_to_the_environment(
    contract: Contract, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dataclasses import replace

    monkeypatch.setenv(kafka.BOOTSTRAP_ENV, "elsewhere:29092")
    monkeypatch.setenv("TEST_KAFKA_PASSWORD", "x")
    bare = replace(contract, kafka=KafkaOrigin(topic="payments.v1"))
    assert (
        kafka.client(Settings(home=tmp_path, contracts_dir=tmp_path), bare).bootstrap_servers
        == "elsewhere:29092"
    )


def test_a_landing_topic_has_no_client(contract: Contract, tmp_path: Path) -> None:
    from dataclasses import replace

    with pytest.raises(ConfigError, match="lands as files"):
        kafka.client(Settings(home=tmp_path, contracts_dir=tmp_path), replace(contract, kafka=None))


def test_a_broker_that_does_not_answer_is_a_broker_unavailable_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Nothing listens at the servers: every request ends, within the client's timeout, in a
    BrokerUnavailableError naming them (never a bare timeout: bronze keeps a commit the group's
    mirror failed after, and the command line prints the message)."""
    from lakehouse.runtime.process import free_port

    monkeypatch.setattr(kafka, "TIMEOUT_S", 1.0)
    servers = f"127.0.0.1:{free_port()}"
    c = kafka.Client("payments", "payments.v1", servers, {"bootstrap.servers": servers})
    requests = {
        "reading the topic's metadata": lambda: kafka.partition_count(c),
        "creating the topic": lambda: kafka.create_topic(c, 3),
        "reading the partitions' offsets": lambda: kafka.offsets(c, 3),
        "committing consumer group lakehouse-bronze.payments": lambda: kafka.commit_group(
            c, {0: 1}
        ),
        "reading consumer group lakehouse-bronze.payments": lambda: kafka.group_offsets(c),
    }
    for what, request in requests.items():
        with pytest.raises(BrokerUnavailableError) as info:
            request()
        assert f"{what} failed, the broker at {servers} did not answer (" in str(info.value)
        assert "did not answer ()" not in str(info.value)
