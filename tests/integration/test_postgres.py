"""The lakehouse's PostgreSQL (`lakehouse postgres start | stop | status`), Airflow's metadata
database for `make airflow`: a real cluster on a free port, in a temporary lakehouse root."""

from __future__ import annotations

import os
import shutil
import socket
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from lakehouse.orchestration.airflow_env import airflow_environment
from lakehouse.runtime.config import REPO_ROOT, Settings
from lakehouse.runtime.postgres import Cluster, PostgresError
from lakehouse.runtime.process import free_port
from lakes import lakehouse

pytestmark = pytest.mark.integration

CONN = "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"


def _lakehouse(settings: Settings, port: int, *args: str) -> subprocess.CompletedProcess[str]:
    return lakehouse(settings.home, *args, env={"LAKEHOUSE_POSTGRES_PORT": str(port)})


def _libpq(url: str) -> str:
    return url.replace("postgresql+psycopg:", "postgresql:")


@pytest.fixture
def settings() -> Iterator[Settings]:
    """A lakehouse root outside pytest's temporary folders (mode 0700): run as root, the server
    runs as the user postgres, which must be able to enter it. Its cluster is stopped at the
    end, whatever the test did."""
    home = Path(tempfile.mkdtemp(prefix="lakehouse-pg-test-"))
    home.chmod(0o711)
    try:
        yield Settings.from_env(home, REPO_ROOT / "contracts")
    finally:
        try:
            Cluster.of(Settings.from_env(home, REPO_ROOT / "contracts")).stop()
        finally:
            shutil.rmtree(home, ignore_errors=True)


def test_start_status_stop_and_airflow_on_it(settings: Settings) -> None:
    port = free_port()
    down = _lakehouse(settings, port, "postgres", "status")
    assert down.returncode == 1 and "not running" in down.stdout

    started = _lakehouse(settings, port, "postgres", "start")
    assert started.returncode == 0, started.stderr
    assert f"127.0.0.1:{port}" in started.stdout
    up = _lakehouse(settings, port, "postgres", "status")
    assert up.returncode == 0 and "running" in up.stdout

    cluster = Cluster.of(settings)
    assert stat.S_IMODE(cluster.password_file.stat().st_mode) == 0o600
    # Airflow's environment, opted in: the cluster's database airflow, and tasks in parallel.
    env = airflow_environment(settings, base={"LAKEHOUSE_AIRFLOW_DB": "postgres"})
    assert (
        env[CONN] == f"postgresql+psycopg://lakehouse:{cluster.password()}@127.0.0.1:{port}/airflow"
    )
    assert env["AIRFLOW__CORE__EXECUTOR"] == "LocalExecutor"
    assert int(env["AIRFLOW__CORE__PARALLELISM"]) > 1
    with psycopg.connect(_libpq(env[CONN])) as conn:
        assert conn.execute("SHOW listen_addresses").fetchone() == ("127.0.0.1",)
        assert conn.execute("SELECT current_database()").fetchone() == ("airflow",)
        conn.execute("CREATE TABLE kept (n int)")
        conn.execute("INSERT INTO kept VALUES (1)")
    # A wrong password is refused.
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        psycopg.connect(_libpq(env[CONN]).replace(cluster.password(), "not-the-password"))
    # The default (SQLite) leaves the database to Airflow.
    assert CONN not in airflow_environment(settings, base={})

    stopped = _lakehouse(settings, port, "postgres", "stop")
    assert stopped.returncode == 0 and "stopped" in stopped.stdout
    with pytest.raises(PostgresError, match="lakehouse postgres start"):
        airflow_environment(settings, base={"LAKEHOUSE_AIRFLOW_DB": "postgres"})
    again = _lakehouse(settings, port, "postgres", "stop")
    assert again.returncode == 0 and "was not running" in again.stdout

    # Started again, on another port: the same cluster, its data kept.
    other = free_port()
    assert _lakehouse(settings, other, "postgres", "start").returncode == 0
    with psycopg.connect(_libpq(cluster.url())) as conn:
        assert conn.execute("SELECT n FROM kept").fetchall() == [(1,)]
    assert f"@127.0.0.1:{other}/" in cluster.url()


def test_a_taken_port_is_refused(settings: Settings) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = _lakehouse(settings, port, "postgres", "start")
    assert proc.returncode == 1
    assert f"port {port} on 127.0.0.1 is taken" in proc.stderr
    assert "LAKEHOUSE_POSTGRES_PORT" in proc.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="only root's server runs as another user")
def test_as_root_a_folder_the_server_user_cannot_enter_is_named(settings: Settings) -> None:
    closed = settings.home / "closed"
    closed.mkdir(mode=0o700)
    cluster = Cluster(closed / "lakehouse" / "postgres")
    with pytest.raises(PostgresError, match=f"cannot enter {closed} "):
        cluster.start(free_port())
