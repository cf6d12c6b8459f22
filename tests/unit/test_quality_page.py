"""The data-quality page on its own (no Airflow): its charts' numbers, links and verdicts from a
ledger written here, and its answers to bad parameters. Airflow's mounting of it, the real
pipeline's ledger and a browser are tested in tests/e2e/test_data_quality_page.py."""

from __future__ import annotations

import html
import re
import warnings
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI

from lakehouse.quality.history import history
from lakehouse.quality.ledger import (
    BLOCKED,
    PUBLISHED,
    BatchOutcome,
    RunInfo,
    ledger_rows,
    write_ledger,
)
from lakehouse.quality.page import (
    Links,
    PageQuery,
    PageQueryError,
    create_router,
    parse_query,
    render_page,
)
from lakehouse.quality.verdict import Outcome, Verdict
from lakehouse.runtime.config import Settings

with warnings.catch_warnings():
    # Starlette asks for `httpx2` under its TestClient; the stack pins `httpx`, which works.
    warnings.filterwarnings("ignore", message="Using `httpx` with `starlette.testclient`")
    from fastapi.testclient import TestClient

NOW = datetime.now(UTC).replace(microsecond=0)
T0 = NOW - timedelta(hours=2)
AIRFLOW = "http://airflow.test/"
DOCS = "http://airflow.test/data-quality/docs/"


def figure(page: str, chart: str, table: str) -> str:
    """The HTML of one chart of the page (its SVG, or the words in its place)."""
    start = page.index(f"<figure class='chart' data-chart='{chart}' data-table='{table}'>")
    return page[start : page.index("</figure>", start)]


def marks(page: str, chart: str, table: str) -> list[dict[str, str]]:
    """The data marks of one chart, each as the ``name: value`` pairs of its aria-label."""
    labels = re.findall(r'aria-label="([^"]*)"', figure(page, chart, table))
    return [
        dict(part.split(": ", 1) for part in html.unescape(label).split("; "))
        for label in labels
        if "DAG run: " in html.unescape(label)
    ]


def _verdict(table: str, at: datetime, *outcomes: Outcome) -> Verdict:
    verdict = Verdict("silver", table, list(outcomes), 10, "pandas")
    verdict.validated_at = at
    return verdict


MET = Outcome("amount_positive", "between", "warn", True, observed=0)
BROKEN = Outcome("id_unique", "unique", "fail", False, observed=2)


def _fresh(age: float) -> Outcome:
    return Outcome(
        "freshness", "freshness", "warn", age <= 600, observed=age, sample=("limit 600 s",)
    )


@pytest.fixture
def ledger(spark: Any, tmp_path: Path) -> tuple[Settings, list[RunInfo]]:
    """Three runs of silver.orders (published with 2 quarantined, blocked by a failed check,
    then published with stale data), and one of gold.per_minute with 2 late rows."""
    settings = Settings.from_env(tmp_path / "home", tmp_path)
    runs = [RunInfo(dag_id="pipeline__orders", dag_run_id=f"manual__{i}") for i in range(4)]
    rows = []
    for i, (checks, result, quarantined) in enumerate(
        [
            ((MET, _fresh(30)), PUBLISHED, 2),
            ((MET, BROKEN), BLOCKED, 0),
            ((MET, _fresh(900)), PUBLISHED, 1),
        ]
    ):
        at = T0 + timedelta(minutes=10 * i)
        published = result == PUBLISHED
        rows += ledger_rows(
            runs[i],
            _verdict("orders", at, *checks),
            table_version=i if published else None,
            published=published,
            lineage=None,
        )
        rows.append(
            BatchOutcome(
                "silver",
                "orders",
                result,
                10,
                i if published else None,
                reasons={"expectation city_known (in_set)": quarantined} if quarantined else {},
                lag=0 if published else 1,
                lag_unit="versions",
            ).row(runs[i], at)
        )
    rows.append(
        BatchOutcome(
            "gold",
            "per_minute",
            PUBLISHED,
            4,
            7,
            late=2,
            late_table="late.per_minute",
            lag=0,
            lag_unit="versions",
        ).row(runs[3], T0 + timedelta(minutes=31))
    )
    write_ledger(spark, settings, rows)
    return settings, runs


def _links(settings: Settings) -> Links:
    return Links(AIRFLOW, DOCS, settings.data_docs_root)


def test_each_chart_carries_the_ledgers_numbers(ledger: tuple[Settings, list[RunInfo]]) -> None:
    settings, _ = ledger
    found = history(settings)
    page = render_page(found, PageQuery(), _links(settings))

    assert [
        (m["DAG run"], m["outcome"], m["pass rate"], m["checks met"])
        for m in marks(page, "pass-rate", "silver.orders")
    ] == [
        ("manual__0", "published", "100.0%", "2 of 2"),
        ("manual__1", "blocked", "50.0%", "1 of 2"),
        ("manual__2", "published", "50.0%", "1 of 2"),
    ]
    bars = marks(page, "batches", "silver.orders")
    assert [(m["DAG run"], m["outcome"], m["quarantined"]) for m in bars] == [
        ("manual__0", "published", "2"),
        ("manual__1", "blocked", "0"),
        ("manual__2", "published", "1"),
    ]
    quarantined, late = marks(page, "batches", "gold.per_minute")
    assert (late["DAG run"], late["late"], late["rows"]) == ("manual__3", "2", "4")
    assert quarantined["quarantined"] == "0"
    assert [(m["age"], m["limit"]) for m in marks(page, "freshness", "silver.orders")] == [
        ("30 s", "600 s"),
        ("900 s", "600 s"),
    ]
    assert "No freshness check" in figure(page, "freshness", "gold.per_minute")
    assert [(m["table"], m["lag"]) for m in marks(page, "lag", "silver")] == [
        ("silver.orders", "0 versions"),
        ("silver.orders", "1 versions"),
        ("silver.orders", "0 versions"),
    ]
    assert [m["lag"] for m in marks(page, "lag", "gold")] == ["0 versions"]
    assert "4 runs of 2 tables since" in page


def test_a_blocked_batch_is_drawn_apart_from_a_published_one(
    ledger: tuple[Settings, list[RunInfo]],
) -> None:
    settings, _ = ledger
    page = render_page(history(settings), PageQuery(), _links(settings))
    points = re.findall(
        r'<path aria-label="([^"]*)"[^>]*? d="([^"]*)" fill="([^"]*)"',
        figure(page, "pass-rate", "silver.orders"),
    )
    looks = {("outcome: blocked" in label): (shape[:3], fill) for label, shape, fill in points}
    assert looks[True] != looks[False]
    assert looks[True][1] == "#c62828" and looks[False][1] == "#2e7d32"


def test_latest_verdicts_link_to_their_airflow_run_and_data_docs_page(
    ledger: tuple[Settings, list[RunInfo]],
) -> None:
    settings, runs = ledger
    latest = runs[2]
    page_file = (
        settings.data_docs_root
        / "validations"
        / "silver"
        / "orders"
        / "x"
        / f"{latest.run_id[:12]}.html"
    )
    found = history(settings)
    without_docs = render_page(found, PageQuery(), _links(settings))
    assert "Data Docs page" not in without_docs  # no page was built: no dead link

    page_file.parent.mkdir(parents=True)
    page_file.write_text("<html>validation</html>")
    page = render_page(found, PageQuery(), _links(settings))
    section = page[page.index("<section class='table' data-table='silver.orders'>") :]
    verdicts = section[section.index("Latest run, with data") : section.index("</table>")]
    assert "DAG run manual__2" in verdicts and "batch <span class='published'>published" in verdicts
    assert (
        f"<a href='{AIRFLOW}dags/pipeline__orders/runs/manual__2' target='_top'>Airflow run</a>"
        in verdicts
    )
    docs_link = f"{DOCS}validations/silver/orders/x/{latest.run_id[:12]}.html"
    assert f"<a href='{docs_link}'>Data Docs page</a>" in verdicts
    rows = re.findall(
        r"<tr><td><span class='(\w+)'>(\w+)</span></td><td>(\w+)</td><td>(\w+)</td>", verdicts
    )
    assert rows == [
        ("failed", "failed", "warn", "freshness"),
        ("ok", "met", "warn", "amount_positive"),
    ]
    assert "900 s" in verdicts  # the freshness check's observed age
    # Each chart's point links to its Airflow run too.
    assert f'xlink:href="{AIRFLOW}dags/pipeline__orders/runs/manual__1"' in figure(
        page, "pass-rate", "silver.orders"
    )


def test_the_page_asks_for_nothing_from_elsewhere(ledger: tuple[Settings, list[RunInfo]]) -> None:
    settings, _ = ledger
    page = render_page(history(settings), PageQuery(), _links(settings))
    assert "<script" not in page and "<link" not in page and "@import" not in page
    assert not re.findall(r"""(?:src|href)=["'](?!http://airflow\.test/)""", page)


@pytest.mark.parametrize(
    ("query", "said"),
    [
        ({"days": "abc"}, "days='abc' is not a number"),
        ({"days": "0"}, "days='0' is out of range: more than 0 and at most 366"),
        ({"days": "-3"}, "out of range"),
        ({"days": "nan"}, "out of range"),
        ({"days": "400"}, "out of range"),
        ({"table": "orders;drop"}, "table='orders;drop' is not a table name"),
        ({"table": "../etc"}, "is not a table name"),
        ({"limit": "5"}, "unknown parameter 'limit': the page takes days and table"),
    ],
)
def test_bad_parameters_are_named(query: dict[str, str], said: str) -> None:
    with pytest.raises(PageQueryError, match=re.escape(said)):
        parse_query(query)


def test_good_parameters() -> None:
    assert parse_query({}) == PageQuery()
    assert parse_query({"days": "0.5", "table": "orders_stream"}) == PageQuery(0.5, "orders_stream")
    assert parse_query({"table": ""}) == PageQuery()
    with pytest.raises(PageQueryError, match="'days' is given more than once"):
        parse_query([("days", "1"), ("days", "2")])


def test_served_answers_bad_input_with_400_and_an_unknown_table_with_404(
    ledger: tuple[Settings, list[RunInfo]],
) -> None:
    settings, _ = ledger
    app = FastAPI()
    app.include_router(create_router(lambda: settings), prefix="/quality")
    client = TestClient(app, base_url="http://airflow.test")

    reply = client.get("/quality/?days=soon")
    assert reply.status_code == 400
    assert "days=&#x27;soon&#x27; is not a number" in reply.text

    reply = client.get("/quality/?table=nowhere")
    assert reply.status_code == 404
    assert (
        "no run of a table named &#x27;nowhere&#x27; was recorded in the last 14 days" in reply.text
    )

    reply = client.get("/quality/?table=orders&days=1")
    assert reply.status_code == 200 and reply.headers["cache-control"] == "no-store"
    assert "data-table='silver.orders'" in reply.text and "gold.per_minute" not in reply.text
    # Links resolve against where the app is served.
    assert "href='http://airflow.test/dags/pipeline__orders/runs/manual__2'" in reply.text


def test_links_resolve_against_where_airflow_mounts_the_app(
    ledger: tuple[Settings, list[RunInfo]],
) -> None:
    settings, _ = ledger
    plugin_app = FastAPI()
    plugin_app.include_router(create_router(lambda: settings, data_docs="docs/"))
    airflow = FastAPI()
    airflow.mount("/data-quality", plugin_app)  # as Airflow's API server mounts plugins
    client = TestClient(airflow, base_url="http://airflow.test")

    page = client.get("/data-quality/?days=1").text
    assert "<a href='http://airflow.test/data-quality/docs/'>the Data Docs</a>" in page
    assert (
        "<a href='http://airflow.test/dags/pipeline__orders/runs/manual__2' target='_top'>" in page
    )


def _run(run_id: str, at: datetime, *, rows: int | None, checks: int) -> Any:
    from lakehouse.quality.history import Run

    return Run(
        layer="silver", table="orders", run_id=run_id, dag_id="pipeline__orders",
        dag_run_id=f"manual__{run_id}", at=at, table_version=None if rows is None else 1,
        outcome=None if rows is None else PUBLISHED, rows=rows, quarantined=None, reasons={},
        late=None, late_table=None, gaps=None, lag=None, lag_unit=None, checks=checks,
        met=checks, failed=(), freshness_age_s=None, freshness_limit_s=None,
    )  # fmt: skip


def test_the_latest_run_is_shown_beside_the_last_batch_with_data_and_counts_read_right(
    tmp_path: Path,
) -> None:
    from lakehouse.quality.history import Check, History

    one = History([_run("a", T0, rows=4, checks=2)], since=T0 - timedelta(days=14))
    one.checks = {("a", "silver.orders"): [Check("id_unique", "unique", None, "fail", True, "0")]}
    links = Links(AIRFLOW, DOCS, tmp_path)
    page = render_page(one, PageQuery(), links)
    assert "<p class='window'>1 run of 1 table since" in page
    assert "Latest run, with data: its checks" in page and "Last batch with data" not in page

    later = T0 + timedelta(minutes=5)
    two = History([*one.runs, _run("b", later, rows=None, checks=1)], since=one.since)
    two.checks = {
        **one.checks,
        ("b", "silver.orders"): [Check("freshness", "freshness", None, "warn", True, "9 s")],
    }
    page = render_page(two, PageQuery(), links)
    assert "2 runs of 1 table since" in page
    latest = page.index("<h3>Latest run: its checks</h3>")
    batch = page.index("<h3>Last batch with data: its checks</h3>")
    assert latest < page.index("manual__b", latest) < page.index("freshness", latest) < batch
    assert page.index("manual__a", batch) < page.index("id_unique", batch)
