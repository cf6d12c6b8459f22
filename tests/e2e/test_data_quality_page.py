"""The data-quality page in the Airflow UI, end to end: real pipeline runs of a contract of this
test's write the ledger (a silver expectation quarantines records, a `fail` one blocks a batch
until the contract is relaxed, a windowed gold table gets a late record), Airflow's real API
server serves the page through the plugin, and headless Chromium logs in with the generated
password, opens it from the UI's menu and reads every chart's numbers, which must be those of
the ledger's history and of `lakehouse dq --format json`; each table's latest run (one that found
nothing new) is shown beside its last batch with data, each with its checks; no text of a chart
(axis label, axis title, legend entry) is cut or overlaps another, on that page and on pages of
long table names and hundreds of runs. Every request the browser makes must stay on 127.0.0.1.
Screenshots go to tests/artifacts/.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from contextlib import redirect_stdout
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

import pytest
from browser import Browser, open_from_menu, requested_urls, screenshot, unreadable_labels
from test_reports_plugin import APP, PREFIX, Server, running_api_server

from lakehouse import cli
from lakehouse.contracts.catalog import Catalog
from lakehouse.errors import QualityGateError
from lakehouse.quality.history import History, Run, history
from lakehouse.quality.reports import build_data_docs
from lakehouse.runtime.config import Settings
from lakes import lake_with, produce, run_pipeline

pytestmark = [pytest.mark.e2e, pytest.mark.integration, pytest.mark.timeout(900)]

PAGE = f"{APP}/"
DAG_ID = "pipeline__visits"
CONTRACT = """\
topic: visits
partitions: 1
key: {format: string, name: user}
value:
  format: json
  fields:
    - {name: event_time, type: timestamp}
    - {name: page, type: string}
    - {name: amount, type: long}
event_time: event_time
stream: {name: visits_stream}
tables:
  - name: visits_per_minute
    kind: aggregate
    window: {type: tumbling, size: 1m, grace: 30s}
    aggregations:
      - {name: n, fn: count}
expectations:
  silver:
    - {name: page_known, expect: in_set, column: page, values: [home, cart], severity: quarantine}
    - {name: amount_small, expect: between, column: amount, min: 0, max: 100, severity: fail}
quality:
  freshness: 1h
"""
T0 = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("quality-page")
    settings = lake_with(root, CONTRACT)
    with running_api_server(settings, root) as running:
        yield running


def _send(settings: Settings, *events: tuple[float, str, int]) -> None:
    """Visits of user u1: (event time in minutes after T0, page, amount), in offset order."""
    produce(
        settings,
        "visits",
        [
            ("u1", {"event_time": (T0 + timedelta(minutes=m)).isoformat(), "page": p, "amount": a})
            for m, p, a in events
        ],
    )


@dataclass(frozen=True)
class Runs:
    """The pipeline's DAG runs, by what each did."""

    quarantined: str
    blocked: str
    released: str
    late: str
    empty: str  # found nothing new: its tables' latest run, a freshness check alone


@pytest.fixture(scope="module")
def pipeline_runs(server: Server, spark: Any) -> Runs:
    """Four runs of the pipeline, as the DAG's tasks would make them (their DAG run in the
    environment), then the Data Docs built from their validations."""
    settings = server.settings
    runs = Runs("manual__1", "manual__2", "manual__3", "manual__4", "manual__5")

    def pipeline(dag_run_id: str) -> None:
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("AIRFLOW_CTX_DAG_ID", DAG_ID)
            mp.setenv("AIRFLOW_CTX_DAG_RUN_ID", dag_run_id)
            run_pipeline(spark, settings)

    # Two records whose page is unknown are quarantined.
    _send(settings, (0, "home", 5), (0.5, "cart", 7), (1, "nowhere", 1), (1.2, "elsewhere", 2))
    pipeline(runs.quarantined)
    # An amount over the `fail` limit blocks silver's batch (and so gold's).
    _send(settings, (2, "home", 500))
    with pytest.raises(QualityGateError, match="amount_small"):
        pipeline(runs.blocked)
    # The contract is relaxed: the held batch is published, with one more record.
    contract = settings.contracts_dir / "visits.yaml"
    contract.write_text(contract.read_text().replace("max: 100", "max: 1000"))
    _send(settings, (5, "home", 3))
    pipeline(runs.released)
    # Stream time is at minute 5: a visit at minute 1 is past its window's grace.
    _send(settings, (1, "home", 4))
    pipeline(runs.late)
    # Nothing new: every table's latest run is its freshness check.
    pipeline(runs.empty)
    build_data_docs(settings, Catalog.load(settings.contracts_dir))
    return runs


def _log_in(driver: Any, server: Server) -> None:
    """Log in through Airflow's own login page as admin, with the password Airflow generated."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    generated = server.settings.airflow_home / "simple_auth_manager_passwords.json.generated"
    password = json.loads(generated.read_text())["admin"]
    driver.get(f"{server.base}/")
    driver.delete_all_cookies()  # a login of an earlier test
    driver.get(f"{server.base}/")
    wait = WebDriverWait(driver, 60)
    wait.until(ec.presence_of_element_located((By.NAME, "username"))).send_keys("admin")
    driver.find_element(By.NAME, "password").send_keys(password, Keys.ENTER)
    wait.until(ec.element_to_be_clickable((By.XPATH, "//button[normalize-space()='Browse']")))


_READ_CHARTS = """
return Array.from(document.querySelectorAll('figure.chart')).map(f => ({
  chart: f.dataset.chart,
  table: f.dataset.table,
  marks: Array.from(f.querySelectorAll('[aria-label]'))
    .map(e => e.getAttribute('aria-label'))
    .filter(label => label.includes('DAG run: ')),
}));
"""


def _marks(charts: list[dict[str, Any]], chart: str, table: str) -> list[dict[str, str]]:
    """One chart's marks, each as the ``name: value`` pairs of its label."""
    (found,) = [c for c in charts if c["chart"] == chart and c["table"] == table]
    return [dict(p.split(": ", 1) for p in label.split("; ")) for label in found["marks"]]


def _expected(runs: list[Run]) -> dict[str, list[tuple[str | None, ...]]]:
    """What each chart of one table must show, from the ledger's runs."""
    batches = [r for r in runs if r.outcome is not None]
    return {
        "pass-rate": [
            (
                r.dag_run_id,
                r.outcome or "no new data",
                f"{r.pass_rate:.1%}",
                f"{r.met} of {r.checks}",
            )
            for r in runs
            if r.pass_rate is not None
        ],
        "quarantined": [(r.dag_run_id, r.outcome, str(r.quarantined or 0)) for r in batches],
        "late": [
            (r.dag_run_id, r.outcome, str(r.late or 0))
            for r in batches
            if any(b.late is not None for b in batches)
        ],
        "freshness": [
            (r.dag_run_id, f"{r.freshness_age_s:.0f} s", f"{r.freshness_limit_s:.0f} s")
            for r in runs
            if r.freshness_age_s is not None
        ],
    }


def _shown(charts: list[dict[str, Any]], table: str) -> dict[str, list[tuple[str | None, ...]]]:
    bars = (
        _marks(charts, "batches", table)
        if any(c["table"] == table and c["chart"] == "batches" and c["marks"] for c in charts)
        else []
    )
    return {
        "pass-rate": [
            (m["DAG run"], m["outcome"], m["pass rate"], m["checks met"])
            for m in _marks(charts, "pass-rate", table)
        ],
        "quarantined": [
            (m["DAG run"], m["outcome"], m["quarantined"]) for m in bars if "quarantined" in m
        ],
        "late": [(m["DAG run"], m["outcome"], m["late"]) for m in bars if "late" in m],
        "freshness": [
            (m["DAG run"], m["age"], m["limit"]) for m in _marks(charts, "freshness", table)
        ],
    }


# Schemes whose requests the browser answers itself (Chromium's own pages load chrome://
# resources); any other request must go to 127.0.0.1.
IN_THE_BROWSER = ("data", "blob", "about", "chrome")


def _left_the_machine(urls: list[str]) -> list[str]:
    """The requests among ``urls`` that went anywhere but this machine's 127.0.0.1."""
    return [
        u
        for u in urls
        if urlsplit(u).scheme not in IN_THE_BROWSER and urlsplit(u).hostname != "127.0.0.1"
    ]


def _dq_json(settings: Settings) -> list[dict[str, Any]]:
    """`lakehouse dq --format json`, run as a user would, its lines parsed."""
    out = io.StringIO()
    with redirect_stdout(out):
        code = cli.main(
            [
                "--home",
                str(settings.home),
                "--contracts",
                str(settings.contracts_dir),
                "dq",
                "--format",
                "json",
            ]
        )
    assert code == 0
    return [json.loads(line) for line in out.getvalue().splitlines()]


def test_page_needs_a_login_and_names_bad_parameters(server: Server, pipeline_runs: Runs) -> None:
    assert server.get(PAGE).status == 401
    assert server.get(PAGE, cookie=server.token("none")).status == 403
    token = server.token("viewer")
    reply = server.get(f"{PAGE}?days=forever", cookie=token)
    assert reply.status == 400 and "days=&#x27;forever&#x27; is not a number" in reply.body
    reply = server.get(f"{PAGE}?table=visits&color=red", cookie=token)
    assert reply.status == 400 and "unknown parameter &#x27;color&#x27;" in reply.body
    reply = server.get(f"{PAGE}?table=nowhere", cookie=token)
    assert reply.status == 404 and "no run of a table named" in reply.body
    reply = server.get(f"{PAGE}?table=visits_stream&days=2", cookie=token)
    assert reply.status == 200 and "data-table='silver.visits_stream'" in reply.body
    assert "data-table='bronze.visits'" not in reply.body


def test_browser_reads_the_ledgers_numbers_in_each_chart(
    server: Server, pipeline_runs: Runs, chrome: Browser
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    found: History = history(server.settings)
    driver = chrome.driver
    requested_urls(driver)  # what an earlier test of the module's browser asked for is not ours
    _log_in(driver, server)
    wait = WebDriverWait(driver, 60)
    open_from_menu(driver, "Browse", "Data quality")
    frame = wait.until(
        ec.presence_of_element_located((By.CSS_SELECTOR, "iframe[title='Data quality']"))
    )
    assert frame.get_attribute("src") == f"{server.base}{PAGE}"
    # The UI's address: the plugin's route, then the page's path, nothing twice.
    wait.until(ec.url_to_be(f"{server.base}/plugin/lakehouse/data-quality/"))
    driver.switch_to.frame(frame)
    try:
        wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, "figure.chart svg")))
        charts: list[dict[str, Any]] = driver.execute_script(_READ_CHARTS)
        text = driver.find_element(By.TAG_NAME, "body").text
        unreadable, measured = unreadable_labels(driver)
        silver_verdicts = driver.find_element(
            By.CSS_SELECTOR, "section[data-table='silver.visits_stream'] .verdicts-block"
        ).text
    finally:
        driver.switch_to.default_content()
    screenshot(driver, "airflow_ui_quality_page.png")
    # Every axis label, axis title and legend entry is whole, and none overlaps another.
    assert unreadable == [] and measured > 50, (unreadable, measured)
    assert f"{len(found.runs)} runs of 3 tables since" in text

    # The scenario shows: two quarantined, one blocked batch, one late record.
    silver = "silver.visits_stream"
    gold = "gold.visits_per_minute"
    shown = {name: _shown(charts, name) for name in found.tables()}
    assert [(r, o) for r, o, _ in shown[silver]["quarantined"]] == [
        (pipeline_runs.quarantined, "published"),
        (pipeline_runs.blocked, "blocked"),
        (pipeline_runs.released, "published"),
        (pipeline_runs.late, "published"),
    ]
    assert [q for *_, q in shown[silver]["quarantined"]] == ["2", "0", "0", "0"]
    blocked = [p for p in shown[silver]["pass-rate"] if p[0] == pipeline_runs.blocked]
    assert [o for _, o, *_ in blocked] == ["blocked"] and blocked[0][2] != "100.0%"
    assert [(r, n) for r, _, n in shown[gold]["late"]] == [
        (pipeline_runs.quarantined, "0"),
        (pipeline_runs.released, "0"),
        (pipeline_runs.late, "1"),
    ]
    assert shown["bronze.visits"]["freshness"], "the contract's freshness limit is charted"
    assert all(limit == "3600 s" for *_, limit in shown["bronze.visits"]["freshness"])

    # Every chart of every table shows the ledger's numbers, run for run.
    assert found.tables() == ["bronze.visits", gold, silver]
    for name in found.tables():
        assert shown[name] == _expected(found.of(name)), name
    lags = {
        layer: [(m["table"], m["DAG run"], m["lag"]) for m in _marks(charts, "lag", layer)]
        for layer in ("bronze", "silver", "gold")
    }
    assert lags == {
        layer: [
            (r.name, r.dag_run_id, f"{r.lag} {r.lag_unit}")
            for r in found.runs
            if r.layer == layer and r.lag is not None
        ]
        for layer in ("bronze", "silver", "gold")
    }
    assert any(lags.values())

    # `lakehouse dq --format json` prints the same runs.
    by_table: dict[str, list[Run]] = {}
    for row in _dq_json(server.settings):
        fields = {k: v for k, v in row.items() if k in Run.__dataclass_fields__}
        fields["at"] = datetime.fromisoformat(fields["at"])
        fields["reasons"] = json.loads(fields["reasons"])
        fields["failed"] = tuple(fields["failed"])
        run_seen = Run(**fields)
        by_table.setdefault(run_seen.name, []).append(run_seen)
    for name in found.tables():
        assert _expected(by_table[name]) == shown[name], name

    # The latest run found nothing new: its freshness check, and beside it the last batch that
    # carried data with its own checks (the quarantine expectation, with its severity).
    latest, last = silver_verdicts.split("Last batch with data: its checks")
    assert latest.startswith("Latest run: its checks")
    assert f"DAG run {pipeline_runs.empty}, batch no new data" in latest
    assert "freshness" in latest and "page_known" not in latest
    assert f"DAG run {pipeline_runs.late}, batch published" in last
    assert "page_known" in last and "quarantine" in last and "amount_small" in last

    # No request left the machine: the UI, the page and its charts came from 127.0.0.1.
    asked = requested_urls(driver)
    assert any(u.startswith(f"{server.base}{PAGE}") for u in asked), asked
    assert _left_the_machine(asked) == []


LINEAGE = "/lineage/"

_READ_GRAPH = """
return {
  nodes: Array.from(document.querySelectorAll('svg.graph g.node')).map(g => ({
    node: g.dataset.node, cls: g.getAttribute('class'),
    stats: g.querySelector('text.stats').textContent})),
  edges: Array.from(document.querySelectorAll('svg.graph path.edge')).map(p => ({
    source: p.dataset.source, target: p.dataset.target, cls: p.getAttribute('class')})),
};
"""


def test_the_lineage_page_draws_the_graph_with_each_tables_state_behind_the_login(
    server: Server, pipeline_runs: Runs, chrome: Browser
) -> None:
    """Browse -> Lineage: the contract's graph (every node and edge of `lakehouse lineage
    --format json`), each table with the version delta-rs reads from its log and the verdict
    `lakehouse dq` gives its latest run; selecting a node lights its upstream and downstream
    only. Behind Airflow's login, and nothing requested beyond 127.0.0.1."""
    from deltalake import DeltaTable
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    assert server.get(LINEAGE).status == 401
    assert server.get(f"{LINEAGE}?node=nope", cookie=server.token("viewer")).status == 404
    settings = server.settings
    out = io.StringIO()
    with redirect_stdout(out):
        assert (
            cli.main(
                [
                    "--home",
                    str(settings.home),
                    "--contracts",
                    str(settings.contracts_dir),
                    "lineage",
                    "--format",
                    "json",
                ]
            )
            == 0
        )
    printed = json.loads(out.getvalue())
    latest = {}
    for row in _dq_json(settings):
        latest[row["layer"] + "." + row["table"]] = row  # oldest first: the last is the latest

    driver = chrome.driver
    requested_urls(driver)
    _log_in(driver, server)
    wait = WebDriverWait(driver, 60)
    open_from_menu(driver, "Browse", "Lineage")
    frame = wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, "iframe[title='Lineage']")))
    assert frame.get_attribute("src") == f"{server.base}{LINEAGE}"
    driver.switch_to.frame(frame)
    try:
        wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, "svg.graph g.node")))
        drawn = driver.execute_script(_READ_GRAPH)
        driver.find_element(By.CSS_SELECTOR, "g.node[data-node='silver.visits_stream']").click()
        wait.until(ec.presence_of_element_located((By.ID, "selected")))
        picked = driver.execute_script(_READ_GRAPH)
        text = driver.find_element(By.TAG_NAME, "body").text
    finally:
        driver.switch_to.default_content()
    screenshot(driver, "airflow_ui_lineage_page.png")

    assert sorted(n["node"] for n in drawn["nodes"]) == sorted(n["name"] for n in printed["nodes"])
    assert sorted((e["source"], e["target"]) for e in drawn["edges"]) == sorted(
        (e["source"], e["target"]) for e in printed["edges"]
    )
    assert len(drawn["nodes"]) == 4  # topic, bronze, silver, the windowed table
    stats = {n["node"]: n["stats"] for n in drawn["nodes"]}
    for name, path in (
        ("bronze.visits", settings.bronze_path("visits")),
        ("silver.visits_stream", settings.silver_path("visits_stream")),
        ("visits_per_minute", settings.gold_path("visits_per_minute")),
    ):
        assert stats[name].startswith(f"v{DeltaTable(str(path)).version()} · "), stats
        run = latest[name if "." in name else f"gold.{name}"]
        verdict = "ok" if not run["failed"] else "failed"
        assert verdict in stats[name], (name, stats[name], run)
    # Selected: the stream, what it is made from and what is made from it, all lit (a straight
    # line here: nothing is dimmed), and its columns listed with their sources.
    assert [n["node"] for n in picked["nodes"] if "selected" in n["cls"]] == [
        "silver.visits_stream"
    ]
    assert not [n for n in picked["nodes"] if " dim" in n["cls"]]
    assert "page bronze.visits.value (transformation: field page of the json value)" in text
    asked = requested_urls(driver)
    assert any(u.startswith(f"{server.base}{LINEAGE}") for u in asked), asked
    assert _left_the_machine(asked) == []


def test_the_page_links_each_latest_verdict_to_its_run_and_data_docs_page(
    server: Server, pipeline_runs: Runs, chrome: Browser
) -> None:
    from selenium.webdriver.common.by import By

    driver = chrome.driver
    requested_urls(driver)
    _log_in(driver, server)
    driver.get(f"{server.base}{PAGE}")
    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(1280, min(int(height) + 120, 12000))
    screenshot(driver, "quality_page.png")
    driver.set_window_size(1280, 1600)

    silver = driver.find_element(By.CSS_SELECTOR, "section[data-table='silver.visits_stream']")
    latest_link, batch_link = silver.find_elements(By.LINK_TEXT, "Airflow run")
    assert latest_link.get_attribute("href") == (
        f"{server.base}/dags/{DAG_ID}/runs/{pipeline_runs.empty}"
    )
    run_link = batch_link
    assert run_link.get_attribute("href") == (
        f"{server.base}/dags/{DAG_ID}/runs/{pipeline_runs.late}"
    )
    assert run_link.get_attribute("target") == "_top"
    docs = silver.find_element(By.LINK_TEXT, "Data Docs page")
    assert docs.get_attribute("href").startswith(
        f"{server.base}{PREFIX}/validations/silver/visits_stream/"
    )
    # The login and the page asked nothing of another host. (The Data Docs' own pages are
    # Great Expectations' HTML, which is tested in test_reports_plugin.py.)
    assert _left_the_machine(requested_urls(driver)) == []
    docs.click()
    body = driver.find_element(By.TAG_NAME, "body").text
    assert "Expectation Validation Result" in body
    assert "Expectation Suite: silver.visits_stream" in body


def _synthetic(names: list[str], runs: int, every: timedelta) -> History:
    """A history of ``runs`` runs of each of bronze, silver and the gold tables ``names``, every
    ``every``: batches that quarantine a few rows, some blocked, some with nothing new."""
    start = datetime(2026, 3, 1, tzinfo=UTC)
    tables = [("bronze", "visits", "records"), ("silver", "visits_stream", "versions")]
    tables += [("gold", name, "versions") for name in names]
    found = History(since=start - timedelta(days=14))
    for i in range(runs):
        for j, (layer, table, unit) in enumerate(tables):
            nothing = i % 5 == 4
            found.runs.append(
                Run(
                    layer=layer,
                    table=table,
                    run_id=f"{i}-{j}",
                    dag_id=DAG_ID,
                    dag_run_id=f"scheduled__2026-03-01T{i:05d}",
                    at=start + every * i + timedelta(seconds=j),
                    table_version=None if nothing else i,
                    outcome=None if nothing else ("blocked" if i % 7 == 3 else "published"),
                    rows=None if nothing else 1000 * i,
                    quarantined=None if nothing else 12345 * (i % 3),
                    reasons={},
                    late=None if layer != "gold" or nothing else i % 2,
                    late_table=None,
                    gaps=None,
                    lag=(i % 4) * 10_000_000,
                    lag_unit=unit,
                    checks=3,
                    met=3 - i % 2,
                    failed=(),
                    freshness_age_s=30.0 * (i % 9) + 1,
                    freshness_limit_s=120.0,
                )
            )
    return found


@pytest.mark.parametrize(
    ("names", "runs", "every"),
    [
        (["visits_per_minute"], 1, timedelta(seconds=30)),
        (
            ["visits_per_minute", "v" * 120, "visits_per_minute_by_page_and_campaign"],
            12,
            timedelta(seconds=30),
        ),
        (["visits_per_minute", "per_user_" * 8], 300, timedelta(seconds=7)),
        (["visits_per_minute"], 60, timedelta(hours=5)),
    ],
    ids=["one run", "long table names", "300 runs", "days of runs"],
)
def test_every_label_is_whole_at_any_table_name_length_and_run_count(
    chrome: Browser, tmp_path: Any, names: list[str], runs: int, every: timedelta
) -> None:
    """The page's charts as Chromium lays them out: no axis label, axis title or legend entry
    is cut by its chart's edge, shortened, or drawn over another."""
    from pathlib import Path

    from lakehouse.quality.page import Links, PageQuery, render_page

    page = Path(tmp_path) / "page.html"
    links = Links("http://127.0.0.1/", "http://127.0.0.1/data-quality/docs/", Path(tmp_path))
    page.write_text(render_page(_synthetic(names, runs, every), PageQuery(), links))
    driver = chrome.driver
    driver.get(page.as_uri())
    unreadable, measured = unreadable_labels(driver)
    assert unreadable == [], unreadable[:20]
    assert measured > 40
