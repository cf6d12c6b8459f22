"""Airflow DAGs generated from the contracts: one pipeline DAG per topic.

Imported by the thin files in ``dags/`` at parse time, so it imports Airflow and the contracts
only: no Spark, Delta or Great Expectations (tasks run those in spark-submit processes).
"""

from __future__ import annotations

import functools
import itertools
import operator
import os
import shlex
import sys
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.providers.standard.operators.bash import BashOperator
from airflow.providers.standard.operators.python import PythonOperator
from airflow.sdk import (
    DAG,
    Asset,
    AssetOrTimeSchedule,
    AssetWatcher,
    DeltaTriggerTimetable,
    Param,
    TriggerRule,
)
from airflow.sdk.exceptions import AirflowException, AirflowFailException, AirflowSkipException

from lakehouse.contracts.model import Catalog, Contract
from lakehouse.errors import CONFIG_ERROR_EXIT, GATE_FAILED_EXIT, ConfigError
from lakehouse.orchestration.airflow_env import kafka_conn_id
from lakehouse.pipeline.request import OFFSETS_PATTERN, RunRequest, joined, own
from lakehouse.runtime import objectstore, server
from lakehouse.runtime.config import LAYERS, REPO_ROOT, Layer, Settings
from lakehouse.runtime.objectstore import Location
from lakehouse.runtime.process import answers
from lakehouse.runtime.spark import submit_conf

JOB = str(REPO_ROOT / "jobs" / "run_layer.py")
START = datetime(2026, 1, 1)


def dag_id(topic: str) -> str:
    return f"pipeline__{topic}"


def table_asset(settings: Settings, layer: Layer, name: str) -> Asset:
    path = {
        "bronze": settings.bronze_path,
        "silver": settings.silver_path,
        "gold": settings.gold_path,
    }[layer](name)
    return _asset(f"{layer}.{name}", path)


def side_assets(
    settings: Settings, contract: Contract, layer: Layer, names: Sequence[str]
) -> list[Asset]:
    """The side tables a layer's job also writes, as Assets: the quarantine of bronze and of
    silver, the late records of each windowed gold table. (The gold tables' private state
    tables are the jobs' own business, not data anyone reads.)"""
    if layer == "bronze":
        return [
            _asset(
                f"quarantine.bronze.{contract.topic}",
                settings.quarantine_path("bronze", contract.topic),
            )
        ]
    if layer == "silver":
        return [
            _asset(
                f"quarantine.silver.{contract.stream}",
                settings.quarantine_path("silver", contract.stream),
            )
        ]
    return [
        _asset(f"late.{t.name}", settings.late_path(t.name))
        for t in contract.tables
        if t.name in names and t.window is not None
    ]


def _inlets(
    settings: Settings, contract: Contract, catalog: Catalog, layer: Layer, names: Sequence[str]
) -> list[Asset]:
    """What a layer's job reads: bronze for silver; for gold, the stream, and the other topics'
    streams that the joins among ``names`` read."""
    if layer == "bronze":
        return []
    if layer == "silver":
        return [table_asset(settings, "bronze", contract.topic)]
    others = sorted({t.join.other for t in contract.tables if t.name in names and t.join})
    return [table_asset(settings, "silver", contract.stream)] + [
        table_asset(settings, "silver", catalog.topic(o).stream) for o in others
    ]


def _outlets(
    settings: Settings, contract: Contract, layer: Layer, names: Sequence[str]
) -> list[Asset]:
    """What a layer's job writes: the tables it publishes and their side tables."""
    return [
        *(table_asset(settings, layer, n) for n in names),
        *side_assets(settings, contract, layer, names),
    ]


def _asset(name: str, path: Location) -> Asset:
    return Asset(
        name=name, uri=path.as_uri() if isinstance(path, Path) else str(path), group="delta"
    )


def records_asset(contract: Contract) -> Asset:
    """The records arriving on a Kafka-sourced topic's broker, as an Asset watched by Airflow's
    Kafka message-queue trigger in the triggerer. The trigger consumes the topic with the
    connection :func:`lakehouse.orchestration.airflow_env.kafka_conn_id` (a consumer group of its own) and
    asks :func:`record_arrived` about each record; a record that asks for a run becomes an event
    of this Asset, and the trigger starts again after each event."""
    assert contract.kafka is not None
    # Imported here: only a catalog with a Kafka-sourced topic pays for the providers' import.
    from airflow.providers.apache.kafka.triggers.msg_queue import KafkaMessageQueueTrigger

    conn_id = kafka_conn_id(contract.topic)
    trigger = KafkaMessageQueueTrigger(
        topics=[contract.kafka.topic],
        kafka_config_id=conn_id,
        apply_function=f"{__name__}.{record_arrived.__name__}",
        apply_function_kwargs={"kafka_config_id": conn_id, "partitions": contract.partitions},
        # The provider sleeps this long after each record the function turns down: none, so a
        # burst already asked for is read through at once.
        poll_interval=0,
    )
    return Asset(
        name=f"kafka.{contract.topic}",
        group="kafka",
        watchers=[AssetWatcher(name=f"records.{contract.topic}", trigger=trigger)],
    )


# Per connection, topic and partition: the end offset when the trigger last asked for a run, in
# the triggerer's process (a new one starts empty, and asks again at its first record).
_ASKED: dict[tuple[str, str, int], int] = {}


def record_arrived(message: Any, *, kafka_config_id: str, partitions: int) -> Any:
    """The Kafka trigger's test of each record it reads (in the triggerer). Any record that
    arrived asks for a run, unless it was on the broker already when the last run was asked for:
    that run's bronze reads up to end offsets read after the request, so it takes the record.
    A burst of records therefore makes one asset event, not one each (with the DAG's one active
    run, Airflow then queues at most one more run, whatever the number of events).

    A request (truthy) is the asset event's payload, which Airflow stores: the record's place,
    never its key or value. When the end offsets cannot be read, the record asks anyway."""
    from airflow.sdk import BaseHook

    from lakehouse.errors import BrokerUnavailableError
    from lakehouse.orchestration.airflow_env import kafka_trigger_settings
    from lakehouse.topics import kafka

    topic, partition, offset = message.topic(), message.partition(), message.offset()
    if offset < _ASKED.get((kafka_config_id, topic, partition), 0):
        return None
    config = {
        k: str(v)
        for k, v in BaseHook.get_connection(kafka_config_id).extra_dejson.items()
        if k not in kafka_trigger_settings(topic)
    }
    client = kafka.Client(topic, topic, config["bootstrap.servers"], config)
    try:
        ends = kafka.offsets(client, partitions)
    except BrokerUnavailableError:
        ends = {}
    _ASKED.update({(kafka_config_id, topic, p): end for p, (_, end) in ends.items()})
    return {"topic": topic, "partition": partition, "offset": offset}


def pipeline_schedule(contract: Contract) -> Any:
    """Every ``schedule_minutes``; a Kafka-sourced topic's DAG also when records arrive on its
    broker (:func:`records_asset`). The time half is what Airflow makes of a ``timedelta``
    schedule, so a landing topic's DAG and a Kafka topic's run on the same clock."""
    every = timedelta(minutes=contract.schedule_minutes)
    if contract.kafka is None:
        return every
    return AssetOrTimeSchedule(
        timetable=DeltaTriggerTimetable(every), assets=records_asset(contract)
    )


# The Airflow connection the layer tasks get their Spark from. Its type decides how a task runs:
# ``spark_connect`` (the default `make airflow` sets up: this lakehouse's Spark server, its token
# as the password) runs the layer in the task's own process as a thin client of the server;
# ``spark`` (a master such as ``spark://host:7077`` or ``local[2]``) spark-submits the layer's
# job, for a cluster deployment or a large backfill.
SPARK_CONN_ID = "lakehouse_spark"


class LayerJobOperator(SparkSubmitOperator):
    """One micro-batch of one layer, on the Spark of the Airflow connection ``conn_id``: as a
    Spark Connect client of a long-lived server, or as a ``spark-submit`` of jobs/run_layer.py,
    depending on the connection's type (see :data:`SPARK_CONN_ID`). The same layer code runs
    either way.

    A layer the run's Params leave out is skipped (the next layer still runs: its trigger rule
    is ``none_failed``). A failed quality gate fails the task at once: the same batch would fail
    again, so retrying it only delays the run's failure and its report. A Spark server that does
    not answer fails the try at once, saying how to start it; Airflow's retries take the batch
    again once it is back."""

    def __init__(
        self,
        *,
        layer: Layer,
        contract: Contract,
        tables: Sequence[str] | None,
        settings: Settings,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.layer, self.contract, self.tables = layer, contract, tables
        self.settings = settings
        self.base_args = list(self.application_args or [])
        self.base_conf = dict(self.conf or {})

    def execute(self, context: Any) -> None:
        _skip_if_left_out(context["params"], self.contract.topic, self.layer)
        request = _request(context, self.contract, self.tables)
        from airflow.providers.apache.spark.hooks.spark_connect import SparkConnectHook
        from airflow.sdk import BaseHook

        connection = BaseHook.get_connection(self._conn_id)
        try:
            aws = store_credentials()
            if connection.conn_type != SparkConnectHook.conn_type:
                # A driver of its own per task must not commit to S3 unless Delta's
                # multi-driver log store arbitrates.
                objectstore.check_commit_safety(self.settings.data_root, self.base_conf)
        except ConfigError as exc:  # before anything runs; every try would fail alike
            raise AirflowFailException(str(exc)) from None
        # This process reads the logs and landing files itself (delta-rs, pyarrow).
        os.environ.update(aws)
        objectstore.reset()
        if connection.conn_type == SparkConnectHook.conn_type:
            url = SparkConnectHook(self._conn_id).get_connection_url()
            self._run_connected(context, request, url, connection.host, connection.port)
        else:
            self.env_vars = {**(self.env_vars or {}), **aws}
            self._submit(context, request)

    def _run_connected(
        self, context: Any, request: RunRequest, url: str, host: str | None, port: int | None
    ) -> None:
        """The layer in this task's process, on a Spark Connect session of the server."""
        where = f"{host}:{port or server.DEFAULT_PORT}"
        if not answers(host or "localhost", port or server.DEFAULT_PORT, timeout=2.0):
            # Retried by Airflow: the batch is taken again once the server is back.
            raise AirflowException(
                f"no Spark server answers at {where} (Airflow connection {self._conn_id!r}): "
                "start it with `lakehouse spark start`"
            )
        from pyspark.sql import SparkSession

        from lakehouse.errors import QualityGateError
        from lakehouse.pipeline.runner import run_layer
        from lakehouse.quality.ledger import RunInfo
        from lakehouse.runtime.server import hold_to_address

        catalog = Catalog.load(self.settings.contracts_dir)
        layer_request = request.for_layer(self.layer)
        try:
            layer_request.check(self.contract)
        except ConfigError as exc:
            raise AirflowFailException(str(exc)) from None
        print(f"on the Spark server at {where}", flush=True)
        spark = SparkSession.builder.remote(url).getOrCreate()
        # A server that dies under the task fails the try at once (and Airflow's retry takes the
        # batch again), instead of the client retrying for ten minutes holding the table's lock.
        hold_to_address(spark, host or "localhost", port or server.DEFAULT_PORT)
        run = RunInfo.from_env(dag_run_id=context["run_id"])
        try:
            for line in run_layer(
                spark,
                self.settings,
                catalog.topic(self.contract.topic),
                self.layer,
                catalog,
                run=run,
                echo=_say,
                request=layer_request,
            ):
                _say(line)
        except QualityGateError as exc:
            raise AirflowFailException(
                f"a `fail` expectation stopped the batch: {exc}; nothing was published"
            ) from None
        except ConfigError as exc:
            raise AirflowFailException(
                f"the job refused its configuration: {exc}; nothing moved"
            ) from None
        finally:
            spark.stop()

    def _submit(self, context: Any, request: RunRequest) -> None:
        """spark-submit of the layer's job, with the flags the run's Params ask for."""
        # Set afresh on each try (never appended to: a retry in the same process adds nothing).
        self.application_args = [
            *self.base_args,
            # One argument: a run id chosen in the trigger form may start with '--'.
            f"--dag-run-id={context['run_id']}",
            *request.for_layer(self.layer).args(),
        ]
        # The interpreter Airflow runs with (it has `lakehouse`) for the driver and executors,
        # and the JVM jars, as this machine has them now (not when the DAG was parsed); the
        # DAG's own conf wins.
        try:
            self.conf = {**submit_conf(), **self.base_conf}
        except ConfigError as exc:  # e.g. a jar missing: every try would fail alike
            raise AirflowFailException(str(exc)) from None
        try:
            super().execute(context)
        except AirflowException as exc:
            if f"Error code is: {GATE_FAILED_EXIT}." in str(exc):
                raise AirflowFailException(
                    "a `fail` expectation stopped the batch (see the quality lines above); "
                    "nothing was published"
                ) from exc
            if f"Error code is: {CONFIG_ERROR_EXIT}." in str(exc):
                raise AirflowFailException(
                    "the job refused its configuration (see the error above); nothing moved"
                ) from exc
            raise


# The Airflow connection whose login and password are the store's access key id and secret
# (any type; Amazon's `aws` type where its provider is installed), when the deployment keeps
# them in Airflow rather than in the workers' environment. Extra: ``aws_session_token``.
S3_CONN_ID = "lakehouse_s3"


def store_credentials(conn_id: str = S3_CONN_ID) -> dict[str, str]:
    """The ``AWS_*`` variables a layer task's processes read the bucket with, from the Airflow
    connection ``conn_id``; nothing when there is no such connection (the environment's own
    credentials then)."""
    from airflow.sdk import BaseHook
    from airflow.sdk.exceptions import AirflowNotFoundException

    try:
        connection = BaseHook.get_connection(conn_id)
    except AirflowNotFoundException:
        return {}
    return aws_variables(conn_id, connection.login, connection.password, connection.extra_dejson)


def aws_variables(
    conn_id: str, login: str | None, password: str | None, extra: Mapping[str, Any]
) -> dict[str, str]:
    """A connection's credentials as the variables S3A, delta-rs and pyarrow read."""
    if not login or not password:
        raise ConfigError(
            f"Airflow connection {conn_id!r}: give both the access key id (login) and the "
            "secret access key (password)"
        )
    found = {"AWS_ACCESS_KEY_ID": login, "AWS_SECRET_ACCESS_KEY": password}
    token = extra.get("aws_session_token")
    if token:
        found["AWS_SESSION_TOKEN"] = str(token)
    return found


def _say(line: str) -> None:
    print(line, flush=True)


def _chosen(params: Any, topic: str) -> bool:
    """Whether a run's Param ``topics`` (the run DAG's; pipeline DAGs have one topic) has it."""
    topics = params.get("topics")
    return topics is None or topic in topics


def _skip_if_left_out(params: Any, topic: str, layer: Layer) -> None:
    """A layer's job or gate whose topic or layer the run's Params leave out is skipped."""
    if not _chosen(params, topic):
        raise AirflowSkipException(f"the run's Param topics leaves out {topic}")
    if layer not in (params.get("layers") or LAYERS):
        raise AirflowSkipException(f"the run's Param layers leaves out {layer}")


def _request(context: Any, contract: Contract, tables: Sequence[str] | None) -> RunRequest:
    try:
        return RunRequest.from_params(context["params"], contract, tables)
    except ConfigError as exc:  # the same Params would fail again: no retries
        raise AirflowFailException(str(exc)) from None


def _multi_select(choices: Sequence[str], **schema: Any) -> Param:
    """An array Param of some of ``choices``; the trigger form draws an array Param that lists
    its choices as ``examples`` as a multi-select."""
    items: dict[str, Any] = {"type": "string"}
    extra: dict[str, Any] = {}
    if choices:
        items["enum"] = extra["examples"] = list(choices)
    return Param(type="array", items=items, uniqueItems=True, **extra, **schema)


def _layers_param() -> Param:
    return _multi_select(
        LAYERS,
        default=list(LAYERS),
        minItems=1,
        title="Layers",
        description="The layers to run, in pipeline order (a layer left out is skipped).",
    )


def _dry_run_param() -> Param:
    return Param(
        False,
        type="boolean",
        title="Dry run",
        description="Print what each layer would read and write; change nothing.",
    )


def _full_refresh_param(tables: Sequence[str]) -> Param:
    return _multi_select(
        tables,
        default=[],
        title="Full refresh",
        description="Gold tables to rebuild from the whole silver stream (only the rows that "
        "differ are published).",
    )


def run_params(contract: Contract, tables: Sequence[str]) -> dict[str, Param]:
    """The form of a triggered pipeline run (every field has a default: a scheduled run takes
    them); ``tables`` are the gold tables of the DAG."""
    return {
        "layers": _layers_param(),
        "dry_run": _dry_run_param(),
        "full_refresh": _full_refresh_param(tables),
        "reprocess_silver_from_version": Param(
            None,
            type=["null", "integer"],
            minimum=0,
            title="Reprocess silver from bronze version",
            description="Decode again the bronze records from this bronze version on: records "
            "in quarantine that now decode join the stream (as late arrivals for gold).",
        ),
        "reprocess_silver_from_offsets": Param(
            None,
            type=["null", "string"],
            pattern=f"^$|{OFFSETS_PATTERN}",
            title="Reprocess silver from offsets",
            description=f"Like the above, per partition: 'partition:offset,...' (e.g. 0:120,1:0; "
            f"partitions 0..{contract.partitions - 1}); partitions not named are left alone.",
        ),
        "reprocess_gold_from_version": Param(
            None,
            type=["null", "integer"],
            minimum=0,
            title="Reprocess gold from silver version",
            description="Rebuild the gold tables that read this topic's stream as of silver "
            "version v-1, then read again from v; each table changes once, by its net "
            "differences, and tables reading their changelogs take the corrections.",
        ),
    }


def _layer_task(
    settings: Settings,
    contract: Contract,
    layer: Layer,
    inlets: list[Asset],
    outlets: list[Asset],
    tables: Sequence[str] | None = None,
    task_id: str | None = None,
) -> LayerJobOperator:
    return LayerJobOperator(
        task_id=task_id or layer,
        layer=layer,
        contract=contract,
        tables=tables,
        application=JOB,
        application_args=[
            *("--topic", contract.topic, "--layer", layer),
        ],  # the run's id and Params add the rest (``--tables`` for gold, ...) at execution
        settings=settings,
        conn_id=SPARK_CONN_ID,
        name=f"lakehouse-{layer}-{contract.topic}",
        env_vars={
            "LAKEHOUSE_HOME": str(settings.home),
            "LAKEHOUSE_DATA": str(settings.data_root),
            "LAKEHOUSE_CONTRACTS": str(settings.contracts_dir),
        },
        inlets=inlets,
        outlets=outlets,
        trigger_rule=TriggerRule.NONE_FAILED,
    )


def _gate_task(
    contract: Contract, layer: Layer, tables: Sequence[str], task_id: str | None = None
) -> PythonOperator:
    return PythonOperator(
        task_id=task_id or f"gate_{layer}",
        python_callable=check_gate,
        op_kwargs={
            "topic": contract.topic,
            "layer": layer,
            "tables": list(tables),
            "dag_run_id": "{{ run_id }}",
        },
        trigger_rule=TriggerRule.NONE_FAILED,
        retries=0,
        doc_md=f"The {layer} gate's verdict in this run, from the data-quality ledger: a failed "
        "`fail` expectation stops the layers after it.",
    )


def _finish(dag_tasks: list[Any], topic: str, last: list[Any] | None = None) -> None:
    """The report is built whatever happened (a failed gate is what people most need to read);
    the watcher fails the run when any task failed, since a run's state follows its leaf tasks
    and the report would otherwise make a failed run look successful."""
    report = PythonOperator(
        task_id="report",
        python_callable=build_report,
        op_kwargs={"topic": topic, "dag_run_id": "{{ run_id }}"},
        trigger_rule=TriggerRule.ALL_DONE,
        retries=0,
    )
    watcher = PythonOperator(
        task_id="watcher",
        python_callable=_fail_run,
        trigger_rule=TriggerRule.ONE_FAILED,
        retries=0,
    )
    (last or dag_tasks[-1:]) >> report
    [*dag_tasks, report] >> watcher


def _default_args(contract: Contract) -> dict[str, Any]:
    return {
        "owner": contract.owner,
        "retries": 2,
        "retry_delay": timedelta(seconds=30),
        "retry_exponential_backoff": True,
    }


def pipeline_dag(contract: Contract, settings: Settings, catalog: Catalog | None = None) -> DAG:
    """plan -> bronze -> gate -> silver -> gate -> gold -> gate -> report for one topic, as
    scheduled micro-batches. The gold step builds the tables the topic's own stream is enough
    for; the tables that join another topic's stream are the join DAG's (:func:`join_dag`)."""
    topic = contract.topic
    catalog = catalog or Catalog.of([contract])
    mine = own(contract)
    elsewhere = joined(contract)
    doc = (
        f"### Pipeline of topic `{topic}`\n\n{contract.description}\n\n"
        f"landing `{topic}` ({contract.partitions} partitions) -> bronze `{topic}` -> "
        f"silver `{contract.stream}` -> gold "
        + (", ".join(f"`{name}`" for name in mine) or "(none)")
        + (
            f"\n\nThe joins ({', '.join(f'`{n}`' for n in elsewhere)}) are built by "
            f"`{join_dag_id(topic)}`, scheduled on the streams they read."
            if elsewhere
            else ""
        )
        + f"\n\nContract: `{contract.source}`\n\n"
        "Trigger with the Params form to run some layers only, do a dry run, reprocess silver "
        "from a bronze version or offsets, reprocess gold from a silver version, or fully "
        "refresh gold tables. The `plan` task prints what the run will do."
    )
    with DAG(
        dag_id=dag_id(topic),
        description=f"Micro-batches of topic {topic}: bronze -> silver -> gold",
        doc_md=doc,
        schedule=pipeline_schedule(contract),
        start_date=START,
        catchup=False,
        max_active_runs=1,
        tags=["lakehouse", f"topic:{topic}"],
        default_args=_default_args(contract),
        params=run_params(contract, mine),
    ) as dag:
        steps: list[Any] = [_plan_task([topic], mine)]
        for layer in LAYERS:
            names = mine if layer == "gold" else contract.published_tables(layer)
            if not names:
                continue
            steps.append(
                _layer_task(
                    settings,
                    contract,
                    layer,
                    _inlets(settings, contract, catalog, layer, names),
                    _outlets(settings, contract, layer, names),
                    names if layer == "gold" else None,
                )
            )
            steps.append(_gate_task(contract, layer, names))
        for upstream, downstream in itertools.pairwise(steps):
            upstream >> downstream
        _finish(steps, topic)
    return dag


def join_dag_id(topic: str) -> str:
    return f"joins__{topic}"


def join_dag(contract: Contract, settings: Settings, catalog: Catalog) -> DAG:
    """The gold tables of a topic that join another topic's stream (and the tables reading
    their changelogs), scheduled on the streams they read: a new version of either side runs
    them, so a join never waits for the next interval of the other topic's DAG."""
    topic = contract.topic
    names = joined(contract)
    others = sorted({t.join.other for t in contract.tables if t.join is not None})
    inputs = _inlets(settings, contract, catalog, "gold", names)
    doc = (
        f"### Joins of topic `{topic}`\n\n"
        + ", ".join(f"`{n}`" for n in names)
        + f", joining the streams of `{topic}` and "
        + ", ".join(f"`{o}`" for o in others)
        + ". Scheduled on those streams' assets: each new version of either runs it."
    )
    schedule = functools.reduce(operator.or_, inputs)
    with DAG(
        dag_id=join_dag_id(topic),
        description=f"Gold tables joining {topic} with {', '.join(others)}",
        doc_md=doc,
        schedule=schedule,
        start_date=START,
        catchup=False,
        max_active_runs=1,
        tags=["lakehouse", f"topic:{topic}", "joins"],
        default_args=_default_args(contract),
        params={"dry_run": _dry_run_param(), "full_refresh": _full_refresh_param(names)},
    ) as dag:
        steps = [
            _plan_task([topic], names),
            _layer_task(
                settings,
                contract,
                "gold",
                inputs,
                _outlets(settings, contract, "gold", names),
                names,
            ),
            _gate_task(contract, "gold", names),
        ]
        for upstream, downstream in itertools.pairwise(steps):
            upstream >> downstream
        _finish(steps, topic)
    return dag


RUN_DAG = "lakehouse__run"


def run_dag(settings: Settings, catalog: Catalog) -> DAG:
    """A manual run of several topics at once: the chosen layers, layer by layer across the
    chosen topics (so a join sees the other topic's stream as of this run), each job followed
    by its gate. Not scheduled: the pipeline DAGs are the micro-batches."""
    contracts = list(catalog)
    topics = [c.topic for c in contracts]
    doc = (
        "### Run topics on demand\n\nTrigger with the form: choose the topics and the layers, "
        "or a dry run. Each layer runs for every chosen topic before the next layer starts; "
        "the gold step builds every table of a topic, joins included. For reprocessing and "
        "refreshes, trigger the topic's own pipeline DAG."
    )
    params = {
        "topics": _multi_select(
            topics,
            default=topics,
            minItems=1,
            title="Topics",
            description="The topics to run (a topic left out is skipped).",
        ),
        "layers": _layers_param(),
        "dry_run": _dry_run_param(),
    }
    with DAG(
        dag_id=RUN_DAG,
        description="Run the chosen layers of the chosen topics once (manual)",
        doc_md=doc,
        schedule=None,
        start_date=START,
        catchup=False,
        max_active_runs=1,
        tags=["lakehouse"],
        default_args={**_default_args(contracts[0]), "owner": "data-platform"},
        params=params,
    ) as dag:
        plan = _plan_task(topics, None)
        tasks: list[Any] = [plan]
        before: list[Any] = [plan]
        for layer in LAYERS:
            gates = []
            for c in contracts:
                names = c.published_tables(layer)
                job = _layer_task(
                    settings,
                    c,
                    layer,
                    _inlets(settings, c, catalog, layer, names),
                    _outlets(settings, c, layer, names),
                    list(names) if layer == "gold" else None,
                    task_id=f"{layer}__{c.topic}",
                )
                gate = _gate_task(c, layer, names, task_id=f"gate_{layer}__{c.topic}")
                before >> job >> gate
                tasks += [job, gate]
                gates.append(gate)
            before = gates
        _finish(tasks, "all", last=before)
    return dag


def _plan_task(topics: Sequence[str], tables: Sequence[str] | None) -> PythonOperator:
    return PythonOperator(
        task_id="plan",
        python_callable=plan_run,
        op_kwargs={"topics": list(topics), "tables": None if tables is None else list(tables)},
        retries=0,
        doc_md="Checks the run's Params against the contracts (bad ones fail here, before any "
        "data moves) and prints what the run will do.",
    )


def plan_run(topics: list[str], tables: list[str] | None, params: dict[str, Any]) -> None:
    """The first task: check the Params against each chosen topic's contract (``tables``: the
    DAG's gold tables, None for all), print the plan."""
    settings = Settings.from_env()
    catalog = Catalog.load(settings.contracts_dir)
    for topic in (t for t in topics if _chosen(params, t)):
        contract = catalog.topic(topic)
        try:
            request = RunRequest.from_params(params, contract, tables)
        except ConfigError as exc:
            raise AirflowFailException(str(exc)) from None
        for line in request.describe(contract):
            print(line)


def check_gate(
    topic: str, layer: Layer, tables: list[str], dag_run_id: str, params: dict[str, Any]
) -> None:
    """A gate task: the verdicts the layer's job recorded in this run. The job's gate decides
    before it publishes (so a failed batch is never visible); this task shows the verdict in
    the DAG and holds the next layer to it, even if the job's task was marked successful by
    hand."""
    if params.get("dry_run"):
        raise AirflowSkipException("dry run: nothing was validated")
    _skip_if_left_out(params, topic, layer)
    from lakehouse.quality.reports import layer_verdict

    lines, failed = layer_verdict(Settings.from_env(), dag_run_id, layer, tables)
    for line in lines:
        print(line)
    if failed:
        raise AirflowFailException(
            f"{layer} gate: {len(failed)} `fail` expectation(s) failed: " + "; ".join(failed)
        )


def build_report(topic: str, dag_run_id: str, params: dict[str, Any]) -> None:
    """Rebuild the Data Docs and print this run's validations (the per-run summary)."""
    from lakehouse.quality.reports import build_data_docs, run_summary

    settings = Settings.from_env()
    for line in run_summary(settings, dag_run_id):
        print(line)
    if params.get("dry_run"):
        print("dry run: the Data Docs are left as they were")
        return
    print(f"Data Docs: {build_data_docs(settings)}")


def _fail_run() -> None:
    raise RuntimeError("a task of this run failed (see its log and the data-quality report)")


MAINTENANCE_DAG = "lakehouse__maintenance"


def maintenance_dag(settings: Settings, catalog: Catalog) -> DAG:
    """Daily upkeep of every table: compaction, vacuum that keeps what a consumer still needs,
    checkpoints and log cleanup; one task per topic, and one for the quality ledger. Each task
    is a `lakehouse maintain` process (OPTIMIZE, VACUUM and a checkpoint through delta-spark, in
    its own Spark session), so neither a JVM nor deltalake loads in a process that forks
    afterwards."""
    cli = str(Path(sys.executable).parent / "lakehouse")
    env = {
        "LAKEHOUSE_HOME": str(settings.home),
        "LAKEHOUSE_DATA": str(settings.data_root),
        "LAKEHOUSE_CONTRACTS": str(settings.contracts_dir),
    }
    doc = (
        "### Table maintenance\n\nFor each topic's tables: `optimize` (compaction), a vacuum "
        "that never removes a file a registered consumer still needs (nor one inside the "
        "retention window), a checkpoint and log cleanup. Then the same for the data-quality "
        "results ledger."
    )
    with DAG(
        dag_id=MAINTENANCE_DAG,
        description="Daily compaction, consumer-aware vacuum and checkpoints of every table",
        doc_md=doc,
        schedule="@daily",
        start_date=START,
        catchup=False,
        max_active_runs=1,
        tags=["lakehouse", "maintenance"],
        default_args={
            "owner": "data-platform",
            "retries": 2,
            "retry_delay": timedelta(minutes=5),
            "retry_exponential_backoff": True,
        },
    ) as dag:
        for contract in catalog:
            BashOperator(
                task_id=f"maintain__{contract.topic}",
                bash_command=f"{shlex.quote(cli)} maintain --topic {shlex.quote(contract.topic)}",
                env=env,
                append_env=True,
            )
        BashOperator(
            task_id="maintain__quality_ledger",
            bash_command=f"{shlex.quote(cli)} maintain --ledger",
            env=env,
            append_env=True,
        )
    return dag


def pipeline_dags(settings: Settings | None = None) -> dict[str, DAG]:
    """Every pipeline DAG and join DAG, keyed by DAG id (for ``globals().update(...)`` in a DAG
    file)."""
    settings = settings or Settings.from_env()
    catalog = Catalog.load(settings.contracts_dir)
    dags = {dag_id(c.topic): pipeline_dag(c, settings, catalog) for c in catalog}
    dags.update(
        {join_dag_id(c.topic): join_dag(c, settings, catalog) for c in catalog if joined(c)}
    )
    if list(catalog):
        dags[RUN_DAG] = run_dag(settings, catalog)
    return dags


def maintenance_dags(settings: Settings | None = None) -> dict[str, DAG]:
    settings = settings or Settings.from_env()
    return {MAINTENANCE_DAG: maintenance_dag(settings, Catalog.load(settings.contracts_dir))}
