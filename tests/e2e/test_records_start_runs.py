"""Records arriving start a run: a Kafka-sourced topic's pipeline DAG, unpaused and never
triggered by hand, runs when records are produced to its broker topic; and a broken contract in
the same folder breaks only its own DAG.

Airflow 3 runs for real with its triggerer (see airflow_stack.py; LocalExecutor on PostgreSQL,
layer tasks as clients of a Spark server), against the test session's Kafka broker. The DAG is
scheduled on its time schedule or on the Asset that Airflow's Kafka message-queue trigger watches
(lakehouse.orchestration.assets.records_asset). Unpausing it also starts its first interval run; the
records are produced once the trigger's consumer has joined its group and that run is done, and
the run the asset events create must take them through bronze, silver and gold, alone.
"""

from __future__ import annotations

import io
import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from airflow_stack import Airflow, running_airflow

from lakehouse import cli
from lakehouse.contracts.model import Catalog, Contract
from lakehouse.orchestration.airflow_env import SPARK_CONN_ENV, kafka_trigger_group
from lakehouse.runtime.config import Settings
from lakehouse.runtime.postgres import Cluster
from lakehouse.storage import read_arrow
from lakehouse.topics import kafka
from lakehouse.topics.landing import Record

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

TOPIC = "kt-checkins"
DAG_ID = f"pipeline__{TOPIC}"
LATEST, COUNTS = "kt_latest_location", "kt_checkin_counts"
EVENTS = [("alice", "Paris"), ("bob", "Lima"), ("alice", "Rome"), ("carol", "Quito")]
BASE_MS = 1_700_000_000_000
BROKEN = "kt-broken"
BROKEN_TEXT = """\
topic: kt-broken
partitions: 1
key: {format: string, name: id}
value: {format: json, fields: [{name: amount, type: long}]}
stream: {name: kt_broken}
tabels: [{name: kt_broken_latest, kind: latest}]
"""
# The DAG processor parses the DAG file again this often (Airflow's default: 30 s). The trigger
# that watches the topic's Asset starts once the file is parsed with the DAG unpaused.
PARSE_EVERY = {"AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "5"}


def _contract_text(kafka_topic: str, servers: str) -> str:
    return f"""\
topic: {TOPIC}
description: Check-ins from a Kafka broker, for the trigger test.
partitions: 2
schedule_minutes: 60
key: {{format: string, name: username}}
value:
  format: json
  fields:
    - {{name: location, type: string, nullable: true}}
stream: {{name: kt_checkins}}
tables:
  - {{name: {LATEST}, kind: latest}}
  - name: {COUNTS}
    kind: aggregate
    aggregations:
      - {{name: count, fn: count}}
kafka: {{topic: {kafka_topic}, bootstrap_servers: '{servers}'}}
"""


@dataclass
class Stack:
    settings: Settings
    contract: Contract
    airflow: Airflow


@pytest.fixture(scope="module")
def stack(
    tmp_path_factory: pytest.TempPathFactory,
    postgres: Cluster,
    spark_server: str,
    kafka_broker: Any,
) -> Iterator[Stack]:
    """The topic created on the broker, Airflow running with its triggerer, the DAG stored."""
    root = tmp_path_factory.mktemp("kafka-trigger")
    contracts = root / "contracts"
    contracts.mkdir()
    kafka_topic = f"kt-checkins-{uuid.uuid4().hex[:8]}"
    (contracts / f"{TOPIC}.yaml").write_text(
        _contract_text(kafka_topic, kafka_broker.bootstrap_servers)
    )
    # Beside it, a contract with a misspelled field: it must break its own DAG and nothing else.
    (contracts / f"{BROKEN}.yaml").write_text(BROKEN_TEXT)
    settings = Settings.from_env(home=root / "lakehouse", contracts_dir=contracts)
    contract = Catalog.load_each(contracts).topic(TOPIC)  # beside a broken contract
    assert cli.create_topic(settings, contract, io.StringIO()) == 0
    extra = PARSE_EVERY | {SPARK_CONN_ENV: spark_server}
    with running_airflow(
        settings, root / "airflow-logs", postgres=postgres, extra_env=extra, triggerer=True
    ) as airflow:
        airflow.wait_for_dag(DAG_ID)
        yield Stack(settings, contract, airflow)


def _wait_for_trigger_consumer(stack: Stack, timeout: float = 180) -> None:
    """Until the trigger's consumer holds the topic's partitions in its group: it reads from the
    end of the topic the first time, so records produced before that would not start a run."""
    from confluent_kafka import ConsumerGroupState, KafkaException
    from confluent_kafka.admin import AdminClient

    client = kafka.client(stack.settings, stack.contract)
    admin = AdminClient({"bootstrap.servers": client.bootstrap_servers})
    group = kafka_trigger_group(TOPIC)
    deadline = time.monotonic() + timeout
    state: Any = None
    assigned: list[int] = []
    while True:
        try:
            described = admin.describe_consumer_groups([group], request_timeout=10)[group].result()
        except KafkaException as exc:  # no such group yet: its coordinator does not know it
            state = exc.args[0]
        else:
            state = described.state
            assigned = [
                tp.partition
                for member in described.members
                for tp in (member.assignment.topic_partitions if member.assignment else [])
            ]
            if state == ConsumerGroupState.STABLE and sorted(assigned) == [0, 1]:
                return
        stack.airflow.check_alive()
        if time.monotonic() > deadline:
            raise AssertionError(
                f"the Kafka trigger's group {group} is {state} with partitions {assigned} "
                f"after {timeout} s\n" + stack.airflow.log_tail("triggerer")
            )
        time.sleep(1)


def _trigger_behind(stack: Stack) -> int:
    """Records of the topic the trigger's group has not committed yet (not read through)."""
    from confluent_kafka import ConsumerGroupTopicPartitions
    from confluent_kafka.admin import AdminClient

    client = kafka.client(stack.settings, stack.contract)
    admin = AdminClient({"bootstrap.servers": client.bootstrap_servers})
    group = kafka_trigger_group(TOPIC)
    answer = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])
    committed = {tp.partition: tp.offset for tp in answer[group].result().topic_partitions}
    ends = kafka.offsets(client, stack.contract.partitions)
    return sum(end - max(committed.get(p, 0), 0) for p, (_, end) in ends.items())


def _runs(airflow: Airflow, run_type: str) -> list[dict[str, Any]]:
    return [r for r in airflow.dag_runs(DAG_ID) if r["run_type"] == run_type]


def _kafka_events(airflow: Airflow) -> list[dict[str, Any]]:
    reply = airflow.api("GET", "/assets/events?limit=100")["asset_events"]
    return [e for e in reply if e["name"] == f"kafka.{TOPIC}"]


def test_records_arriving_start_a_run_that_takes_them_to_gold(stack: Stack) -> None:
    airflow = stack.airflow
    started = time.monotonic()
    airflow.set_paused(DAG_ID, False)
    _wait_for_trigger_consumer(stack)
    print(f"\ntrigger consuming {time.monotonic() - started:.1f} s after unpausing")
    # Unpausing also started the DAG's interval run at once (catchup off): it finds nothing and
    # must be done before the records are produced, so that only the trigger can take them.
    while not (scheduled_runs := _runs(airflow, "scheduled")):
        assert time.monotonic() < started + 60, "no interval run after unpausing"
        time.sleep(0.5)
    (scheduled,) = scheduled_runs
    assert airflow.wait_for_run(DAG_ID, scheduled["dag_run_id"])["state"] == "success"
    print(f"interval run done {time.monotonic() - started:.1f} s after unpausing")
    assert (
        not stack.settings.bronze_path(TOPIC).exists()
        or not read_arrow(stack.settings.bronze_path(TOPIC)).num_rows
    )

    records = [
        Record(user.encode(), json.dumps({"location": place}).encode(), BASE_MS + 60_000 * i)
        for i, (user, place) in enumerate(EVENTS)
    ]
    client = kafka.client(stack.settings, stack.contract)
    kafka.Producer(client, stack.contract.partitions).send_batch(records)
    produced = time.monotonic()

    while not (runs := _runs(airflow, "asset_triggered")):
        airflow.check_alive()
        assert time.monotonic() < produced + 120, airflow.log_tail("triggerer")
        time.sleep(0.5)
    created = time.monotonic()
    (run,) = runs
    finished = airflow.wait_for_run(DAG_ID, run["dag_run_id"], timeout=600)
    print(
        f"asset-triggered run created {created - produced:.1f} s after producing, "
        f"{finished['state']} {time.monotonic() - produced:.1f} s after"
    )
    assert finished["state"] == "success", _tasks(airflow, run["dag_run_id"])
    assert finished["triggered_by"] == "asset"

    # It took the records through every layer.
    bronze = read_arrow(stack.settings.bronze_path(TOPIC)).to_pylist()
    assert sorted(r["key"] for r in bronze) == sorted(u.encode() for u, _ in EVENTS)
    assert read_arrow(stack.settings.silver_path(stack.contract.stream)).num_rows == len(EVENTS)
    gold = {t: read_arrow(stack.settings.gold_path(t)).to_pylist() for t in (LATEST, COUNTS)}
    assert {r["username"]: r["location"] for r in gold[LATEST]} == {
        "alice": "Rome",
        "bob": "Lima",
        "carol": "Quito",
    }
    assert {r["username"]: r["count"] for r in gold[COUNTS]} == {"alice": 2, "bob": 1, "carol": 1}

    # The run consumed the Kafka asset's events, which name a record's place, not its content.
    path = f"/dags/{DAG_ID}/dagRuns/{run['dag_run_id']}/upstreamAssetEvents"
    consumed = airflow.api("GET", path)["asset_events"]
    assert consumed and {e["name"] for e in consumed} == {f"kafka.{TOPIC}"}, consumed
    assert all(set(e["extra"]["payload"]) == {"topic", "partition", "offset"} for e in consumed)

    # No storm: once the trigger has read every record, the burst made one run, not one each.
    while behind := _trigger_behind(stack):
        assert time.monotonic() < produced + 120, f"the trigger is {behind} record(s) behind"
        time.sleep(0.5)
    time.sleep(3)  # a few scheduler loops, for a run another event would make
    events = _kafka_events(airflow)
    print(
        f"{len(EVENTS)} records: {len(events)} asset event(s), "
        f"{len(_runs(airflow, 'asset_triggered'))} asset-triggered run(s)"
    )
    assert len(_runs(airflow, "asset_triggered")) == 1
    assert len(events) < len(EVENTS)


def _tasks(airflow: Airflow, run_id: str) -> dict[str, str]:
    return {t["task_id"]: t["state"] for t in airflow.task_instances(DAG_ID, run_id)}


def test_a_broken_contract_beside_it_breaks_only_its_own_dag(stack: Stack) -> None:
    """The good topic's DAG is there and runs (the test above: its interval run and its
    asset-triggered run, with the broken file in the same folder all along); the DAG files parse
    without an import error; the broken contract's DAG says what is wrong and where; the
    maintenance DAG is there."""
    airflow = stack.airflow
    assert airflow.api("GET", "/importErrors")["import_errors"] == []
    broken = airflow.wait_for_dag(f"pipeline__{BROKEN}")
    assert broken["description"].startswith(f"broken contract {BROKEN}.yaml: ")
    assert "tabels" in broken["description"]
    assert {t["name"] for t in broken["tags"]} >= {"broken contract"}
    details = airflow.api("GET", f"/dags/pipeline__{BROKEN}/details")
    assert str(stack.settings.contracts_dir / f"{BROKEN}.yaml") in details["doc_md"]
    assert airflow.wait_for_dag("lakehouse__maintenance")["dag_id"] == "lakehouse__maintenance"
    assert airflow.wait_for_dag(DAG_ID)["is_paused"] is False
