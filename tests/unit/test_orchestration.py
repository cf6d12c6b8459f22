"""The pipeline DAGs' schedules: a landing topic's runs on its clock alone; a Kafka-sourced
topic's on the same clock or when records arrive on its broker topic. A contract that does not
load breaks only its own DAGs. A run's Params are what its request reads, by the same names."""

from __future__ import annotations

import importlib
import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from airflow.sdk import DAG, Asset, AssetOrTimeSchedule
from airflow.serialization.serialized_objects import DagSerialization

from lakehouse.contracts.catalog import Catalog, parse_contract
from lakehouse.contracts.model import Contract
from lakehouse.errors import ContractError
from lakehouse.orchestration.airflow_env import kafka_conn_id
from lakehouse.orchestration.dags import START, maintenance_dags, pipeline_dag, pipeline_dags
from lakehouse.pipeline.request import OPTIONS, RunRequest, own
from lakehouse.runtime.config import REPO_ROOT, Settings

CONTRACT = {
    "topic": "payments",
    "partitions": 3,
    "schedule_minutes": 7,
    "key": {"format": "string", "name": "id"},
    "value": {"format": "json", "fields": [{"name": "amount", "type": "long"}]},
    "stream": {"name": "payments_stream"},
    "tables": [{"name": "payment_latest", "kind": "latest"}],
}
FROM_KAFKA = {"kafka": {"topic": "payments-v1", "bootstrap_servers": "broker:9092"}}


def _contract(**extra: Any) -> Contract:
    return parse_contract(yaml.safe_load(yaml.safe_dump({**CONTRACT, **extra})))


def _settings(tmp_path: Path) -> Settings:
    return Settings.from_env(tmp_path / "home", tmp_path / "contracts")


def _every(minutes: int) -> Any:
    """What Airflow makes of ``schedule=timedelta(minutes=...)``."""
    return DAG("reference", schedule=timedelta(minutes=minutes), start_date=START).timetable


def test_a_landing_topics_dag_runs_on_its_clock_alone(tmp_path: Path) -> None:
    dag = pipeline_dag(_contract(), _settings(tmp_path))
    assert dag.timetable == _every(7)
    assert dag.max_active_runs == 1
    assert dag.description.endswith("when triggered and every 7 min once unpaused")


def test_a_dag_runs_when_triggered_unless_its_contract_sets_a_schedule(tmp_path: Path) -> None:
    """Unpausing a DAG (the trigger form's box, ticked by default) leaves no schedule behind
    that its contract did not ask for: the shipped contracts set none."""
    unscheduled = {k: v for k, v in CONTRACT.items() if k != "schedule_minutes"}
    dag = pipeline_dag(parse_contract(unscheduled), _settings(tmp_path))
    assert type(dag.timetable).__name__ == "NullTimetable"  # Airflow's schedule=None
    assert dag.description.endswith("bronze -> silver -> gold, when triggered")
    shipped = pipeline_dags(Settings.from_env(tmp_path / "home", REPO_ROOT / "contracts"))
    for contract in Catalog.load(REPO_ROOT / "contracts"):
        assert contract.schedule_minutes is None
        timetable = shipped[f"pipeline__{contract.topic}"].timetable
        assert type(timetable).__name__ == "NullTimetable"
    # A Kafka topic's DAG without a clock: when records arrive, and when triggered.
    kafka = pipeline_dag(parse_contract({**unscheduled, **FROM_KAFKA}), _settings(tmp_path))
    assert not isinstance(kafka.timetable, AssetOrTimeSchedule)
    assert kafka.timetable.asset_condition.name == "kafka.payments"
    assert kafka.description.endswith(
        "when triggered and when records arrive on its broker once unpaused"
    )


def test_a_kafka_topics_dag_runs_on_the_same_clock_or_when_records_arrive(
    tmp_path: Path,
) -> None:
    contract = _contract(**FROM_KAFKA)
    dag = pipeline_dag(contract, _settings(tmp_path))
    schedule = dag.timetable
    assert isinstance(schedule, AssetOrTimeSchedule)
    assert schedule.timetable == _every(7)
    assert dag.max_active_runs == 1
    asset = schedule.asset_condition
    assert isinstance(asset, Asset) and asset.name == "kafka.payments"
    (watcher,) = asset.watchers
    # Airflow's Kafka message-queue trigger, on the broker topic, with the topic's connection.
    _, kwargs = watcher.trigger.serialize()
    assert kwargs["topics"] == ["payments-v1"]
    assert kwargs["kafka_config_id"] == kafka_conn_id("payments") == "lakehouse_kafka__payments"
    # The function the trigger asks about each record is importable where the trigger runs.
    module, name = kwargs["apply_function"].rsplit(".", 1)
    assert callable(getattr(importlib.import_module(module), name))
    assert kwargs["apply_function_kwargs"] == {
        "kafka_config_id": "lakehouse_kafka__payments",
        "partitions": 3,
    }
    # As the scheduler reads it back: the same clock as the landing topic's, and the Asset.
    stored = _stored(dag).timetable
    assert type(stored).__name__ == "AssetOrTimeSchedule"
    landing = _stored(pipeline_dag(_contract(), _settings(tmp_path))).timetable
    assert stored.timetable.serialize() == landing.serialize()  # type: ignore[attr-defined]
    assert stored.asset_condition.name == "kafka.payments"  # type: ignore[attr-defined]


def _stored(dag: DAG) -> Any:
    return DagSerialization.from_dict(DagSerialization.to_dict(dag))


def test_store_credentials_come_from_the_airflow_connection_when_there_is_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from lakehouse.errors import ConfigError
    from lakehouse.orchestration.operators import S3_CONN_ID, store_credentials

    monkeypatch.delenv("AIRFLOW_CONN_LAKEHOUSE_S3", raising=False)
    assert store_credentials() == {}  # none: the processes' own environment is used
    connection = {
        "conn_type": "aws",
        "login": "AKIA-EXAMPLE-ID",
        "password": "example-secret-key",
        "extra": {"aws_session_token": "example-session-token"},
    }
    monkeypatch.setenv("AIRFLOW_CONN_LAKEHOUSE_S3", json.dumps(connection))
    assert store_credentials() == {
        "AWS_ACCESS_KEY_ID": "AKIA-EXAMPLE-ID",
        "AWS_SECRET_ACCESS_KEY": "example-secret-key",
        "AWS_SESSION_TOKEN": "example-session-token",
    }
    del connection["password"]
    monkeypatch.setenv("AIRFLOW_CONN_LAKEHOUSE_S3", json.dumps(connection))
    with pytest.raises(ConfigError, match=f"{S3_CONN_ID!r}: give both the access key id"):
        store_credentials()


def test_the_schema_registry_comes_from_the_airflow_connection_when_there_is_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The connection's host, port and path make the URL the jobs look writer schemas up at;
    its login and password, the basic-auth credentials (never a contract's)."""
    from lakehouse.contracts.confluent import URL_ENV, USER_INFO_ENV
    from lakehouse.errors import ConfigError
    from lakehouse.orchestration.operators import REGISTRY_CONN_ID, registry_settings

    variable = "AIRFLOW_CONN_LAKEHOUSE_SCHEMA_REGISTRY"
    monkeypatch.delenv(variable, raising=False)
    assert registry_settings() == {}  # none: the environment's, else `lakehouse registry`
    connection: dict[str, Any] = {
        "conn_type": "http",
        "host": "registry.example",
        "schema": "https",
        "port": 8443,
        "login": "reader",
        "password": "s3cret",
        "extra": {"path": "/apis/ccompat/v7"},
    }
    monkeypatch.setenv(variable, json.dumps(connection))
    assert registry_settings() == {
        URL_ENV: "https://registry.example:8443/apis/ccompat/v7",
        USER_INFO_ENV: "reader:s3cret",
    }
    plain = {"conn_type": "http", "host": "http://127.0.0.1:18081/apis/ccompat/v7/"}
    monkeypatch.setenv(variable, json.dumps(plain))
    assert registry_settings() == {URL_ENV: "http://127.0.0.1:18081/apis/ccompat/v7"}
    monkeypatch.setenv(variable, json.dumps({**connection, "password": None}))
    with pytest.raises(ConfigError, match=f"{REGISTRY_CONN_ID!r}: give both the registry's user"):
        registry_settings()
    monkeypatch.setenv(variable, json.dumps({**plain, "host": "http://h/x?token=1"}))
    with pytest.raises(ConfigError, match="is not a registry URL"):
        registry_settings()


# -- a contract that does not load is its own problem ---------------------------------------------

JOINING = {
    **CONTRACT,
    "topic": "orders",
    "stream": {"name": "orders_stream"},
    "tables": [
        {"name": "order_latest", "kind": "latest"},
        {
            "name": "order_payment",
            "kind": "join",
            "join": {"type": "table-table", "with": "payments", "fields": ["amount"]},
        },
    ],
}


def _folder(tmp_path: Path, **contracts: dict[str, Any] | str) -> Settings:
    folder = tmp_path / "contracts"
    folder.mkdir()
    for topic, body in contracts.items():
        text = body if isinstance(body, str) else yaml.safe_dump(body)
        (folder / f"{topic}.yaml").write_text(text)
    return Settings.from_env(tmp_path / "home", folder)


def test_a_contract_that_does_not_load_gets_a_dag_saying_why_and_the_others_are_built(
    tmp_path: Path,
) -> None:
    misspelled = {**CONTRACT, "topic": "refunds", "stream": {"name": "refunds_stream"}}
    misspelled["tabels"] = misspelled.pop("tables")
    settings = _folder(tmp_path, payments=CONTRACT, refunds=misspelled)
    dags = pipeline_dags(settings)
    assert sorted(dags) == ["lakehouse__run", "pipeline__payments", "pipeline__refunds.broken"]
    assert "gate_gold" in dags["pipeline__payments"].task_dict  # the good one, whole
    broken = dags["pipeline__refunds.broken"]
    source = str(settings.contracts_dir / "refunds.yaml")
    # Where the DAG list and the DAG's page show it: the file, the path in it, the problem.
    assert broken.dag_display_name == (
        "pipeline__refunds: broken contract: refunds.yaml: unknown key 'tabels' (did you mean "
        "'tables'?)"
    )
    assert broken.description.startswith("broken contract refunds.yaml: ")
    assert "tabels" in broken.description
    assert source in (broken.doc_md or "")
    assert broken.schedule is None and "broken contract" in broken.tags
    (task,) = broken.tasks
    with pytest.raises(ContractError, match=r"refunds\.yaml.*tabels"):
        task.python_callable()
    # The run DAG offers the topics that load; maintenance keeps their tables and names the other.
    assert dags["lakehouse__run"].params["topics"] == ["payments"]
    (maintenance,) = maintenance_dags(settings).values()
    assert sorted(maintenance.task_dict) == ["maintain__payments", "maintain__quality_ledger"]
    assert source in (maintenance.doc_md or "")


def test_a_join_with_a_broken_contract_breaks_only_the_join_dag(tmp_path: Path) -> None:
    not_yaml = "topic: payments\n  partitions: [3\n"
    dags = pipeline_dags(_folder(tmp_path, payments=not_yaml, orders=JOINING))
    assert sorted(dags) == [
        "joins__orders.broken",
        "lakehouse__run",
        "pipeline__orders",
        "pipeline__payments.broken",
    ]
    assert "gold" in dags["pipeline__orders"].task_dict  # its own tables still run
    joins = dags["joins__orders.broken"]
    assert "broken contract" in joins.tags
    assert "payments.yaml" in (joins.doc_md or "")
    assert joins.dag_display_name.startswith("joins__orders: broken contract: payments.yaml: ")


def test_a_name_taken_twice_breaks_the_later_file_only(tmp_path: Path) -> None:
    twin = {**CONTRACT, "topic": "refunds"}  # takes payments_stream and payment_latest again
    dags = pipeline_dags(_folder(tmp_path, payments=CONTRACT, refunds=twin))
    assert "broken contract" not in dags["pipeline__payments"].tags
    assert "already used by" in dags["pipeline__refunds.broken"].description


class _Runs:
    """The part of Airflow's task instance `plan` asks: how many runs of a DAG are queued."""

    def __init__(self, queued: int) -> None:
        self.queued = queued
        self.asked: list[dict[str, Any]] = []

    def get_dr_count(self, **query: Any) -> int:
        self.asked.append(query)
        return self.queued


@pytest.mark.parametrize(
    ("run_type", "queued", "goes_on"),
    [
        ("scheduled", 0, True),
        ("scheduled", 1, False),  # unpaused on trigger: the triggered run is queued behind it
        ("asset_triggered", 2, False),
        ("manual", 1, True),  # someone asked for this one
        ("backfill", 1, True),
    ],
)
def test_a_run_airflow_started_yields_to_a_run_queued_behind_it(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    run_type: str,
    queued: int,
    goes_on: bool,
) -> None:
    from types import SimpleNamespace

    from lakehouse.orchestration.callables import plan_run

    contracts = tmp_path / "contracts"
    contracts.mkdir()
    (contracts / "payments.yaml").write_text(yaml.safe_dump(CONTRACT))
    monkeypatch.setenv("LAKEHOUSE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("LAKEHOUSE_CONTRACTS", str(contracts))
    run = SimpleNamespace(dag_id="pipeline__payments", run_type=run_type)
    runs = _Runs(queued)

    assert plan_run(["payments"], None, {}, run, runs) is goes_on
    said = capsys.readouterr().out
    assert ("queued behind this" in said) is not goes_on, said
    if run_type in ("scheduled", "asset_triggered"):
        assert runs.asked == [{"dag_id": "pipeline__payments", "states": ["queued"]}]
    else:
        assert runs.asked == []


@pytest.mark.parametrize("layer", ["bronze", "silver", "gold"])
def test_a_layer_of_a_scheduled_run_yields_to_a_run_triggered_once_it_was_under_way(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], layer: str
) -> None:
    """The run someone triggered while a scheduled one was past its plan: the scheduled run's
    next layer leaves its batch to it (the triggered run then commits those records), and a
    triggered run's layer never yields."""
    from types import SimpleNamespace

    from airflow.sdk.exceptions import AirflowNotFoundException, AirflowSkipException

    task = pipeline_dag(_contract(), _settings(tmp_path)).task_dict[layer]
    scheduled = SimpleNamespace(dag_id="pipeline__payments", run_type="scheduled")
    context = {"params": {}, "dag_run": scheduled, "ti": _Runs(1)}
    with pytest.raises(AirflowSkipException, match=f"skips its {layer} job"):
        task.execute(context)
    assert "1 run(s) of pipeline__payments queued behind this scheduled run" in (
        capsys.readouterr().out
    )
    # A manual run goes on (here to the Spark connection, which this test has none of).
    manual = SimpleNamespace(dag_id="pipeline__payments", run_type="manual")
    runs = _Runs(1)
    with pytest.raises(AirflowNotFoundException, match="lakehouse_spark"):
        task.execute({"params": {}, "dag_run": manual, "ti": runs, "run_id": "manual__1"})
    assert runs.asked == []


def test_a_runs_params_are_the_requests_options_under_their_names(tmp_path: Path) -> None:
    """The pipeline DAG's trigger form has a Param for everything a run can ask, under the name
    the request, the command line and the job give it; its defaults ask nothing beyond the
    micro-batch (a scheduled run takes them). The other DAGs offer some of them, by the same
    names."""
    contract = _contract()
    dag = pipeline_dag(contract, _settings(tmp_path))
    assert list(dag.params) == [o.name for o in OPTIONS]
    request = RunRequest.from_params(dag.params.dump(), contract, own(contract))
    assert request == RunRequest(tables=tuple(own(contract)))
    assert RunRequest.from_json(request.to_json(), contract) == request
    shipped = pipeline_dags(Settings.from_env(tmp_path / "home", REPO_ROOT / "contracts"))
    for built in shipped.values():
        assert set(built.params) <= {o.name for o in OPTIONS} | {"topics"}, built.dag_id


def test_a_gate_runs_once_its_job_is_done_and_fails_when_the_job_did(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each gate waits for its job to be done, succeeded or failed (a job a `fail` check
    stopped fails its gate with the checks); the next job waits on the job too, so a gate
    skipped with its job never lets the next layer run after a failure. A job that failed
    with no verdict fails its gate saying so; one that succeeded with none passes it."""
    from airflow.sdk import TriggerRule
    from airflow.sdk.exceptions import AirflowFailException

    from lakehouse.orchestration.callables import check_gate

    dag = pipeline_dag(_contract(), _settings(tmp_path))
    tasks = dag.task_dict
    for layer in ("bronze", "silver", "gold"):
        assert tasks[f"gate_{layer}"].trigger_rule == TriggerRule.ONE_DONE
        assert tasks[f"gate_{layer}"].upstream_task_ids == {layer}
    assert tasks["silver"].upstream_task_ids == {"gate_bronze", "bronze"}
    assert tasks["gold"].upstream_task_ids == {"gate_silver", "silver"}

    monkeypatch.setenv("LAKEHOUSE_HOME", str(tmp_path / "home"))

    class Ti:
        dag_id, run_id, task = "pipeline__payments", "manual__1", tasks["gate_silver"]

        def __init__(self, state: str) -> None:
            self.state = state

        def get_task_states(self, **asked: Any) -> dict[str, dict[str, str]]:
            assert asked == {
                "dag_id": self.dag_id,
                "task_ids": ["silver"],
                "run_ids": ["manual__1"],
            }
            return {self.run_id: {"silver": self.state}}

    gate = {"topic": "payments", "layer": "silver", "tables": ["payments_stream"]}
    check_gate(**gate, dag_run_id="manual__1", params={}, ti=Ti("success"))  # no new data
    with pytest.raises(AirflowFailException, match="the silver job failed before its gate"):
        check_gate(**gate, dag_run_id="manual__1", params={}, ti=Ti("failed"))
