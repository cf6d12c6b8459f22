"""A small web app that serves one folder of static HTML: the Great Expectations Data Docs that
``lakehouse report`` builds into ``reports/data_docs``.

The Airflow plugin (:mod:`lakehouse.orchestration.airflow_plugin`) mounts it in Airflow's API server, behind
Airflow's own authentication; it does not depend on Airflow itself, so it can be served and tested
on its own too.

Only regular files inside the folder are served. A request whose path has a ``..`` segment, a
NUL, or that resolves (symbolic links included) outside the folder is answered 404, exactly like a
file that does not exist, whether the dots came in plain or percent-encoded. Until the site has
been built, every request gets a short page saying so and how to build it.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Sequence
from pathlib import Path, PurePosixPath

from fastapi import FastAPI, params
from fastapi.responses import FileResponse, HTMLResponse, Response

INDEX = "index.html"

_PAGE = """<!DOCTYPE html>
<html lang="en">
<head><meta charset="utf-8"><title>{title}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2rem; max-width: 46rem; line-height: 1.5; }}
code {{ background: #f2f2f2; padding: 0.1rem 0.3rem; border-radius: 3px; }}
</style></head>
<body>
<h1>{title}</h1>
{body}
</body>
</html>
"""


def not_built_page(site_root: Path) -> str:
    """The page served while the Data Docs site has not been built yet."""
    body = (
        "<p>No data-quality report has been built yet: the Great Expectations Data Docs "
        "are made from the validation results the quality gates save.</p>"
        "<p>Build them with <code>lakehouse report</code> (each pipeline DAG's last task, "
        "<code>report</code>, does it after every run). They are written to "
        f"<code>{html.escape(str(site_root))}</code>; then reload this page.</p>"
    )
    return _PAGE.format(title="No data-quality report yet", body=body)


def _not_found_page() -> str:
    return _PAGE.format(title="Not found", body="<p>There is no such page in the report.</p>")


def site_file(root: Path, path: str) -> Path | None:
    """The regular file that the URL path ``path`` names inside ``root``, or ``None`` when it
    names nothing there or would leave ``root``. A folder stands for its ``index.html``."""
    if "\x00" in path:
        return None
    relative = path.replace("\\", "/").lstrip("/")
    if any(part == ".." for part in PurePosixPath(relative).parts):
        return None
    base = root.resolve()
    try:
        candidate = (base / relative).resolve()
    except (OSError, RuntimeError):  # e.g. a symbolic-link loop
        return None
    if not candidate.is_relative_to(base):
        return None
    if candidate.is_dir():
        candidate = candidate / INDEX
    return candidate if candidate.is_file() else None


def create_app(
    site_root: Path | Callable[[], Path],
    *,
    dependencies: Sequence[params.Depends] = (),
    title: str = "Data-quality reports",
) -> FastAPI:
    """A FastAPI app that serves the static site under ``site_root``.

    ``site_root`` may be a callable, resolved on each request (so a site built after the app
    started, or a root that only the serving process's environment knows, is found).
    ``dependencies`` (FastAPI ``Depends(...)`` objects) apply to every route: the Airflow plugin
    passes Airflow's authentication there."""

    def root() -> Path:
        return site_root() if callable(site_root) else site_root

    app = FastAPI(
        title=title,
        dependencies=list(dependencies),
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )

    @app.api_route("/{path:path}", methods=["GET", "HEAD"], include_in_schema=False)
    def serve(path: str) -> Response:
        folder = root()
        if not (folder / INDEX).is_file():
            status = 200 if path.strip("/") in ("", INDEX) else 404
            return HTMLResponse(not_built_page(folder), status_code=status)
        found = site_file(folder, path)
        if found is None:
            return HTMLResponse(_not_found_page(), status_code=404)
        # The site is rebuilt in place by each report run: let browsers revalidate.
        return FileResponse(found, headers={"Cache-Control": "no-cache"})

    return app
