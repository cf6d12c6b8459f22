"""`make airflow`'s Airflow (`lakehouse airflow standalone`): Airflow's components on this machine,
each on 127.0.0.1, under a supervisor that says when it is ready and ends all of it when asked.

What ``airflow standalone`` runs, but every server on the loopback address:

* ``airflow db migrate`` first, then the API server (UI, REST API and the workers' execution
  API, on ``[api] host`` and ``port``: 127.0.0.1:8080 unless set), the scheduler (its
  LocalExecutor runs the tasks), the DAG processor and the triggerer;
* Airflow's two log servers, which the scheduler and the triggerer would start on every address
  of the machine, run on 127.0.0.1 by :mod:`lakehouse.orchestration.log_server` instead (the
  components are started with ``--skip-serve-logs``; ``[core] hostname_callable`` names
  127.0.0.1 as the tasks' host, where the API server then fetches a running task's log).

Each component's output goes to the terminal, each line after its name. Once the UI answers,
one line gives its address, the admin user and the password the simple auth manager generated.
Ctrl-C (SIGINT) or SIGTERM stops it: the components get SIGINT, as a terminal's Ctrl-C would
give them, and whatever of them still runs after :data:`GRACE_S` seconds (a triggerer waiting on
a trigger that does not end, say) is killed. They run in a process group of their own, so
nothing of them is left behind; a component that ends by itself ends the others too.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, TextIO

from lakehouse.runtime.config import Settings
from lakehouse.runtime.process import alive, answers

GRACE_S = 15.0
PASSWORDS_FILE = "simple_auth_manager_passwords.json.generated"
HOSTNAME_CALLABLE = "lakehouse.orchestration.log_server.loopback"


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


def standalone_environment(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` for the components of `make airflow`: the tasks' host is 127.0.0.1, where the
    log servers listen (unless ``[core] hostname_callable`` is set already)."""
    return {"AIRFLOW__CORE__HOSTNAME_CALLABLE": HOSTNAME_CALLABLE, **env}


def components(airflow: str) -> dict[str, list[str]]:
    """The processes of `make airflow`'s Airflow, by name (``airflow``: its command)."""
    return {
        "api-server": [airflow, "api-server"],
        "scheduler": [airflow, "scheduler", "--skip-serve-logs"],
        "dag-processor": [airflow, "dag-processor"],
        "triggerer": [airflow, "triggerer", "--skip-serve-logs"],
        "log-server": [sys.executable, "-m", "lakehouse.orchestration.log_server"],
    }


def run_standalone(airflow: str, env: Mapping[str, str], *, out: TextIO = sys.stdout) -> int:
    """``airflow db migrate``, then :func:`supervise` the :func:`components`."""
    env = standalone_environment(env)
    print("airflow db migrate ...", file=out, flush=True)
    migrate = subprocess.run(
        [airflow, "db", "migrate"], env=env, capture_output=True, text=True, check=False
    )
    if migrate.returncode != 0:
        print(migrate.stdout[-3000:] + migrate.stderr[-3000:], file=out, flush=True)
        print(f"airflow db migrate failed (exit code {migrate.returncode})", file=out)
        return migrate.returncode
    return supervise(components(airflow), env, out=out)


def supervise(
    commands: Mapping[str, Sequence[str]],
    env: Mapping[str, str],
    *,
    grace: float = GRACE_S,
    out: TextIO = sys.stdout,
    poll: float = 0.5,
) -> int:
    """Run ``commands`` (name: argv) in a process group of their own until one ends or this
    process is asked to stop; see the module docstring. Returns 0 when stopped on request, else
    the exit status of the command that ended."""
    asked: list[int] = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda signum, _frame: asked.append(signum))
    lock = threading.Lock()
    procs: dict[str, subprocess.Popen[bytes]] = {}
    relays = []
    for name, argv in commands.items():
        first = next(iter(procs.values()), None)
        # One process group for all of them (the first one's), apart from this process's: a
        # signal to the group reaches every component and what it started, never this one.
        proc = subprocess.Popen(
            list(argv),
            env=dict(env),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            process_group=0 if first is None else first.pid,
        )
        procs[name] = proc
        assert proc.stdout is not None
        relay = threading.Thread(target=_relay, args=(name, proc.stdout, out, lock), daemon=True)
        relay.start()
        relays.append(relay)
    leader = next(iter(procs.values()))
    host, port = ui_address(env)
    announced = False
    ended: tuple[str, int] | None = None
    while not asked and ended is None:
        ended = next(((n, p.returncode) for n, p in procs.items() if p.poll() is not None), None)
        if ended is None and not announced and answers(host, port):
            with lock:
                print(ready_line(env), file=out, flush=True)
            announced = True
        time.sleep(poll)
    with lock:
        if ended is not None:
            print(f"{ended[0]} exited with code {ended[1]}: stopping Airflow ...", file=out)
        else:
            print("stopping Airflow ...", file=out, flush=True)
    stop_group(leader, grace)
    for proc in procs.values():
        proc.wait()
    for relay in relays:
        relay.join(timeout=5)
    return 0 if ended is None else (ended[1] or 1)


def _relay(name: str, stream: IO[bytes], out: TextIO, lock: threading.Lock) -> None:
    """Each line of a component's output to the terminal, after its name."""
    for raw in iter(stream.readline, b""):
        line = raw.decode(errors="replace").rstrip("\n")
        with lock:
            print(f"{name:13} | {line}", file=out, flush=True)


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


def airflow_command(settings: Settings, args: list[str]) -> int:
    """The airflow command line with this lakehouse's environment; ``standalone`` is `make
    airflow`'s Airflow (:mod:`lakehouse.orchestration.standalone`), whose metadata database
    the commands after it use. Every command but ``standalone`` says on stderr which database
    it uses, unless ``LAKEHOUSE_AIRFLOW_DB`` chose it."""
    from lakehouse.orchestration.airflow_env import (
        DB_ENV,
        airflow_environment,
        describe_database,
        record_database,
    )

    env = airflow_environment(settings)
    Path(env["AIRFLOW_HOME"]).mkdir(parents=True, exist_ok=True)
    airflow = str(Path(sys.executable).parent / "airflow")
    if args == ["standalone"]:  # `make airflow`: said when ready, stopped whole on Ctrl-C
        record_database(settings, os.environ)
        print(describe_database(settings, os.environ), flush=True)
        return run_standalone(airflow, env)
    if not os.environ.get(DB_ENV):
        print(describe_database(settings, os.environ), file=sys.stderr, flush=True)
    os.execve(airflow, [airflow, *args], env)
    return 0  # pragma: no cover - execve does not return
