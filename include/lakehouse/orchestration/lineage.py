"""OpenLineage from the pipeline: a layer task's and a gate task's datasets, from the contracts.

Airflow's OpenLineage provider calls a task's ``get_openlineage_facets_on_start``,
``..._on_complete`` and ``..._on_failure`` and sends START, COMPLETE and FAIL run events with
what they return, to the transport the deployment configures (``[openlineage] transport``, or
``OPENLINEAGE_URL``); with none configured the provider is disabled and nothing here runs. Both
the layer task (:class:`~lakehouse.orchestration.operators.LayerJobOperator`) and the gate task
get theirs from this module:

* a layer task's inputs are the datasets its tables are made from and its outputs the tables
  it writes (:mod:`lakehouse.pipeline.lineage`), each with a schema facet and its name in the
  catalog as a symlink; an output has its column lineage, and once the batch is done its
  version and the rows the batch wrote (the ledger's row of the batch);
* a gate task reads the layer's tables' verdicts: its inputs are those tables, each with the
  assertions the batch was judged by (``dataQualityAssertions``, an input facet in
  OpenLineage's spec: a check reads what it judges).

Datasets are named by OpenLineage's naming spec: a Kafka topic ``kafka://host:port`` and its
name, a landing folder or a Delta table by its storage location (``file`` and the absolute
path, or ``s3://bucket`` and the key); the catalog's name of a table is a symlink in the SQL
endpoint's namespace ``spark://host:port``, as dbt-ol names what dbt reads there.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from lakehouse.contracts.catalog import Catalog
from lakehouse.contracts.model import Contract, aggregate_field
from lakehouse.errors import LakehouseError
from lakehouse.pipeline import lineage
from lakehouse.runtime.config import Layer, Settings
from lakehouse.runtime.objectstore import Location, ObjectPath

if TYPE_CHECKING:
    from airflow.providers.openlineage.extractors import OperatorLineage
    from openlineage.client.event_v2 import InputDataset, OutputDataset

# A Kafka record's parts and ingest metadata, typed as Spark's Kafka source types them.
_RECORD_TYPES = {
    "key": "binary",
    "value": "binary",
    "topic": "string",
    "partition": "int",
    "offset": "long",
    "timestamp": "timestamp",
    "timestampType": "int",
    "headers": "array",
}
_STREAM_TYPES = {
    "partition": "int",
    "offset": "long",
    "timestamp": "timestamp",
    "tombstone": "boolean",
    "event_time": "timestamp",
}
_HISTORY_TYPES = {"valid_from": "timestamp", "valid_to": "timestamp", "is_current": "boolean"}
_WINDOW_TYPES = {"window_start": "timestamp", "window_end": "timestamp"}


def published_name(node: lineage.Node) -> str:
    """A written node's name in its layer, as the ledger and the settings name it."""
    return node.name.split(".", 1)[1] if node.kind in ("bronze", "silver") else node.name


class Naming:
    """OpenLineage's name for each node of the graph, in this deployment."""

    def __init__(self, settings: Settings, catalog: Catalog, graph: lineage.Graph) -> None:
        self.settings, self.catalog, self.graph = settings, catalog, graph

    def of(self, name: str) -> tuple[str, str]:
        """The node's dataset namespace and name."""
        node = self.graph.nodes[name]
        if node.kind == "topic":
            assert node.topic is not None
            contract = self.catalog.topic(node.topic)
            if contract.kafka is not None:
                return f"kafka://{_first_server(self.settings, contract)}", contract.kafka.topic
            return _storage(self.settings.topic_dir(node.topic))
        assert node.layer is not None
        return _storage(self.settings.table_path(node.layer, published_name(node)))

    def symlink(self, name: str) -> tuple[str, str] | None:
        """The table's name in the catalog, in the SQL endpoint's namespace."""
        from lakehouse.runtime import readers
        from lakehouse.storage.metastore import table_name

        node = self.graph.nodes[name]
        if node.layer is None:
            return None
        found = table_name(
            self.settings.data_root,
            self.settings.table_path(node.layer, published_name(node)),
        )
        if found is None:
            return None
        port = os.environ.get(readers.SQL_PORT_ENV) or str(readers.DEFAULT_SQL_PORT)
        return f"spark://127.0.0.1:{port}", str(found)


def _first_server(settings: Settings, contract: Contract) -> str:
    from lakehouse.topics.kafka import bootstrap_servers

    try:
        return bootstrap_servers(settings, contract).split(",")[0].strip()
    except LakehouseError:  # no broker runs: the bronze task fails on it too
        return "unknown:9092"


def _storage(where: Location) -> tuple[str, str]:
    if isinstance(where, ObjectPath):
        return f"s3://{where.bucket}", where.key
    return "file", str(where)


def column_types(catalog: Catalog, graph: lineage.Graph) -> dict[str, dict[str, str]]:
    """Each node's columns' types, as far as the contracts say them (a collect's list and a dbt
    model's columns are left without one)."""
    types: dict[str, dict[str, str]] = {}
    for node in graph.nodes.values():
        if node.kind in ("topic", "bronze"):
            types[node.name] = {c: _RECORD_TYPES[c] for c in node.columns}
        elif node.kind == "silver":
            assert node.topic is not None
            c = catalog.topic(node.topic)
            fields = {f.name: f.type for f in c.fields}
            types[node.name] = {c.key_name: c.key_type, **fields, **_STREAM_TYPES}

    def gold(name: str) -> dict[str, str]:
        """A gold table's types, its inputs' first (another topic's table may come later)."""
        if name in types:
            return types[name]
        node = graph.nodes[name]
        assert node.topic is not None
        c = catalog.topic(node.topic)
        spec = c.table(name)
        mine: dict[str, str] = {}
        for column, sources in graph.columns.get(name, {}).items():
            first = next((s for s in sources if s.subtype == "IDENTITY"), None)
            if first is None:
                continue
            of = types.get(first.node) if graph.nodes[first.node].kind != "gold" else None
            found = of if of is not None else gold(first.node)
            if first.column in found:
                mine[column] = found[first.column]
        for a in spec.aggregations:
            if a.fn != "collect":
                mine[a.name] = aggregate_field(c.input(spec), a).type
        mine.update(
            {k: v for k, v in {**_HISTORY_TYPES, **_WINDOW_TYPES}.items() if k in node.columns}
        )
        types[name] = mine
        return mine

    for name, node in graph.nodes.items():
        if node.kind == "gold":
            gold(name)
    return types


class LayerLineage:
    """The OpenLineage datasets of the pipeline's tasks, from the catalog and the ledger."""

    def __init__(self, settings: Settings, catalog: Catalog) -> None:
        self.settings, self.catalog = settings, catalog
        self.graph = lineage.graph(catalog, None)
        self.naming = Naming(settings, catalog, self.graph)
        self.types = column_types(catalog, self.graph)

    def written(self, contract: Contract, layer: Layer, tables: Sequence[str]) -> list[str]:
        """The nodes a layer task writes."""
        if layer == "bronze":
            return [f"bronze.{contract.topic}"]
        if layer == "silver":
            return [f"silver.{contract.stream}"]
        return list(tables)

    def task(
        self,
        contract: Contract,
        layer: Layer,
        tables: Sequence[str],
        batches: Sequence[Mapping[str, Any]] = (),
    ) -> OperatorLineage:
        """A layer task's datasets: what its tables are made from, and the tables (with their
        version and the rows of the batch, given the ledger's ``batches`` rows of the run)."""
        from airflow.providers.openlineage.extractors import OperatorLineage

        outputs = self.written(contract, layer, tables)
        sources = [e.source for o in outputs for e in self.graph.inputs(o)]
        return OperatorLineage(
            inputs=[self._input(n) for n in dict.fromkeys(sources)],
            outputs=[self._output(n, layer, batches) for n in outputs],
        )

    def gate(
        self,
        contract: Contract,
        layer: Layer,
        tables: Sequence[str],
        rows: Sequence[Mapping[str, Any]],
    ) -> OperatorLineage:
        """A gate task's datasets: the layer's tables, each with the assertions its batch in
        this run was judged by (the ledger's ``rows`` of the run)."""
        from airflow.providers.openlineage.extractors import OperatorLineage
        from openlineage.client.facet_v2 import data_quality_assertions_dataset as dq

        inputs = []
        for name in self.written(contract, layer, tables):
            node = self.graph.nodes[name]
            checks = [
                r
                for r in rows
                if r["table"] == published_name(node) and r.get("expectation") is not None
            ]
            facets = {}
            if checks:
                facets["dataQualityAssertions"] = dq.DataQualityAssertionsDatasetFacet(
                    assertions=[
                        dq.Assertion(
                            assertion=r["kind"],
                            success=bool(r["success"]),
                            column=r.get("column"),
                            severity=_SEVERITY.get(r.get("severity") or ""),
                            name=r["expectation"],
                            actual=r.get("observed_value"),
                        )
                        for r in checks
                    ]
                )
            inputs.append(self._input(name, facets))
        return OperatorLineage(inputs=inputs)

    def _dataset_facets(self, name: str) -> dict[str, Any]:
        from openlineage.client.facet_v2 import documentation_dataset, schema_dataset
        from openlineage.client.facet_v2 import symlinks_dataset as links

        node = self.graph.nodes[name]
        types = self.types.get(name, {})
        facets: dict[str, Any] = {
            "schema": schema_dataset.SchemaDatasetFacet(
                fields=[
                    schema_dataset.SchemaDatasetFacetFields(name=c, type=types.get(c))
                    for c in node.columns
                ]
            )
        }
        described = self._description(node)
        if described:
            facets["documentation"] = documentation_dataset.DocumentationDatasetFacet(described)
        symlink = self.naming.symlink(name)
        if symlink is not None:
            facets["symlinks"] = links.SymlinksDatasetFacet(
                identifiers=[links.Identifier(namespace=symlink[0], name=symlink[1], type="TABLE")]
            )
        return facets

    def _description(self, node: lineage.Node) -> str:
        if node.topic is None:
            return ""
        c = self.catalog.topic(node.topic)
        if node.kind == "gold":
            return c.table(node.name).description
        return c.description

    def _input(self, name: str, input_facets: Mapping[str, Any] | None = None) -> InputDataset:
        from openlineage.client.event_v2 import InputDataset

        namespace, dataset = self.naming.of(name)
        return InputDataset(
            namespace=namespace,
            name=dataset,
            facets=self._dataset_facets(name),
            inputFacets=dict(input_facets or {}),
        )

    def _output(
        self, name: str, layer: Layer, batches: Sequence[Mapping[str, Any]]
    ) -> OutputDataset:
        from openlineage.client.event_v2 import OutputDataset
        from openlineage.client.facet_v2 import column_lineage_dataset as cl
        from openlineage.client.facet_v2 import dataset_version_dataset
        from openlineage.client.facet_v2 import output_statistics_output_dataset as stats

        namespace, dataset = self.naming.of(name)
        facets = self._dataset_facets(name)
        columns = self.graph.columns.get(name, {})
        if columns:
            facets["columnLineage"] = cl.ColumnLineageDatasetFacet(
                fields={
                    column: cl.Fields(
                        inputFields=[
                            cl.InputField(
                                *self.naming.of(s.node),
                                s.column,
                                transformations=[
                                    cl.Transformation(
                                        type=s.type,
                                        subtype=s.subtype,
                                        description=s.description or None,
                                        masking=False,
                                    )
                                ],
                            )
                            for s in sources
                        ]
                    )
                    for column, sources in columns.items()
                }
            )
        output_facets: dict[str, Any] = {}
        mine = [b for b in batches if b["table"] == published_name(self.graph.nodes[name])]
        published = [b for b in mine if b.get("published") and b.get("table_version") is not None]
        if published:
            last = max(published, key=lambda b: b["table_version"])
            facets["version"] = dataset_version_dataset.DatasetVersionDatasetFacet(
                str(last["table_version"])
            )
            output_facets["outputStatistics"] = stats.OutputStatisticsOutputDatasetFacet(
                rowCount=sum(int(b.get("rows") or 0) for b in published)
            )
        return OutputDataset(
            namespace=namespace, name=dataset, facets=facets, outputFacets=output_facets
        )


# The contract's severities in the words of OpenLineage's assertion facet.
_SEVERITY = {"warn": "warn", "quarantine": "quarantine", "fail": "error"}


def of_task(
    settings: Settings,
    topic: str,
    layer: Layer,
    tables: Sequence[str] | None,
    run_id: str | None,
    *,
    gate: bool = False,
) -> OperatorLineage:
    """What a layer task (or its gate task, ``gate``) reports: the contracts as they are now,
    and the ledger's rows of DAG run ``run_id`` (None: before the task ran, none)."""
    from lakehouse.pipeline.job import load_topic
    from lakehouse.quality.ledger import read_ledger

    catalog, contract = load_topic(settings, topic)
    names = contract.published_tables(layer) if tables is None else list(tables)
    rows = []
    if run_id is not None:
        rows = read_ledger(settings, dag_run_id=run_id, layer=layer).to_pylist()
    found = LayerLineage(settings, catalog)
    if gate:
        return found.gate(contract, layer, names, rows)
    return found.task(contract, layer, names, [r for r in rows if r["kind"] == "batch"])
