"""The report site app on its own (no Airflow): which files it serves, what it refuses, and the
page it shows before any report exists. Airflow's mounting and authentication of it are tested in
tests/e2e/test_reports_plugin.py."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
from fastapi import Depends, HTTPException

from lakehouse.quality.report_site import create_app, site_file

with warnings.catch_warnings():
    # Starlette asks for `httpx2` under its TestClient; the stack pins `httpx`, which works.
    warnings.filterwarnings("ignore", message="Using `httpx` with `starlette.testclient`")
    from fastapi.testclient import TestClient


@pytest.fixture
def site(tmp_path: Path) -> Path:
    root = tmp_path / "reports" / "data_docs"
    (root / "validations" / "silver").mkdir(parents=True)
    (root / "static").mkdir()
    (root / "index.html").write_text("<html><body>Data Docs index</body></html>")
    (root / "validations" / "silver" / "run.html").write_text("<html>one run</html>")
    (root / "static" / "site.css").write_text("body { color: black; }")
    (tmp_path / "secret.cfg").write_text("[core] secret")
    return root


def test_site_file_finds_files_and_folder_indexes(site: Path) -> None:
    assert site_file(site, "index.html") == site / "index.html"
    assert site_file(site, "") == site / "index.html"
    assert site_file(site, "/") == site / "index.html"
    assert site_file(site, "validations/silver/run.html") == site / "validations/silver/run.html"
    assert site_file(site, "validations/silver/missing.html") is None
    assert site_file(site, "static/") is None  # a folder without index.html: no listing


@pytest.mark.parametrize(
    "path",
    [
        "../secret.cfg",
        "../../secret.cfg",
        "static/../../secret.cfg",
        "static/../index.html",  # stays inside, but no client sends '..' unresolved
        "..\\..\\secret.cfg",
        "/../secret.cfg",
        "index.html\x00.png",
    ],
)
def test_site_file_refuses_dot_dot_and_nul(site: Path, path: str) -> None:
    assert site_file(site, path) is None


def test_site_file_keeps_absolute_paths_and_links_inside(site: Path, tmp_path: Path) -> None:
    assert site_file(site, str(tmp_path / "secret.cfg")) is None  # read as relative to the site
    (site / "static" / "leak.cfg").symlink_to(tmp_path / "secret.cfg")
    assert site_file(site, "static/leak.cfg") is None
    (site / "static" / "inside.html").symlink_to(site / "index.html")
    assert site_file(site, "static/inside.html") == site / "index.html"


def test_app_serves_the_site(site: Path) -> None:
    client = TestClient(create_app(site))
    for path in ("/", "/index.html"):
        reply = client.get(path)
        assert reply.status_code == 200
        assert reply.headers["content-type"].startswith("text/html")
        assert "Data Docs index" in reply.text
    css = client.get("/static/site.css")
    assert css.status_code == 200 and css.headers["content-type"].startswith("text/css")
    assert css.headers["cache-control"] == "no-cache"
    head = client.head("/validations/silver/run.html")
    assert head.status_code == 200 and head.content == b""
    assert client.get("/validations/silver/run.html").text == "<html>one run</html>"


@pytest.mark.parametrize(
    "path",
    [
        "/%2e%2e/secret.cfg",
        "/%2e%2e%2fsecret.cfg",
        "/static/%2e%2e/%2e%2e/secret.cfg",
        "/..%5csecret.cfg",
        "/%252e%252e/secret.cfg",
        "/missing.html",
        "/static/",
    ],
)
def test_app_answers_404_outside_the_site(site: Path, path: str) -> None:
    reply = TestClient(create_app(site)).get(path)
    assert reply.status_code == 404
    assert "secret" not in reply.text
    assert "There is no such page" in reply.text


def test_app_says_how_to_build_a_report_until_there_is_one(tmp_path: Path) -> None:
    root = tmp_path / "reports" / "data_docs"
    client = TestClient(create_app(lambda: root))
    for path in ("/", "/index.html"):
        reply = client.get(path)
        assert reply.status_code == 200
        assert "No data-quality report has been built yet" in reply.text
        assert "<code>lakehouse report</code>" in reply.text
        assert str(root) in reply.text
    assert client.get("/validations/x.html").status_code == 404
    # The root is read on each request: a site built later is served at once.
    root.mkdir(parents=True)
    (root / "index.html").write_text("<html>built</html>")
    assert client.get("/").text == "<html>built</html>"


def test_app_applies_the_dependencies_to_every_route(site: Path) -> None:
    def deny() -> None:
        raise HTTPException(status_code=401, detail="Not authenticated")

    client = TestClient(create_app(site, dependencies=[Depends(deny)]))
    for path in ("/", "/index.html", "/static/site.css", "/missing", "/%2e%2e/secret.cfg"):
        assert client.get(path).status_code == 401, path
