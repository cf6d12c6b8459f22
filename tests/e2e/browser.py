"""Headless Chromium for the browser tests (Debian's chromium and chromium-driver, through
Selenium), and where their screenshots go."""

from __future__ import annotations

import json
import shutil
import tempfile
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
    # The pages reference CDN scripts and styles; fail those at once instead of waiting on
    # a network this machine may not have (the content is in the HTML).
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
        # Chrome's performance log carries the DevTools protocol's network events: what the
        # pages asked for (requested_urls).
        options.set_capability("goog:loggingPrefs", {"performance": "ALL"})
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


def requested_urls(driver: Any) -> list[str]:
    """Every URL the browser's pages (and their frames) asked for since the last call, in
    order: the ``Network.requestWillBeSent`` events of Chrome's performance log, which reading
    empties."""
    urls = []
    for entry in driver.get_log("performance"):
        event = json.loads(entry["message"])["message"]
        if event["method"] == "Network.requestWillBeSent":
            urls.append(str(event["params"]["request"]["url"]))
    return urls
