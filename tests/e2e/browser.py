"""Headless Chromium for the browser tests (Debian's chromium and chromium-driver, through
Selenium), and where their screenshots go."""

from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from lakehouse.runtime.config import REPO_ROOT

ARTIFACTS = REPO_ROOT / "tests" / "artifacts"

CHROME_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1280,1600",
    # A page that asks another host for anything fails that request at once instead of waiting
    # on a network this machine may not have; the request is still seen (`network_traffic`).
    "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1",
)


class Browser:
    """Headless Chromium, started on first use so that a missing browser fails the test that
    needs it (with how to install it) rather than erroring in a fixture."""

    def __init__(self, profiles: Path) -> None:
        self._profiles = profiles
        self._driver: Any = None

    @property
    def driver(self) -> Any:
        if self._driver is None:
            self._driver = self._start()
        return self._driver

    def _start(self) -> Any:
        chromium = shutil.which("chromium") or shutil.which("chromium-browser")
        chromedriver = shutil.which("chromedriver")
        missing = [n for n, p in (("chromium", chromium), ("chromedriver", chromedriver)) if not p]
        if chromium is None or chromedriver is None:
            pytest.fail(
                f"{' and '.join(missing)} not found: `make browser` installs Debian's chromium "
                "and chromium-driver packages, which the browser tests need",
                pytrace=False,
            )
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service

        options = webdriver.ChromeOptions()
        options.binary_location = chromium
        for flag in CHROME_FLAGS:
            options.add_argument(flag)
        # DevTools' Network events and the pages' console, read back by `network_traffic`.
        options.set_capability("goog:loggingPrefs", {"performance": "ALL", "browser": "ALL"})
        profile = tempfile.mkdtemp(prefix="chromium-", dir=self._profiles)
        options.add_argument(f"--user-data-dir={profile}")
        driver = webdriver.Chrome(options=options, service=Service(chromedriver))
        driver.set_page_load_timeout(60)
        return driver

    def quit(self) -> None:
        if self._driver is not None:
            self._driver.quit()
            self._driver = None


def screenshot(driver: Any, name: str) -> Path:
    """Save what the browser shows as ``tests/artifacts/<name>``."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / name
    assert driver.save_screenshot(str(path)), f"no screenshot saved to {path}"
    assert path.stat().st_size > 1000
    return path


@dataclass
class Traffic:
    """What the browser asked of the network: every request's URL, and those that failed; and
    the errors the pages' console showed meanwhile."""

    requests: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # the console's errors (scripts', refusals)


def network_traffic(driver: Any) -> Traffic:
    """The requests of the pages the browser loaded since the last call (Chrome's performance
    log: DevTools' ``Network.requestWillBeSent``, ``responseReceived`` and ``loadingFailed``
    events), and the errors their console showed. A failure is an HTTP status of 400 or more,
    or a request that got no response."""
    traffic = Traffic()
    urls: dict[str, str] = {}
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        method, params = message.get("method"), message.get("params", {})
        if method == "Network.requestWillBeSent":
            urls[params["requestId"]] = params["request"]["url"]
            traffic.requests.append(params["request"]["url"])
        elif method == "Network.responseReceived" and params["response"]["status"] >= 400:
            traffic.failures.append(
                f"{params['response']['url']}: HTTP {params['response']['status']}"
            )
        elif method == "Network.loadingFailed":
            url = urls.get(params["requestId"], params["requestId"])
            reason = params.get("blockedReason") or params.get("errorText")
            traffic.failures.append(f"{url}: {reason}")
    traffic.errors = [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    return traffic


def requested_urls(driver: Any) -> list[str]:
    """Every URL the browser's pages (and their frames) asked for since the last read of its
    log (:func:`network_traffic`, which reading empties), in order."""
    return network_traffic(driver).requests


def open_from_menu(driver: Any, menu: str, item: str) -> None:
    """Open ``menu`` -> ``item`` of the Airflow UI's navigation bar, as a user would."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    wait = WebDriverWait(driver, 60)
    wait.until(
        ec.element_to_be_clickable((By.XPATH, f"//button[normalize-space()='{menu}']"))
    ).click()
    wait.until(
        ec.element_to_be_clickable((By.XPATH, f"//*[@role='menuitem'][normalize-space()='{item}']"))
    ).click()


_LABEL_PROBLEMS = """
const problems = [];
const visible = el => {
  for (let e = el; e && e.nodeType === 1; e = e.parentElement) {
    const o = e.getAttribute('opacity');
    if ((o !== null && parseFloat(o) === 0) || getComputedStyle(e).opacity === '0') return false;
  }
  return true;
};
const inside = (r, box) => r.left >= box.left - 0.5 && r.right <= box.right + 0.5
  && r.top >= box.top - 0.5 && r.bottom <= box.bottom + 0.5;
const overlap = (a, b) => Math.min(a.right, b.right) - Math.max(a.left, b.left) > 0.5
  && Math.min(a.bottom, b.bottom) - Math.max(a.top, b.top) > 0.5;
const where = f => `${f.dataset.chart} of ${f.dataset.table}`;
let texts = 0;
for (const f of document.querySelectorAll('figure.chart')) {
  const svg = f.querySelector('svg');
  if (!svg) continue;
  const box = svg.getBoundingClientRect();
  const groups = new Map();
  for (const t of svg.querySelectorAll('text')) {
    if (!visible(t) || !t.textContent.trim()) continue;
    texts += 1;
    const r = t.getBoundingClientRect();
    if (!inside(r, box)) problems.push(`${where(f)}: '${t.textContent}' is cut by the chart's edge`);
    if (t.textContent.includes('\u2026')) problems.push(`${where(f)}: '${t.textContent}' is shortened`);
    const axis = t.closest('g.role-axis, g.role-legend, g.role-title') || svg;
    if (!groups.has(axis)) groups.set(axis, []);
    groups.get(axis).push([t.textContent, r]);
  }
  for (const items of groups.values())
    for (let i = 0; i < items.length; i++)
      for (let j = i + 1; j < items.length; j++)
        if (overlap(items[i][1], items[j][1]))
          problems.push(`${where(f)}: '${items[i][0]}' and '${items[j][0]}' overlap`);
  const entries = Array.from(f.querySelectorAll('ul.legend li'));
  for (const li of entries) {
    texts += 1;
    if (li.scrollWidth > li.clientWidth + 1 || li.scrollHeight > li.clientHeight + 1)
      problems.push(`${where(f)}: legend entry '${li.textContent}' is cut`);
    if (!inside(li.getBoundingClientRect(), f.getBoundingClientRect()))
      problems.push(`${where(f)}: legend entry '${li.textContent}' leaves its figure`);
  }
  for (let i = 0; i < entries.length; i++)
    for (let j = i + 1; j < entries.length; j++)
      if (overlap(entries[i].getBoundingClientRect(), entries[j].getBoundingClientRect()))
        problems.push(`${where(f)}: legend entries '${entries[i].textContent}' and '${entries[j].textContent}' overlap`);
}
return {problems: problems, texts: texts};
"""


def unreadable_labels(driver: Any) -> tuple[list[str], int]:
    """Every text of the page's charts that a reader could not read whole, as the browser lays
    it out: an axis label, axis title or legend entry cut by its chart's edge or shortened
    with an ellipsis, and any two that overlap (labels Vega hid to avoid overlap are not
    shown, so not counted); and how many texts were measured."""
    found = driver.execute_script(_LABEL_PROBLEMS)
    return list(found["problems"]), int(found["texts"])
