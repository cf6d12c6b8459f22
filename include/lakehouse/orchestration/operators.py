"""The layer task's operator, run by Airflow's workers: one micro-batch of one layer
(:func:`lakehouse.pipeline.job.run_job`), as a Spark Connect client of the lakehouse's Spark
server or as a spark-submit of jobs/run_layer.py given the run's request as one JSON argument;
and the bucket's credentials it hands to what it starts.

Imported at DAG parse time to build the tasks; Spark and the layers are imported only when a
task runs.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk.exceptions import AirflowException, AirflowFailException, AirflowSkipException

from lakehouse.contracts.catalog import Catalog
from lakehouse.contracts.model import Contract
from lakehouse.errors import (
    CONFIG_ERROR_EXIT,
    GATE_FAILED_EXIT,
    ConfigError,
    LakehouseError,
    QualityGateError,
    TablesFailedError,
)
from lakehouse.orchestration.callables import skip_if_left_out, yielded
from lakehouse.pipeline.job import load_topic, run_job, say
from lakehouse.pipeline.request import RunRequest
from lakehouse.runtime import objectstore, server
from lakehouse.runtime.config import Layer, Settings
from lakehouse.runtime.process import answers
from lakehouse.runtime.spark import submit_conf

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
    is ``none_failed``), and so is the layer of a run Airflow started by itself when a run of
    its DAG is queued behind it (:func:`~lakehouse.orchestration.callables.yielded`). A failed quality gate fails the task at once: the same batch would fail
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
        written: Sequence[str] = (),
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.layer, self.contract, self.tables = layer, contract, tables
        self.written = list(written)  # the tables whose changes it emits as asset events
        self.settings = settings
        self.base_args = list(self.application_args or [])
        self.base_conf = dict(self.conf or {})

    def execute(self, context: Any) -> None:
        skip_if_left_out(context["params"], self.contract.topic, self.layer)
        # A scheduled or record-started run leaves the batch to a run queued behind it (one
        # triggered once this run was under way): that one takes these records too.
        why = yielded(context.get("dag_run"), context.get("ti"), f"its {self.layer} job")
        if why is not None:
            raise AirflowSkipException(why)
        from airflow.providers.apache.spark.hooks.spark_connect import SparkConnectHook
        from airflow.sdk import BaseHook

        connection = BaseHook.get_connection(self._conn_id)
        try:
            # The contracts as they are now (the DAG may have been parsed long ago).
            catalog, contract = load_topic(self.settings, self.contract.topic)
            request = RunRequest.from_params(context["params"], contract, self.tables)
            aws = {**store_credentials(), **registry_settings()}
            preflight(connection.conn_type, self.settings, self.base_conf)
        except LakehouseError as exc:  # before anything runs; every try would fail alike
            raise AirflowFailException(str(exc)) from None
        # This process reads the logs and landing files itself (delta-rs, pyarrow), and asks
        # the schema registry for a topic's writer schemas when it runs the layer.
        os.environ.update(aws)
        objectstore.reset()
        if connection.conn_type == SparkConnectHook.conn_type:
            url = SparkConnectHook(self._conn_id).get_connection_url()
            self._run_connected(context, catalog, contract, request, url, connection)
        else:
            self.env_vars = {**(self.env_vars or {}), **aws}
            self._submit(context, request)
        self._emit_changes(context)

    # OpenLineage (Airflow's provider calls these when a transport is configured): the datasets
    # the batch reads and writes, from the contracts and this run's ledger rows.
    def get_openlineage_facets_on_start(self) -> Any:
        from lakehouse.orchestration.lineage import of_task

        return of_task(self.settings, self.contract.topic, self.layer, self.tables, None)

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        from lakehouse.orchestration.lineage import of_task

        return of_task(
            self.settings, self.contract.topic, self.layer, self.tables, task_instance.run_id
        )

    def get_openlineage_facets_on_failure(self, task_instance: Any) -> Any:
        return self.get_openlineage_facets_on_complete(task_instance)

    def _emit_changes(self, context: Any) -> None:
        """An asset event for each table this run's batches changed, through the task's alias,
        with what the ledger says of the batch (:func:`~lakehouse.orchestration.assets.
        changed`); none for a table left as it was."""
        from airflow.sdk import AssetAlias

        from lakehouse.orchestration.assets import changed
        from lakehouse.quality.ledger import read_ledger

        aliases = [o for o in self.outlets if isinstance(o, AssetAlias)]
        if not aliases or not self.written:  # an operator made without them emits nothing
            return
        (alias,) = aliases
        rows = read_ledger(self.settings, dag_run_id=context["run_id"], layer=self.layer)
        events = changed(self.settings, self.contract, self.layer, self.written, rows.to_pylist())
        for asset, extra in events:
            context["outlet_events"][alias].add(asset, extra=extra)
        told = ", ".join(a.name for a, _ in events) or "none (no table changed)"
        say(f"asset events: {told}")

    def _run_connected(
        self,
        context: Any,
        catalog: Catalog,
        contract: Contract,
        request: RunRequest,
        url: str,
        connection: Any,
    ) -> None:
        """The layer's job in this task's process, on a Spark Connect session of the server."""
        host, port = connection.host or "localhost", connection.port or server.DEFAULT_PORT
        if not answers(host, port, timeout=2.0):
            # Retried by Airflow: the batch is taken again once the server is back.
            raise AirflowException(
                f"no Spark server answers at {host}:{port} (Airflow connection "
                f"{self._conn_id!r}): start it with `lakehouse spark start`"
            )
        say(f"on the Spark server at {host}:{port}")
        # The session is held to the server's address: a server that dies under the task fails
        # the try at once (Airflow's retry takes the batch again), instead of the client
        # retrying for ten minutes holding the table's lock.
        try:
            run_job(
                self.settings,
                catalog,
                contract,
                self.layer,
                request,
                session=lambda: server.connect_to(url, host, port),
                dag_run_id=context["run_id"],
            )
        except QualityGateError as exc:
            raise AirflowFailException(
                f"a `fail` expectation stopped the batch: {exc}; nothing was published"
            ) from None
        except TablesFailedError as exc:
            if exc.quality_only:  # a retry would fail again
                raise AirflowFailException(
                    f"`fail` expectations stopped some tables: {exc}; nothing of theirs was "
                    "published"
                ) from None
            raise
        except ConfigError as exc:
            raise AirflowFailException(
                f"the job refused its configuration: {exc}; nothing moved"
            ) from None

    def _submit(self, context: Any, request: RunRequest) -> None:
        """spark-submit of the layer's job, with the run's request as its one JSON argument."""
        # Set afresh on each try (never appended to: a retry in the same process adds nothing).
        self.application_args = [
            *self.base_args,
            # One argument each: a run id chosen in the trigger form may start with '--'.
            f"--dag-run-id={context['run_id']}",
            f"--request={request.to_json()}",
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


def preflight(conn_type: str | None, settings: Settings, conf: Mapping[str, str]) -> None:
    """A layer task's checks of its topology before anything runs: on a connection of type
    ``spark`` (a driver of its own per task) it must not commit to tables in a bucket unless
    Delta's multi-driver log store arbitrates (:func:`~lakehouse.runtime.objectstore.
    check_commit_safety`); on ``spark_connect`` the Spark server is the one committing
    driver."""
    from airflow.providers.apache.spark.hooks.spark_connect import SparkConnectHook

    if conn_type != SparkConnectHook.conn_type:
        objectstore.check_commit_safety(settings.data_root, dict(conf))


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


# The Airflow connection of the schema registry the topics written through one are read with
# (any type; `http` as Airflow's HTTP connections are): host (with or without its scheme), port,
# the API's path in the extra's ``path`` (Apicurio's: ``/apis/ccompat/v7``), and basic-auth
# credentials as login and password. A contract's own ``value.registry.url`` still wins.
REGISTRY_CONN_ID = "lakehouse_schema_registry"


def registry_settings(conn_id: str = REGISTRY_CONN_ID) -> dict[str, str]:
    """``LAKEHOUSE_SCHEMA_REGISTRY_URL`` (and ``..._USER_INFO``) from the Airflow connection
    ``conn_id``; nothing when there is no such connection (the environment's own, else the
    registry `lakehouse registry start` runs)."""
    from airflow.sdk import BaseHook
    from airflow.sdk.exceptions import AirflowNotFoundException

    from lakehouse.contracts.confluent import URL_ENV, USER_INFO_ENV, valid_url

    try:
        connection = BaseHook.get_connection(conn_id)
    except AirflowNotFoundException:
        return {}
    host = (connection.host or "").strip().rstrip("/")
    if not host:
        raise ConfigError(f"Airflow connection {conn_id!r}: give the schema registry's host")
    if "://" not in host:
        host = f"{connection.schema or 'http'}://{host}"
    if connection.port:
        host = f"{host}:{connection.port}"
    path = str(connection.extra_dejson.get("path") or "").strip()
    found = {URL_ENV: host + ("/" + path.lstrip("/") if path else "")}
    if not valid_url(found[URL_ENV]):
        raise ConfigError(
            f"Airflow connection {conn_id!r}: {found[URL_ENV]!r} is not a registry URL "
            "(http(s)://host[:port][/path], with the credentials as login and password)"
        )
    if connection.login or connection.password:
        if not connection.login or not connection.password:
            raise ConfigError(
                f"Airflow connection {conn_id!r}: give both the registry's user (login) and "
                "its password, or neither"
            )
        found[USER_INFO_ENV] = f"{connection.login}:{connection.password}"
    return found


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
