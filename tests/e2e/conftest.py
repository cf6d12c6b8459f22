"""Fixtures shared by the end-to-end tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from airflow_stack import temporary_postgres
from browser import Browser

from lakehouse.postgres import Cluster


@pytest.fixture(scope="module")
def chrome(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Browser]:
    holder = Browser(tmp_path_factory.mktemp("chromium"))
    try:
        yield holder
    finally:
        holder.quit()


@pytest.fixture(scope="session")
def postgres() -> Iterator[Cluster]:
    """One PostgreSQL cluster for the session's running Airflows (a database each), on a free
    port; stopped and removed when the session ends."""
    with temporary_postgres() as cluster:
        yield cluster
