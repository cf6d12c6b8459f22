"""Airflow plugin: the data-quality page (charts of the results ledger), the Great
Expectations Data Docs and the lineage page inside the Airflow UI.

Registered through the ``airflow.plugins`` entry point in ``pyproject.toml``, so any Airflow
that has this package installed loads it (``airflow plugins`` lists it). It adds:

* a FastAPI app (``fastapi_apps``) that Airflow's API server mounts at ``/data-quality``
  (``url_prefix``). At its root it serves the data-quality page (:mod:`lakehouse.quality.page`:
  per table, charts of the ledger's history and the latest verdicts, linking to their Airflow
  runs and Data Docs pages); under ``/data-quality/docs/`` the static files of
  ``Settings.from_env().data_docs_root`` (``$LAKEHOUSE_HOME/reports/data_docs``, which
  ``lakehouse report`` builds), or a short page saying that no report has been built yet and
  how to build one (see :mod:`lakehouse.quality.report_site`);
* a navigation entry (``external_views``: ``destination`` "nav", ``category`` "browse"): Browse
  -> Data quality, which opens the data-quality page. Its ``url_route`` makes the UI show it
  inside its own page (an iframe) instead of opening a new tab; the UI's address is then
  ``/plugin/<url_route>`` followed by the frame's own path, ``/plugin/lakehouse/data-quality/``
  (and ``/plugin/lakehouse/data-quality/docs/...`` in the Data Docs): the route names the
  plugin, the path the page, nothing twice. ``href`` has no leading slash: the UI resolves it
  against its ``<base href>``, so the link also works when Airflow is served under a sub-path;
* the same for the lineage page (:mod:`lakehouse.pipeline.lineage_page`): an app at
  ``/lineage`` and Browse -> Lineage, at ``/plugin/lakehouse-lineage/lineage/`` in the UI.

The keys are those of Airflow 3.3's plugin interface: ``fastapi_apps`` entries are
``{"app", "url_prefix", "name"}`` (``airflow.api_fastapi.app.init_plugins`` mounts ``app`` at
``url_prefix``, which must not start with ``/api/v2``, ``/ui``, ``/execution``, ``/auth`` or
``/pluginsv2``); ``external_views`` entries are ``{"name", "href", "destination", "url_route",
"category", "icon", "icon_dark_mode", "nav_top_level"}`` (``ExternalViewResponse`` in
``airflow.api_fastapi.core_api.datamodels.plugins``, and "Plugins" in Airflow's
administration docs).

Authentication. Airflow does *not* authenticate plugin apps: the core API is protected by
FastAPI dependencies declared on its routers (``Depends(get_user)`` and the ``requires_access_*``
helpers), and a plugin app is attached with ``app.mount()``; a Starlette mount keeps its own
route table and inherits none of the parent's dependencies, and no API-server middleware
authenticates requests (``init_plugins`` in ``airflow/api_fastapi/app.py``). Airflow's plugin
documentation now says so ("Airflow does not authenticate plugin FastAPI apps. Authenticating
them is the plugin author's responsibility": ``plugins.rst``, apache/airflow PRs #72655 and
#72935) and recommends attaching the dependency once, at the
application level, from ``airflow.api_fastapi.core_api.security`` (``get_user`` /
``GetUserDep`` for authentication, ``requires_access_*`` for authorization). That is what this
plugin does: its app is built with ``dependencies=[Depends(requires_access_view(
AccessView.WEBSITE))]`` (the page's routes are its own, the Data Docs app mounted in it is given
the same dependency: a mounted app does not run its parent's). In Airflow 3.3.2 that dependency

* authenticates through ``get_user``: the JWT comes from an ``Authorization: Bearer`` header if
  one is sent, else from the ``_token`` cookie that the UI's login sets
  (``COOKIE_NAME_JWT_TOKEN``), or from the user that Airflow's ``JWTRefreshMiddleware`` has just
  re-authenticated; it is validated by the configured auth manager's ``get_user_from_token``
  (so the simple auth manager, FAB or any other works alike). No token answers 401, an expired
  one 401, an invalid one 403;
* then asks the auth manager whether that user may see the Airflow UI at all
  (``is_authorized_view(access_view=AccessView.WEBSITE)``; the simple auth manager allows any
  user with a role, viewers included), else 403.

The report covers every topic's tables: a user who may use the UI sees all of it (there is no
per-DAG filtering of the static site). Inside the UI the iframe is same-origin (its sandbox
allows same-origin), so the browser sends the ``_token`` cookie with every page of the site.

Import cost. Airflow imports plugins in every process (scheduler, DAG processor, workers), so
importing this module imports neither Spark, Delta nor Great Expectations, and not even FastAPI
or Airflow's API security module (which loads the ORM models): the app is built on first use of
``fastapi_apps``, which only the API server (and ``airflow plugins``) reads. Airflow's docs allow
plugin attributes to be properties for this kind of initialisation.
"""

from __future__ import annotations

from functools import cached_property
from pathlib import Path
from typing import Any

from airflow.plugins_manager import AirflowPlugin

from lakehouse.runtime.config import Settings

PLUGIN_NAME = "lakehouse"
URL_PREFIX = "/data-quality"  # the page (lakehouse.quality.page) at its root
URL_ROUTE = "lakehouse"  # the UI's route for the view: /plugin/lakehouse/data-quality/
DATA_DOCS = "/docs"  # the Data Docs, under the page
LINEAGE_PREFIX = "/lineage"  # the lineage page (lakehouse.pipeline.lineage_page)
LINEAGE_ROUTE = "lakehouse-lineage"  # the UI's route: /plugin/lakehouse-lineage/lineage/


def _view(name: str, prefix: str, route: str) -> dict[str, Any]:
    """A Browse menu entry showing the app at ``prefix`` inside the UI, at ``/plugin/<route>``."""
    return {
        "name": name,
        "href": prefix.lstrip("/") + "/",
        "destination": "nav",
        "url_route": route,
        "category": "browse",
    }


DATA_QUALITY_VIEW = _view("Data quality", URL_PREFIX, URL_ROUTE)
LINEAGE_VIEW = _view("Lineage", LINEAGE_PREFIX, LINEAGE_ROUTE)


def data_docs_root() -> Path:
    """Where the Data Docs are, read from the serving process's environment on each request."""
    return Settings.from_env().data_docs_root


def _login() -> list[Any]:
    """The dependency every route of the plugin's apps runs: Airflow's login, and the right to
    use its UI (see the module's docstring)."""
    from airflow.api_fastapi.auth.managers.models.resource_details import AccessView
    from airflow.api_fastapi.core_api.security import requires_access_view
    from fastapi import Depends

    return [Depends(requires_access_view(AccessView.WEBSITE))]


def _app(title: str, login: list[Any]) -> Any:
    """A FastAPI app behind ``login``, without the API's own documentation pages."""
    from fastapi import FastAPI

    return FastAPI(title=title, dependencies=login, docs_url=None, redoc_url=None, openapi_url=None)


def create_reports_app() -> Any:
    """The FastAPI app serving the data-quality page at its root and the Data Docs under
    ``/docs/``, only to a user whom Airflow's auth manager has authenticated and allows to use
    the UI (see the module's docstring)."""
    from lakehouse.quality.page import create_router
    from lakehouse.quality.report_site import create_app

    login = _login()
    app = _app("Lakehouse data quality", login)
    # Airflow's UI is at the root the plugin's app is mounted under (URL_PREFIX), the Data Docs
    # under this app's DATA_DOCS.
    app.include_router(
        create_router(Settings.from_env, airflow="../", data_docs=DATA_DOCS.lstrip("/") + "/")
    )
    # A mounted app runs its own dependencies: the Data Docs get the login check too.
    app.mount(DATA_DOCS, create_app(data_docs_root, dependencies=login, title="Data Docs"))
    return app


def create_lineage_app() -> Any:
    """The FastAPI app serving the lineage page at its root, behind the same login."""
    from lakehouse.pipeline.lineage_page import create_router

    app = _app("Lakehouse lineage", _login())
    app.include_router(create_router(Settings.from_env, airflow="../"))
    return app


class LakehousePlugin(AirflowPlugin):
    """The lakehouse's additions to Airflow: the data-quality page and reports, and the lineage
    page, in the UI."""

    name = PLUGIN_NAME
    external_views = [DATA_QUALITY_VIEW, LINEAGE_VIEW]  # noqa: RUF012 (Airflow's own style)

    @cached_property
    def fastapi_apps(self) -> list[Any]:  # type: ignore[override]
        return [
            {
                "app": create_reports_app(),
                "url_prefix": URL_PREFIX,
                "name": "Lakehouse data-quality reports",
            },
            {
                "app": create_lineage_app(),
                "url_prefix": LINEAGE_PREFIX,
                "name": "Lakehouse lineage",
            },
        ]
