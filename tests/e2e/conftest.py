"""Fixtures shared by the end-to-end tests."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from airflow_stack import free_port, temporary_postgres
from browser import Browser

from lakehouse.runtime import server
from lakehouse.runtime.config import Settings
from lakehouse.runtime.postgres import Cluster


@pytest.fixture(scope="module")
def chrome(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Browser]:
    holder = Browser(tmp_path_factory.mktemp("chromium"))
    try:
        yield holder
    finally:
        holder.quit()


@pytest.fixture(scope="session")
def spark_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One Spark server (`lakehouse spark start`) for the Airflow tests of this test process,
    stopped at its end. Yields the ``lakehouse_spark`` connection (JSON, for
    :data:`SPARK_CONN_ENV`) that makes the layer tasks its clients: the server holds no
    lakehouse of its own, every task names its tables' paths."""
    home = tmp_path_factory.mktemp("spark-server") / "lakehouse"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LAKEHOUSE_HOME", str(home))
        mp.setenv(server.PORT_ENV, str(free_port()))
        settings = Settings.from_env()
        running = server.start(settings)
        connection = {
            "conn_type": "spark_connect",
            "host": "localhost",
            "port": running.port,
            "password": server.token(settings),
        }
    try:
        yield json.dumps(connection)
    finally:
        server.stop(settings)


@pytest.fixture(scope="session")
def postgres() -> Iterator[Cluster]:
    """One PostgreSQL cluster for the session's running Airflows (a database each), on a free
    port; stopped and removed when the session ends."""
    with temporary_postgres() as cluster:
        yield cluster
