"""Airflow DAGs generated from the contracts: one pipeline DAG per topic.

Imported by the thin files in ``dags/`` at parse time, so it imports Airflow and the contracts
only: no Spark, Delta or Great Expectations (tasks run those in spark-submit processes).
"""

from __future__ import annotations

import itertools
import shlex
import sys
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.providers.standard.operators.bash import BashOperator
from airflow.providers.standard.operators.python import PythonOperator
from airflow.sdk import DAG, Asset, TriggerRule
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from lakehouse.config import REPO_ROOT, Layer, Settings
from lakehouse.contracts import Catalog, Contract
from lakehouse.errors import GATE_FAILED_EXIT

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
    return Asset(name=f"{layer}.{name}", uri=path.as_uri(), group="delta")


class LayerJobOperator(SparkSubmitOperator):
    """spark-submit of one layer's job. A failed quality gate fails the task at once: the same
    batch would fail again, so retrying it only delays the run's failure and its report."""

    def execute(self, context: Any) -> None:
        try:
            super().execute(context)
        except AirflowException as exc:
            if f"Error code is: {GATE_FAILED_EXIT}." in str(exc):
                raise AirflowFailException(
                    "a `fail` expectation stopped the batch (see the quality lines above); "
                    "nothing was published"
                ) from exc
            raise


def _spark_conf() -> dict[str, str]:
    # The driver and executors run the interpreter Airflow runs with, which has `lakehouse`.
    return {"spark.pyspark.python": sys.executable, "spark.pyspark.driver.python": sys.executable}


def pipeline_dag(contract: Contract, settings: Settings, catalog: Catalog | None = None) -> DAG:
    """ingest (bronze) -> silver -> gold for one topic, as scheduled micro-batches. The gold task
    also reads the streams of the topics its joins name."""
    topic = contract.topic
    bronze = table_asset(settings, "bronze", topic)
    silver = table_asset(settings, "silver", contract.stream)
    gold = [table_asset(settings, "gold", t.name) for t in contract.tables]
    joined = sorted({t.join.other for t in contract.tables if t.join is not None})
    others = (
        []
        if catalog is None
        else [table_asset(settings, "silver", catalog.topic(name).stream) for name in joined]
    )
    doc = (
        f"### Pipeline of topic `{topic}`\n\n{contract.description}\n\n"
        f"landing `{topic}` ({contract.partitions} partitions) -> bronze `{topic}` -> "
        f"silver `{contract.stream}` -> gold "
        + (", ".join(f"`{t.name}`" for t in contract.tables) or "(none)")
        + f"\n\nContract: `{contract.source}`"
    )
    with DAG(
        dag_id=dag_id(topic),
        description=f"Micro-batches of topic {topic}: bronze -> silver -> gold",
        doc_md=doc,
        schedule=timedelta(minutes=contract.schedule_minutes),
        start_date=START,
        catchup=False,
        max_active_runs=1,
        tags=["lakehouse", f"topic:{topic}"],
        default_args={
            "owner": contract.owner,
            "retries": 2,
            "retry_delay": timedelta(seconds=30),
            "retry_exponential_backoff": True,
        },
    ) as dag:
        steps: list[LayerJobOperator] = []
        for layer, inlets, outlets in (
            ("bronze", [], [bronze]),
            ("silver", [bronze], [silver]),
            ("gold", [silver, *others], gold),
        ):
            steps.append(
                LayerJobOperator(
                    task_id=layer,
                    application=JOB,
                    application_args=[
                        *("--topic", topic, "--layer", layer),
                        *("--dag-run-id", "{{ run_id }}"),
                    ],
                    conn_id="spark_default",
                    name=f"lakehouse-{layer}-{topic}",
                    conf=_spark_conf(),
                    env_vars={
                        "LAKEHOUSE_HOME": str(settings.home),
                        "LAKEHOUSE_CONTRACTS": str(settings.contracts_dir),
                    },
                    inlets=inlets,
                    outlets=outlets,
                )
            )
        for upstream, downstream in itertools.pairwise(steps):
            upstream >> downstream
        # The report is built whatever happened (a failed gate is what people most need to
        # read); the watcher fails the run when any task failed, since a run's state follows
        # its leaf tasks and the report would otherwise make a failed run look successful.
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
        steps[-1] >> report
        [*steps, report] >> watcher
    return dag


def build_report(topic: str, dag_run_id: str) -> None:
    """Rebuild the Data Docs and print this run's validations (the per-run summary)."""
    from lakehouse.reports import build_data_docs, run_summary

    settings = Settings.from_env()
    for line in run_summary(settings, dag_run_id):
        print(line)
    print(f"Data Docs: {build_data_docs(settings)}")


def _fail_run() -> None:
    raise RuntimeError("a task of this run failed (see its log and the data-quality report)")


MAINTENANCE_DAG = "lakehouse__maintenance"


def maintenance_dag(settings: Settings, catalog: Catalog) -> DAG:
    """Daily upkeep of every table: compaction, vacuum that keeps what a consumer still needs,
    checkpoints and log cleanup; one task per topic, and one for the quality ledger. Each task
    is a `lakehouse maintain` process (delta-rs only, no Spark), so deltalake never loads in a
    process that forks afterwards."""
    cli = str(Path(sys.executable).parent / "lakehouse")
    env = {
        "LAKEHOUSE_HOME": str(settings.home),
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
    """Every pipeline DAG, keyed by DAG id (for ``globals().update(...)`` in a DAG file)."""
    settings = settings or Settings.from_env()
    catalog = Catalog.load(settings.contracts_dir)
    return {dag_id(c.topic): pipeline_dag(c, settings, catalog) for c in catalog}


def maintenance_dags(settings: Settings | None = None) -> dict[str, DAG]:
    settings = settings or Settings.from_env()
    return {MAINTENANCE_DAG: maintenance_dag(settings, Catalog.load(settings.contracts_dir))}
