"""The styles, fonts and scripts of the Data Docs pages, served with the site instead of from CDNs.

Great Expectations' page templates load Bootstrap, jQuery, Popper, bootstrap-table,
bootstrap-datepicker, Font Awesome and Vega from public CDNs, and GX's logo from its own servers.
On a closed network such pages render unstyled, with empty index tables; on an open one, each
reading tells those servers that a report was opened. So the platform serves them itself:

* ``include/web/package.json`` names the same packages at the versions the templates name, and
  ``include/web/package-lock.json`` locks them with their integrity hashes. ``make web-assets``
  (part of ``make install``) installs them once with ``npm ci`` into ``include/web/node_modules``.
* :func:`make_offline` copies the files the pages use from there into the site's
  ``static/vendor/`` (with the files their stylesheets reference, such as Font Awesome's
  webfonts, and each package's licence) and points every page at its copy.

What a page loads, and this module checks: the ``src``, ``srcset``, ``poster``, ``data`` and
``background`` attributes of any element, the ``href`` of ``<link>``, and CSS ``url()`` and
``@import`` in ``<style>`` elements, ``style`` attributes and the site's stylesheets. Each must be
a path inside the site or an address of :data:`CDN` (or GX's logo); any other address fails the
build with :class:`~lakehouse.errors.OfflineDocsError`, naming it and its page, so a GX upgrade
that adds one is caught when the site is built, not by a reader on a closed network.
Hyperlinks (``<a href>``, ``<area href>``) are not loads: a link to GX's documentation stays as it
is. Text and script literals are not read as loads (the browser test watches what a page
actually requests).

``python -m lakehouse.quality.web_assets`` checks that the installed packages are the ones the
pages need.
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
import os
import re
import shutil
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path, PurePosixPath
from urllib.parse import urlsplit

from lakehouse.errors import OfflineDocsError, WebAssetsError
from lakehouse.runtime.config import REPO_ROOT

WEB = REPO_ROOT / "include" / "web"
NODE_MODULES = WEB / "node_modules"
INSTALL = "run `make web-assets` (part of `make install`; it installs include/web/package-lock.json with npm)"
# Where the copies go, relative to the site's root.
VENDOR = "static/vendor"


@dataclass(frozen=True)
class Asset:
    """One file of an npm package, as a CDN address serves it."""

    package: str  # its folder in node_modules (an npm alias where two versions are needed)
    version: str  # the version the address names: exact ("3.7.1") or a major one ("5" of vega@5)
    file: str  # the file inside the package, as the CDN serves it for the address

    @property
    def site_path(self) -> str:
        """Where the site keeps its copy, relative to the site's root."""
        return f"{VENDOR}/{self.package}/{self.file}"


# Every address GX 1.x's templates load (great_expectations/render/view/templates), with the file
# of the locked package that each CDN serves for it. jsDelivr's `npm/vega@5` is the file named by
# the newest 5.x release's `jsdelivr` field; cdnjs' paths drop npm's `dist/`.
CDN: dict[str, Asset] = {
    "https://code.jquery.com/jquery-3.7.1.min.js": Asset("jquery", "3.7.1", "dist/jquery.min.js"),
    "https://cdnjs.cloudflare.com/ajax/libs/popper.js/1.12.9/umd/popper.min.js": Asset(
        "popper.js", "1.12.9", "dist/umd/popper.min.js"
    ),
    "https://maxcdn.bootstrapcdn.com/bootstrap/4.3.1/css/bootstrap.min.css": Asset(
        "bootstrap", "4.3.1", "dist/css/bootstrap.min.css"
    ),
    "https://stackpath.bootstrapcdn.com/bootstrap/4.3.1/js/bootstrap.min.js": Asset(
        "bootstrap", "4.3.1", "dist/js/bootstrap.min.js"
    ),
    "https://cdn.jsdelivr.net/npm/@forevolve/bootstrap-dark@1.1.0/dist/css/bootstrap-prefers-dark.css": Asset(
        "@forevolve/bootstrap-dark", "1.1.0", "dist/css/bootstrap-prefers-dark.css"
    ),
    "https://unpkg.com/bootstrap-table@1.19.1/dist/bootstrap-table.min.css": Asset(
        "bootstrap-table", "1.19.1", "dist/bootstrap-table.min.css"
    ),
    "https://unpkg.com/bootstrap-table@1.19.1/dist/bootstrap-table.min.js": Asset(
        "bootstrap-table", "1.19.1", "dist/bootstrap-table.min.js"
    ),
    "https://unpkg.com/bootstrap-table@1.19.1/dist/extensions/filter-control/bootstrap-table-filter-control.min.js": Asset(
        "bootstrap-table",
        "1.19.1",
        "dist/extensions/filter-control/bootstrap-table-filter-control.min.js",
    ),
    # The templates take the filter control's stylesheet from 1.19.0 (an npm alias installs it).
    "https://unpkg.com/bootstrap-table@1.19.0/dist/extensions/filter-control/bootstrap-table-filter-control.css": Asset(
        "bootstrap-table-1.19.0",
        "1.19.0",
        "dist/extensions/filter-control/bootstrap-table-filter-control.css",
    ),
    "https://unpkg.com/bootstrap-table@1.19.0/dist/extensions/filter-control/bootstrap-table-filter-control.min.css": Asset(
        "bootstrap-table-1.19.0",
        "1.19.0",
        "dist/extensions/filter-control/bootstrap-table-filter-control.min.css",
    ),
    "https://cdnjs.cloudflare.com/ajax/libs/bootstrap-datepicker/1.9.0/css/bootstrap-datepicker.min.css": Asset(
        "bootstrap-datepicker", "1.9.0", "dist/css/bootstrap-datepicker.min.css"
    ),
    "https://cdnjs.cloudflare.com/ajax/libs/bootstrap-datepicker/1.9.0/js/bootstrap-datepicker.min.js": Asset(
        "bootstrap-datepicker", "1.9.0", "dist/js/bootstrap-datepicker.min.js"
    ),
    "https://cdnjs.cloudflare.com/ajax/libs/font-awesome/6.6.0/css/all.min.css": Asset(
        "@fortawesome/fontawesome-free", "6.6.0", "css/all.min.css"
    ),
    "https://cdn.jsdelivr.net/npm/vega@5": Asset("vega", "5", "build/vega.min.js"),
    "https://cdn.jsdelivr.net/npm/vega-lite@5": Asset("vega-lite", "5", "build/vega-lite.min.js"),
    "https://cdn.jsdelivr.net/npm/vega-embed@6": Asset(
        "vega-embed", "6", "build/vega-embed.min.js"
    ),
}

# GX's logo, which the pages take from GX's servers (with the context's id in the address), and
# the logo of its dark theme's stylesheet: both are GX's own logo in the site's static/images.
# (GX ships no dark variant; the light one is what a closed network can show.)
GX_HOST = "great-expectations-web-assets.s3.us-east-2.amazonaws.com"
GX_IMAGES = {
    "logo-long.png": "static/images/logo-long.png",
    "full_logo_dark.png": "static/images/logo-long.png",
}

# Attributes that make the browser fetch what they name, on any element (`href` only on <link>).
_LOADING_ATTRIBUTES = frozenset({"src", "poster", "data", "background"})
_ATTRIBUTE = re.compile(
    r"""([^\s"'>/=]+)(?:\s*=\s*(?:"([^"]*)"|'([^']*)'|([^\s"'=<>`]+)))?""", re.ASCII
)
_CSS_COMMENT = re.compile(r"/\*.*?\*/", re.DOTALL)
_CSS_REFERENCE = re.compile(
    r"""url\(\s*(?:"([^"]*)"|'([^']*)'|([^)"'\s]*))\s*\)|@import\s+(?:"([^"]*)"|'([^']*)')""",
    re.IGNORECASE,
)
# Schemes that never leave the browser.
_LOCAL_SCHEMES = frozenset({"", "data", "blob", "about"})


def is_remote(url: str) -> bool:
    """Whether loading ``url`` from a page of the site would reach another host."""
    parts = urlsplit(url.strip())
    return bool(parts.netloc) or parts.scheme.lower() not in _LOCAL_SCHEMES


def local_path(url: str) -> str | None:
    """The site-relative path of the copy the site serves for a remote ``url``, or ``None``."""
    url = url.strip()
    if url in CDN:
        return CDN[url].site_path
    parts = urlsplit(url)
    if parts.netloc.lower() == GX_HOST:
        return GX_IMAGES.get(PurePosixPath(parts.path).name)
    return None


# -- finding what a page loads -------------------------------------------------------------------
@dataclass
class _Edit:
    start: int
    end: int
    text: str


def _css_references(css: str) -> Iterator[tuple[int, int, str]]:
    """Each ``url()`` and ``@import`` of ``css`` outside comments: start, end, address."""
    comments = [m.span() for m in _CSS_COMMENT.finditer(css)]
    for match in _CSS_REFERENCE.finditer(css):
        if any(a <= match.start() < b for a, b in comments):
            continue
        group = next(g for g in range(1, 6) if match.group(g) is not None)
        yield match.start(group), match.end(group), match.group(group)


def _rewrite_css(css: str, resolve: Callable[[str], str | None]) -> str:
    """``css`` with each reference that ``resolve`` maps replaced."""
    edits = [_Edit(a, b, new) for a, b, url in _css_references(css) if (new := resolve(url))]
    return _apply(css, edits)


def _apply(text: str, edits: Iterable[_Edit]) -> str:
    for edit in sorted(edits, key=lambda e: e.start, reverse=True):
        text = text[: edit.start] + edit.text + text[edit.end :]
    return text


class _PageScanner(HTMLParser):
    """Collects the edits that point a page's loads at the site's copies. ``resolve`` returns the
    replacement of a load's address, or ``None`` to keep it."""

    def __init__(self, text: str, resolve: Callable[[str], str | None]) -> None:
        super().__init__(convert_charrefs=True)
        self.resolve = resolve
        self.edits: list[_Edit] = []
        self.integrity: list[tuple[str, str]] = []  # (address, integrity attribute) of a load
        self._line_starts = [0] + [m.end() for m in re.finditer("\n", text)]
        self._in_style = False

    def _offset(self) -> int:
        line, column = self.getpos()
        return self._line_starts[line - 1] + column

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        raw = self.get_starttag_text() or ""
        start = self._offset()
        body = len(tag) + 1  # attributes follow "<tag"
        loaded: str | None = None
        for match in _ATTRIBUTE.finditer(raw, body):
            name = match.group(1).lower()
            group = next((g for g in (2, 3, 4) if match.group(g) is not None), None)
            if group is None:
                continue
            value = html.unescape(match.group(group))
            if name == "style":
                new = _rewrite_css(value, self.resolve)
            elif name in _LOADING_ATTRIBUTES or (name == "href" and tag == "link"):
                loaded = value
                new = self.resolve(value) or value
            elif name == "srcset":
                new = ",".join(self._srcset_candidate(c) for c in value.split(","))
            else:
                continue
            if new != value:
                edit = _Edit(start + match.start(group), start + match.end(group), html.escape(new))
                self.edits.append(edit)
        integrity = dict(attrs).get("integrity")
        if loaded is not None and integrity:
            self.integrity.append((loaded, integrity))
        if tag == "style":
            self._in_style = True

    def _srcset_candidate(self, candidate: str) -> str:
        url, _, descriptor = candidate.strip().partition(" ")
        new = self.resolve(url) or url
        return f"{new} {descriptor}".strip() if new != url else candidate

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.handle_starttag(tag, attrs)
        self._in_style = False

    def handle_endtag(self, tag: str) -> None:
        if tag == "style":
            self._in_style = False

    def handle_data(self, data: str) -> None:
        # A <style> element's text reaches here raw (HTML's rules for it), at the parser's
        # position: its offsets are the page's.
        if self._in_style:
            start = self._offset()
            for a, b, url in _css_references(data):
                if new := self.resolve(url):
                    self.edits.append(_Edit(start + a, start + b, new))


# -- the vendored files ---------------------------------------------------------------------------
def _installed_version(modules: Path, package: str) -> str:
    manifest = modules / package / "package.json"
    try:
        return str(json.loads(manifest.read_text(encoding="utf-8"))["version"])
    except (OSError, ValueError, KeyError) as exc:
        raise WebAssetsError(
            [f"{package} is not installed in {modules} ({type(exc).__name__}: {exc})"], INSTALL
        ) from exc


def check_installed(modules: Path = NODE_MODULES, assets: Iterable[Asset] | None = None) -> None:
    """Check that every asset (default: all of :data:`CDN`) is installed under ``modules`` at
    the version its address names; raise :class:`~lakehouse.errors.WebAssetsError` naming each
    one that is not."""
    problems: list[str] = []
    for asset in sorted(set(CDN.values() if assets is None else assets), key=lambda a: a.site_path):
        if not (modules / asset.package / "package.json").is_file():
            problems.append(f"{asset.package} is not installed in {modules}")
            continue
        version = _installed_version(modules, asset.package)
        if version != asset.version and not version.startswith(asset.version + "."):
            problems.append(
                f"{asset.package} {version} is installed in {modules}; the Data Docs pages "
                f"name version {asset.version}"
            )
        elif not (modules / asset.package / asset.file).is_file():
            problems.append(f"{asset.package} {version} has no {asset.file} in {modules}")
    if problems:
        raise WebAssetsError(problems, INSTALL)


def _copy_asset(asset: Asset, modules: Path, site: Path) -> None:
    """Copy ``asset`` into the site, with the files its stylesheet references and the package's
    licence."""
    package = (modules / asset.package).resolve()
    packaged = package / asset.file
    _copy(packaged, site / asset.site_path)
    for licence in sorted(package.glob("LICEN[CS]E*")):
        _copy(licence, site / VENDOR / asset.package / licence.name)
    if packaged.suffix != ".css":
        return
    css = packaged.read_text(encoding="utf-8")
    for _, _, url in _css_references(css):
        if is_remote(url):
            raise OfflineDocsError([(url, f"{VENDOR}/{asset.package}/{asset.file}")])
        if url.strip().lower().startswith("data:"):
            continue
        relative = urlsplit(url).path
        if not relative:  # a fragment: an element of the page
            continue
        target = (packaged.parent / relative).resolve()
        if not target.is_relative_to(package) or not target.is_file():
            raise WebAssetsError(
                [f"{asset.package}/{asset.file} references {url}, not a file of {package}"],
                INSTALL,
            )
        _copy(target, site / VENDOR / asset.package / target.relative_to(package).as_posix())


def _copy(packaged: Path, target: Path) -> None:
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(packaged, target)


def _subresource_digest(path: Path, integrity: str) -> bool:
    """Whether ``path``'s content satisfies an ``integrity`` attribute (any of its hashes)."""
    data = path.read_bytes()
    for token in integrity.split():
        algorithm, _, expected = token.partition("-")
        if algorithm in ("sha256", "sha384", "sha512"):
            actual = base64.b64encode(hashlib.new(algorithm, data).digest()).decode()
            if actual == expected.split("?")[0]:
                return True
    return False


# -- the site ---------------------------------------------------------------------------------
def _mended(url: str, document: Path, site: Path) -> str | None:
    """A relative path into the site's ``static/`` that climbs to the wrong folder, pointed at
    the file it means; ``None`` for any other address. GX's favicon link on validation pages
    climbs one folder too few (its favicon.j2 counts one level less than the page's other
    templates), so the browser would ask for a file that is not there."""
    path = urlsplit(url).path
    parts = PurePosixPath(path).parts
    if "static" not in parts or ".." in parts[parts.index("static") :]:
        return None
    if (document.parent / path).exists():
        return None
    meant = site.joinpath(*parts[parts.index("static") :])
    if not meant.is_file():
        return None
    return Path(os.path.relpath(meant, document.parent)).as_posix()


def make_offline(site: Path, modules: Path = NODE_MODULES) -> list[str]:
    """Serve everything the pages of ``site`` load from the site itself.

    Copies the vendored files the pages use from ``modules`` into ``site/static/vendor`` and
    rewrites each page's (and each of the site's own stylesheets') CDN addresses to relative
    paths. Raises :class:`~lakehouse.errors.OfflineDocsError` naming every remote address a page
    loads that is not mapped (and its page), and :class:`~lakehouse.errors.WebAssetsError` when
    the vendored files are not installed. Returns the site-relative paths of the copies."""
    vendor = site / VENDOR
    documents = [
        p
        for p in sorted(site.rglob("*"))
        if p.suffix in (".html", ".css") and p.is_file() and not p.is_relative_to(vendor)
    ]
    used: dict[str, Asset] = {}
    unmapped: list[tuple[str, str]] = []
    rewritten: dict[Path, str] = {}
    integrity: list[tuple[Path, str, str]] = []
    for document in documents:
        name = document.relative_to(site).as_posix()

        def resolve(url: str, document: Path = document, name: str = name) -> str | None:
            if not is_remote(url):
                return _mended(url, document, site)
            target = local_path(url)
            if target is None:
                unmapped.append((url, name))
                return None
            if (asset := CDN.get(url.strip())) is not None:
                used[url.strip()] = asset
            return Path(os.path.relpath(site / target, document.parent)).as_posix()

        text = document.read_text(encoding="utf-8")
        if document.suffix == ".css":
            new = _rewrite_css(text, resolve)
        else:
            scanner = _PageScanner(text, resolve)
            scanner.feed(text)
            scanner.close()
            new = _apply(text, scanner.edits)
            integrity += [(document, url, value) for url, value in scanner.integrity]
        if new != text:
            rewritten[document] = new
    if unmapped:
        raise OfflineDocsError(unmapped)
    check_installed(modules, used.values())
    for asset in used.values():
        _copy_asset(asset, modules, site)
    # The pages keep the integrity attributes GX gives some files: a copy that does not match
    # would be refused by the browser, so it fails the build instead.
    for document, url, value in integrity:
        checked = CDN.get(url.strip())
        if checked is not None and not _subresource_digest(site / checked.site_path, value):
            problem = (
                f"{document.relative_to(site)} requires {url} to match {value!r}, which the "
                f"installed {checked.package}'s {checked.file} does not (a browser would refuse it)"
            )
            raise WebAssetsError([problem], INSTALL)
    for document, text in rewritten.items():
        document.write_text(text, encoding="utf-8")
    return sorted({a.site_path for a in used.values()})


def main() -> int:
    """``python -m lakehouse.quality.web_assets``: check the install (exit 1 with what is wrong)."""
    try:
        check_installed()
    except WebAssetsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"Data Docs web assets: {len(set(CDN.values()))} files installed in {NODE_MODULES}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
