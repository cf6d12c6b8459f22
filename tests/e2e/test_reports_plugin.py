"""The Airflow plugin that puts the data-quality reports (Great Expectations Data Docs) in the
Airflow UI, tested through Airflow's real API server: Airflow finds the plugin through its entry
point, mounts its app at /data-quality (the Data Docs at /data-quality/docs) behind Airflow's
authentication, lists the navigation
entry, and headless Chromium renders the Data Docs both directly and inside the Airflow UI,
styled and scripted by files the platform serves: nothing is asked of any other host.

The API server runs in its own interpreter (tests/e2e/api_server.py) with an Airflow home under
a temporary lakehouse root, like the other Airflow tests. Screenshots go to tests/artifacts/.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import selectors
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from browser import Browser, network_traffic, open_from_menu, screenshot

from lakehouse.orchestration.airflow_env import airflow_environment
from lakehouse.runtime.config import REPO_ROOT, Settings
from lakes import FAILING_SUITE, save_failing_validation

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

HEAVY = ("pyspark", "deltalake", "great_expectations", "polars")
API_SERVER = Path(__file__).with_name("api_server.py")
APP = "/data-quality"  # the plugin's app: the data-quality page at its root
PREFIX = f"{APP}/docs"  # the Data Docs
ENTRY_POINT = "lakehouse.orchestration.airflow_plugin:LakehousePlugin"
SIMPLE_AUTH = "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager"
SUITE = FAILING_SUITE


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: str


@dataclass
class Server:
    """Airflow's API server, started by :func:`server`."""

    settings: Settings
    port: int
    info: dict[str, Any]

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def token(self, role: str) -> str:
        return str(self.info["tokens"][role])

    def get(self, path: str, *, cookie: str | None = None, bearer: str | None = None) -> Reply:
        """GET ``path`` sent exactly as written (http.client neither normalises dot segments
        nor re-encodes, unlike httpx and browsers)."""
        headers = {}
        if cookie is not None:
            headers["Cookie"] = f"_token={cookie}"
        if bearer is not None:
            headers["Authorization"] = f"Bearer {bearer}"
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        try:
            conn.request("GET", path, headers=headers)
            response = conn.getresponse()
            body = response.read().decode("utf-8", "replace")
            return Reply(response.status, {k.lower(): v for k, v in response.getheaders()}, body)
        finally:
            conn.close()


def _clean_environment(settings: Settings) -> dict[str, str]:
    """Airflow's environment for ``settings`` alone: none of the caller's Airflow or lakehouse
    variables (``make test`` exports LAKEHOUSE_HOME, for one) may point it elsewhere."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "LAKEHOUSE_"))}
    env = airflow_environment(settings, base)
    env["AIRFLOW__CORE__AUTH_MANAGER"] = SIMPLE_AUTH
    env["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS"] = "False"
    return env


def _read_result(proc: subprocess.Popen[str], log: Path, timeout: float) -> dict[str, Any]:
    assert proc.stdout is not None
    selector = selectors.DefaultSelector()
    selector.register(proc.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if selector.select(timeout=1):
            line = proc.stdout.readline()
            if line.startswith("RESULT"):
                return dict(json.loads(line[len("RESULT") :]))
            if line:
                continue
        if proc.poll() is not None:
            break
    proc.kill()
    pytest.fail(f"Airflow's API server did not start; its log:\n{log.read_text()[-4000:]}")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("reports-plugin")
    settings = Settings.from_env(home=root / "lakehouse", contracts_dir=REPO_ROOT / "contracts")
    with running_api_server(settings, root) as running:
        yield running


@contextmanager
def running_api_server(settings: Settings, root: Path) -> Iterator[Server]:
    """Airflow's API server with the plugin, for the lakehouse ``settings`` (its log in
    ``root``), from a migrated metadata database to its end (test_data_quality_page.py's too)."""
    env = _clean_environment(settings)
    airflow = Path(sys.executable).parent / "airflow"
    migrate = subprocess.run(
        [str(airflow), "db", "migrate"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert migrate.returncode == 0, migrate.stderr[-3000:]
    log = root / "api-server.log"
    with log.open("w") as err:
        proc = subprocess.Popen(
            [sys.executable, str(API_SERVER), *HEAVY],
            env=env,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
        )
    try:
        info = _read_result(proc, log, timeout=180)
        yield Server(settings, int(info["port"]), info)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def built_site(server: Server) -> Path:
    """Data Docs built from one saved validation result whose only expectation fails."""
    from lakehouse.contracts.catalog import Catalog
    from lakehouse.quality.reports import build_data_docs

    settings = server.settings
    save_failing_validation(settings)
    index = build_data_docs(settings, Catalog.load(settings.contracts_dir))
    assert index == settings.data_docs_root / "index.html" and index.is_file()
    return settings.data_docs_root


@contextmanager
def _site_moved_away(settings: Settings) -> Iterator[None]:
    site = settings.data_docs_root
    parked = site.with_name("data_docs.parked")
    moved = site.exists()
    if moved:
        site.rename(parked)
    try:
        yield
    finally:
        if moved:
            parked.rename(site)


# -- Airflow finds and mounts the plugin --------------------------------------------------------
def test_airflow_loads_the_plugin_from_its_entry_point(server: Server) -> None:
    info = server.info
    assert info["import_errors"] == {}, (
        "a second copy of the package metadata (a stale include/lakehouse.egg-info, left by an "
        "editable install; `make install` removes it) makes Airflow load the plugin twice"
    )
    assert info["heavy"] == [], "loading the plugin must not import Spark, Delta, GX or polars"
    assert info["security_loaded_with_plugins"] is False
    plugin = next(p for p in info["plugins"] if p["name"] == "lakehouse")
    assert "group='airflow.plugins'" in plugin["source"]
    assert ENTRY_POINT in plugin["source"]
    assert plugin["fastapi_apps"] == [
        {
            "app": "fastapi.applications.FastAPI",
            "url_prefix": APP,
            "name": "Lakehouse data-quality reports",
        },
        {
            "app": "fastapi.applications.FastAPI",
            "url_prefix": "/lineage",
            "name": "Lakehouse lineage",
        },
    ]
    view = {
        "name": "Data quality",
        "href": "data-quality/",
        "destination": "nav",
        "url_route": "lakehouse",
        "category": "browse",
    }
    lineage_view = {
        "name": "Lineage",
        "href": "lineage/",
        "destination": "nav",
        "url_route": "lakehouse-lineage",
        "category": "browse",
    }
    assert plugin["external_views"] == [view, lineage_view]
    # What the UI reads to build its navigation.
    reply = server.get("/api/v2/plugins", bearer=server.token("admin"))
    assert reply.status == 200, reply.body
    listed = {p["name"]: p for p in json.loads(reply.body)["plugins"]}
    served_view, served_lineage = listed["lakehouse"]["external_views"]
    assert view.items() <= served_view.items()
    assert lineage_view.items() <= served_lineage.items()
    assert [a["url_prefix"] for a in listed["lakehouse"]["fastapi_apps"]] == [APP, "/lineage"]


def test_reports_require_an_airflow_login(server: Server) -> None:
    with _site_moved_away(server.settings):
        for path in (f"{PREFIX}/", f"{PREFIX}/index.html", f"{PREFIX}/../../etc/passwd"):
            assert server.get(path).status == 401, path
        assert server.get(f"{PREFIX}/", cookie="not-a-jwt").status == 403
        assert server.get(f"{PREFIX}/", bearer="not-a-jwt").status == 403
        # Authenticated, but allowed nothing by the auth manager.
        assert server.get(f"{PREFIX}/", cookie=server.token("none")).status == 403
        # A viewer may see them, by the UI's cookie or by a bearer token.
        assert server.get(f"{PREFIX}/", cookie=server.token("viewer")).status == 200
        assert server.get(f"{PREFIX}/", bearer=server.token("viewer")).status == 200


def test_before_any_report_a_page_says_how_to_build_one(server: Server) -> None:
    with _site_moved_away(server.settings):
        for path in (f"{PREFIX}/", f"{PREFIX}/index.html"):
            reply = server.get(path, cookie=server.token("admin"))
            assert reply.status == 200, path
            assert reply.headers["content-type"].startswith("text/html")
            assert "No data-quality report has been built yet" in reply.body
            assert "<code>lakehouse report</code>" in reply.body
        reply = server.get(f"{PREFIX}/validations/x.html", cookie=server.token("admin"))
        assert reply.status == 404
        assert "lakehouse report" in reply.body


def test_serves_the_site_and_nothing_outside_it(server: Server, built_site: Path) -> None:
    token = server.token("admin")
    for path in (f"{PREFIX}/", f"{PREFIX}/index.html"):
        reply = server.get(path, cookie=token)
        assert reply.status == 200, path
        assert reply.headers["content-type"].startswith("text/html")
        assert "Data Docs" in reply.body and SUITE in reply.body
    css = server.get(f"{PREFIX}/static/styles/data_docs_default_styles.css", cookie=token)
    assert css.status == 200 and css.headers["content-type"].startswith("text/css")
    assert server.get(f"{PREFIX}/static/", cookie=token).status == 404  # no listings

    # Secrets beside the site: Airflow's config, and the raw validation results.
    saved = next((server.settings.validations_root / SUITE).glob("*.json"))
    outside = {
        "airflow/airflow.cfg": "[core]",
        f"quality/validations/{SUITE}/{saved.name}": '"validated_at"',
        "../../../../../../../../etc/passwd": "root:",
    }
    link = built_site / "static" / "leak.cfg"
    link.symlink_to(server.settings.airflow_home / "airflow.cfg")
    probes: list[tuple[str, str]] = [(f"{PREFIX}/static/leak.cfg", "[core]")]
    for target, marker in outside.items():
        up = "../../" + target  # data_docs -> reports -> the lakehouse root
        encoded_dots = up.replace("..", "%2e%2e")
        probes += [
            (f"{PREFIX}/{up}", marker),
            (f"{PREFIX}/{encoded_dots}", marker),
            (f"{PREFIX}/{up.replace('/', '%2f')}", marker),
            (f"{PREFIX}/{encoded_dots.replace('/', '%2F')}", marker),
            (f"{PREFIX}/{up.replace('/', '%5c')}", marker),
            (f"{PREFIX}/{up.replace('..', '%252e%252e')}", marker),
            (f"{PREFIX}/static/../{up}", marker),
        ]
    probes += [
        (f"{PREFIX}//etc/passwd", "root:"),
        (f"{PREFIX}/%2fetc%2fpasswd", "root:"),
        (f"{PREFIX}/index.html%00.png", "Data Docs"),
    ]
    try:
        for path, marker in probes:
            reply = server.get(path, cookie=token)
            assert reply.status == 404, (path, reply.status, reply.body[:200])
            assert marker not in reply.body, path
    finally:
        link.unlink()


# -- in a browser ---------------------------------------------------------------------------
def _log_in(driver: Any, server: Server, role: str = "admin") -> None:
    """Give the browser Airflow's session cookie, as the UI's login would."""
    driver.get(f"{server.base}{PREFIX}/")  # cookies are set on the page's own origin
    driver.delete_all_cookies()
    driver.add_cookie({"name": "_token", "value": server.token(role), "path": "/"})


def _text(driver: Any) -> str:
    from selenium.webdriver.common.by import By

    return str(driver.find_element(By.TAG_NAME, "body").text)


def test_browser_renders_the_data_docs(server: Server, built_site: Path, chrome: Browser) -> None:
    browser = chrome.driver
    _log_in(browser, server)
    from selenium.webdriver.common.by import By

    browser.get(f"{server.base}{PREFIX}/")
    assert browser.title == "Data quality"
    text = _text(browser)
    assert "No data-quality report" not in text
    # The front page is plain HTML: the suite, its verdict, the failed check.
    assert SUITE in text and "failed" in text and "city_known" in text
    links = browser.find_elements(By.CSS_SELECTOR, "a[href*='validations/silver/demo_stream/']")
    assert len(links) == 1, [a.get_attribute("href") for a in links]
    screenshot(browser, "data_docs_index.png")

    links[0].click()
    text = _text(browser)
    assert "Expectation Validation Result" in text
    assert f"Expectation Suite: {SUITE}" in text
    assert "Status: Failed" in text
    assert "values must belong to this set: Berlin Lima" in text
    assert "1 unexpected values found" in text
    assert re.search(r"Unexpected Value\s+Count\s+Paris\s+1", text), text
    screenshot(browser, "data_docs_validation.png")


# What a Data Docs page shows only if its scripts ran: the libraries GX's templates load.
_LIBRARIES = """return {
    jquery: window.jQuery ? jQuery.fn.jquery : null,
    bootstrap: !!(window.jQuery && jQuery.fn.tab && jQuery.fn.tooltip),
    popper: typeof window.Popper,
    table: !!(window.jQuery && jQuery.fn.bootstrapTable),
    datepicker: !!(window.jQuery && jQuery.fn.datepicker),
    vega: typeof window.vega, vegaLite: typeof window.vegaLite, vegaEmbed: typeof window.vegaEmbed,
}"""
_ALL_LIBRARIES = {
    "jquery": "3.7.1",
    "bootstrap": True,
    "popper": "function",
    "table": True,
    "datepicker": True,
    "vega": "object",
    "vegaLite": "object",
    "vegaEmbed": "function",
}
# Bootstrap's stylesheet: its grid's padding utility and its flex navigation bar.
_BOOTSTRAP_STYLE = """const padded = document.querySelector('.container-fluid.pl-5');
return [getComputedStyle(padded).paddingLeft,
        getComputedStyle(document.querySelector('nav.navbar')).display]"""
FONT_NOT_LOADED = "Font Awesome's webfont did not load"
_FONT_AWESOME_LOADED = """return [...document.fonts].some(
    f => f.family.replace(/"/g, '') === 'Font Awesome 6 Free' && f.status === 'loaded')"""


def _served_from_here(server: Server, driver: Any, page: str) -> None:
    """Everything ``page`` asked for came from the lakehouse's own server, and came."""
    from urllib.parse import urlsplit

    traffic = network_traffic(driver)
    assert traffic.requests, f"no requests recorded for {page}"
    elsewhere = [
        url
        for url in traffic.requests
        if urlsplit(url).scheme not in ("data", "blob", "about")
        and urlsplit(url).hostname != "127.0.0.1"
    ]
    assert elsewhere == [], f"{page} asked other hosts for these"
    assert traffic.failures == [], f"{page}: requests that failed"
    assert traffic.errors == [], f"{page}: errors in the console"
    assert any(f"{server.base}{PREFIX}/static/vendor/" in url for url in traffic.requests), page


def test_data_docs_load_everything_from_the_platform_and_render_styled(
    server: Server, built_site: Path, chrome: Browser
) -> None:
    """GX's index, a validation result and an expectation suite in Chromium, whose resolver
    knows no host but 127.0.0.1: every request goes to the lakehouse's server and succeeds,
    Bootstrap's styles and Font Awesome's font apply, and the index's scripts build its tables."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    browser = chrome.driver
    wait = WebDriverWait(browser, 60)
    _log_in(browser, server)
    network_traffic(browser)  # what came before is other pages'

    browser.get(f"{server.base}{PREFIX}/gx-index.html")
    # The page's scripts are in its head: they have run once it has loaded.
    assert browser.execute_script(_LIBRARIES) == _ALL_LIBRARIES
    # bootstrap-table drew the validation results from the page's data: one row, ours.
    rows = browser.find_elements(
        By.CSS_SELECTOR, ".ge-index-page-validation-results-table tbody tr.clickable-row"
    )
    assert len(rows) == 1 and SUITE in rows[0].text
    assert rows[0].find_elements(By.CSS_SELECTOR, "i.fa-times.text-danger")  # failed
    assert browser.execute_script(_BOOTSTRAP_STYLE) == ["48px", "flex"]
    wait.until(lambda d: d.execute_script(_FONT_AWESOME_LOADED), FONT_NOT_LOADED)
    screenshot(browser, "data_docs_offline_index.png")
    _served_from_here(server, browser, "gx-index.html")

    # A validation result: clicking its row, which the index's script makes a link. The row is
    # found again at each try: bootstrap-table may redraw the table (while the fonts load, or
    # the page settles), and an element of the table it replaced is stale.
    def click_row(driver: Any) -> bool:
        driver.find_element(
            By.CSS_SELECTOR, ".ge-index-page-validation-results-table tbody tr.clickable-row td"
        ).click()
        return True

    WebDriverWait(browser, 60, ignored_exceptions=[StaleElementReferenceException]).until(click_row)
    wait.until(ec.url_contains(f"{PREFIX}/validations/silver/demo_stream/"))
    status = wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, "i.fas.fa-times")))
    assert "Status: Failed" in _text(browser)
    assert browser.execute_script(_LIBRARIES) == _ALL_LIBRARIES
    assert browser.execute_script(_BOOTSTRAP_STYLE) == ["48px", "flex"]
    wait.until(lambda d: d.execute_script(_FONT_AWESOME_LOADED), FONT_NOT_LOADED)
    icon = browser.execute_script(
        "return getComputedStyle(arguments[0], '::before').content", status
    )
    assert icon not in ("none", "normal", ""), "Font Awesome's stylesheet draws no icon"
    screenshot(browser, "data_docs_offline_validation.png")
    _served_from_here(server, browser, "the validation page")

    # An expectation suite: Bootstrap's tab script shows the suites' table, which
    # bootstrap-table drew too; its first row leads to the suite's page.
    browser.back()
    wait.until(ec.element_to_be_clickable((By.ID, "Expectation-Suites-tab"))).click()
    suite_rows = wait.until(
        lambda d: [
            r
            for r in d.find_elements(By.CSS_SELECTOR, "#Expectation-Suites tbody tr.clickable-row")
            if r.is_displayed()
        ]
    )
    suite = suite_rows[0].text.strip()
    assert re.fullmatch(r"(bronze|silver|gold)\.[\w-]+", suite), suite
    suite_rows[0].find_element(By.TAG_NAME, "td").click()
    wait.until(ec.url_contains(f"{PREFIX}/expectations/"))
    wait.until(lambda d: suite in _text(d))
    assert browser.execute_script(_LIBRARIES) == _ALL_LIBRARIES
    assert browser.execute_script(_BOOTSTRAP_STYLE) == ["48px", "flex"]
    screenshot(browser, "data_docs_offline_suite.png")
    _served_from_here(server, browser, "the index and the expectation suite page")


def test_airflow_ui_shows_the_data_docs_under_browse(
    server: Server, built_site: Path, chrome: Browser
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    browser = chrome.driver
    _log_in(browser, server, "viewer")
    browser.get(f"{server.base}/")
    wait = WebDriverWait(browser, 60)
    # The navigation bar: Browse -> Data quality (the plugin's external view).
    open_from_menu(browser, "Browse", "Data quality")
    # The UI's own route for the view, then the page's path in its frame: nothing twice.
    wait.until(ec.url_to_be(f"{server.base}/plugin/lakehouse/data-quality/"))
    frame = wait.until(
        ec.presence_of_element_located((By.CSS_SELECTOR, "iframe[title='Data quality']"))
    )
    # It opens the data-quality page (tests/e2e/test_data_quality_page.py), which links to the
    # Data Docs, shown in the same frame.
    assert frame.get_attribute("src") == f"{server.base}{APP}/"
    browser.switch_to.frame(frame)
    try:
        wait.until(ec.element_to_be_clickable((By.LINK_TEXT, "the Data Docs"))).click()
        wait.until(lambda d: SUITE in _text(d) and "Data quality" in _text(d))
    finally:
        browser.switch_to.default_content()
    screenshot(browser, "airflow_ui_data_docs.png")
