"""A layer's job in a pipeline run: the one entry that an Airflow layer task runs, whichever way
it runs, in its own process as a Spark Connect client of the lakehouse's Spark server, or as a
spark-submit of ``jobs/run_layer.py``.

Each way makes its own session and maps the errors :func:`run_job` raises to what its process
reports (an Airflow task state, an exit code); everything else is here.

Imported at DAG parse time (the layer task's operator names it): the layers, Spark and the
quality ledger are imported when a job runs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from lakehouse.contracts.catalog import Catalog
from lakehouse.contracts.model import Contract
from lakehouse.pipeline.request import RunRequest
from lakehouse.runtime.config import Layer, Settings

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def say(line: str) -> None:
    """A line of the job's log, at once (a task log is read while the job runs)."""
    print(line, flush=True)


def load_topic(settings: Settings, topic: str) -> tuple[Catalog, Contract]:
    """The contracts that load and ``topic``'s: a ContractError when the topic's own does not
    load, nothing when another topic's does not (that one is not this job's business)."""
    loaded = Catalog.load_each(settings.contracts_dir)
    return loaded.catalog, loaded.topic(topic)


def run_job(
    settings: Settings,
    catalog: Catalog,
    contract: Contract,
    layer: Layer,
    request: RunRequest,
    *,
    session: Callable[[], SparkSession],
    dag_run_id: str | None = None,
    echo: Callable[[str], None] = say,
) -> None:
    """One micro-batch of ``layer`` of ``contract``'s topic, with what ``request`` asks besides
    (checked already: :meth:`RunRequest.from_params`), recorded in the ledger under the DAG
    run ``dag_run_id``. ``session`` makes the Spark session, once nothing is left to check
    before data moves; it is stopped when the job ends.

    Raises what a caller tells apart: :class:`~lakehouse.errors.QualityGateError` (a ``fail``
    expectation stopped the batch, nothing of it was published),
    :class:`~lakehouse.errors.TablesFailedError` (some gold tables failed, the others
    committed), :class:`~lakehouse.errors.ConfigError` (the configuration was refused before
    any data moved); anything else is a failure worth a retry."""
    from lakehouse.pipeline.runner import run_layer
    from lakehouse.quality.ledger import RunInfo

    run = RunInfo.from_env(dag_run_id=dag_run_id)
    spark = session()
    try:
        for line in run_layer(
            spark, settings, contract, layer, catalog, run=run, echo=echo, request=request
        ):
            echo(line)
    finally:
        spark.stop()
