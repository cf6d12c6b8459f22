"""The Data Docs serve every style, font and script their pages load (lakehouse.quality.web_assets):
a site built from a real validation loads nothing from another host, and an address the site
cannot serve fails the build, naming it and its page."""

from __future__ import annotations

import json
import re
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from lakehouse.errors import OfflineDocsError, WebAssetsError
from lakehouse.quality import web_assets
from lakehouse.quality.web_assets import CDN, VENDOR, WEB, make_offline
from lakehouse.runtime.config import REPO_ROOT, Settings
from lakes import FAILING_SUITE, save_failing_validation

SUITE = FAILING_SUITE
JQUERY = "https://code.jquery.com/jquery-3.7.1.min.js"

# Independent of the module's parser: any absolute address, a hyperlink's, and what tags load.
ADDRESS = re.compile(r"(?:https?:)?//[^\s\"'<>()]+")
HYPERLINK = re.compile(r"<a\s[^>]*?href\s*=\s*\"([^\"]*)\"", re.IGNORECASE)
LOADED = re.compile(
    r"<(?:script|link|img)\b[^>]*?\s(?:src|href)\s*=\s*\"([^\"]*)\"|url\(\s*['\"]?([^'\")]+)",
    re.IGNORECASE,
)


def _build(home: Path) -> Settings:
    """Data Docs of the repository's contracts and one saved validation whose expectation fails."""
    from lakehouse.contracts.catalog import Catalog
    from lakehouse.quality.reports import build_data_docs

    settings = Settings.from_env(home=home, contracts_dir=REPO_ROOT / "contracts")
    save_failing_validation(settings)
    build_data_docs(settings, Catalog.load(settings.contracts_dir))
    return settings


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _build(tmp_path_factory.mktemp("data-docs") / "lakehouse").data_docs_root


def _documents(site: Path) -> list[Path]:
    """The site's pages and its own stylesheets (the vendored files are the packages')."""
    vendor = site / VENDOR
    return [
        p
        for p in sorted(site.rglob("*"))
        if p.suffix in (".html", ".css") and not p.is_relative_to(vendor)
    ]


def test_every_address_a_built_site_loads_is_a_file_of_the_site(site: Path) -> None:
    documents = _documents(site)
    assert {"index.html", "gx-index.html"} <= {p.name for p in documents}
    assert any(p.is_relative_to(site / "validations") for p in documents)
    assert any(p.is_relative_to(site / "expectations") for p in documents)
    for document in documents:
        text = document.read_text(encoding="utf-8")
        links = {m.span(1) for m in HYPERLINK.finditer(text)}
        remote = [
            m.group()
            for m in ADDRESS.finditer(text)
            if not any(a <= m.start() < b for a, b in links)
        ]
        assert remote == [], f"{document.relative_to(site)} loads from other hosts"
        for match in LOADED.finditer(text):
            url = match.group(1) or match.group(2)
            if url.startswith(("data:", "#")):
                continue
            target = (document.parent / urlsplit(url).path).resolve()
            where = f"{document.relative_to(site)}: {url}"
            assert target.is_relative_to(site.resolve()) and target.is_file(), where
    # The links to GX's own pages stay: a reader may follow them.
    assert 'href="https://greatexpectations.io"' in (site / "gx-index.html").read_text()


def test_the_site_carries_each_vendored_file_and_what_its_stylesheet_references(
    site: Path,
) -> None:
    for asset in CDN.values():
        assert (site / asset.site_path).is_file(), asset.site_path
    # Font Awesome's stylesheet loads its webfonts relative to itself.
    fonts = site / VENDOR / "@fortawesome/fontawesome-free/webfonts"
    assert (fonts / "fa-solid-900.woff2").is_file()
    for css in (site / VENDOR).rglob("*.css"):
        for match in LOADED.finditer(css.read_text(encoding="utf-8")):
            url = match.group(2)
            if url and not url.startswith(("data:", "#")):
                assert (css.parent / urlsplit(url).path).is_file(), f"{css}: {url}"
    # Popper and Bootstrap keep the integrity attribute GX gives them (the build checked the
    # copies against it).
    page = (site / "gx-index.html").read_text()
    assert re.search(r'<script src="static/vendor/popper\.js/[^"]+" integrity="sha384-', page)


def test_a_page_loading_an_unmapped_address_fails_the_build_naming_it_and_its_page(
    tmp_path: Path,
) -> None:
    page = tmp_path / "validations" / "silver" / "page.html"
    page.parent.mkdir(parents=True)
    text = (
        "<html><head>"
        '<script src="https://cdn.example.org/lib.js"></script>'
        "<style>@import 'https://fonts.example.org/f.css'; p { color: red }</style>"
        "</head><body>"
        "<div style=\"background: url('//img.example.org/a.png')\">x</div>"
        '<a href="https://docs.example.org/guide">the guide</a>'
        "<p>observed https://text.example.org/value in the column</p>"
        "</body></html>"
    )
    page.write_text(text)
    with pytest.raises(OfflineDocsError) as caught:
        make_offline(tmp_path, modules=tmp_path / "node_modules")
    message = str(caught.value)
    for url in (
        "https://cdn.example.org/lib.js",
        "https://fonts.example.org/f.css",
        "//img.example.org/a.png",
    ):
        assert f"validations/silver/page.html loads {url}" in message
    # A hyperlink and a value in the text are not loads.
    assert "docs.example.org" not in message and "text.example.org" not in message
    assert "lakehouse.quality.web_assets.CDN" in message
    assert page.read_text() == text


def test_a_stylesheet_of_the_site_is_checked_too(tmp_path: Path) -> None:
    css = tmp_path / "static" / "styles" / "custom.css"
    css.parent.mkdir(parents=True)
    css.write_text(
        "/* url(https://ignored.example.org/in-a-comment.png) */\n"
        "h1 { background: url(https://img.example.org/b.png) }"
    )
    with pytest.raises(
        OfflineDocsError, match=r"static/styles/custom\.css loads https://img\.example\.org/b\.png"
    ) as caught:
        make_offline(tmp_path, modules=tmp_path / "node_modules")
    assert "ignored.example.org" not in str(caught.value)


def _page_loading(site: Path, *urls: str) -> Path:
    page = site / "index.html"
    page.parent.mkdir(parents=True, exist_ok=True)
    page.write_text("".join(f'<script src="{u}"></script>' for u in urls))
    return page


def test_without_the_install_the_error_says_which_make_target_installs_it(tmp_path: Path) -> None:
    _page_loading(tmp_path / "site", JQUERY)
    with pytest.raises(WebAssetsError, match=r"make web-assets") as caught:
        make_offline(tmp_path / "site", modules=tmp_path / "node_modules")
    assert f"jquery is not installed in {tmp_path / 'node_modules'}" in str(caught.value)


def _package(modules: Path, name: str, version: str, files: dict[str, str]) -> None:
    folder = modules / name
    folder.mkdir(parents=True)
    (folder / "package.json").write_text(json.dumps({"name": name, "version": version}))
    for path, content in files.items():
        (folder / path).parent.mkdir(parents=True, exist_ok=True)
        (folder / path).write_text(content)


def test_a_package_at_another_version_than_the_pages_name_is_refused(tmp_path: Path) -> None:
    modules = tmp_path / "node_modules"
    _package(modules, "jquery", "3.6.0", {"dist/jquery.min.js": "window.jQuery = 1;"})
    _page_loading(tmp_path / "site", JQUERY)
    with pytest.raises(WebAssetsError) as caught:
        make_offline(tmp_path / "site", modules=modules)
    assert "jquery 3.6.0 is installed" in str(caught.value)
    assert "name version 3.7.1" in str(caught.value)


def test_a_vendored_stylesheet_brings_its_fonts_and_may_not_load_from_other_hosts(
    tmp_path: Path,
) -> None:
    fa = "https://cdnjs.cloudflare.com/ajax/libs/font-awesome/6.6.0/css/all.min.css"
    modules = tmp_path / "node_modules"
    _package(
        modules,
        "@fortawesome/fontawesome-free",
        "6.6.0",
        {
            "css/all.min.css": '@font-face{src:url(../webfonts/fa.woff2) format("woff2")}',
            "webfonts/fa.woff2": "font",
            "LICENSE.txt": "licence",
        },
    )
    site = tmp_path / "site"
    page = site / "expectations" / "silver" / "t.html"
    page.parent.mkdir(parents=True)
    page.write_text(f'<link rel="stylesheet" href="{fa}">')
    assert make_offline(site, modules=modules) == [
        f"{VENDOR}/@fortawesome/fontawesome-free/css/all.min.css"
    ]
    assert (
        'href="../../static/vendor/@fortawesome/fontawesome-free/css/all.min.css"'
        in page.read_text()
    )
    vendored = site / VENDOR / "@fortawesome/fontawesome-free"
    assert (vendored / "webfonts/fa.woff2").read_text() == "font"
    assert (vendored / "LICENSE.txt").is_file()

    (modules / "@fortawesome/fontawesome-free/css/all.min.css").write_text(
        "@import url(https://fonts.example.org/x.css);"
    )
    page.write_text(f'<link rel="stylesheet" href="{fa}">')
    with pytest.raises(OfflineDocsError) as caught:
        make_offline(site, modules=modules)
    assert (
        "static/vendor/@fortawesome/fontawesome-free/css/all.min.css loads "
        "https://fonts.example.org/x.css"
    ) in str(caught.value)


def test_a_copy_that_fails_the_pages_integrity_attribute_is_refused(tmp_path: Path) -> None:
    popper = "https://cdnjs.cloudflare.com/ajax/libs/popper.js/1.12.9/umd/popper.min.js"
    modules = tmp_path / "node_modules"
    _package(modules, "popper.js", "1.12.9", {"dist/umd/popper.min.js": "not the file"})
    site = tmp_path / "site"
    site.mkdir()
    (site / "index.html").write_text(
        f'<script src="{popper}" integrity="sha384-ApNbgh9B+Y1QKtv3Rn7W3mgPxhU9K/ScQsAP7hUibX39j7fakFPskvXusvfa0b4Q"></script>'
    )
    with pytest.raises(WebAssetsError) as caught:
        make_offline(site, modules=modules)
    assert f"index.html requires {popper} to match 'sha384-ApNbgh9B" in str(caught.value)
    assert "a browser would refuse it" in str(caught.value)


def test_package_json_pins_the_versions_the_cdn_addresses_name() -> None:
    manifest = json.loads((WEB / "package.json").read_text())["dependencies"]
    lock = json.loads((WEB / "package-lock.json").read_text())["packages"]
    for url, asset in CDN.items():
        pinned = manifest[asset.package].rpartition("@")[2]  # "npm:name@x.y.z" for an alias
        assert pinned == asset.version or pinned.startswith(asset.version + "."), url
        locked = lock[f"node_modules/{asset.package}"]
        assert locked["version"] == pinned and locked["integrity"].startswith("sha512-"), url


def test_a_build_whose_page_loads_an_unmapped_address_fails_and_keeps_the_last_site(
    site: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a Great Expectations upgrade that adds a CDN reference does: here, jQuery's."""
    import shutil

    home = tmp_path / "lakehouse"
    shutil.copytree(site.parents[1], home)  # the lakehouse root of the built site
    settings = Settings.from_env(home=home, contracts_dir=REPO_ROOT / "contracts")
    before = (settings.data_docs_root / "gx-index.html").read_text()
    monkeypatch.delitem(web_assets.CDN, JQUERY)
    with pytest.raises(OfflineDocsError) as caught:
        _build(home)
    assert f"gx-index.html loads {JQUERY}" in str(caught.value)
    assert re.search(
        rf"validations/silver/demo_stream/\S+\.html loads {re.escape(JQUERY)}", str(caught.value)
    )
    assert (settings.data_docs_root / "gx-index.html").read_text() == before
