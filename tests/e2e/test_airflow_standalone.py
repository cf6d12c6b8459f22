"""`make airflow` as a person at a terminal meets it, its commands run as the Makefile runs them
but on free ports: the lakehouse's PostgreSQL (`lakehouse postgres start`), the Spark server on
it (`LAKEHOUSE_METASTORE=postgres lakehouse spark start`) and Airflow
(`LAKEHOUSE_AIRFLOW_DB=postgres lakehouse airflow standalone`).

- One line says where the UI is and the admin's password once it answers.
- Every socket any of those processes listens on is on 127.0.0.1: the UI and APIs, Airflow's two
  log servers, PostgreSQL, the Spark server's and the readers' server's ports.
- `lakehouse airflow ...` run afterwards without ``LAKEHOUSE_AIRFLOW_DB`` reaches that Airflow's
  database, and says which one it uses: a run it triggers is one the running API server lists.
- Ctrl-C ends every process of Airflow within 30 seconds.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from airflow_stack import call, free_port

from lakehouse.runtime import readers, server
from lakehouse.runtime.config import REPO_ROOT, Settings
from lakehouse.runtime.postgres import Cluster
from lakehouse.runtime.process import alive, answers
from sockets import descendants, environment_has, listeners

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

DAG_ID = "pipeline__user-locations"


@dataclass
class Machine:
    """A lakehouse root with `make airflow`'s servers, each on a port of its own."""

    home: Path
    env: dict[str, str]  # what the Makefile's commands run with (LAKEHOUSE_HOME, the ports)
    ports: dict[str, int]

    def lakehouse(self, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "lakehouse.cli", *args],
            env=self.env | extra,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )


@pytest.fixture
def machine() -> Iterator[Machine]:
    # Not under pytest's folder (mode 0700): run as root, PostgreSQL runs as the user postgres,
    # which must be able to enter every folder above its cluster.
    root = Path(tempfile.mkdtemp(prefix="lakehouse-make-airflow-"))
    root.chmod(0o711)
    home = root / "lakehouse"
    ports = {
        "airflow": free_port(),
        "worker log server": free_port(),
        "trigger log server": free_port(),
        "postgres": free_port(),
        "spark connect": free_port(),
        "readers' connect": free_port(),
        "sql endpoint": free_port(),
    }
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LAKEHOUSE_", "AIRFLOW"))}
    env |= {
        "LAKEHOUSE_HOME": str(home),
        "LAKEHOUSE_CONTRACTS": str(REPO_ROOT / "contracts"),
        "AIRFLOW__API__PORT": str(ports["airflow"]),
        "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(ports["worker log server"]),
        "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(ports["trigger log server"]),
        "LAKEHOUSE_POSTGRES_PORT": str(ports["postgres"]),
        server.PORT_ENV: str(ports["spark connect"]),
        readers.PORT_ENV: str(ports["readers' connect"]),
        readers.SQL_PORT_ENV: str(ports["sql endpoint"]),
    }
    found = Machine(home, env, ports)
    try:
        started = found.lakehouse("postgres", "start")
        assert started.returncode == 0, started.stderr[-3000:]
        started = found.lakehouse("spark", "start", LAKEHOUSE_METASTORE="postgres")
        assert started.returncode == 0, started.stderr[-3000:]
        yield found
    finally:
        found.lakehouse("spark", "stop")
        found.lakehouse("postgres", "stop")
        shutil.rmtree(root, ignore_errors=True)


def _machine_processes(machine: Machine) -> set[int]:
    """Every process of `make airflow` on this lakehouse root: those whose environment names
    it (Airflow, the Spark server), PostgreSQL's server and what they started."""
    settings = Settings.from_env(machine.home, REPO_ROOT / "contracts")
    roots = environment_has("LAKEHOUSE_HOME", str(machine.home))
    roots |= environment_has("AIRFLOW_HOME", str(settings.airflow_home))
    postgres = Cluster.of(settings).status()
    assert postgres.running and postgres.pid is not None
    roots.add(postgres.pid)
    spark = server.status(settings)
    assert spark.running and spark.pid is not None
    assert spark.readers is not None and spark.readers.pid is not None
    roots |= {spark.pid, spark.readers.pid}
    return {p for root in roots for p in (root, *descendants(root)) if alive(p)}


def _token(base: str, password: str) -> str:
    status, body = call(f"{base}/auth/token", {"username": "admin", "password": password})
    assert status == 201, body[:500]
    return str(json.loads(body)["access_token"])


def test_make_airflow_listens_on_loopback_only_shares_its_database_and_stops_whole(
    machine: Machine,
) -> None:
    port = machine.ports["airflow"]
    airflow_home = machine.home / "airflow"
    # Its own process group, as a terminal's foreground job: Ctrl-C is SIGINT to the group.
    standalone = subprocess.Popen(
        [sys.executable, "-m", "lakehouse.cli", "airflow", "standalone"],
        env=machine.env | {"LAKEHOUSE_AIRFLOW_DB": "postgres"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        assert standalone.stdout is not None
        lines: list[str] = []
        deadline = time.monotonic() + 300
        while not any(line.startswith("Airflow is ready at ") for line in lines):
            line = standalone.stdout.readline()
            assert line or standalone.poll() is None, "".join(lines[-60:])
            assert time.monotonic() < deadline, "".join(lines[-60:])
            lines.append(line)
        ready = next(line for line in lines if line.startswith("Airflow is ready at "))
        passwords = json.loads(
            (airflow_home / "simple_auth_manager_passwords.json.generated").read_text()
        )
        assert ready.startswith(
            f"Airflow is ready at http://127.0.0.1:{port} (user admin, password "
            f"{passwords['admin']}; "
        ), ready
        assert answers("127.0.0.1", port)
        # The rest of its output is read on, so that no component blocks on a full pipe.
        rest: list[str] = []
        reader = _drain(standalone, rest)

        # `lakehouse airflow` afterwards, without LAKEHOUSE_AIRFLOW_DB: the same database, said.
        base = f"http://127.0.0.1:{port}"
        token = _token(base, passwords["admin"])
        deadline = time.monotonic() + 300
        while True:  # the DAG processor stores the DAGs shortly after the start
            status, _ = call(f"{base}/api/v2/dags/{DAG_ID}", token=token)
            if status == 200:
                break
            assert time.monotonic() < deadline, f"{DAG_ID} not parsed: {status}"
            time.sleep(2)
        trigger = machine.lakehouse(
            "airflow", "dags", "trigger", DAG_ID, "--run-id", "from_the_command_line"
        )
        assert trigger.returncode == 0, trigger.stdout[-2000:] + trigger.stderr[-3000:]
        postgres_port = machine.ports["postgres"]
        assert (
            f"Airflow's metadata database: PostgreSQL at 127.0.0.1:{postgres_port}, the one "
            "`lakehouse airflow standalone` (make airflow) last ran on (LAKEHOUSE_AIRFLOW_DB="
            "sqlite or postgres chooses another)"
        ) in trigger.stderr
        status, body = call(f"{base}/api/v2/dags/{DAG_ID}/dagRuns", token=token)
        assert status == 200, body[:500]
        runs = [r["dag_run_id"] for r in json.loads(body)["dag_runs"]]
        assert "from_the_command_line" in runs, runs
        listed = machine.lakehouse("airflow", "dags", "list-runs", DAG_ID, "-o", "json")
        assert listed.returncode == 0, listed.stderr[-3000:]
        table = listed.stdout.strip().splitlines()[-1]  # after Airflow's own warnings
        assert "from_the_command_line" in {r["run_id"] for r in json.loads(table)}

        # Every socket of every process of it, on 127.0.0.1; each server among them.
        found = listeners(_machine_processes(machine))
        assert [str(s) for s in found if s.address != "127.0.0.1"] == []
        ports = {s.port for s in found}
        missing = {name: p for name, p in machine.ports.items() if p not in ports}
        assert missing == {}, [str(s) for s in found]
        print(f"\n{len(found)} listening sockets, all on 127.0.0.1:")
        for s in sorted(found, key=lambda s: s.port):
            print(f"  {s}")

        asked = time.monotonic()
        os.killpg(standalone.pid, signal.SIGINT)
        standalone.wait(timeout=30)
        while _processes_of(airflow_home):
            assert time.monotonic() - asked < 30, _processes_of(airflow_home)
            time.sleep(0.5)
        print(f"all of Airflow gone {time.monotonic() - asked:.1f} s after Ctrl-C")
        assert standalone.returncode == 0
        reader.join(timeout=10)
        assert any("stopping Airflow" in line for line in rest), "".join(rest[-60:])
        assert not answers("127.0.0.1", port)
    finally:
        if standalone.poll() is None:
            os.killpg(standalone.pid, signal.SIGKILL)
        for pid in _processes_of(airflow_home):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _processes_of(airflow_home: Path) -> list[int]:
    """The live processes whose environment names this Airflow home."""
    return sorted(p for p in environment_has("AIRFLOW_HOME", str(airflow_home)) if alive(p))


def _drain(proc: subprocess.Popen[str], into: list[str]) -> threading.Thread:
    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            into.append(line)

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    return thread
