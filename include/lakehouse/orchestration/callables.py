"""What the pipeline DAGs' Python tasks run, in Airflow's workers: the plan of a run, the gates'
verdicts, the report, and what the layer tasks share with them (which tasks a run's Params
leave out).

Imported at DAG parse time (the tasks name these callables); the quality reports are imported
only when a task runs.
"""

from __future__ import annotations

from typing import Any

from airflow.providers.standard.operators.python import PythonOperator
from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

from lakehouse.contracts.catalog import Catalog
from lakehouse.errors import ConfigError
from lakehouse.pipeline.request import RunRequest
from lakehouse.runtime.config import LAYERS, Layer, Settings

# The run types Airflow creates by itself (DagRunType's values): such a run yields to a run
# queued behind it (:func:`plan_run`); a run someone asked for never does.
YIELDING_RUNS = ("scheduled", "asset_triggered")


def chosen(params: Any, topic: str) -> bool:
    """Whether a run's Param ``topics`` (the run DAG's; pipeline DAGs have one topic) has it."""
    topics = params.get("topics")
    return topics is None or topic in topics


def skip_if_left_out(params: Any, topic: str, layer: Layer) -> None:
    """A layer's job or gate whose topic or layer the run's Params leave out is skipped."""
    if not chosen(params, topic):
        raise AirflowSkipException(f"the run's Param topics leaves out {topic}")
    if layer not in (params.get("layers") or LAYERS):
        raise AirflowSkipException(f"the run's Param layers leaves out {layer}")


def plan_run(
    topics: list[str], tables: list[str] | None, params: dict[str, Any], dag_run: Any, ti: Any
) -> bool:
    """The first task: check the Params against each chosen topic's contract (``tables``: the
    DAG's gold tables, None for all), print the plan; False (the rest of the run is skipped)
    when a run Airflow started by itself finds another run of its DAG queued behind it.

    A DAG runs one run at a time, so a run triggered by hand waits for the one in progress. On a
    DAG with a schedule, the commonest case is the trigger form's "unpause on trigger":
    unpausing makes the scheduler start the latest interval's run at once, and the triggered run
    would queue behind it for a whole micro-batch. A scheduled or asset-triggered run has
    nothing to do that the run behind it will not do (it reads the same new records), so it
    yields (:func:`yielded`); each layer task asks the same before it starts, for a run queued
    once this one was under way."""
    settings = Settings.from_env()
    loaded = Catalog.load_each(settings.contracts_dir)  # another topic's broken one: not ours
    for topic in (t for t in topics if chosen(params, t)):
        contract = loaded.topic(topic)
        try:
            request = RunRequest.from_params(params, contract, tables)
        except ConfigError as exc:
            raise AirflowFailException(str(exc)) from None
        for line in request.describe(contract):
            print(line)
    return yielded(dag_run, ti, "its tasks") is None


def yielded(dag_run: Any, ti: Any, what: str) -> str | None:
    """Why a run Airflow started by itself (scheduled, or by records arriving) leaves ``what``
    to a run of its DAG queued behind it (the run behind reads the same new records, and a run
    someone triggered should not wait for a micro-batch that would do its work); None when it
    does not: a run someone asked for never yields. Printed when it does. (A task run outside
    a DAG run, ``dag_run`` None, has no one to yield to.)"""
    if dag_run is None or ti is None:
        return None
    kind = str(getattr(dag_run.run_type, "value", dag_run.run_type))  # a DagRunType
    if kind not in YIELDING_RUNS:
        return None
    waiting = ti.get_dr_count(dag_id=dag_run.dag_id, states=["queued"])
    if not waiting:
        return None
    why = (
        f"{waiting} run(s) of {dag_run.dag_id} queued behind this {kind} run: it leaves its "
        f"micro-batch to them and skips {what}"
    )
    print(why)
    return why


def check_gate(
    topic: str,
    layer: Layer,
    tables: list[str],
    dag_run_id: str,
    params: dict[str, Any],
    ti: Any = None,
) -> None:
    """A gate task: the verdicts the layer's job recorded in this run. The job's gate decides
    before it publishes (so a failed batch is never visible); this task shows the verdict in
    the DAG and holds the next layer to it, even if the job's task was marked successful by
    hand. It runs when its layer's task is done, succeeded or failed (a `fail` check fails
    the job at once): a failed one fails the gate too, with the checks that stopped it, so that
    the gate's own run (and its OpenLineage event) says what the batch was judged by."""
    if params.get("dry_run"):
        raise AirflowSkipException("dry run: nothing was validated")
    skip_if_left_out(params, topic, layer)
    from lakehouse.quality.reports import layer_verdict

    lines, failed = layer_verdict(Settings.from_env(), dag_run_id, layer, tables)
    for line in lines:
        print(line)
    if failed:
        raise AirflowFailException(
            f"{layer} gate: {len(failed)} `fail` expectation(s) failed: " + "; ".join(failed)
        )
    if _upstream_failed(ti):
        raise AirflowFailException(
            f"the {layer} job failed before its gate judged a batch (see its log); nothing of "
            "its batch was published"
        )


def _upstream_failed(ti: Any) -> bool:
    """Whether the task before ``ti`` (its layer's job) failed in this DAG run."""
    if ti is None or not getattr(ti, "task", None):
        return False
    upstream = sorted(ti.task.upstream_task_ids)
    states = ti.get_task_states(dag_id=ti.dag_id, task_ids=upstream, run_ids=[ti.run_id])
    return any(s == "failed" for s in states.get(ti.run_id, {}).values())


class GateOperator(PythonOperator):
    """A layer's gate task (:func:`check_gate`), reporting to OpenLineage the tables it judged
    as its inputs with the assertions their batches were judged by
    (:mod:`lakehouse.orchestration.lineage`)."""

    def __init__(self, *, topic: str, layer: Layer, tables: list[str], **kwargs: Any) -> None:
        super().__init__(
            python_callable=check_gate,
            op_kwargs={
                "topic": topic,
                "layer": layer,
                "tables": list(tables),
                "dag_run_id": "{{ run_id }}",
            },
            **kwargs,
        )
        self.topic, self.layer, self.tables = topic, layer, list(tables)

    def get_openlineage_facets_on_start(self) -> Any:
        from lakehouse.orchestration.lineage import of_task

        return of_task(Settings.from_env(), self.topic, self.layer, self.tables, None, gate=True)

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        from lakehouse.orchestration.lineage import of_task

        return of_task(
            Settings.from_env(),
            self.topic,
            self.layer,
            self.tables,
            task_instance.run_id,
            gate=True,
        )

    def get_openlineage_facets_on_failure(self, task_instance: Any) -> Any:
        return self.get_openlineage_facets_on_complete(task_instance)


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


def fail_run() -> None:
    raise RuntimeError("a task of this run failed (see its log and the data-quality report)")
