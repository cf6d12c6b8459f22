"""The data-quality page: per table, charts of the ledger's history (the pass rate of its checks
over time, quarantined and late rows per batch, freshness age against its limit), the lag of
every table per layer, and each table's latest verdicts with links to its Airflow run and its
Data Docs page.

The data is :func:`lakehouse.quality.history.history`, the same window that ``lakehouse dq``
prints: one query over the ledger's newest ``days`` (at most ``LIMIT`` runs), so the page costs
the same on a ledger of years as on one of a day.

The charts are Vega-Altair specifications rendered to SVG on the server by ``vl-convert``
(Vega and Vega-Lite run in its embedded JavaScript runtime, with no data loader allowed to
fetch): the page is one HTML document with no script and nothing fetched from anywhere, so it
works on a closed network. Vega writes each mark's ``description`` into its ``aria-label``; the
page sets it to the mark's numbers in words (``run: ...; pass rate: 50.0%; ...``), which screen
readers read out and the tests compare with the ledger.

The Airflow plugin serves it at ``/data-quality/`` behind Airflow's login
(:mod:`lakehouse.orchestration.airflow_plugin`); it depends on FastAPI but not on Airflow.
"""

from __future__ import annotations

import html
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote, urljoin

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse

from lakehouse.errors import LakehouseError
from lakehouse.quality.history import DAYS, LIMIT, History, Run
from lakehouse.quality.ledger import BLOCKED, PUBLISHED
from lakehouse.runtime.config import LAYERS, Settings

MAX_DAYS = 366.0
NO_NEW_DATA = "no new data"
_TABLE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,248}")

# One look for an outcome in every chart: a blocked batch is a red cross, never a green dot.
OUTCOMES = (PUBLISHED, BLOCKED, NO_NEW_DATA)
_OUTCOME_COLORS = ("#2e7d32", "#c62828", "#9e9e9e")
_OUTCOME_SHAPES = ("circle", "cross", "square")
_WIDTH, _HEIGHT = 360, 180


class PageQueryError(LakehouseError):
    """A query parameter of the page that it cannot use; the message says which and why."""


@dataclass(frozen=True)
class PageQuery:
    """What the page shows: the newest ``days`` of the ledger, of one table's name or all."""

    days: float = DAYS
    table: str | None = None


def parse_query(params: Mapping[str, str] | Iterable[tuple[str, str]]) -> PageQuery:
    """The page's query parameters, checked: ``days`` (a number of days, more than 0, at most
    366) and ``table`` (a topic, stream or gold table name, as ``lakehouse dq --table``).
    Anything else, or a parameter given twice, raises :class:`PageQueryError`."""
    pairs = list(params.items() if isinstance(params, Mapping) else params)
    seen: dict[str, str] = {}
    for key, value in pairs:
        if key not in ("days", "table"):
            raise PageQueryError(f"unknown parameter {key!r}: the page takes days and table")
        if key in seen:
            raise PageQueryError(f"parameter {key!r} is given more than once")
        seen[key] = value
    days = DAYS
    if "days" in seen:
        try:
            days = float(seen["days"])
        except ValueError:
            raise PageQueryError(
                f"days={seen['days']!r} is not a number: give how many days back to show, "
                f"e.g. days=7"
            ) from None
        if not math.isfinite(days) or not 0 < days <= MAX_DAYS:
            raise PageQueryError(
                f"days={seen['days']!r} is out of range: more than 0 and at most {MAX_DAYS:g}"
            )
    table = seen.get("table") or None
    if table is not None and not _TABLE_NAME.fullmatch(table):
        raise PageQueryError(
            f"table={table!r} is not a table name: letters, digits, '_' and '-', as in the "
            f"contracts (a topic, its stream or a gold table)"
        )
    return PageQuery(days, table)


@dataclass(frozen=True)
class Links:
    """Where the page's links go: Airflow's UI (absolute, ending in ``/``), the Data Docs site
    (its URL, ending in ``/``, and its folder, to link only pages that exist)."""

    airflow: str
    data_docs: str
    data_docs_root: Path

    def airflow_run(self, run: Run) -> str | None:
        """The Airflow UI's page of the DAG run that ran ``run``, if an Airflow run did."""
        if not run.dag_id or not run.dag_run_id:
            return None
        return (
            f"{self.airflow}dags/{quote(run.dag_id, safe='')}/runs/{quote(run.dag_run_id, safe='')}"
        )

    def data_docs_page(self, run: Run) -> str | None:
        """The run's validation page in the Data Docs, if the site has one (``lakehouse report``
        builds them, naming each after the first 12 characters of the run's id)."""
        folder = self.data_docs_root / "validations" / run.layer / run.table
        if not folder.is_dir():
            return None
        found = sorted(folder.rglob(f"{run.run_id[:12]}.html"))
        if not found:
            return None
        return self.data_docs + quote(found[0].relative_to(self.data_docs_root).as_posix())


# -- the marks' words ---------------------------------------------------------------------------
def outcome(run: Run) -> str:
    return run.outcome or NO_NEW_DATA


def when(at: datetime) -> str:
    return f"{at:%Y-%m-%d %H:%M:%S} UTC"


def _run_words(run: Run) -> str:
    return f"DAG run: {run.dag_run_id or '-'}; at: {when(run.at)}; outcome: {outcome(run)}"


def pass_rate_words(run: Run) -> str:
    """The words (and the numbers) of one run's point in the pass-rate chart."""
    rate = run.pass_rate
    return (
        f"{_run_words(run)}; pass rate: {'-' if rate is None else format(rate, '.1%')}; "
        f"checks met: {run.met} of {run.checks}"
    )


def batch_words(run: Run, measure: str, value: int) -> str:
    """The words of one bar of the batches chart: ``measure`` (quarantined or late) of a batch."""
    return f"{_run_words(run)}; {measure}: {value}; rows: {run.rows}"


def freshness_words(run: Run) -> str:
    age, limit = run.freshness_age_s, run.freshness_limit_s
    return (
        f"{_run_words(run)}; age: {age:.0f} s; "
        f"limit: {'-' if limit is None else format(limit, '.0f') + ' s'}"
    )


def lag_words(run: Run) -> str:
    return f"table: {run.name}; {_run_words(run)}; lag: {run.lag} {run.lag_unit}"


# -- charts -------------------------------------------------------------------------------------
def _iso(at: datetime) -> str:
    return at.isoformat().replace("+00:00", "Z")


# -- charts -------------------------------------------------------------------------------------
# The SVG is drawn on the server, where Vega measures its text with fonts of its own; the browser
# draws it with the page's. So nothing the page shows depends on those two agreeing: legends are
# HTML beside the chart (they wrap, a long table name included), axis titles are short, an
# axis keeps one label in a width that holds one in any font (LABEL_SPACING), and the end
# labels are kept inside the plot (labelFlush).
LABEL_SPACING = 90  # px of axis per time label
_PALETTE = (
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
    "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf",
)  # fmt: skip


@dataclass(frozen=True)
class LegendItem:
    """One entry of a chart's legend: its words and how its marks look."""

    label: str
    color: str
    shape: str = "circle"  # circle, cross, square, bar, dash


@dataclass(frozen=True)
class Figure:
    """A chart and the legend drawn beside it."""

    chart: Any
    legend: tuple[LegendItem, ...] = ()


def _time_axis(runs: Sequence[Run]) -> Any:
    """Run time on x, in UTC, its labels as precise as the runs' span needs (Vega's own
    choice mixes seconds, minutes and a 12-hour clock on one axis), one per
    :data:`LABEL_SPACING` pixels at most."""
    import altair as alt

    span = runs[-1].at - runs[0].at
    if span.total_seconds() < 3600:
        label = "%H:%M:%S"
    elif span.days < 2:
        label = "%H:%M"
    else:
        label = "%m-%d %H:%M"
    return alt.X(
        "at:T",
        title="run (UTC)",
        scale=alt.Scale(type="utc", padding=10),  # the first and last marks whole
        axis=alt.Axis(
            format=label,  # on a utc scale, in UTC
            tickCount=max(2, _WIDTH // LABEL_SPACING),
            labelOverlap=True,
            labelSeparation=16,
            labelFlush=True,
        ),
    )


def _y_axis(**options: Any) -> Any:
    """A y axis whose title stays clear of its labels in any font (the labels of a count are
    short: 1.5G, not 1,500,000,000)."""
    import altair as alt

    return alt.Axis(titlePadding=14, **options)


def _outcome_scales() -> dict[str, Any]:
    import altair as alt

    return {
        "color": alt.Color(
            "outcome:N",
            scale=alt.Scale(domain=list(OUTCOMES), range=list(_OUTCOME_COLORS)),
            legend=None,
        ),
        "shape": alt.Shape(
            "outcome:N",
            scale=alt.Scale(domain=list(OUTCOMES), range=list(_OUTCOME_SHAPES)),
            legend=None,
        ),
    }


def _outcome_legend(runs: Sequence[Run]) -> tuple[LegendItem, ...]:
    seen = {outcome(r) for r in runs}
    return tuple(
        LegendItem(f"batch {name}" if name != NO_NEW_DATA else name, color, shape)
        for name, color, shape in zip(OUTCOMES, _OUTCOME_COLORS, _OUTCOME_SHAPES, strict=True)
        if name in seen
    )


def pass_rate_chart(runs: Sequence[Run], links: Links) -> Figure | None:
    """The share of each checked run's checks that held, over time; each point's shape and
    colour say what became of the run's batch, and a click opens its Airflow run."""
    import altair as alt

    checked = [r for r in runs if r.checks]
    if not checked:
        return None
    data = alt.Data(
        values=[
            {
                "at": _iso(r.at),
                "rate": r.pass_rate,
                "outcome": outcome(r),
                "words": pass_rate_words(r),
                "link": links.airflow_run(r),
            }
            for r in checked
        ]
    )
    base = alt.Chart(data).encode(
        x=_time_axis(checked),
        y=alt.Y(
            "rate:Q", title="checks met", scale=alt.Scale(domain=[0, 1]), axis=_y_axis(format="%")
        ),
    )
    line = base.mark_line(color="#90a4ae", aria=False)
    points = base.mark_point(filled=True, size=90, opacity=1).encode(
        **_outcome_scales(), description="words:N", href="link:N"
    )
    chart = (line + points).properties(width=_WIDTH, height=_HEIGHT)
    return Figure(chart, _outcome_legend(checked))


_MEASURE_COLORS = {"quarantined": "#ef6c00", "late": "#6a1b9a"}


def batches_chart(runs: Sequence[Run], links: Links) -> Figure | None:
    """Quarantined and (for a windowed table) late rows of each batch, at the batch's time,
    side by side; a blocked batch's bars are faded and outlined."""
    import altair as alt

    batches = [r for r in runs if r.outcome is not None]
    measures = [
        m for m in ("quarantined", "late") if any(getattr(r, m) is not None for r in batches)
    ]
    if not batches or not measures:
        return None
    values = [
        {
            "at": _iso(r.at),
            "measure": m,
            "rows": getattr(r, m) or 0,
            "outcome": outcome(r),
            "words": batch_words(r, m, getattr(r, m) or 0),
            "link": links.airflow_run(r),
        }
        for r in batches
        for m in measures
    ]
    top = max(1, *(getattr(r, m) or 0 for r in batches for m in measures))
    layers = []
    for i, m in enumerate(measures):
        shift = 0 if len(measures) == 1 else (-3 if i == 0 else 3)
        layers.append(
            alt.Chart(alt.Data(values=[v for v in values if v["measure"] == m]))
            .mark_bar(width=5, xOffset=shift, strokeWidth=1.5, color=_MEASURE_COLORS[m])
            .encode(
                x=_time_axis(batches),
                # At least 0 to 1: a table whose batches quarantined nothing shows bars at 0
                # on a scale, not a flat line.
                y=alt.Y(
                    "rows:Q",
                    title="rows",
                    axis=_y_axis(tickMinStep=1, format="~s"),
                    scale=alt.Scale(domain=[0, top]),
                ),
                opacity=alt.Opacity(
                    "outcome:N",
                    scale=alt.Scale(domain=[PUBLISHED, BLOCKED], range=[1.0, 0.35]),
                    legend=None,
                ),
                stroke=alt.Stroke(
                    "outcome:N",
                    scale=alt.Scale(domain=[PUBLISHED, BLOCKED], range=["transparent", "#c62828"]),
                    legend=None,
                ),
                description="words:N",
                href="link:N",
            )
        )
    chart = alt.layer(*layers).properties(width=_WIDTH, height=_HEIGHT)
    legend = [LegendItem(f"{m} rows", _MEASURE_COLORS[m], "bar") for m in measures]
    if any(r.outcome == BLOCKED for r in batches):
        legend.append(LegendItem("blocked batch (faded, outlined)", "#c62828", "outline"))
    return Figure(chart, tuple(legend))


_AGE_COLORS = {"within the limit": "#1565c0", "over the limit": "#c62828"}


def freshness_chart(runs: Sequence[Run], links: Links) -> Figure | None:
    """How old the table's newest data was at each run, against the contract's limit."""
    import altair as alt

    fresh = [r for r in runs if r.freshness_age_s is not None]
    if not fresh:
        return None
    values = [
        {
            "at": _iso(r.at),
            "age": r.freshness_age_s,
            "limit": r.freshness_limit_s,
            "state": (
                "over the limit"
                if r.freshness_limit_s is not None
                and (r.freshness_age_s or 0) > r.freshness_limit_s
                else "within the limit"
            ),
            "words": freshness_words(r),
            "link": links.airflow_run(r),
        }
        for r in fresh
    ]
    base = alt.Chart(alt.Data(values=values)).encode(x=_time_axis(fresh))
    limit = base.mark_line(color="#c62828", strokeDash=[6, 4], aria=False).encode(
        y=alt.Y("limit:Q", title="age (s)", axis=_y_axis(format="~s"))
    )
    age = base.mark_point(filled=True, size=80, opacity=1).encode(
        y=alt.Y("age:Q"),
        color=alt.Color(
            "state:N",
            scale=alt.Scale(domain=list(_AGE_COLORS), range=list(_AGE_COLORS.values())),
            legend=None,
        ),
        description="words:N",
        href="link:N",
    )
    states = {v["state"] for v in values}
    legend = [
        LegendItem(f"age {state}", color) for state, color in _AGE_COLORS.items() if state in states
    ]
    if any(r.freshness_limit_s is not None for r in fresh):
        legend.append(LegendItem("the contract's limit", "#c62828", "dash"))
    return Figure((limit + age).properties(width=_WIDTH, height=_HEIGHT), tuple(legend))


def lag_chart(layer: str, runs: Sequence[Run], links: Links) -> Figure | None:
    """How far each table of ``layer`` was behind its input after each run (bronze: records of
    its topic not yet read; silver and gold: versions of their input table)."""
    import altair as alt

    lagging = [r for r in runs if r.layer == layer and r.lag is not None]
    if not lagging:
        return None
    unit = lagging[-1].lag_unit or ""
    tables = sorted({r.name for r in lagging})
    colors = [_PALETTE[i % len(_PALETTE)] for i in range(len(tables))]
    data = alt.Data(
        values=[
            {
                "at": _iso(r.at),
                "lag": r.lag,
                "table": r.name,
                "words": lag_words(r),
                "link": links.airflow_run(r),
            }
            for r in lagging
        ]
    )
    base = alt.Chart(data).encode(
        x=_time_axis(lagging),
        y=alt.Y("lag:Q", title=f"lag ({unit})", axis=_y_axis(tickMinStep=1, format="~s")),
        color=alt.Color("table:N", scale=alt.Scale(domain=tables, range=colors), legend=None),
    )
    chart = (
        base.mark_line(aria=False)
        + base.mark_point(filled=True, size=60, opacity=1).encode(
            description="words:N", href="link:N"
        )
    ).properties(width=_WIDTH, height=_HEIGHT)
    return Figure(chart, tuple(LegendItem(t, c) for t, c in zip(tables, colors, strict=True)))


def svg(chart: Any) -> str:
    """The chart as SVG, drawn by Vega in vl-convert's runtime; no URL may be fetched. A margin
    around the plot keeps the axes' text inside the drawing in the browser's fonts too."""
    import vl_convert

    spec = chart.properties(padding=12).to_dict()
    return str(vl_convert.vegalite_to_svg(spec, allowed_base_urls=[]))


# -- the page -----------------------------------------------------------------------------------
_STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5rem 2rem; color: #222; }
h2 { margin-top: 2.2rem; border-bottom: 1px solid #ddd; padding-bottom: 0.2rem;
     overflow-wrap: anywhere; }
h3 { font-size: 1rem; margin: 1.2rem 0 0.3rem; }
.charts { display: flex; flex-wrap: wrap; gap: 1rem 2rem; }
figure { margin: 0; max-width: 100%; } figcaption { font-weight: 600; margin-bottom: 0.3rem; }
figure svg { display: block; max-width: 100%; height: auto; }
ul.legend { list-style: none; margin: 0.2rem 0 0; padding: 0; max-width: 26rem;
            display: flex; flex-wrap: wrap; gap: 0.2rem 1rem; font-size: 0.85rem; }
ul.legend li { display: flex; align-items: center; gap: 0.35rem; min-width: 0;
               overflow-wrap: anywhere; }
.swatch { flex: none; display: inline-block; width: 0.75rem; height: 0.75rem; }
.swatch.circle { border-radius: 50%; } .swatch.bar { width: 0.45rem; height: 0.9rem; }
.swatch.dash { height: 0; border-top: 2px dashed; width: 1rem; }
.swatch.outline { background: transparent !important; border: 2px solid; }
.swatch.cross { background: transparent !important; position: relative; }
.swatch.cross::before, .swatch.cross::after { content: ""; position: absolute; left: 45%;
  top: -10%; width: 20%; height: 120%; background: currentColor; }
.swatch.cross::before { transform: rotate(45deg); } .swatch.cross::after { transform: rotate(-45deg); }
table { border-collapse: collapse; margin: 0.5rem 0 1rem; }
th, td { border: 1px solid #ccc; padding: 0.25rem 0.55rem; text-align: left; vertical-align: top; }
th { background: #f4f4f4; }
.ok { color: #176f2c; font-weight: 600; } .failed { color: #b00020; font-weight: 600; }
.blocked { color: #b00020; font-weight: 600; } .muted { color: #666; }
form.query { display: flex; flex-wrap: wrap; align-items: end; gap: 0.6rem 1rem;
             margin: 0.8rem 0 1rem; padding: 0.7rem 0.9rem; background: #f6f7f9;
             border: 1px solid #dde1e6; border-radius: 6px; max-width: 40rem; }
form.query label { display: flex; flex-direction: column; gap: 0.2rem; font-size: 0.85rem;
                   color: #444; }
form.query input { font: inherit; padding: 0.3rem 0.5rem; border: 1px solid #b8bec6;
                   border-radius: 4px; background: #fff; }
form.query input[name=days] { width: 6rem; } form.query input[name=table] { width: 16rem; }
form.query button { font: inherit; padding: 0.35rem 1rem; border: 1px solid #1565c0;
                    border-radius: 4px; background: #1565c0; color: #fff; cursor: pointer; }
form.query button:hover { background: #0d47a1; }
"""


def _legend(items: Sequence[LegendItem]) -> str:
    esc = html.escape
    return (
        "<ul class='legend'>"
        + "".join(
            f"<li><span class='swatch {esc(i.shape)}' style='background: {esc(i.color)}; "
            f"color: {esc(i.color)}; border-color: {esc(i.color)}'></span>"
            f"<span class='label'>{esc(i.label)}</span></li>"
            for i in items
        )
        + "</ul>"
    )


def _figure(chart_id: str, table: str, caption: str, drawn: Figure | None, empty: str) -> str:
    esc = html.escape
    inner = (
        f"<p class='muted'>{esc(empty)}</p>"
        if drawn is None
        else svg(drawn.chart) + (_legend(drawn.legend) if drawn.legend else "")
    )
    return (
        f"<figure class='chart' data-chart='{esc(chart_id)}' data-table='{esc(table)}'>"
        f"<figcaption>{esc(caption)}</figcaption>{inner}</figure>"
    )


def _link(href: str | None, text: str, *, top: bool = False) -> str:
    if href is None:
        return ""
    # The page is shown inside the Airflow UI's frame: Airflow's own pages replace the whole
    # window rather than nest a second UI in the frame; the Data Docs stay in the frame.
    target = " target='_top'" if top else ""
    return f"<a href='{html.escape(href)}'{target}>{html.escape(text)}</a>"


def counted(n: int, thing: str, things: str | None = None) -> str:
    """``1 run``, ``2 runs``."""
    return f"{n} {thing if n == 1 else (things or thing + 's')}"


def _checks_of(run: Run, heading: str, found: History, links: Links) -> str:
    """One run's verdict: when, its DAG run, its batch in words, links, and its checks."""
    from lakehouse.quality.reports import describe_run

    esc = html.escape
    state = outcome(run)
    words = describe_run(run)
    if run.outcome is None:  # "no new data" is the state already
        words = words.removeprefix(NO_NEW_DATA).removeprefix(", ")
    parts = [
        f"<h3>{esc(heading)}</h3>",
        f"<p class='verdicts-run'>{esc(when(run.at))}, DAG run {esc(run.dag_run_id or '-')}, "
        f"batch <span class='{esc(state.replace(' ', '-'))}'>{esc(state)}</span>"
        + (f": {esc(words)}. " if words else ". ")
        + " · ".join(
            x
            for x in (
                _link(links.airflow_run(run), "Airflow run", top=True),
                _link(links.data_docs_page(run), "Data Docs page"),
            )
            if x
        )
        + "</p>",
    ]
    checks = found.checks_of(run)
    if not checks:
        parts.append("<p class='muted'>No checks in this run.</p>")
        return "".join(parts)
    rows = [
        "<table class='verdicts'><tr><th>result</th><th>severity</th><th>expectation</th>"
        "<th>kind</th><th>column</th><th>observed</th></tr>"
    ]
    for c in sorted(checks, key=lambda c: (c.success, c.expectation)):
        verdict = (
            "<span class='ok'>met</span>" if c.success else "<span class='failed'>failed</span>"
        )
        rows.append(
            f"<tr><td>{verdict}</td><td>{esc(c.severity)}</td><td>{esc(c.expectation)}</td>"
            f"<td>{esc(c.kind)}</td><td>{esc(c.column or '')}</td><td>{esc(c.observed)}</td></tr>"
        )
    rows.append("</table>")
    return "".join(parts + rows)


def _verdicts(name: str, found: History, links: Links) -> str:
    """The table's latest run and, beside it, its last batch that carried data (after runs
    with nothing new, the latest run holds a freshness check alone), each with its checks."""
    latest, batch = found.latest(name), found.last_batch(name)
    parts = ["<div class='verdicts-block'>"]
    if batch is latest:
        parts.append(_checks_of(latest, "Latest run, with data: its checks", found, links))
    else:
        parts.append(_checks_of(latest, "Latest run: its checks", found, links))
        if batch is None:
            parts.append("<h3>Last batch with data</h3><p class='muted'>None in this window.</p>")
        else:
            parts.append(_checks_of(batch, "Last batch with data: its checks", found, links))
    parts.append("</div>")
    return "".join(parts)


def render_page(found: History, query: PageQuery, links: Links) -> str:
    """The whole page for the history ``found`` (read for ``query``)."""
    esc = html.escape
    parts = [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
        f"<title>Data quality</title><style>{_STYLE}</style></head><body>",
        "<h1>Data quality</h1>",
        "<p class='muted'>From the results ledger: every run of every table in the window, "
        "as <code>lakehouse dq</code> reports it. Every check in detail: "
        f"{_link(links.data_docs, 'the Data Docs')}.</p>",
        "<form class='query' method='get'><label>days back <input name='days' type='number' "
        f"min='0.01' max='{MAX_DAYS:g}' step='any' value='{query.days:g}'></label> "
        f"<label>table or topic <input name='table' value='{esc(query.table or '')}' "
        "placeholder='all tables'></label> <button type='submit'>Show</button></form>",
    ]
    since = "" if found.since is None else f" since {when(found.since)}"
    cut = f" (the newest {LIMIT}: the window holds more)" if len(found.runs) >= LIMIT else ""
    parts.append(
        f"<p class='window'>{counted(len(found.runs), 'run')} of "
        f"{counted(len(found.tables()), 'table')}{since}{cut}.</p>"
    )
    if not found.runs:
        parts.append("<p>No run was recorded in this window.</p></body></html>")
        return "\n".join(parts)

    parts.append("<h2 id='lag'>Lag per layer</h2><div class='charts'>")
    for layer in LAYERS:
        drawn = lag_chart(layer, found.runs, links)
        if drawn is not None:
            parts.append(_figure("lag", layer, f"{layer}: lag behind its input", drawn, ""))
    parts.append("</div>")

    for name in found.tables():
        runs = found.of(name)
        parts.append(f"<section class='table' data-table='{esc(name)}'>")
        parts.append(f"<h2 id='{esc(name)}'>{esc(name)}</h2><div class='charts'>")
        parts.append(
            _figure(
                "pass-rate",
                name,
                "Checks met per run",
                pass_rate_chart(runs, links),
                "No checks in this window.",
            )
        )
        parts.append(
            _figure(
                "batches",
                name,
                "Quarantined and late rows per batch",
                batches_chart(runs, links),
                "No batch in this window.",
            )
        )
        parts.append(
            _figure(
                "freshness",
                name,
                "Freshness: seconds since the newest data, against the contract's limit",
                freshness_chart(runs, links),
                "No freshness check (the contract sets no quality.freshness).",
            )
        )
        parts.append("</div>")
        parts.append(_verdicts(name, found, links))
        parts.append("</section>")
    parts.append("</body></html>")
    return "\n".join(parts)


def message_page(title: str, message: str) -> str:
    """A short page for a request the page cannot answer (a bad parameter, no such table)."""
    esc = html.escape
    return (
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
        f"<title>{esc(title)}</title><style>{_STYLE}</style></head><body>"
        f"<h1>{esc(title)}</h1><p class='error'>{esc(message)}</p>"
        "<p><a href='./'>The data-quality page</a></p></body></html>"
    )


def create_router(
    settings: Callable[[], Settings], *, airflow: str = "../", data_docs: str = "./"
) -> APIRouter:
    """A FastAPI router with the page at ``/``. ``settings`` is read on each request (the
    serving process's environment); ``airflow`` and ``data_docs`` are the URLs of Airflow's UI
    and of the Data Docs relative to the base URL of the app the router is part of."""
    from lakehouse.quality.history import history

    router = APIRouter()

    @router.get("/", response_class=HTMLResponse)
    def quality_page(request: Request) -> HTMLResponse:
        try:
            query = parse_query(request.query_params.multi_items())
        except PageQueryError as exc:
            return HTMLResponse(message_page("Bad request", str(exc)), status_code=400)
        current = settings()
        # The URL of the app the router is part of: where Airflow mounted it (its root_path),
        # which Starlette's base_url leaves out for a mounted app.
        root = str(request.scope.get("root_path", "")).rstrip("/")
        base = str(request.url.replace(path=root + "/", query=""))
        links = Links(urljoin(base, airflow), urljoin(base, data_docs), current.data_docs_root)
        found = history(current, table=query.table, days=query.days)
        if query.table is not None and not found.runs:
            return HTMLResponse(
                message_page(
                    "No such table in this window",
                    f"no run of a table named {query.table!r} was recorded in the last "
                    f"{query.days:g} days",
                ),
                status_code=404,
            )
        # Each request reads the ledger anew: never serve a cached page.
        return HTMLResponse(render_page(found, query, links), headers={"Cache-Control": "no-store"})

    return router
