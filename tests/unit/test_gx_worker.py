"""The Great Expectations validation worker (lakehouse.gx_worker): the same verdict as
validating in the job's own process, a fallback to that whenever the worker cannot answer, and
no worker left behind by a job that ends or dies."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pyarrow as pa
import pytest

from lakehouse import gx_worker
from lakehouse.config import REPO_ROOT
from lakehouse.contracts import Expectation
from lakehouse.errors import CONFIG_ERROR_EXIT, ConfigError
from lakehouse.quality import run_suite


def _e(name: str, expect: str, severity: str = "warn", column: str | None = None, **params: Any):  # type: ignore[no-untyped-def]
    return Expectation(
        layer="silver",
        name=name,
        expect=expect,
        severity=severity,  # type: ignore[arg-type]
        column=column,
        params=tuple(sorted(params.items())),
    )


EXPECTATIONS = [
    _e("rows", "row_count_between", "fail", min=1, max=100),
    _e("user_present", "not_null", "quarantine", "user"),
    _e("user_unique", "unique", "warn", "user"),
    _e("lat_range", "between", "fail", "lat", min=-90, max=90),
    _e("known_city", "in_set", "warn", "city", values=("Oslo", "Lima")),
    _e("user_shape", "match_regex", "warn", "user", pattern="^u[0-9]+$"),
    _e("city_length", "length_between", "warn", "city", min=2, max=4),
]
BATCH = pa.table(
    {
        "user": ["u1", "u2", "u2", None, "bob", "u7"],
        "lat": [10.5, 95.0, -91.25, None, 0.0, 45.0],
        "city": ["Oslo", "Lima", "Rome", "Oslo", None, "Lisboa"],
        "unused": [1, 2, 3, 4, 5, 6],
    }
)
VOLATILE = {
    "id",
    "validation_time",
    "run_id",
    "ge_load_time",
    "validation_id",
    "batch_id",
    "data_asset_name",  # a per-process label: its number counts the process's earlier suites
}


def _stable(document: Any) -> Any:
    """A GX result without what differs between any two validations (ids, clock times, the
    per-process labels of assets)."""
    if isinstance(document, dict):
        return {k: _stable(v) for k, v in document.items() if k not in VOLATILE}
    if isinstance(document, list):
        return [_stable(v) for v in document]
    return document


@pytest.fixture
def worker() -> Iterator[gx_worker.ValidationWorker]:
    started = gx_worker.start()
    assert started is not None
    yield started
    gx_worker.stop()


def test_the_worker_gives_the_verdict_of_this_process(
    worker: gx_worker.ValidationWorker,
) -> None:
    outcomes, engine, document = run_suite("silver.t", EXPECTATIONS, BATCH, BATCH.num_rows)
    here, here_engine, here_document = run_suite(
        "silver.t", EXPECTATIONS, BATCH, BATCH.num_rows, in_process=True
    )
    assert worker.proc.poll() is None  # it answered and is still there
    assert (engine, here_engine) == ("pandas", "pandas")
    assert outcomes == here
    assert _stable(document) == _stable(json.loads(json.dumps(here_document)))
    verdicts = {o.expectation: (o.success, o.unexpected_count) for o in outcomes}
    assert verdicts == {
        "rows": (True, None),
        "user_present": (False, 1),
        "user_unique": (False, 2),
        "lat_range": (False, 2),
        "known_city": (False, 2),
        "user_shape": (False, 1),
        "city_length": (False, 1),
    }
    assert next(o for o in outcomes if o.expectation == "known_city").sample == ("Rome", "Lisboa")


def test_a_dead_worker_is_replaced_by_this_process(
    worker: gx_worker.ValidationWorker, capfd: pytest.CaptureFixture[str]
) -> None:
    expected, _, _ = run_suite("silver.t", EXPECTATIONS, BATCH, BATCH.num_rows, in_process=True)
    os.kill(worker.proc.pid, signal.SIGKILL)
    worker.proc.wait()
    outcomes, engine, _ = run_suite("silver.t", EXPECTATIONS, BATCH, BATCH.num_rows)
    assert (outcomes, engine) == (expected, "pandas")
    err = capfd.readouterr().err
    assert "quality: the worker stopped answering" in err
    assert "validating in this process" in err
    # Once broken, it is not asked again.
    run_suite("silver.t", EXPECTATIONS, BATCH, BATCH.num_rows)
    assert "stopped answering" in capfd.readouterr().err


def test_an_error_in_the_worker_is_raised_here_too(
    worker: gx_worker.ValidationWorker, capfd: pytest.CaptureFixture[str]
) -> None:
    """A failure of GX on the batch is not swallowed: this process validates again and raises
    it, and the worker stays up for the next batch."""
    bad = [_e("odd", "no_such_kind", "warn", "user")]
    with pytest.raises(ValueError, match="unknown expectation kind 'no_such_kind'"):
        run_suite("silver.t", bad, BATCH, BATCH.num_rows)
    assert "the worker failed: ValueError: unknown expectation kind" in capfd.readouterr().err
    outcomes, _, _ = run_suite("silver.t", EXPECTATIONS[:1], BATCH, BATCH.num_rows)
    assert [o.success for o in outcomes] == [True]
    assert "validating in this process" not in capfd.readouterr().err


def test_the_setting_turns_the_worker_off_or_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LAKEHOUSE_GX_WORKER", "0")
    assert gx_worker.start() is None
    assert gx_worker.current() is None
    monkeypatch.setenv("LAKEHOUSE_GX_WORKER", "yes")
    with pytest.raises(ConfigError, match="LAKEHOUSE_GX_WORKER must be 0 or 1, not 'yes'"):
        gx_worker.start()


def test_the_worker_ends_with_its_job() -> None:
    """Closed by the job, the worker exits; when the job is killed, the worker sees its request
    pipe close and exits too (after its import), so no process is left behind."""
    worker = gx_worker.ValidationWorker()
    worker.close()  # at once, while it still imports GX
    assert worker.proc.returncode is not None
    assert not _alive(worker.proc.pid)

    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import time; from lakehouse import gx_worker; "
            "print(gx_worker.start().proc.pid, flush=True); time.sleep(600)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 60
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(child), f"worker {child} outlived its killed job"


def _alive(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie, exited but not reaped, is not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_the_worker_imports_gx_as_a_pandas_only_deployment() -> None:
    probe = (
        "import sys; from lakehouse.gx_worker import _trim_imports; _trim_imports(); "
        "import great_expectations; "
        "print(sys.modules['pyspark'] is None, sys.modules['sqlalchemy'] is None, "
        "type(sys.modules['scipy.stats']).__name__)"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout
    assert out.split() == ["True", "True", "_LazyModule"]


def test_the_job_refuses_a_bad_worker_setting_before_anything_moves(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    layer_job: ModuleType,
) -> None:
    monkeypatch.setenv("LAKEHOUSE_HOME", str(tmp_path / "lakehouse"))
    monkeypatch.setenv("LAKEHOUSE_CONTRACTS", str(REPO_ROOT / "contracts"))
    monkeypatch.setenv("LAKEHOUSE_GX_WORKER", "2")
    assert layer_job.main(["--topic", "user-locations", "--layer", "silver"]) == CONFIG_ERROR_EXIT
    assert "LAKEHOUSE_GX_WORKER must be 0 or 1, not '2'" in capsys.readouterr().err
    assert gx_worker.current() is None
    assert not (tmp_path / "lakehouse").exists()


class _NoSpark:
    def stop(self) -> None:
        pass


def test_the_job_starts_the_worker_first_and_keeps_it_only_if_the_layer_validates(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, layer_job: ModuleType
) -> None:
    """Run as a script, the job starts the worker before reading its contract; it stops it
    at once for a layer without expectations, a dry run or a refused command line."""
    monkeypatch.setenv("LAKEHOUSE_HOME", str(tmp_path / "lakehouse"))
    monkeypatch.setenv("LAKEHOUSE_CONTRACTS", str(REPO_ROOT / "contracts"))
    monkeypatch.setattr("lakehouse.spark.get_session", lambda *_a, **_k: _NoSpark())
    during: list[gx_worker.ValidationWorker | None] = []
    monkeypatch.setattr(
        "lakehouse.pipeline.run_layer", lambda *_a, **_k: during.append(gx_worker.current()) or []
    )

    gx_worker.start_early(["--topic", "t", "--layer", "gold", "--dry-run"])
    assert gx_worker.current() is None

    def job(*argv: str) -> tuple[int, gx_worker.ValidationWorker]:
        gx_worker.start_early(list(argv))  # what the job does first, run as a script
        early = gx_worker.current()
        assert early is not None
        code = layer_job.main(list(argv))
        assert early.proc.returncode is not None  # stopped and reaped by the end
        return int(code), early

    # user-profiles declares no bronze expectations: nothing to validate.
    assert job("--topic", "user-profiles", "--layer", "bronze")[0] == 0
    assert during.pop() is None
    # user-locations' silver does: the early worker is the one the batch uses.
    code, early = job("--topic", "user-locations", "--layer", "silver")
    assert code == 0 and during.pop() is early
    refused = job("--topic", "user-locations", "--layer", "silver", "--from-version", "-1")
    assert refused[0] == CONFIG_ERROR_EXIT
    assert during == [] and gx_worker.current() is None
