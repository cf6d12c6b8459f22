"""Airflow 3 running for real on PostgreSQL, as `make airflow` runs it (scheduler, DAG processor
and API server; LocalExecutor; see airflow_stack.py), under a temporary lakehouse root with small
test contracts, its layer tasks clients of a Spark server. One stack for these tests:

- The metadata database is the lakehouse's PostgreSQL cluster, and the LocalExecutor runs a DAG
  run's independent tasks at the same time: one run of the run DAG (``lakehouse__run``), bronze
  only, for two topics, triggered through the REST API.
- A pipeline run triggered from the Airflow UI, as a user would: log in, open the topic's DAG,
  Trigger, submit the form as it opens (its "Unpause on trigger" box ticked); the run is the only
  one (the DAG has no schedule to leave behind), and its own layers commit the records waiting.
  A second run asks for a full refresh of one gold table in the Params form. Headless Chromium
  drives the UI; screenshots of the trigger form and of the succeeded run go to tests/artifacts/.
- A contract with a misspelt key, beside them: the DAG list and the DAG's page say what is wrong
  and where; once the file is fixed, the real DAG is there and nothing of the broken one (its
  failed run) is left in the list.

DAGs start paused, and only the UI test unpauses one (the trigger form's box): the runs the tests
trigger are the only ones.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest
from airflow_stack import AIRFLOW, Airflow, clean_environment, running_airflow
from browser import ARTIFACTS, Browser, screenshot

from lakehouse.orchestration.airflow_env import SPARK_CONN_ENV, airflow_secrets
from lakehouse.runtime.config import Settings
from lakehouse.runtime.postgres import Cluster

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

TOPIC = "ui-checkins"
DAG_ID = f"pipeline__{TOPIC}"
LATEST, COUNTS = "ui_latest_location", "ui_checkin_counts"
REFRESHED = COUNTS  # the gold table the form asks to rebuild in full
CONTRACT = f"""\
topic: {TOPIC}
description: Check-ins, for the UI trigger test.
partitions: 2
key: {{format: string, name: username}}
value:
  format: json
  fields:
    - {{name: location, type: string, nullable: true}}
stream: {{name: ui_checkins}}
tables:
  - {{name: {LATEST}, kind: latest}}
  - name: {COUNTS}
    kind: aggregate
    aggregations:
      - {{name: count, fn: count}}
"""
FIRST = [("alice", "Paris"), ("bob", "Lima"), ("alice", "Rome")]
SECOND = [("bob", "Oslo"), ("carol", "Quito")]
BASE_MS = 1_700_000_000_000
BROKEN_TOPIC = "ui-orders"
BROKEN_CONTRACT = """\
topic: ui-orders
key: {format: string, name: order_id}
value:
  format: json
  fields:
    - {name: amount, type: long}
stream: {name: ui_orders}
tables:
  - {name: ui_order_latest, kind: latest}
  - name: ui_order_counts
    kind: aggregate
    agregations:
      - {name: orders, fn: count}
"""
BROKEN_SAYS = (
    "pipeline__ui-orders: broken contract: ui-orders.yaml: tables[1] (table 'ui_order_counts'): "
    "unknown key 'agregations' (did you mean 'aggregations'?)"
)
RUN_DAG = "lakehouse__run"  # (lakehouse.orchestration.dags.RUN_DAG; importing it loads Airflow)
PG_TOPICS = ("pg-east", "pg-west")  # the run DAG's two bronze jobs, independent of each other


def _pg_contract(topic: str) -> str:
    name = topic.replace("-", "_")
    return f"""\
topic: {topic}
description: Check-ins, for the PostgreSQL test.
partitions: 1
key: {{format: string, name: username}}
value:
  format: json
  fields:
    - {{name: location, type: string, nullable: true}}
stream: {{name: {name}}}
tables:
  - {{name: {name}_latest, kind: latest}}
"""


def _succeeds(
    settings: Settings,
    argv: list[str],
    what: str,
    stdin: str | None = None,
    env: dict[str, str] | None = None,
) -> str:
    """``argv`` run in ``settings``' environment alone (and ``env``); its output, once it has
    succeeded."""
    proc = subprocess.run(
        argv,
        input=stdin,
        env=clean_environment(settings) | (env or {}),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, f"{what}:\n{proc.stderr[-3000:]}"
    return proc.stdout + proc.stderr


def _lakehouse(settings: Settings, *args: str, stdin: str | None = None) -> str:
    cli = str(Path(sys.executable).parent / "lakehouse")
    return _succeeds(settings, [cli, *args], f"lakehouse {' '.join(args)}", stdin)


def _produce(
    settings: Settings, events: list[tuple[str, str]], first: int, topic: str = TOPIC
) -> None:
    lines = [
        json.dumps(
            {"key": user, "value": {"location": place}, "timestamp": BASE_MS + 60_000 * (first + i)}
        )
        for i, (user, place) in enumerate(events)
    ]
    out = _lakehouse(settings, "produce", topic, stdin="\n".join(lines) + "\n")
    assert f"produced {len(events)} record(s) to {topic}" in out


def _run_on_the_server(settings: Settings, server: Any, topic: str) -> str:
    """One micro-batch of ``topic`` through every layer, the way the DAG's layer tasks run it:
    in a process of its own, a Spark Connect client of the run's Spark server (found through
    Spark's own ``SPARK_REMOTE``, which keeps the token out of the command line), so no JVM
    starts for it."""
    script = (
        "from pyspark.sql import SparkSession\n"
        "from lakehouse.contracts.catalog import Catalog\n"
        "from lakehouse.pipeline.runner import run\n"
        "from lakehouse.runtime.config import Settings\n"
        "settings = Settings.from_env()\n"
        "spark = SparkSession.builder.getOrCreate()\n"
        # The contracts that load (the broken one beside them is not this run's business).
        f"run(spark, settings, Catalog.load_each(settings.contracts_dir).catalog, "
        f"topics=[{topic!r}])\n"
    )
    remote = {"SPARK_REMOTE": f"sc://localhost:{server.port}/;token={server.token}"}
    argv = [sys.executable, "-c", script]
    return _succeeds(settings, argv, f"the first batch of {topic}", env=remote)


def _version(settings: Settings, table: str) -> int:
    from deltalake import DeltaTable

    return int(DeltaTable(str(settings.gold_path(table))).version())


@dataclass
class Lakehouse:
    settings: Settings
    airflow: Airflow
    before: dict[str, int]  # gold versions before the UI's run


@pytest.fixture(scope="module")
def lakehouse(
    tmp_path_factory: pytest.TempPathFactory,
    postgres: Cluster,
    shared_spark_server: Any,  # conftest.SparkServer
) -> Iterator[Lakehouse]:
    """The UI's topic: a first batch already through the pipeline (on the Spark server, no
    Airflow), a second one waiting in landing; the PostgreSQL test's two topics: a batch each in
    landing. Airflow running, its layer tasks clients of a Spark server."""
    root = tmp_path_factory.mktemp("airflow-on-postgres")
    contracts = root / "contracts"
    contracts.mkdir()
    (contracts / f"{TOPIC}.yaml").write_text(CONTRACT)
    for topic in PG_TOPICS:
        (contracts / f"{topic}.yaml").write_text(_pg_contract(topic))
    (contracts / f"{BROKEN_TOPIC}.yaml").write_text(BROKEN_CONTRACT)
    settings = Settings.from_env(home=root / "lakehouse", contracts_dir=contracts)
    _produce(settings, FIRST, 0)
    _run_on_the_server(settings, shared_spark_server, TOPIC)
    before = {t: _version(settings, t) for t in (LATEST, COUNTS)}
    _produce(settings, SECOND, len(FIRST))
    for topic in PG_TOPICS:
        _produce(settings, [("alice", "Paris"), ("bob", "Lima")], 0, topic)
    extra = {
        SPARK_CONN_ENV: shared_spark_server.connection,
        # A DAG its file no longer makes (the broken contract's, once fixed) is deactivated
        # 10 s after the file's next parse rather than Airflow's 50.
        "AIRFLOW__DAG_PROCESSOR__STALE_DAG_THRESHOLD": "10",
    }
    with running_airflow(
        settings, root / "airflow-logs", postgres=postgres, extra_env=extra
    ) as airflow:
        airflow.wait_for_dag(DAG_ID)
        yield Lakehouse(settings, airflow, before)


# -- PostgreSQL and the LocalExecutor ----------------------------------------------------------
@dataclass
class Run:
    airflow: Airflow
    run_id: str
    state: str
    tasks: dict[str, dict[str, Any]]  # task id -> task instance, from the REST API


@pytest.fixture(scope="module")
def run(lakehouse: Lakehouse) -> Run:
    """The run DAG triggered once for bronze of the two PostgreSQL-test topics, and finished
    (the UI's topic is left out by the run's Params)."""
    airflow = lakehouse.airflow
    airflow.wait_for_dag(RUN_DAG)
    airflow.set_paused(RUN_DAG, False)
    conf = {"layers": ["bronze"], "topics": list(PG_TOPICS)}
    run_id = str(airflow.trigger(RUN_DAG, conf)["dag_run_id"])
    finished = airflow.wait_for_run(RUN_DAG, run_id, timeout=600)
    tasks = {t["task_id"]: t for t in airflow.task_instances(RUN_DAG, run_id)}
    return Run(airflow, run_id, finished["state"], tasks)


def test_the_metadata_database_is_postgres(run: Run, postgres: Cluster) -> None:
    proc = subprocess.run(
        [str(AIRFLOW), "config", "get-value", "database", "sql_alchemy_conn"],
        env=run.airflow.env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    url = proc.stdout.strip()
    port = postgres.status().port
    assert url.startswith("postgresql+psycopg://lakehouse:"), url.split(":")[0]
    assert f"@127.0.0.1:{port}/airflow_" in url
    # The run Airflow reports is a row of dag_run in that database.
    with psycopg.connect(url.replace("postgresql+psycopg:", "postgresql:")) as conn:
        row = conn.execute(
            "SELECT dag_id, state FROM dag_run WHERE run_id = %s", (run.run_id,)
        ).fetchone()
    assert row == (RUN_DAG, run.state)


def test_independent_tasks_of_a_run_overlap(run: Run) -> None:
    bronze = [run.tasks[f"bronze__{topic}"] for topic in PG_TOPICS]
    assert run.state == "success", {t: ti["state"] for t, ti in run.tasks.items()}
    assert [ti["state"] for ti in bronze] == ["success", "success"]
    # Left out by the run's Params: skipped, not run.
    assert {run.tasks[f"silver__{topic}"]["state"] for topic in PG_TOPICS} == {"skipped"}
    assert run.tasks[f"bronze__{TOPIC}"]["state"] == "skipped"
    (start_a, end_a), (start_b, end_b) = [
        (datetime.fromisoformat(ti["start_date"]), datetime.fromisoformat(ti["end_date"]))
        for ti in bronze
    ]
    # Each of the two bronze jobs started before the other one ended.
    assert start_a < end_b and start_b < end_a, (start_a, end_a, start_b, end_b)


# -- the UI ------------------------------------------------------------------------------------
def _log_in(driver: Any, wait: Any, airflow: Airflow) -> None:
    """Through the login page the UI redirects to, with admin's generated password."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec

    driver.get(f"{airflow.base}/")
    if any(c["name"] == "_token" for c in driver.get_cookies()):
        return  # logged in already (by an earlier test of the module)
    wait.until(ec.url_contains("/auth/login"))
    wait.until(ec.element_to_be_clickable((By.NAME, "username"))).send_keys("admin")
    driver.find_element(By.NAME, "password").send_keys(airflow.password)
    driver.find_element(By.XPATH, "//button[@type='submit']").click()
    wait.until(lambda d: "/auth/login" not in d.current_url)
    assert any(c["name"] == "_token" for c in driver.get_cookies()), "no session cookie"


def _set_full_refresh(driver: Any, table: str) -> None:
    """Ask for ``table`` in the Param full_refresh: a multi-select if the Param lists its
    choices (``examples``), else a text area taking one name per line."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    field = driver.find_element(By.ID, "element_full_refresh")
    driver.execute_script("arguments[0].scrollIntoView({block: 'center'});", field)
    if field.tag_name == "textarea":
        field.click()
        field.send_keys(Keys.CONTROL, "a")
        field.send_keys(table)
        field.send_keys(Keys.TAB)  # the lines become the list when the area loses focus
        assert field.get_attribute("value") == table
        return
    # react-select: type into its input, take the highlighted option.
    field.click()
    entry = field.find_element(By.CSS_SELECTOR, "input")
    entry.send_keys(table)
    entry.send_keys(Keys.ENTER)  # (Escape would close the dialog, Tab pick another option)
    assert table in field.text, f"{table} not selected: {field.text!r}"


def _blocking_params(airflow: Airflow) -> list[str]:
    """Params the UI's form counts as missing: a type without null and an empty value (the
    form disables Trigger while any is)."""
    params = airflow.api("GET", f"/dags/{DAG_ID}/details")["params"] or {}
    blocking = []
    for name, param in params.items():
        kind = param.get("schema", {}).get("type")
        kinds = kind if isinstance(kind, list) else [kind]
        if kind and "null" not in kinds and param.get("value") in (None, ""):
            blocking.append(name)
    return blocking


def _trigger_from_the_ui(driver: Any, airflow: Airflow, full_refresh: str | None = None) -> str:
    """Open the DAG, Trigger, and submit the Params form: as it opens (``full_refresh`` None,
    the "Unpause on trigger" box as Airflow ticks it), or asking for a full refresh of one
    table; the new run's id."""
    from selenium.common.exceptions import StaleElementReferenceException, TimeoutException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    wait = WebDriverWait(driver, 30, ignored_exceptions=[StaleElementReferenceException])
    driver.get(f"{airflow.base}/dags/{DAG_ID}")
    wait.until(
        ec.element_to_be_clickable((By.CSS_SELECTOR, "[data-testid='trigger-dag-button']"))
    ).click()
    # The dialog: Single Run (the default), the unpause box (on a paused DAG), the Params form.
    wait.until(ec.presence_of_element_located((By.ID, "element_full_refresh")))
    unpause = driver.find_elements(
        By.XPATH, f"//label[contains(normalize-space(), 'Unpause {DAG_ID} on trigger')]"
    )
    if airflow.dag(DAG_ID)["is_paused"]:
        assert unpause, "a paused DAG's trigger form offers to unpause it"
        assert unpause[0].find_element(By.TAG_NAME, "input").is_selected(), (
            "the box is ticked by default"
        )
    if full_refresh is not None:
        _set_full_refresh(driver, full_refresh)
    # The dialog's footer re-renders as the form's state changes: find the button afresh.
    submit = (By.CSS_SELECTOR, "[data-testid='trigger-dag-submit']")
    driver.execute_script(
        "arguments[0].scrollIntoView({block: 'end'});", driver.find_element(*submit)
    )
    shot = "ui_trigger_form.png" if full_refresh else "ui_trigger_default_form.png"
    try:
        wait.until(ec.element_to_be_clickable(submit))
    except TimeoutException:
        screenshot(driver, shot)
        if not driver.find_elements(*submit):
            pytest.fail(f"the trigger dialog closed; page: {_text(driver)[-2000:]}")
        pytest.fail(
            "the trigger form's Trigger button stays disabled: Airflow's form counts a Param "
            "whose type does not allow null and whose value is empty ('' or null) as a missing "
            f"required value; such Params of {DAG_ID}: {_blocking_params(airflow)} (see "
            f"{ARTIFACTS / shot})",
            pytrace=False,
        )
    screenshot(driver, shot)
    known = {r["dag_run_id"] for r in airflow.dag_runs(DAG_ID)}
    wait.until(ec.element_to_be_clickable(submit)).click()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        new = [r for r in airflow.dag_runs(DAG_ID) if r["dag_run_id"] not in known]
        if new:
            assert [r["run_type"] for r in new] == ["manual"], new
            return str(new[0]["dag_run_id"])
        time.sleep(1)
    pytest.fail(f"no DAG run appeared after Trigger; page: {_text(driver)[-2000:]}")


def _seconds(end: str, start: str) -> float:
    """The seconds between two of the REST API's timestamps."""
    return (datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds()


def _text(driver: Any) -> str:
    from selenium.webdriver.common.by import By

    return str(driver.find_element(By.TAG_NAME, "body").text)


def _failure_report(airflow: Airflow, run_id: str) -> str:
    lines = []
    for ti in airflow.task_instances(DAG_ID, run_id):
        lines.append(f"{ti['task_id']}: {ti['state']}")
        if ti["state"] in ("failed", "upstream_failed") and ti.get("try_number"):
            log = airflow.task_log(DAG_ID, run_id, ti["task_id"], ti["try_number"])
            lines.append(log[-3000:])
    return "\n".join(lines)


# -- the test ----------------------------------------------------------------------------------
def _committed(settings: Settings, run_id: str) -> dict[str, tuple[str, int]]:
    """What each table's batch became in DAG run ``run_id``, from the results ledger: its
    outcome and rows, by ``layer.table``."""
    from lakehouse.quality.ledger import read_ledger

    return {
        f"{r['layer']}.{r['table']}": (r["outcome"], r["rows"])
        for r in read_ledger(settings, dag_run_id=run_id).to_pylist()
        if r["kind"] == "batch"
    }


def test_trigger_with_the_default_form_then_with_params_from_the_ui(
    lakehouse: Lakehouse, chrome: Browser, postgres: Cluster
) -> None:
    airflow, settings = lakehouse.airflow, lakehouse.settings
    driver = chrome.driver
    assert airflow.dag(DAG_ID)["is_paused"], "a new DAG starts paused"

    # -- the form as it opens: the run takes what is waiting -----------------------------------
    wait = _wait(driver)
    _log_in(driver, wait, airflow)
    try:
        run_id = _trigger_from_the_ui(driver, airflow)
    except BaseException:
        screenshot(driver, "ui_trigger_failure.png")
        raise
    assert not airflow.dag(DAG_ID)["is_paused"], "the dialog's box unpaused the DAG"
    run = airflow.wait_for_run(DAG_ID, run_id, timeout=600)
    assert run["state"] == "success", _failure_report(airflow, run_id)
    print(
        f"UI trigger to a finished run: {_seconds(run['end_date'], run['queued_at']):.0f} s, "
        f"of which queued: {_seconds(run['start_date'], run['queued_at']):.0f} s"
    )
    # Unpausing left no schedule behind: the triggered run is the DAG's only run, and no next
    # run is due.
    assert [r["dag_run_id"] for r in airflow.dag_runs(DAG_ID)] == [run_id]
    dag = airflow.dag(DAG_ID)
    assert dag["next_dagrun_run_after"] is None, dag
    assert dag["description"].endswith("when triggered"), dag["description"]
    # The triggered run's own layers committed the records that were waiting (SECOND).
    assert _committed(settings, run_id) == {
        f"bronze.{TOPIC}": ("published", len(SECOND)),
        "silver.ui_checkins": ("published", len(SECOND)),
        f"gold.{LATEST}": ("published", len(SECOND)),
        f"gold.{COUNTS}": ("published", len(SECOND)),
    }
    bronze = airflow.task_log(DAG_ID, run_id, "bronze")
    assert f"committed: {len(SECOND)} records from 1 segment(s)" in bronze, bronze[-3000:]
    # Both gold tables moved on, and hold both batches.
    after = {t: _version(settings, t) for t in lakehouse.before}
    assert all(after[t] > lakehouse.before[t] for t in after), (lakehouse.before, after)
    from lakehouse.storage import read_arrow

    counts = read_arrow(settings.gold_path(COUNTS)).to_pylist()
    assert sorted((r["username"], r["count"]) for r in counts) == [
        ("alice", 2),
        ("bob", 2),
        ("carol", 1),
    ]
    latest = read_arrow(settings.gold_path(LATEST)).to_pylist()
    assert sorted((r["username"], r["location"]) for r in latest) == [
        ("alice", "Rome"),
        ("bob", "Oslo"),
        ("carol", "Quito"),
    ]

    # -- with Params: a full refresh of one table ----------------------------------------------
    refresh_id = _trigger_from_the_ui(driver, airflow, full_refresh=REFRESHED)
    run = airflow.dag_run(DAG_ID, refresh_id)
    assert run["conf"]["full_refresh"] == [REFRESHED], run["conf"]
    # The form sends every Param; the others keep their defaults.
    assert run["conf"].get("dry_run") is False, run["conf"]
    run = airflow.wait_for_run(DAG_ID, refresh_id, timeout=600)
    assert run["state"] == "success", _failure_report(airflow, refresh_id)

    # The run in the UI.
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get(f"{airflow.base}/dags/{DAG_ID}/runs/{urllib.parse.quote(refresh_id, safe='')}")
    WebDriverWait(driver, 60).until(
        ec.presence_of_element_located(
            (
                By.XPATH,
                f"//*[normalize-space()='{refresh_id}']/following::*[normalize-space()='Success']",
            )
        )
    )
    text = _text(driver)
    assert "Manual" in text and "admin" in text  # run type and triggering user
    screenshot(driver, "ui_trigger_run_success.png")

    # The Params reached the jobs: the plan says so, and gold rebuilt the table in full.
    plan = airflow.task_log(DAG_ID, refresh_id, "plan")
    assert f"gold {REFRESHED}: full refresh" in plan, plan[-2000:]
    gold = airflow.task_log(DAG_ID, refresh_id, "gold")
    assert f"gold {REFRESHED}: rebuilt from input versions" in gold, gold[-3000:]
    # Nothing new arrived: bronze says so, and the gold tables still hold both batches.
    bronze = airflow.task_log(DAG_ID, refresh_id, "bronze")
    assert f"bronze {TOPIC}: no new segments" in bronze, bronze[-3000:]
    counts = read_arrow(settings.gold_path(COUNTS)).to_pylist()
    assert sorted((r["username"], r["count"]) for r in counts) == [
        ("alice", 2),
        ("bob", 2),
        ("carol", 1),
    ]
    # The report's log is the platform's words: Great Expectations' chatter stays out of it.
    report = airflow.task_log(DAG_ID, refresh_id, "report")
    assert "Data Docs: " in report, report[-2000:]
    chatter = [line for line in report.splitlines() if "great_expectations" in line]
    assert chatter == [], chatter[:5]

    # No secret of the deployment is in any task log the runs wrote (the admin password is
    # printed once by the API server, at its first start, and nowhere else; the metadata
    # database's is in the components' environment only).
    task_logs = [
        p.read_text(errors="replace") for p in (settings.airflow_home / "logs").rglob("*.log")
    ]
    assert len(task_logs) >= 9, "a log per task of the run"
    secrets = {
        **airflow_secrets(settings.airflow_home),
        "admin password": airflow.password,
        "metadata database password": postgres.password(),
    }
    assert [name for name, value in secrets.items() if any(value in t for t in task_logs)] == []


# -- a broken contract -------------------------------------------------------------------------
def _wait(driver: Any, timeout: float = 60) -> Any:
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout, ignored_exceptions=[StaleElementReferenceException])


def _dag_list(driver: Any, airflow: Airflow, shown: str) -> str:
    """The DAG list's text, once it shows ``shown``."""
    driver.get(f"{airflow.base}/dags")
    _wait(driver).until(lambda d: shown in _text(d))
    return _text(driver)


def test_a_broken_contract_says_so_in_the_dag_list_and_on_its_page_and_leaves_once_fixed(
    lakehouse: Lakehouse, chrome: Browser
) -> None:
    airflow = lakehouse.airflow
    driver = chrome.driver
    broken_id = f"pipeline__{BROKEN_TOPIC}.broken"
    airflow.wait_for_dag(broken_id)
    _log_in(driver, _wait(driver), airflow)

    # Where people look: the DAG list, and the DAG's own page (its overview).
    text = _dag_list(driver, airflow, BROKEN_SAYS)
    assert BROKEN_SAYS in text
    screenshot(driver, "ui_broken_contract_dag_list.png")
    driver.get(f"{airflow.base}/dags/{broken_id}")
    _wait(driver).until(lambda d: BROKEN_SAYS in _text(d))
    screenshot(driver, "ui_broken_contract_overview.png")

    # Triggered, it fails with the error, in red while the contract is broken.
    failing = str(airflow.trigger(broken_id)["dag_run_id"])
    airflow.set_paused(broken_id, False)
    assert airflow.wait_for_run(broken_id, failing, timeout=300)["state"] == "failed"
    log = airflow.task_log(broken_id, failing, "contract")
    assert "unknown key 'agregations' (did you mean 'aggregations'?)" in log, log[-2000:]

    # Fixed: the next parse builds the real DAG; the broken one, its failed run with it, goes.
    path = lakehouse.settings.contracts_dir / f"{BROKEN_TOPIC}.yaml"
    path.write_text(BROKEN_CONTRACT.replace("agregations", "aggregations"))
    real = f"pipeline__{BROKEN_TOPIC}"
    deadline = time.monotonic() + 300
    while True:
        listed = {
            d["dag_id"] for d in airflow.api("GET", f"/dags?dag_id_pattern={BROKEN_TOPIC}")["dags"]
        }
        if listed == {real}:
            break
        assert time.monotonic() < deadline, f"after the fix, the DAG list holds {listed}"
        # Ask for the file's parse, as the UI's Reparse button does.
        token = airflow.dag(next(iter(listed)))["file_token"]
        airflow.api("PUT", f"/parseDagFile/{token}")
        time.sleep(5)
    assert airflow.dag_runs(real) == []  # its history starts clean
    text = _dag_list(driver, airflow, real)
    assert "broken contract" not in text
    screenshot(driver, "ui_broken_contract_fixed.png")
