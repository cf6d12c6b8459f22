"""`make airflow`'s Airflow: ``airflow standalone`` (api-server, scheduler, DAG processor,
triggerer) under a supervisor that says when it is ready and ends all of it when asked.

* Once the UI answers, one line on the terminal gives its address, the admin user and the
  password the simple auth manager generated (after Airflow's start-up output, where it is
  seen, not in the middle of it).
* Ctrl-C (SIGINT) or SIGTERM stops it: Airflow gets SIGINT, as a terminal's Ctrl-C would give
  it, and whatever of it is still running after :data:`GRACE_S` seconds (a triggerer waiting on
  a trigger that does not end, say) is killed. Airflow runs in a process group of its own, so
  nothing of it is left behind.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TextIO

from lakehouse.runtime.process import alive, answers

GRACE_S = 15.0
PASSWORDS_FILE = "simple_auth_manager_passwords.json.generated"


def ui_address(env: Mapping[str, str]) -> tuple[str, int]:
    """Where the API server of this environment listens (Airflow's ``[api]`` host and port)."""
    host = env.get("AIRFLOW__API__HOST", "127.0.0.1")
    port = int(env.get("AIRFLOW__API__PORT", "8080"))
    return ("127.0.0.1" if host in ("0.0.0.0", "") else host), port


def ready_line(env: Mapping[str, str]) -> str:
    """What the terminal is told once the UI answers: where, who, and the password."""
    host, port = ui_address(env)
    home = Path(env["AIRFLOW_HOME"])
    users = env.get("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS", "admin:admin")
    user = users.split(",")[0].split(":")[0]
    try:
        password = json.loads((home / PASSWORDS_FILE).read_text())[user]
    except (OSError, ValueError, KeyError):
        password = None
    login = f"user {user}, password {password}" if password else f"user {user}"
    return (
        f"Airflow is ready at http://{host}:{port} ({login}; kept in {home / PASSWORDS_FILE}). "
        "Ctrl-C stops it."
    )


def supervise(
    command: Sequence[str],
    env: Mapping[str, str],
    *,
    grace: float = GRACE_S,
    out: TextIO = sys.stdout,
    poll: float = 0.5,
) -> int:
    """Run ``command`` (``airflow standalone``) in a process group of its own until it ends or
    this process is asked to stop; see the module docstring. Returns its exit status (0 when
    stopped on request)."""
    asked: list[int] = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda signum, _frame: asked.append(signum))
    proc = subprocess.Popen(list(command), env=dict(env), start_new_session=True)
    host, port = ui_address(env)
    announced = False
    while proc.poll() is None and not asked:
        if not announced and answers(host, port):
            print(ready_line(env), file=out, flush=True)
            announced = True
        time.sleep(poll)
    if proc.poll() is not None:
        return proc.returncode
    print("stopping Airflow ...", file=out, flush=True)
    stop_group(proc, grace)
    return 0


def stop_group(proc: subprocess.Popen[bytes], grace: float) -> None:
    """SIGINT to ``proc``'s process group, then SIGKILL to what is left of it after ``grace``
    seconds."""
    with contextlib.suppress(ProcessLookupError):  # all of it ended already
        os.killpg(proc.pid, signal.SIGINT)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and _group_alive(proc.pid):
        proc.poll()
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _group_alive(pgid: int) -> bool:
    """Whether any process of group ``pgid`` lives (zombies do not)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and alive(int(stat.parent.name)):
            return True
    return False
