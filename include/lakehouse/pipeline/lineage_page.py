"""The Lineage page: the graph of :mod:`lakehouse.pipeline.lineage` drawn as one SVG, from the
topics to the dbt models, each table with its latest version, lag and latest quality verdict,
each edge with the DAG task that moves data along it. ``?node=NAME`` selects a node: its
upstream and downstream stay lit, the rest is dimmed, and the page lists its edges and the
columns each of its columns is made from.

The picture is laid out here (a column per step from the topics, a row per node) and written
as SVG on the server: one HTML document, no script, nothing fetched, so it works on a closed
network like the data-quality page. The Airflow plugin serves it at ``/lineage/`` behind
Airflow's login (:mod:`lakehouse.orchestration.airflow_plugin`).
"""

from __future__ import annotations

import html
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from urllib.parse import quote, urljoin

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse

from lakehouse.contracts.catalog import Catalog
from lakehouse.errors import LakehouseError
from lakehouse.pipeline import lake, lineage
from lakehouse.runtime.config import Settings

_W, _H, _GAP_X, _GAP_Y, _PAD = 215, 54, 48, 14, 14


@dataclass(frozen=True)
class NodeState:
    """What the page says of a node: its table's latest version, its lag behind its input and
    the verdict of its latest run (None: not known, e.g. no table yet)."""

    version: int | None = None
    lag: str | None = None
    verdict: str | None = None  # "ok", "failed: <checks>", "blocked"


def states(settings: Settings, catalog: Catalog, graph: lineage.Graph) -> dict[str, NodeState]:
    """Each node's state, from the tables' logs and the ledger's newest runs."""
    from lakehouse.quality.history import history
    from lakehouse.quality.ledger import BLOCKED

    versions = {s.table.name: s.version for s in lake.existing(settings, catalog)}
    found = history(settings, catalog=catalog)
    out = {}
    for name, node in graph.nodes.items():
        run = None
        if node.layer is not None:
            runs = found.of(name if node.kind != "gold" else f"gold.{name}")
            run = runs[-1] if runs else None
        verdict = lag = None
        if run is not None:
            if run.outcome == BLOCKED:
                verdict = "blocked"
            elif run.failed:
                verdict = "failed: " + ", ".join(run.failed)
            else:
                verdict = "ok"
            if run.lag is not None:
                lag = f"{run.lag} {run.lag_unit or ''}".strip()
        out[name] = NodeState(versions.get(name), lag, verdict)
    return out


def _layout(graph: lineage.Graph) -> dict[str, tuple[int, int]]:
    """Each node's column (the longest path to it from a node with no input) and row."""
    depth: dict[str, int] = {}

    def of(name: str) -> int:
        if name not in depth:
            depth[name] = 1 + max((of(e.source) for e in graph.inputs(name)), default=-1)
        return depth[name]

    rows: dict[int, int] = {}
    place = {}
    for name in graph.nodes:
        column = of(name)
        place[name] = (column, rows.get(column, 0))
        rows[column] = rows.get(column, 0) + 1
    return place


def _box(column: int, row: int) -> tuple[int, int]:
    return _PAD + column * (_W + _GAP_X), _PAD + row * (_H + _GAP_Y)


def _stats(node: lineage.Node, state: NodeState) -> str:
    if node.kind == "topic":
        return "topic"
    if node.kind == "dbt":
        return "dbt model"
    parts = [f"v{state.version}" if state.version is not None else "no table yet"]
    if state.lag is not None:
        parts.append(f"lag {state.lag}")
    if state.verdict is not None:
        parts.append(state.verdict if len(state.verdict) < 24 else state.verdict[:22] + "…")
    return " · ".join(parts)


def svg(graph: lineage.Graph, found: Mapping[str, NodeState], selected: str | None = None) -> str:
    """The graph as SVG: a box per node (a link selecting it), a curve per edge."""
    esc = html.escape
    place = _layout(graph)
    lit: set[str] = set()
    if selected is not None:
        lit = set(graph.upstream(selected).nodes) | set(graph.downstream(selected).nodes)
    columns = 1 + max((c for c, _ in place.values()), default=0)
    rows = 1 + max((r for _, r in place.values()), default=0)
    width = 2 * _PAD + columns * _W + (columns - 1) * _GAP_X
    height = 2 * _PAD + rows * _H + (rows - 1) * _GAP_Y
    parts = [
        f"<svg xmlns='http://www.w3.org/2000/svg' class='graph' width='{width}' "
        f"height='{height}' viewBox='0 0 {width} {height}' role='img' "
        f"aria-label='lineage graph of {len(graph.nodes)} nodes and {len(graph.edges)} edges'>"
    ]
    for e in graph.edges:
        x1, y1 = _box(*place[e.source])
        x2, y2 = _box(*place[e.target])
        x1, y1, y2 = x1 + _W, y1 + _H // 2, y2 + _H // 2
        bend = (x2 - x1) / 2
        on = selected is None or (e.source in lit and e.target in lit)
        parts.append(
            f"<path class='edge{'' if on else ' dim'}' data-source='{esc(e.source)}' "
            f"data-target='{esc(e.target)}' d='M{x1},{y1} C{x1 + bend},{y1} {x2 - bend},{y2} "
            f"{x2},{y2}'><title>{esc(e.source)} → {esc(e.target)} by {esc(e.by)}</title></path>"
        )
    for name, node in graph.nodes.items():
        x, y = _box(*place[name])
        state = found.get(name, NodeState())
        tone = "plain"
        if state.verdict is not None:
            tone = "ok" if state.verdict == "ok" else "bad"
        role = ""
        if selected is not None:
            role = " selected" if name == selected else "" if name in lit else " dim"
        stats = _stats(node, state)
        label = name if len(name) <= 27 else name[:25] + "…"
        parts.append(
            f"<a href='?node={quote(name, safe='')}'><g class='node {node.kind} {tone}{role}' "
            f"data-node='{esc(name)}'><title>{esc(name)} ({node.kind}): {esc(stats)}</title>"
            f"<rect x='{x}' y='{y}' width='{_W}' height='{_H}' rx='6'/>"
            f"<text x='{x + 10}' y='{y + 22}' class='name'>{esc(label)}</text>"
            f"<text x='{x + 10}' y='{y + 43}' class='stats'>{esc(stats)}</text></g></a>"
        )
    parts.append("</svg>")
    return "".join(parts)


def _edges_table(edges: list[lineage.Edge], airflow: str) -> str:
    esc = html.escape
    if not edges:
        return "<p class='muted'>None.</p>"
    rows = []
    for e in edges:
        by = esc(e.by)
        if e.dag is not None:
            by = f"<a href='{esc(airflow)}dags/{quote(e.dag, safe='')}' target='_top'>{by}</a>"
        rows.append(f"<tr><td>{esc(e.source)}</td><td>{esc(e.target)}</td><td>{by}</td></tr>")
    return (
        "<table class='edges'><tr><th>from</th><th>to</th><th>moved by</th></tr>"
        + "".join(rows)
        + "</table>"
    )


def render_page(
    graph: lineage.Graph,
    found: Mapping[str, NodeState],
    selected: str | None,
    airflow: str,
) -> str:
    """The whole page; ``airflow``: the Airflow UI's URL, ending in ``/``."""
    esc = html.escape
    parts = [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
        f"<title>Lineage</title><style>{_STYLE}</style></head><body>",
        "<h1>Lineage</h1>",
        "<p class='muted'>From the contracts: every topic, table and dbt model, and what moves "
        "data between them (as <code>lakehouse lineage</code> prints it). Select a node to "
        "see what it is made from and what is made from it.</p>",
        f"<div class='picture'>{svg(graph, found, selected)}</div>",
    ]
    if selected is None:
        parts.append("<h2>Every edge</h2>")
        parts.append(_edges_table(list(graph.edges), airflow))
    else:
        node = graph.nodes[selected]
        parts.append(f"<h2 id='selected'>{esc(selected)} <span class='muted'>({node.kind})</span>")
        parts.append("</h2><p><a href='./'>Show the whole graph</a></p>")
        up, down = graph.upstream(selected), graph.downstream(selected)
        parts.append("<h3>Upstream</h3>" + _edges_table(list(up.edges), airflow))
        parts.append("<h3>Downstream</h3>" + _edges_table(list(down.edges), airflow))
        columns = graph.columns.get(selected, {})
        if columns:
            parts.append("<h3>Columns</h3><table class='columns'><tr><th>column</th>")
            parts.append("<th>made from</th></tr>")
            for column, sources in columns.items():
                made = "<br>".join(
                    esc(
                        f"{s.node}.{s.column} ({s.subtype.lower()}"
                        + (f": {s.description})" if s.description else ")")
                    )
                    for s in sources
                )
                parts.append(f"<tr><td>{esc(column)}</td><td>{made}</td></tr>")
            parts.append("</table>")
    parts.append("</body></html>")
    return "".join(parts)


def _message(title: str, message: str) -> str:
    esc = html.escape
    return (
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
        f"<title>{esc(title)}</title><style>{_STYLE}</style></head><body>"
        f"<h1>{esc(title)}</h1><p class='error'>{esc(message)}</p>"
        "<p><a href='./'>The whole graph</a></p></body></html>"
    )


def create_router(settings: Callable[[], Settings], *, airflow: str = "../") -> APIRouter:
    """A FastAPI router with the page at ``/`` (``settings`` read on each request; ``airflow``
    the UI's URL relative to the app's)."""
    router = APIRouter()

    @router.get("/", response_class=HTMLResponse)
    def lineage_page(request: Request) -> HTMLResponse:
        params = request.query_params.multi_items()
        unknown = sorted({k for k, _ in params} - {"node"})
        if unknown or len(params) > 1:
            return HTMLResponse(
                _message("Bad request", "the page takes one parameter, node"), status_code=400
            )
        current = settings()
        loaded = Catalog.load_each(current.contracts_dir)
        graph = lineage.graph(loaded.catalog)
        selected = dict(params).get("node")
        if selected is not None:
            try:
                selected = graph.resolve(selected)
            except LakehouseError as exc:
                return HTMLResponse(_message("No such node", str(exc)), status_code=404)
        root = str(request.scope.get("root_path", "")).rstrip("/")
        base = str(request.url.replace(path=root + "/", query=""))
        page = render_page(
            graph, states(current, loaded.catalog, graph), selected, urljoin(base, airflow)
        )
        return HTMLResponse(page, headers={"Cache-Control": "no-store"})

    return router


_STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5rem 2rem; color: #222; }
h2 { margin-top: 2rem; border-bottom: 1px solid #ddd; padding-bottom: 0.2rem; }
h3 { font-size: 1rem; margin: 1.2rem 0 0.3rem; }
.muted { color: #666; } .error { color: #b00020; }
.picture { overflow-x: auto; border: 1px solid #dde1e6; border-radius: 6px; background: #fafbfc; }
svg.graph { display: block; }
.edge { fill: none; stroke: #7a8794; stroke-width: 1.4; }
.node rect { fill: #fff; stroke: #7a8794; stroke-width: 1.2; }
.node.topic rect { fill: #eef3fb; } .node.dbt rect { fill: #f5effa; }
.node.ok rect { stroke: #2e7d32; stroke-width: 2; } .node.bad rect { stroke: #c62828; stroke-width: 2.5; }
.node.selected rect { stroke: #0b57d0; stroke-width: 3; }
.node text { font-size: 13px; fill: #222; } .node text.stats { font-size: 11.5px; fill: #555; }
.node.bad text.stats { fill: #b00020; }
.dim { opacity: 0.25; }
table { border-collapse: collapse; margin: 0.5rem 0 1rem; }
th, td { border: 1px solid #ccc; padding: 0.25rem 0.55rem; text-align: left; vertical-align: top; }
th { background: #f4f4f4; }
"""
