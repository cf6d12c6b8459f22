"""The ``lakehouse`` command's entry point (lakehouse.launch): a command's quick exit still runs
its exit handlers, and the installed command runs a micro-batch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from importlib.metadata import entry_points
from pathlib import Path

import pytest

from lakehouse import launch
from lakehouse.config import REPO_ROOT


@pytest.mark.parametrize(
    ("argv", "command"),
    [
        (["run"], "run"),
        (["run", "--topic", "t"], "run"),
        (["--home", "h", "run"], "run"),
        (["--contracts", "c", "--home", "h", "run", "--layer", "gold"], "run"),
        (["--home=h", "run"], "run"),
        (["--home", "run", "show", "t"], "show"),  # "run" is the home folder's name here
        (["show", "run"], "show"),
        (["-h"], None),
        ([], None),
    ],
)
def test_the_command_is_the_first_word_that_is_no_option(
    argv: list[str], command: str | None
) -> None:
    assert launch.command_of(argv) == command


def test_the_console_script_is_the_launcher() -> None:
    (script,) = entry_points(group="console_scripts", name="lakehouse")
    assert script.value == "lakehouse.launch:main"


def _python(code: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = os.environ | {
        "LAKEHOUSE_HOME": str(tmp_path / "lakehouse"),
        "LAKEHOUSE_CONTRACTS": str(REPO_ROOT / "contracts"),
    }
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_a_quick_exit_still_runs_exit_handlers_and_finalizers(tmp_path: Path) -> None:
    proc = _python(
        """
        import atexit, weakref
        from lakehouse.launch import quiet_exit

        class Held:
            pass

        held = Held()
        held.me = held  # a cycle: only a garbage collection would free it
        weakref.finalize(held, print, "finalizer ran", flush=True)
        atexit.register(print, "exit handler ran", flush=True)
        quiet_exit()
        """,
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["exit handler ran", "finalizer ran"]


CONTRACT = """\
topic: launch-check
partitions: 2
key: {format: string, name: user}
value:
  format: json
  fields:
    - {name: city, type: string}
stream: {name: launch_check}
tables:
  - {name: launch_check_latest, kind: latest}
expectations:
  bronze:
    - {name: partition_ok, expect: between, column: partition, min: 0, max: 1, severity: fail}
  silver:
    - {name: user_present, expect: not_null, column: user, severity: quarantine}
  gold:
    - {name: one_row_per_user, table: launch_check_latest, expect: unique, column: user, severity: fail}
"""


def test_the_installed_command_runs_a_micro_batch(tmp_path: Path) -> None:
    """``lakehouse produce`` then ``lakehouse run`` through the installed script: every layer
    validated, the table published."""
    contracts = tmp_path / "contracts"
    contracts.mkdir()
    (contracts / "launch-check.yaml").write_text(CONTRACT)
    env = os.environ | {
        "LAKEHOUSE_HOME": str(tmp_path / "lakehouse"),
        "LAKEHOUSE_CONTRACTS": str(contracts),
    }
    lakehouse = str(Path(sys.executable).with_name("lakehouse"))
    records = "".join(
        json.dumps({"key": user, "value": {"city": city}}) + "\n"
        for user, city in [("ana", "Oslo"), ("bo", "Lima"), ("ana", "Rome")]
    )

    def command(*argv: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [lakehouse, *argv],
            input=stdin,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )

    produced = command("produce", "launch-check", stdin=records)
    assert produced.returncode == 0, produced.stderr
    ran = command("run", "--topic", "launch-check")
    assert ran.returncode == 0, ran.stderr
    verdicts = [line for line in ran.stdout.splitlines() if "checks met" in line]
    assert [line.split(":")[0] for line in verdicts] == [
        "quality bronze.launch-check",
        "quality silver.launch_check",
        "quality gold.launch_check_latest",
    ]
    shown = command("show", "launch_check_latest", "--format", "json")
    assert shown.returncode == 0, shown.stderr
    rows = sorted((r["user"], r["city"]) for r in map(json.loads, shown.stdout.splitlines()))
    assert rows == [("ana", "Rome"), ("bo", "Lima")]
