"""Fixtures shared by the end-to-end tests."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from airflow_stack import free_port, temporary_postgres
from browser import Browser

from lakehouse.runtime import server
from lakehouse.runtime.config import REPO_ROOT, Settings
from lakehouse.runtime.postgres import Cluster
from lakes import lakehouse, shared_by_the_run


@pytest.fixture(scope="module")
def chrome(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Browser]:
    holder = Browser(tmp_path_factory.mktemp("chromium"))
    try:
        yield holder
    finally:
        holder.quit()


@dataclass(frozen=True)
class SparkServer:
    """The run's Spark server: the ``lakehouse_spark`` connection (JSON, for
    :data:`SPARK_CONN_ENV`) that makes layer tasks its clients, and its log."""

    connection: str
    log: Path

    @property
    def port(self) -> int:
        return int(json.loads(self.connection)["port"])

    @property
    def token(self) -> str:
        return str(json.loads(self.connection)["password"])


@pytest.fixture(scope="session")
def shared_spark_server(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[SparkServer]:
    """One Spark server (`lakehouse spark start`) for the Airflow tests of the whole run
    (:func:`lakes.shared_by_the_run`). It holds no lakehouse of its own: every task names its
    tables' paths. When the run has tests marked ``s3``, it starts with the run's S3 API's
    settings and credentials in its environment, as a deployment's server would (a JVM reads its
    environment once), so tasks can keep their tables in the test bucket too."""
    s3 = None
    if any(item.get_closest_marker("s3") for item in request.session.items):
        s3 = request.getfixturevalue("s3_server")

    def home(folder: Path) -> Settings:
        return Settings.from_env(folder / "lakehouse", REPO_ROOT / "contracts")

    def start(folder: Path) -> SparkServer:
        settings = home(folder)
        with pytest.MonkeyPatch.context() as mp:
            for name, value in (s3.env if s3 is not None else {}).items():
                mp.setenv(name, value)
            mp.setenv("LAKEHOUSE_HOME", str(settings.home))
            mp.setenv(server.PORT_ENV, str(free_port()))  # for the first start only
            running = server.start(settings)
        connection = {
            "conn_type": "spark_connect",
            "host": "localhost",
            "port": running.port,
            "password": server.token(settings),
        }
        return SparkServer(json.dumps(connection), server.state_dir(settings) / "server.log")

    with shared_by_the_run(
        tmp_path_factory, "spark-server", start, lambda folder: server.stop(home(folder))
    ) as running:
        yield running


@pytest.fixture(scope="session")
def spark_server(shared_spark_server: SparkServer) -> str:
    """The run's Spark server's ``lakehouse_spark`` connection (JSON)."""
    return shared_spark_server.connection


@pytest.fixture(scope="session")
def postgres() -> Iterator[Cluster]:
    """One PostgreSQL cluster for the session's running Airflows (a database each), on a free
    port; stopped and removed when the session ends."""
    with temporary_postgres() as cluster:
        yield cluster


@pytest.fixture(scope="session")
def migrated(tmp_path_factory: pytest.TempPathFactory) -> Callable[[Settings], None]:
    """``migrated(settings)`` gives that lakehouse's Airflow a SQLite metadata database made by
    `lakehouse airflow db migrate`: run once per test process (it takes seconds of CPU), then
    copied. The database holds no path or secret of the home it was made in."""
    home = tmp_path_factory.mktemp("airflow-db") / "lakehouse"
    done = lakehouse(home, "airflow", "db", "migrate", timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    database = Settings.from_env(home, REPO_ROOT / "contracts").airflow_home / "airflow.db"
    assert database.is_file()

    def copy(settings: Settings) -> None:
        settings.airflow_home.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(database, settings.airflow_home / "airflow.db")

    return copy
