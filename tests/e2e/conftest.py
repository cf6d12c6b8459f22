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
    """The run's Spark server: where layer tasks find it, and its log."""

    port: int
    token: str
    log: Path

    @property
    def connection(self) -> str:
        """The ``lakehouse_spark`` connection (JSON, for :data:`SPARK_CONN_ENV`) that makes
        layer tasks its clients."""
        return json.dumps(
            {
                "conn_type": "spark_connect",
                "host": "localhost",
                "port": self.port,
                "password": self.token,
            }
        )


@pytest.fixture(scope="session")
def shared_spark_server(
    tmp_path_factory: pytest.TempPathFactory, s3_env: dict[str, str]
) -> Iterator[SparkServer]:
    """One Spark server (`lakehouse spark start`) for the Airflow tests of the whole run
    (:func:`lakes.shared_by_the_run`), started with ``s3_env`` (tests/conftest.py) in its
    environment, so tasks can keep their tables in the test bucket too. It holds no lakehouse
    of its own: every task names its tables' paths."""

    def home(folder: Path) -> Settings:
        return Settings.from_env(folder / "lakehouse", REPO_ROOT / "contracts")

    def start(folder: Path) -> SparkServer:
        settings = home(folder)
        with pytest.MonkeyPatch.context() as mp:
            for name, value in s3_env.items():
                mp.setenv(name, value)
            mp.setenv("LAKEHOUSE_HOME", str(settings.home))
            mp.setenv(server.PORT_ENV, str(free_port()))  # for the first start only
            running = server.start(settings, only="pipeline")
        log = server.state_dir(settings) / "server.log"
        return SparkServer(running.port, server.token(settings), log)

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
