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

The Airflow plugin serves it at ``/lakehouse-reports/quality/`` behind Airflow's login
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
_TABLE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_-]{0,127}")

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


def _time_axis(runs: Sequence[Run]) -> Any:
    """Run time on x, in UTC, its labels as precise as the runs' span needs (Vega's own
    choice mixes seconds, minutes and a 12-hour clock on one axis)."""
    import altair as alt

    span = runs[-1].at - runs[0].at
    if span.total_seconds() < 3600:
        label = "%H:%M:%S"
    elif span.days < 2:
        label = "%H:%M"
    else:
        label = "%b %d %H:%M"
    return alt.X(
        "at:T",
        title="run (UTC)",
        scale=alt.Scale(type="utc"),
        # At most about six labels: a few seconds of runs made one every second, on top of each other.
        axis=alt.Axis(format=label, labelOverlap=True, tickCount=6),  # on a utc scale, in UTC
    )


def _outcome_scales() -> dict[str, Any]:
    import altair as alt

    return {
        "color": alt.Color(
            "outcome:N",
            title="batch",
            scale=alt.Scale(domain=list(OUTCOMES), range=list(_OUTCOME_COLORS)),
        ),
        "shape": alt.Shape(
            "outcome:N",
            title="batch",
            scale=alt.Scale(domain=list(OUTCOMES), range=list(_OUTCOME_SHAPES)),
        ),
    }


def pass_rate_chart(runs: Sequence[Run], links: Links) -> Any | None:
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
            "rate:Q", title="checks met", scale=alt.Scale(domain=[0, 1]), axis=alt.Axis(format="%")
        ),
    )
    line = base.mark_line(color="#90a4ae", aria=False)
    points = base.mark_point(filled=True, size=90, opacity=1).encode(
        **_outcome_scales(), description="words:N", href="link:N"
    )
    return (line + points).properties(width=_WIDTH, height=_HEIGHT)


def batches_chart(runs: Sequence[Run], links: Links) -> Any | None:
    """Quarantined and (for a windowed table) late rows of each batch, side by side; a blocked
    batch's bars are faded and outlined."""
    import altair as alt

    batches = [r for r in runs if r.outcome is not None]
    measures = [
        m for m in ("quarantined", "late") if any(getattr(r, m) is not None for r in batches)
    ]
    if not batches or not measures:
        return None
    labels: dict[str, int] = {}
    values = []
    for r in batches:
        label = f"{r.at:%m-%d %H:%M:%S}"
        labels[label] = labels.get(label, 0) + 1
        if labels[label] > 1:  # two batches in one second: still two bars
            label += f" #{labels[label]}"
        for m in measures:
            count = getattr(r, m) or 0
            values.append(
                {
                    "batch": label,
                    "measure": m,
                    "rows": count,
                    "outcome": outcome(r),
                    "words": batch_words(r, m, count),
                    "link": links.airflow_run(r),
                }
            )
    return (
        alt.Chart(alt.Data(values=values))
        .mark_bar(strokeWidth=1.5)
        .encode(
            x=alt.X("batch:O", title="batch (UTC)", sort=None, axis=alt.Axis(labelAngle=-40)),
            xOffset=alt.XOffset("measure:N", sort=measures),
            # At least 0 to 1: a table whose batches quarantined nothing shows bars at 0 on a
            # scale, not a flat line.
            y=alt.Y(
                "rows:Q",
                title="rows",
                axis=alt.Axis(tickMinStep=1),
                scale=alt.Scale(
                    domain=[0, max(1, *(getattr(r, m) or 0 for r in batches for m in measures))]
                ),
            ),
            color=alt.Color(
                "measure:N",
                title="rows",
                sort=measures,
                scale=alt.Scale(domain=["quarantined", "late"], range=["#ef6c00", "#6a1b9a"]),
            ),
            opacity=alt.Opacity(
                "outcome:N",
                title="batch",
                scale=alt.Scale(domain=[PUBLISHED, BLOCKED], range=[1.0, 0.35]),
            ),
            stroke=alt.Stroke(
                "outcome:N",
                title="batch",
                scale=alt.Scale(domain=[PUBLISHED, BLOCKED], range=["transparent", "#c62828"]),
            ),
            description="words:N",
            href="link:N",
        )
        .properties(width=_WIDTH, height=_HEIGHT)
    )


def freshness_chart(runs: Sequence[Run], links: Links) -> Any | None:
    """How old the table's newest data was at each run, against the contract's limit."""
    import altair as alt

    fresh = [r for r in runs if r.freshness_age_s is not None]
    if not fresh:
        return None
    data = alt.Data(
        values=[
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
    )
    base = alt.Chart(data).encode(x=_time_axis(fresh))
    limit = base.mark_line(color="#c62828", strokeDash=[6, 4], aria=False).encode(
        y=alt.Y("limit:Q", title="seconds since the newest data")
    )
    age = base.mark_point(filled=True, size=80, opacity=1).encode(
        y=alt.Y("age:Q"),
        color=alt.Color(
            "state:N",
            title="age",
            scale=alt.Scale(
                domain=["within the limit", "over the limit"], range=["#1565c0", "#c62828"]
            ),
        ),
        description="words:N",
        href="link:N",
    )
    return (limit + age).properties(width=_WIDTH, height=_HEIGHT)


def lag_chart(layer: str, runs: Sequence[Run], links: Links) -> Any | None:
    """How far each table of ``layer`` was behind its input after each run (bronze: records of
    its topic not yet read; silver and gold: versions of their input table)."""
    import altair as alt

    lagging = [r for r in runs if r.layer == layer and r.lag is not None]
    if not lagging:
        return None
    unit = lagging[-1].lag_unit or ""
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
        y=alt.Y("lag:Q", title=f"lag ({unit})", axis=alt.Axis(tickMinStep=1)),
        color=alt.Color("table:N", title="table"),
    )
    return (
        base.mark_line(aria=False)
        + base.mark_point(filled=True, size=60, opacity=1).encode(
            description="words:N", href="link:N"
        )
    ).properties(width=_WIDTH, height=_HEIGHT)


def svg(chart: Any) -> str:
    """The chart as SVG, drawn by Vega in vl-convert's runtime; no URL may be fetched."""
    import vl_convert

    # Legends below the plot, their labels whole (table names are long).
    spec = chart.configure_legend(orient="bottom", labelLimit=0, columns=3).to_dict()
    return str(vl_convert.vegalite_to_svg(spec, allowed_base_urls=[]))


# -- the page -----------------------------------------------------------------------------------
_STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5rem 2rem; color: #222; }
h2 { margin-top: 2.2rem; border-bottom: 1px solid #ddd; padding-bottom: 0.2rem; }
.charts { display: flex; flex-wrap: wrap; gap: 1rem 2rem; }
figure { margin: 0; } figcaption { font-weight: 600; margin-bottom: 0.3rem; }
table { border-collapse: collapse; margin: 0.5rem 0 1rem; }
th, td { border: 1px solid #ccc; padding: 0.25rem 0.55rem; text-align: left; vertical-align: top; }
th { background: #f4f4f4; }
.ok { color: #176f2c; font-weight: 600; } .failed { color: #b00020; font-weight: 600; }
.blocked { color: #b00020; font-weight: 600; } .muted { color: #666; }
form { margin: 0.6rem 0 1rem; } input { width: 5rem; }
"""


def _figure(chart_id: str, table: str, caption: str, chart: Any | None, empty: str) -> str:
    esc = html.escape
    inner = f"<p class='muted'>{esc(empty)}</p>" if chart is None else svg(chart)
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


def _verdicts(name: str, runs: Sequence[Run], found: History, links: Links) -> str:
    from lakehouse.quality.reports import describe_run

    esc = html.escape
    checks = found.latest_checks.get(name, [])
    checked = [r for r in runs if r.checks]
    if not checks or not checked:
        return "<p class='muted'>No checks in this window.</p>"
    run = checked[-1]
    state = outcome(run)
    heading = (
        f"<p class='verdicts-run'>Latest checks: {esc(when(run.at))}, DAG run "
        f"{esc(run.dag_run_id or '-')}, batch <span class='{esc(state.replace(' ', '-'))}'>"
        f"{esc(state)}</span>: {esc(describe_run(run))}. "
        + " · ".join(
            x
            for x in (
                _link(links.airflow_run(run), "Airflow run", top=True),
                _link(links.data_docs_page(run), "Data Docs page"),
            )
            if x
        )
        + "</p>"
    )
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
    return heading + "".join(rows)


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
        "<form method='get'><label>days <input name='days' type='number' min='0.01' "
        f"max='{MAX_DAYS:g}' step='any' value='{query.days:g}'></label> "
        f"<label>table <input name='table' value='{esc(query.table or '')}' "
        "placeholder='all'></label> <button type='submit'>show</button></form>",
    ]
    since = "" if found.since is None else f" since {when(found.since)}"
    cut = f" (the newest {LIMIT}: the window holds more)" if len(found.runs) >= LIMIT else ""
    parts.append(
        f"<p class='window'>{len(found.runs)} runs of {len(found.tables())} tables{since}{cut}.</p>"
    )
    if not found.runs:
        parts.append("<p>No run was recorded in this window.</p></body></html>")
        return "\n".join(parts)

    parts.append("<h2 id='lag'>Lag per layer</h2><div class='charts'>")
    for layer in LAYERS:
        chart = lag_chart(layer, found.runs, links)
        if chart is not None:
            parts.append(_figure("lag", layer, f"{layer}: lag behind its input", chart, ""))
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
                "Freshness: age of the newest data against its limit",
                freshness_chart(runs, links),
                "No freshness check (the contract sets no quality.freshness).",
            )
        )
        parts.append("</div>")
        parts.append(_verdicts(name, runs, found, links))
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
