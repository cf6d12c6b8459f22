"""`make airflow`'s Airflow (`lakehouse airflow standalone`) as a person at a terminal meets it:
one line says where the UI is and the admin's password once it answers, the UI is on 127.0.0.1,
and Ctrl-C ends every process of it within 30 seconds."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from airflow_stack import free_port

from lakehouse.runtime.config import REPO_ROOT
from lakehouse.runtime.process import alive, answers

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]


def _processes_of(airflow_home: Path) -> list[int]:
    """The live processes whose environment names this Airflow home."""
    wanted = f"AIRFLOW_HOME={airflow_home}".encode()
    found = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if wanted in environ.read_bytes().split(b"\0"):
                found.append(int(environ.parent.name))
        except OSError:
            continue
    return [pid for pid in found if alive(pid)]


def test_standalone_says_where_and_who_and_stops_whole_on_ctrl_c(tmp_path: Path) -> None:
    home = tmp_path / "lakehouse"
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LAKEHOUSE_", "AIRFLOW"))}
    env |= {
        "LAKEHOUSE_HOME": str(home),
        "LAKEHOUSE_CONTRACTS": str(REPO_ROOT / "contracts"),
        "AIRFLOW__API__PORT": str(port),
    }
    # Its own process group, as a terminal's foreground job: Ctrl-C is SIGINT to the group.
    standalone = subprocess.Popen(
        [sys.executable, "-m", "lakehouse.cli", "airflow", "standalone"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    airflow_home = home / "airflow"
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
        running = _processes_of(airflow_home)
        assert len(running) >= 5, running  # the supervisor, standalone and its components

        asked = time.monotonic()
        os.killpg(standalone.pid, signal.SIGINT)
        standalone.wait(timeout=30)
        while _processes_of(airflow_home):
            assert time.monotonic() - asked < 30, _processes_of(airflow_home)
            time.sleep(0.5)
        print(f"\nall {len(running)} processes gone {time.monotonic() - asked:.1f} s after Ctrl-C")
        assert standalone.returncode == 0
        rest = standalone.stdout.read()
        assert "stopping Airflow" in rest, rest[-3000:]
        assert not answers("127.0.0.1", port)
    finally:
        if standalone.poll() is None:
            os.killpg(standalone.pid, signal.SIGKILL)
        for pid in _processes_of(airflow_home):
            os.kill(pid, signal.SIGKILL)
