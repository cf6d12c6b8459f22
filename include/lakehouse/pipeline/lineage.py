"""Lineage: where every table comes from and what reads it, from the contracts alone.

The contracts know every edge: a topic is ingested into ``bronze.<topic>``, decoded into
``silver.<stream>``, aggregated into each gold table; a gold table may read another table's
changelog (``changelog:``), another topic's stream or history table (a join); and the dbt
project's models read gold tables (``source('gold', ...)``) and one another (``ref(...)``). Each
edge carries the DAG and task that move data along it (None for dbt's own build), and each
node's columns say which columns of its inputs they come from, and how, in OpenLineage's terms
(a DIRECT IDENTITY, TRANSFORMATION or AGGREGATION; an INDIRECT GROUP_BY, JOIN or WINDOW).

Nodes are named as the command line names tables (:mod:`lakehouse.pipeline.lake`), a topic as
``topic.<topic>`` and a dbt model as ``dbt.<model>``. :mod:`lakehouse.orchestration.lineage`
turns a layer task's part of the graph into OpenLineage datasets; ``lakehouse lineage`` and the
Lineage page draw it. No Spark, Delta or Airflow here: the graph is read from files.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from lakehouse.contracts.catalog import Catalog
from lakehouse.contracts.model import (
    BRONZE_COLUMNS,
    HISTORY_COLUMNS,
    STREAM_METADATA_COLUMNS,
    WINDOW_END,
    WINDOW_START,
    Contract,
    TableSpec,
)
from lakehouse.errors import UnknownTableError
from lakehouse.pipeline.request import dag_id, join_dag_id, joined
from lakehouse.runtime.config import REPO_ROOT, Layer

NodeKind = Literal["topic", "bronze", "silver", "gold", "dbt"]
DBT_PROJECT = REPO_ROOT / "analytics"

# A Kafka record's parts, as bronze keeps them (bronze adds the topic's name).
RECORD_COLUMNS = tuple(c for c in BRONZE_COLUMNS if c != "topic")


@dataclass(frozen=True)
class Node:
    """A dataset of the graph: its name, what it is, the topic whose contract it belongs to
    (None for a dbt model) and its columns (a dbt model's are dbt's business: none)."""

    name: str
    kind: NodeKind
    topic: str | None
    columns: tuple[str, ...] = ()
    layer: Layer | None = None  # the layer that writes it (None: a topic, a dbt model)


@dataclass(frozen=True)
class ColumnSource:
    """One column of an input that a column of a node is made from, and how (OpenLineage's
    transformation ``type`` and ``subtype``, with a description)."""

    node: str
    column: str
    type: Literal["DIRECT", "INDIRECT"]
    subtype: str
    description: str = ""


@dataclass(frozen=True)
class Edge:
    """Data moving from ``source`` to ``target``, by task ``task`` of DAG ``dag`` (both None:
    by the dbt project's build)."""

    source: str
    target: str
    dag: str | None
    task: str | None

    @property
    def by(self) -> str:
        return f"{self.dag}.{self.task}" if self.dag else "dbt build"


@dataclass(frozen=True)
class Graph:
    nodes: Mapping[str, Node]
    edges: tuple[Edge, ...]
    # node -> its column -> the input columns it is made from
    columns: Mapping[str, Mapping[str, tuple[ColumnSource, ...]]] = field(default_factory=dict)

    def resolve(self, text: str) -> str:
        """The node ``text`` names: a node's own name, a topic's bare name, ``gold.<table>``,
        a stream's bare name or a dbt model's; anything else is an UnknownTableError listing
        what the graph has."""
        for name in (text, f"topic.{text}", f"silver.{text}", f"dbt.{text}"):
            if name in self.nodes:
                return name
        if text.startswith("gold.") and text[5:] in self.nodes:
            return text[5:]
        raise UnknownTableError(text, list(self.nodes))

    def inputs(self, name: str) -> list[Edge]:
        return [e for e in self.edges if e.target == name]

    def outputs(self, name: str) -> list[Edge]:
        return [e for e in self.edges if e.source == name]

    def upstream(self, name: str) -> Graph:
        """``name`` and everything it is made from, with the edges between them."""
        return self._closure(name, lambda n: (e.source for e in self.inputs(n)))

    def downstream(self, name: str) -> Graph:
        """``name`` and everything made from it, with the edges between them."""
        return self._closure(name, lambda n: (e.target for e in self.outputs(n)))

    def _closure(self, name: str, step: Callable[[str], Iterable[str]]) -> Graph:
        seen = {name}
        frontier = [name]
        while frontier:
            frontier = [n for m in frontier for n in step(m) if n not in seen]
            seen.update(frontier)
        edges = tuple(e for e in self.edges if e.source in seen and e.target in seen)
        return Graph(
            {n: v for n, v in self.nodes.items() if n in seen},
            edges,
            {n: v for n, v in self.columns.items() if n in seen},
        )


def topic_node(topic: str) -> str:
    return f"topic.{topic}"


def graph(catalog: Catalog, dbt_project: Path | None = DBT_PROJECT) -> Graph:
    """The catalog's whole graph, with the dbt project's models on gold (``None``: without)."""
    nodes: dict[str, Node] = {}
    edges: list[Edge] = []
    columns: dict[str, dict[str, tuple[ColumnSource, ...]]] = {}
    for c in catalog:
        for node, made in _of_topic(catalog, c):
            nodes[node.name] = node
            columns[node.name] = {}
            for edge, sources in made:
                edges.append(edge)
                for column, source in sources.items():
                    columns[node.name][column] = (*columns[node.name].get(column, ()), *source)
    # A dbt model is in the graph when it reads something that is (a contract's gold table,
    # or a model that is): the project's models on another lake's tables are not.
    models = dict(_dbt_models(dbt_project)) if dbt_project is not None else {}
    kept: dict[str, list[str]] = {}
    while added := [m for m, reads in models.items() if any(r in nodes for r in reads)]:
        for model in added:
            kept[model] = models.pop(model)
            nodes[f"dbt.{model}"] = Node(f"dbt.{model}", "dbt", None)
            columns[f"dbt.{model}"] = {}
    for model, reads in kept.items():
        edges.extend(Edge(r, f"dbt.{model}", None, None) for r in reads if r in nodes)
    return Graph(nodes, tuple(edges), columns)


Sources = dict[str, tuple[ColumnSource, ...]]
Made = Iterator[tuple[Node, list[tuple[Edge, Sources]]]]


def _one(node: str, column: str, subtype: str, description: str = "") -> tuple[ColumnSource, ...]:
    kind: Literal["DIRECT", "INDIRECT"] = (
        "DIRECT" if subtype in ("IDENTITY", "TRANSFORMATION", "AGGREGATION") else "INDIRECT"
    )
    return (ColumnSource(node, column, kind, subtype, description),)


def _of_topic(catalog: Catalog, c: Contract) -> Made:
    """The nodes a contract gives rise to, in pipeline order, each with the edges into it and
    the column sources along each."""
    topic, bronze, silver = topic_node(c.topic), f"bronze.{c.topic}", f"silver.{c.stream}"
    pipeline = dag_id(c.topic)
    yield Node(topic, "topic", c.topic, RECORD_COLUMNS), []
    yield (
        Node(bronze, "bronze", c.topic, BRONZE_COLUMNS, "bronze"),
        [
            (
                Edge(topic, bronze, pipeline, "bronze"),
                {col: _one(topic, col, "IDENTITY") for col in RECORD_COLUMNS},
            )
        ],
    )
    yield (
        Node(silver, "silver", c.topic, (*c.columns, *STREAM_METADATA_COLUMNS), "silver"),
        [(Edge(bronze, silver, pipeline, "silver"), _silver_sources(c, bronze))],
    )
    joins = set(joined(c))
    for spec in c.tables:
        dag = join_dag_id(c.topic) if spec.name in joins else pipeline
        made = []
        source = spec.changelog or silver
        made.append((Edge(source, spec.name, dag, "gold"), _gold_sources(c, spec, source)))
        if spec.join is not None:
            j = spec.join
            other = catalog.topic(j.other)
            side = j.table or f"silver.{other.stream}"
            # Matched on the other side's key (a history table's is its stream's).
            on = _one(side, other.key_name, "JOIN", f"matched on {j.on or c.key_name}")
            taken: Sources = {j.column(f): _one(side, f, "IDENTITY") + on for f in j.fields}
            if spec.kind == "stream-stream":
                for col in ("partition", "offset", "event_time"):
                    taken[j.column(col)] = _one(side, col, "IDENTITY")
            made.append((Edge(side, spec.name, dag, "gold"), taken))
        yield Node(spec.name, "gold", c.topic, c.table_columns(spec), "gold"), made


def _silver_sources(c: Contract, bronze: str) -> Sources:
    """Each column of the stream from the raw record: the key and value decoded with the
    contract's formats, the record's position and time as they came."""
    found: Sources = {c.key_name: _one(bronze, "key", "TRANSFORMATION", f"the {c.key_format} key")}
    for f in c.fields:
        described = f"field {f.name} of the {c.value_format} value"
        found[f.name] = _one(bronze, "value", "TRANSFORMATION", described)
    for col in ("partition", "offset", "timestamp"):
        found[col] = _one(bronze, col, "IDENTITY")
    found["tombstone"] = _one(bronze, "value", "TRANSFORMATION", "the value is null")
    found["event_time"] = (
        _one(bronze, "value", "TRANSFORMATION", f"the value's field {c.event_time}")
        if c.event_time
        else _one(bronze, "timestamp", "IDENTITY", "the record's timestamp")
    )
    return found


def _gold_sources(c: Contract, spec: TableSpec, source: str) -> Sources:
    """Each column of a gold table from the columns of the stream it reads (its own, or another
    table's changelog)."""
    stream = c.input(spec)
    key = c.table_key(spec)
    found: Sources = {}
    if spec.kind in ("latest", "history") or spec.join is not None:
        found = {col: _one(source, col, "IDENTITY") for col in stream.columns}
        if spec.join is not None:
            found.update(
                {col: _one(source, col, "IDENTITY") for col in ("partition", "offset", "timestamp")}
            )
            found["event_time"] = _one(source, "event_time", "IDENTITY")
        if spec.kind == "history":
            order = spec.sequence_by or "event_time"
            for col in HISTORY_COLUMNS:
                found[col] = _one(source, order, "TRANSFORMATION", f"versions ordered by {order}")
        return {col: s for col, s in found.items() if col in c.table_columns(spec)}
    found[key] = _one(source, key, "IDENTITY") + (
        _one(source, key, "GROUP_BY", f"re-keyed by {key}") if spec.group_by else ()
    )
    if spec.window is not None:
        for col in (WINDOW_START, WINDOW_END):
            found[col] = _one(source, "event_time", "TRANSFORMATION", f"{spec.window.type} window")
    for a in spec.aggregations:
        found[a.name] = _one(source, a.field or stream.key_name, "AGGREGATION", a.fn)
    return found


# dbt's own references in a model's SQL: {{ source('gold', 'table') }} and {{ ref('model') }}.
_SOURCE = re.compile(r"""source\(\s*['"](\w+)['"]\s*,\s*['"](\w+)['"]\s*\)""")
_REF = re.compile(r"""ref\(\s*['"](\w+)['"]\s*\)""")


def _dbt_models(project: Path) -> list[tuple[str, list[str]]]:
    """Each model of the dbt project (a ``.sql`` file under ``models/``) with the nodes it
    reads: gold tables named as sources of schema ``gold``, and other models."""
    found = []
    for path in sorted((project / "models").rglob("*.sql")):
        sql = path.read_text(encoding="utf-8")
        reads = [t for schema, t in _SOURCE.findall(sql) if schema == "gold"]
        reads += [f"dbt.{m}" for m in _REF.findall(sql)]
        found.append((path.stem, list(dict.fromkeys(reads))))
    return found


def print_lineage(
    catalog: Catalog,
    name: str | None,
    direction: Literal["both", "upstream", "downstream"],
    fmt: str,
    dbt_project: Path | None = DBT_PROJECT,
) -> int:
    """``lakehouse lineage``: the whole graph's edges (no ``name``), or one node's upstream and
    downstream as trees, each edge with the task that moves data along it; ``json``: the
    nodes, edges and column sources."""
    whole = graph(catalog, dbt_project)
    if name is None:
        chosen = whole
    else:
        node = whole.resolve(name)
        up, down = whole.upstream(node), whole.downstream(node)
        picked = {"upstream": (up,), "downstream": (down,), "both": (up, down)}[direction]
        chosen = Graph(
            {n: v for g in picked for n, v in g.nodes.items()},
            tuple(dict.fromkeys(e for g in picked for e in g.edges)),
            {n: v for g in picked for n, v in g.columns.items()},
        )
    if fmt == "json":
        print(json.dumps(as_json(chosen), indent=2))
        return 0
    if name is None:
        for e in chosen.edges:
            print(f"{e.source} -> {e.target}  ({e.by})")
        return 0
    print(_label(chosen.nodes[node]))
    if direction != "downstream":
        print("upstream:")
        _tree(chosen, node, lambda n: [(e, e.source) for e in chosen.inputs(n)], "  <- ")
    if direction != "upstream":
        print("downstream:")
        _tree(chosen, node, lambda n: [(e, e.target) for e in chosen.outputs(n)], "  -> ")
    return 0


def _label(node: Node) -> str:
    return f"{node.name} ({node.kind}" + (f", topic {node.topic})" if node.topic else ")")


def _tree(
    g: Graph, start: str, step: Callable[[str], list[tuple[Edge, str]]], arrow: str, depth: int = 1
) -> None:
    found = step(start)
    if not found and depth == 1:
        print("  (none)")
    for edge, other in found:
        print("  " * (depth - 1) + arrow + _label(g.nodes[other]) + f"  by {edge.by}")
        _tree(g, other, step, arrow, depth + 1)


def as_json(g: Graph) -> dict[str, Any]:
    """The graph as plain data: nodes, edges, and each node's column sources."""
    return {
        "nodes": [
            {"name": n.name, "kind": n.kind, "topic": n.topic, "columns": list(n.columns)}
            for n in g.nodes.values()
        ],
        "edges": [
            {"source": e.source, "target": e.target, "dag": e.dag, "task": e.task} for e in g.edges
        ],
        "columns": {
            node: {col: [asdict(s) for s in sources] for col, sources in cols.items()}
            for node, cols in g.columns.items()
            if cols
        },
    }
