"""The Kafka trigger of a Kafka-sourced topic's pipeline DAG, run as Airflow's triggerer runs it
(the trigger its DAG serializes, rebuilt from its class path and arguments, on the connection
``airflow_environment`` gives Airflow) against the test session's broker: a burst of records asks
for one run, and a record arriving later for another."""

from __future__ import annotations

import asyncio
import io
import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from lakehouse.contracts.catalog import Catalog
from lakehouse.contracts.model import Contract
from lakehouse.orchestration.airflow_env import kafka_connections
from lakehouse.orchestration.assets import records_asset
from lakehouse.runtime.config import Settings
from lakehouse.topics import kafka
from lakehouse.topics import produce as producing
from lakehouse.topics.landing import Record

pytestmark = pytest.mark.integration


def _contract_text(kafka_topic: str, servers: str) -> str:
    return (
        "topic: checkins\n"
        "partitions: 2\n"
        "key: {format: string, name: user}\n"
        "value: {format: json, fields: [{name: place, type: string}]}\n"
        "stream: {name: checkins_stream}\n"
        f"kafka: {{topic: {kafka_topic}, bootstrap_servers: '{servers}'}}\n"
    )


@pytest.fixture
def topic(
    tmp_path: Path, kafka_broker: Any, monkeypatch: pytest.MonkeyPatch
) -> tuple[Settings, Contract]:
    """A Kafka-sourced topic created on the broker, its trigger's connection in the
    environment as Airflow's processes get it."""
    contracts = tmp_path / "contracts"
    contracts.mkdir()
    text = _contract_text(f"checkins-{uuid.uuid4().hex[:8]}", kafka_broker.bootstrap_servers)
    (contracts / "checkins.yaml").write_text(text)
    settings = Settings.from_env(tmp_path / "home", contracts)
    contract = Catalog.load(contracts).topic("checkins")
    assert producing.create_topic(settings, contract, io.StringIO()) == 0
    for key, value in kafka_connections(settings, {}).items():
        monkeypatch.setenv(key, value)
    return settings, contract


def _send(settings: Settings, contract: Contract, users: list[str]) -> list[tuple[int, int]]:
    records = [Record(u.encode(), json.dumps({"place": "Oslo"}).encode()) for u in users]
    sent = kafka.Producer(kafka.client(settings, contract), 2).send_batch(records)
    return [(m.partition, m.offset) for m in sent]


def _next_request(contract: Contract) -> dict[str, Any]:
    """One life of the trigger, as the triggerer runs it: until it fires an event, whose
    payload is returned. The triggerer starts it again after each event."""
    from airflow.providers.common.compat.module_loading import import_string

    (watcher,) = records_asset(contract).watchers
    classpath, kwargs = watcher.trigger.serialize()
    trigger = import_string(classpath)(**kwargs)

    async def run() -> list[Any]:
        try:
            return [event.payload async for event in trigger.run()]
        finally:
            await trigger.cleanup()

    (payload,) = asyncio.run(asyncio.wait_for(run(), timeout=60))
    return dict(payload)


def test_a_burst_asks_for_one_run_and_a_later_record_for_another(
    topic: tuple[Settings, Contract],
) -> None:
    settings, contract = topic
    assert contract.kafka is not None
    burst = _send(settings, contract, [f"user-{i}" for i in range(12)])
    assert {p for p, _ in burst} == {0, 1}  # both partitions have records

    first = _next_request(contract)
    assert first["topic"] == contract.kafka.topic
    assert (first["partition"], first["offset"]) in burst
    assert set(first) == {"topic", "partition", "offset"}  # where the record is, not what

    # The rest of the burst was on the broker when the run was asked for: that run reads it.
    # The next request is the next record to arrive.
    (later,) = _send(settings, contract, ["user-late"])
    second = _next_request(contract)
    assert (second["partition"], second["offset"]) == later
