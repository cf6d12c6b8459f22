"""The pipeline DAGs built from the contracts: one pipeline DAG per topic, a join DAG per topic
that joins another, a manual run DAG and the maintenance DAG; a contract that does not load gets
a DAG of its own that says why, and the others are built as usual.

Imported by the thin files in ``dags/`` at parse time, so it imports Airflow and the contracts
only: no Spark, Delta or Great Expectations (import-linter holds it to that). The tasks' code is
in :mod:`~lakehouse.orchestration.operators` and :mod:`~lakehouse.orchestration.callables`, the
assets in :mod:`~lakehouse.orchestration.assets`.
"""

from __future__ import annotations

import functools
import itertools
import logging
import operator
import shlex
import sys
from collections.abc import Collection, Mapping, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from airflow.providers.standard.operators.bash import BashOperator
from airflow.providers.standard.operators.python import PythonOperator, ShortCircuitOperator
from airflow.sdk import DAG, Asset, Param, TriggerRule

from lakehouse.contracts.catalog import Catalog, LoadedCatalog
from lakehouse.contracts.model import Contract
from lakehouse.errors import ContractError
from lakehouse.orchestration.assets import (
    changes_alias,
    inlets,
    outlets,
    pipeline_schedule,
    schedule_words,
)
from lakehouse.orchestration.callables import GateOperator, build_report, fail_run, plan_run
from lakehouse.orchestration.notify import QualityNotifier
from lakehouse.orchestration.operators import SPARK_CONN_ID, LayerJobOperator
from lakehouse.pipeline.request import OFFSETS_PATTERN, dag_id, join_dag_id, joined, own
from lakehouse.runtime.config import LAYERS, REPO_ROOT, Layer, Settings

log = logging.getLogger(__name__)

JOB = str(REPO_ROOT / "jobs" / "run_layer.py")
START = datetime(2026, 1, 1)


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
    names: Sequence[str],
    tables: Sequence[str] | None = None,
    task_id: str | None = None,
    *,
    joins: bool = False,
) -> LayerJobOperator:
    """A layer's job. Its outlet is an alias through which it emits an event for each table its
    batch changed (:func:`~lakehouse.orchestration.assets.changed`)."""
    # Told once the task has ended for good, whether it failed (a `fail` check fails the task
    # itself) or succeeded with failed checks the contract asks to be told of.
    notifier = QualityNotifier(
        contract, layer, contract.published_tables(layer) if tables is None else tables
    )
    return LayerJobOperator(
        task_id=task_id or layer,
        layer=layer,
        contract=contract,
        tables=tables,
        application=JOB,
        # The run's id and its request (the Params, as JSON) are added when the task runs.
        application_args=["--topic", contract.topic, "--layer", layer],
        settings=settings,
        conn_id=SPARK_CONN_ID,
        name=f"lakehouse-{layer}-{contract.topic}",
        env_vars=settings.task_environment(),
        inlets=inlets,
        outlets=[changes_alias(contract, layer, joins=joins)],
        written=names,
        trigger_rule=TriggerRule.NONE_FAILED,
        on_success_callback=notifier,
        on_failure_callback=notifier,
    )


def _gate_task(
    settings: Settings,
    contract: Contract,
    layer: Layer,
    tables: Sequence[str],
    task_id: str | None = None,
) -> GateOperator:
    """A layer's gate: it reads the ledger's verdicts on the layer's tables, which are its
    inlets (so the tables are Assets of the DAG from its first parse, with their group and
    location, though the layer task declares only its alias). It runs once its layer's task
    is done, whether it succeeded or failed (one a `fail` check stopped fails with its checks);
    a skipped or never-run layer skips it, and the next layer waits on both (:func:`_chain`)."""
    return GateOperator(
        topic=contract.topic,
        layer=layer,
        tables=list(tables),
        inlets=outlets(settings, contract, layer, tables),
        task_id=task_id or f"gate_{layer}",
        trigger_rule=TriggerRule.ONE_DONE,
        retries=0,
        doc_md=f"The {layer} gate's verdict in this run, from the data-quality ledger: a failed "
        "`fail` expectation stops the layers after it.",
    )


def _chain(steps: Sequence[Any]) -> None:
    """plan -> job -> gate -> job -> gate ...: each job also waits on the job before its gate
    (a gate is skipped when its job did not run, and a job after a skipped gate would run)."""
    for upstream, downstream in itertools.pairwise(steps):
        upstream >> downstream
    jobs = [s for s in steps if isinstance(s, LayerJobOperator)]
    for before, after in itertools.pairwise(jobs):
        before >> after


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
        python_callable=fail_run,
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
        + f"\n\nContract: `{contract.file}`\n\n"
        f"Runs {schedule_words(contract)}; a triggered run takes everything waiting. "
        "Trigger with the Params form to run some layers only, do a dry run, reprocess silver "
        "from a bronze version or offsets, reprocess gold from a silver version, or fully "
        "refresh gold tables. The `plan` task prints what the run will do."
    )
    with DAG(
        dag_id=dag_id(topic),
        description=f"Micro-batches of topic {topic}: bronze -> silver -> gold, "
        f"{schedule_words(contract)}",
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
                    inlets(settings, contract, catalog, layer, names),
                    names,
                    names if layer == "gold" else None,
                )
            )
            steps.append(_gate_task(settings, contract, layer, names))
        _chain(steps)
        _finish(steps, topic)
    return dag


def join_dag(contract: Contract, settings: Settings, catalog: Catalog) -> DAG:
    """The gold tables of a topic that join another topic's stream (and the tables reading
    their changelogs), scheduled on the streams they read: a new version of either side runs
    them, so a join never waits for the next interval of the other topic's DAG."""
    topic = contract.topic
    names = joined(contract)
    others = sorted({o for t in contract.tables if (o := t.other_topic)})
    inputs = inlets(settings, contract, catalog, "gold", names)
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
                names,
                names,
                joins=True,
            ),
            _gate_task(settings, contract, "gold", names),
        ]
        _chain(steps)
        _finish(steps, topic)
    return dag


RUN_DAG = "lakehouse__run"


def _joins_any(contract: Contract, name: str, topics: Collection[str]) -> bool:
    """Whether ``name`` is a gold table of ``contract`` that joins one of ``topics``."""
    spec = next((t for t in contract.tables if t.name == name), None)
    return spec is not None and spec.other_topic in topics


def run_dag(
    settings: Settings, catalog: Catalog, unjoinable: Mapping[str, Mapping[str, str]] | None = None
) -> DAG:
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
    ) + "".join(
        f"\n\nLeft out: the joins of `{topic}` with `{other}`, whose contract (`{source}`) does "
        "not load."
        for topic, others in (unjoinable or {}).items()
        for other, source in others.items()
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
                cut = (unjoinable or {}).get(c.topic, {})
                names = [n for n in c.published_tables(layer) if not _joins_any(c, n, cut)]
                job = _layer_task(
                    settings,
                    c,
                    layer,
                    inlets(settings, c, catalog, layer, names),
                    names,
                    list(names) if layer == "gold" else None,
                    task_id=f"{layer}__{c.topic}",
                )
                gate = _gate_task(settings, c, layer, names, task_id=f"gate_{layer}__{c.topic}")
                before >> job >> gate
                tasks += [job, gate]
                gates += [job, gate]  # the next layer waits on both (see _chain)
            before = gates
        _finish(tasks, "all", last=before)
    return dag


def _plan_task(topics: Sequence[str], tables: Sequence[str] | None) -> ShortCircuitOperator:
    return ShortCircuitOperator(
        task_id="plan",
        python_callable=plan_run,
        op_kwargs={"topics": list(topics), "tables": None if tables is None else list(tables)},
        retries=0,
        doc_md="Checks the run's Params against the contracts (bad ones fail here, before any "
        "data moves) and prints what the run will do. A scheduled or asset-triggered run with "
        "another run queued behind it skips the rest: the run behind it does the micro-batch "
        "(each layer task asks again before it starts).",
    )


MAINTENANCE_DAG = "lakehouse__maintenance"


def maintenance_dag(
    settings: Settings, catalog: Catalog, broken: Mapping[str, ContractError] | None = None
) -> DAG:
    """Daily upkeep of every table: compaction, vacuum that keeps what a consumer still needs,
    checkpoints and log cleanup; one task per topic, and one for the quality ledger. Each task
    is a `lakehouse maintain` process (OPTIMIZE, VACUUM and a checkpoint through delta-spark, in
    its own Spark session), so neither a JVM nor deltalake loads in a process that forks
    afterwards."""
    cli = str(Path(sys.executable).parent / "lakehouse")
    env = settings.task_environment()
    doc = (
        "### Table maintenance\n\nFor each topic's tables: `optimize` (compaction), a vacuum "
        "that never removes a file a registered consumer still needs (nor one inside the "
        "retention window), a checkpoint and log cleanup. Then the same for the data-quality "
        "results ledger."
    ) + "".join(
        f"\n\n**Not maintained until its contract loads:** `{source}`: {error}"
        for source, error in (broken or {}).items()
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


BROKEN_SUFFIX = ".broken"
DISPLAY_NAME_MAX = 1000  # characters of a broken DAG's display name (Airflow keeps 2,000)


def broken_dag_id(dag: str) -> str:
    """The id of the DAG that stands in for ``dag`` while a contract it needs does not load."""
    return dag + BROKEN_SUFFIX


def _said(error: ContractError) -> str:
    """An error as a DAG's name shows it: the file by its name, then where in it and what."""
    return str(error).replace(error.file, Path(error.file).name, 1)


def broken_dag(dag: str, title: str, source: str, errors: Sequence[ContractError]) -> DAG:
    """A DAG in place of one a contract cannot give (``dag``), under an id of its own
    (:func:`broken_dag_id`): its display name, which the DAG list and the DAG's page show,
    says what is wrong and where (the file, the path in it, the problem); its description and
    page say it in full, and its one task fails with the error when triggered. It has no
    schedule: nothing runs until the contract is fixed. Once it is, the next parse builds
    ``dag`` again and this DAG, its failed runs with it, leaves the DAG list (Airflow deactivates
    a DAG its file no longer makes): nothing of the broken state stays red beside the fixed
    DAG."""
    full = "; ".join(str(e) for e in errors)
    said = "; ".join(_said(e) for e in errors)
    doc = (
        f"### {title}: the contract does not load\n\n`{source}`\n\n```\n{full}\n```\n\n"
        f"Fix the file: the next parse of the DAG files builds `{dag}` from it, and this DAG "
        "goes. The other contracts' DAGs are not affected."
    )
    first = errors[0]

    def refuse() -> None:
        raise ContractError(first.file, first.path, first.problem)

    name = f"{dag}: broken contract: {said}"
    if len(name) > DISPLAY_NAME_MAX:
        name = name[: DISPLAY_NAME_MAX - 1] + "\u2026"
    with DAG(
        dag_id=broken_dag_id(dag),
        dag_display_name=name,
        description=f"broken contract {Path(source).name}: {full}"[:500],
        doc_md=doc,
        schedule=None,
        start_date=START,
        catchup=False,
        tags=["lakehouse", "broken contract"],
        default_args={"owner": "data-platform", "retries": 0},
    ) as built:
        PythonOperator(task_id="contract", python_callable=refuse, doc_md=doc)
    return built


def pipeline_dags(settings: Settings | None = None) -> dict[str, DAG]:
    """Every pipeline DAG and join DAG, keyed by DAG id (for ``globals().update(...)`` in a DAG
    file). A contract that does not load gets a :func:`broken_dag` in place of its pipeline
    DAG, and so does a join DAG whose other topic's contract does not load: the error is shown
    against the contract's file, and every other DAG is built as usual."""
    settings = settings or Settings.from_env()
    loaded = _load(settings)
    catalog = loaded.catalog
    dags = {dag_id(c.topic): pipeline_dag(c, settings, catalog) for c in catalog}
    for c in catalog:
        if not joined(c):
            continue
        missing = loaded.unjoinable.get(c.topic)
        if missing:
            errors = [loaded.errors[source] for source in missing.values()]
            broken = broken_dag(join_dag_id(c.topic), f"Joins of topic `{c.topic}`", c.file, errors)
            dags[broken.dag_id] = broken
        else:
            dags[join_dag_id(c.topic)] = join_dag(c, settings, catalog)
    for source, error in loaded.errors.items():
        topic = Path(source).stem
        broken = broken_dag(dag_id(topic), f"Pipeline of topic `{topic}`", source, [error])
        dags[broken.dag_id] = broken
    if list(catalog):
        dags[RUN_DAG] = run_dag(settings, catalog, loaded.unjoinable)
    return dags


def maintenance_dags(settings: Settings | None = None) -> dict[str, DAG]:
    """The maintenance DAG, for the tables of every contract that loads (a broken one is
    named in the DAG's page and in the parse log; its tables wait for the fix)."""
    settings = settings or Settings.from_env()
    loaded = _load(settings)
    return {MAINTENANCE_DAG: maintenance_dag(settings, loaded.catalog, loaded.errors)}


def _load(settings: Settings) -> LoadedCatalog:
    loaded = Catalog.load_each(settings.contracts_dir)
    for error in loaded.errors.values():
        log.error("contract does not load (its DAGs say so; the others are built): %s", error)
    return loaded
