"""The Great Expectations validation service (lakehouse.quality.gx_service): a job validates its
pandas-sized batches there without importing GX, with the verdict and result document of
validating in its own process; a job whose service is gone validates itself."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from lakehouse.contracts.model import Expectation
from lakehouse.quality import gx_service
from lakehouse.quality.ledger import read_ledger
from lakehouse.quality.verdict import run_suite
from lakehouse.runtime import server
from lakehouse.runtime.config import Settings
from lakehouse.runtime.process import socket_answers, write_record


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
def service(settings: Settings) -> Iterator[subprocess.Popen[bytes]]:
    """The validation service of this test's lakehouse, in a process group of its own."""
    proc = server.spawn_validation_service(settings)
    path = server.validation_socket(settings)
    deadline = time.monotonic() + 180
    while not socket_answers(path):
        assert proc.poll() is None, (path.parent / "gx.log").read_text()
        assert time.monotonic() < deadline, "the validation service did not listen"
        time.sleep(0.1)
    yield proc
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)  # the service and any child it forked
    proc.wait(timeout=60)


def _python(code: str, settings: Settings, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=os.environ | {"LAKEHOUSE_HOME": str(settings.home), **env},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def test_a_job_gets_the_verdict_of_its_own_process_without_importing_gx(
    settings: Settings, service: subprocess.Popen[bytes], tmp_path: Path
) -> None:
    batch = tmp_path / "batch.arrow"
    with pa.ipc.new_file(batch, BATCH.schema) as out:
        out.write_table(BATCH)
    names = [e.name for e in EXPECTATIONS]
    done = _python(
        f"""
        import json, sys
        import pyarrow as pa
        from lakehouse.quality import gx_service
        from lakehouse.runtime import server
        from lakehouse.runtime.config import Settings
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from test_gx_service import EXPECTATIONS
        from lakehouse.quality.verdict import run_suite
        batch = pa.ipc.open_file({str(batch)!r}).read_all()
        path = server.validation_socket(Settings.from_env())
        outcomes, engine, document = run_suite("silver.t", EXPECTATIONS, batch, 6, service=gx_service.client(path))
        print(json.dumps({{
            "outcomes": [[o.expectation, o.success, o.unexpected_count, list(o.sample)]
                         for o in outcomes],
            "engine": engine,
            "document": document,
            "gx_imported": "great_expectations" in sys.modules,
        }}))
        """,
        settings,
    )
    assert done.returncode == 0, done.stderr
    assert "validating in this process" not in done.stderr
    seen = json.loads(done.stdout)
    assert seen["gx_imported"] is False
    here, here_engine, here_document = run_suite("silver.t", EXPECTATIONS, BATCH, 6)
    assert seen["engine"] == here_engine == "pandas"
    assert seen["outcomes"] == [
        [o.expectation, o.success, o.unexpected_count, list(o.sample)] for o in here
    ]
    assert [o[0] for o in seen["outcomes"]] == names
    assert _stable(seen["document"]) == _stable(json.loads(json.dumps(here_document)))
    verdicts = {o[0]: (o[1], o[2]) for o in seen["outcomes"]}
    assert verdicts == {
        "rows": (True, None),
        "user_present": (False, 1),
        "user_unique": (False, 2),
        "lat_range": (False, 2),
        "known_city": (False, 2),
        "user_shape": (False, 1),
        "city_length": (False, 1),
    }
    assert service.poll() is None  # it answered and is still there


def test_a_job_whose_service_died_validates_itself(
    settings: Settings, service: subprocess.Popen[bytes], capfd: pytest.CaptureFixture[str]
) -> None:
    path = server.validation_socket(settings)
    expected, _, _ = run_suite("silver.t", EXPECTATIONS, BATCH, 6)
    service.kill()
    service.wait()
    outcomes, engine, _ = run_suite(
        "silver.t", EXPECTATIONS, BATCH, 6, service=gx_service.client(path)
    )
    assert (outcomes, engine) == (expected, "pandas")
    err = capfd.readouterr().err
    assert f"quality: no answer from the validation service at {path}" in err
    assert "validating in this process" in err


def test_an_error_in_the_service_is_raised_in_the_job_too(
    settings: Settings, service: subprocess.Popen[bytes], capfd: pytest.CaptureFixture[str]
) -> None:
    """A failure of GX on the batch is not swallowed: the job validates again and raises it,
    and the service stays up for the next batch."""
    path = server.validation_socket(settings)
    bad = [_e("odd", "no_such_kind", "warn", "user")]
    with pytest.raises(ValueError, match="unknown expectation kind 'no_such_kind'"):
        run_suite("silver.t", bad, BATCH, 6, service=gx_service.client(path))
    assert (
        "the validation service failed: ValueError: unknown expectation" in capfd.readouterr().err
    )
    outcomes, _, _ = run_suite(
        "silver.t", EXPECTATIONS[:1], BATCH, 6, service=gx_service.client(path)
    )
    assert [o.success for o in outcomes] == [True]
    assert "validating in this process" not in capfd.readouterr().err


CONTRACT = """\
topic: service-check
partitions: 2
key: {format: string, name: user}
value:
  format: json
  fields:
    - {name: city, type: string}
stream: {name: service_check}
tables:
  - {name: service_check_latest, kind: latest}
expectations:
  bronze:
    - {name: partition_ok, expect: between, column: partition, min: 0, max: 1, severity: fail}
  silver:
    - {name: user_present, expect: not_null, column: user, severity: quarantine}
    - {name: city_known, expect: in_set, column: city, values: [Oslo, Lima], severity: warn}
  gold:
    - {name: one_row_per_user, table: service_check_latest, expect: unique, column: user, severity: fail}
"""


def test_a_gated_run_validates_every_layer_in_the_service(
    settings: Settings, service: subprocess.Popen[bytes], tmp_path: Path
) -> None:
    """`lakehouse run` of a gated topic, every layer a Spark job of its own process: each
    verdict is in the ledger as GX judged it, and the job never imported GX."""
    contracts = tmp_path / "contracts"
    contracts.mkdir()
    (contracts / "service-check.yaml").write_text(CONTRACT)
    records = [("ana", "Oslo"), ("bo", "Lima"), ("ana", "Rome")]
    lines = "".join(json.dumps({"key": u, "value": {"city": c}}) + "\n" for u, c in records)
    (tmp_path / "records.jsonl").write_text(lines)
    done = _python(
        f"""
        import json, sys
        from lakehouse.cli import main
        with open({str(tmp_path / "records.jsonl")!r}) as records:
            sys.stdin = records
            produced = main(["produce", "service-check"])
        ran = main(["run", "--topic", "service-check"])
        print(json.dumps({{"codes": [produced, ran],
                           "gx_imported": "great_expectations" in sys.modules}}))
        """,
        settings,
        LAKEHOUSE_CONTRACTS=str(contracts),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "validating in this process" not in done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == {"codes": [0, 0], "gx_imported": False}
    ledger = read_ledger(settings).to_pylist()
    seen = sorted(
        (r["layer"], r["table"], r["expectation"], r["success"], r["unexpected_count"])
        for r in ledger
        if r["engine"] == "pandas"
    )
    assert seen == [
        ("bronze", "service-check", "partition_ok", True, 0),
        ("gold", "service_check_latest", "one_row_per_user", True, 0),
        ("silver", "service_check", "city_known", False, 1),
        ("silver", "service_check", "user_present", True, 0),
    ]
    assert all(r["published"] for r in ledger)


def _record_a_dead_server(settings: Settings, validation_pid: int) -> None:
    """server.json as a server whose JVM was killed (kill -9) leaves it: its pid dead, its
    validation service's recorded."""
    gone = subprocess.Popen(["true"])
    gone.wait()
    server.state_dir(settings).mkdir(parents=True, exist_ok=True)
    write_record(
        server.state_dir(settings) / "server.json",
        {"pid": gone.pid, "validation_pid": validation_pid, "port": 1},
    )


def test_stop_after_the_server_died_ends_its_validation_service(
    settings: Settings, service: subprocess.Popen[bytes]
) -> None:
    _record_a_dead_server(settings, service.pid)
    assert not server.stop(settings)  # no server was running
    assert service.wait(timeout=30) is not None
    assert not server.validation_socket(settings).exists()
    assert not (server.state_dir(settings) / "server.json").exists()


def test_start_after_the_server_died_ends_its_validation_service_first(
    settings: Settings, service: subprocess.Popen[bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before it spawns a service of its own; here the start then fails (its port is taken),
    after the cleanup."""
    _record_a_dead_server(settings, service.pid)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        monkeypatch.setenv(server.PORT_ENV, str(taken.getsockname()[1]))
        with pytest.raises(server.ServerError, match="is taken by another process"):
            server.start(settings)
    assert service.wait(timeout=30) is not None


# A process that reports the signals it gets: it blocks them (a blocked signal stays pending),
# says "ready", takes them one by one until SIGUSR1, then prints the names of those it took and
# of those still pending, and exits.
_SIGNAL_REPORTER = textwrap.dedent(
    """\
    import signal
    watched = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1}
    signal.pthread_sigmask(signal.SIG_BLOCK, watched)
    print("ready", flush=True)
    got = []
    while signal.SIGUSR1 not in got:
        got.append(signal.Signals(signal.sigwaitinfo(watched).si_signo))
    got += sorted(signal.sigpending() & watched)
    print(" ".join(sig.name for sig in got), flush=True)
    """
)


def test_a_recorded_service_pid_reused_by_another_process_is_left_alone(
    settings: Settings,
) -> None:
    """stop() sends no signal to a process that merely has the recorded pid. kill(2) makes a
    signal pending before it returns: the process reports what it got or has pending once it
    takes a SIGUSR1 sent after stop() returned, so a signal stop() sent is in the report (or
    the process is dead, for SIGKILL)."""
    other = subprocess.Popen(
        [sys.executable, "-c", _SIGNAL_REPORTER],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert other.stdout is not None
        assert other.stdout.readline() == "ready\n"
        _record_a_dead_server(settings, other.pid)
        assert not server.stop(settings)
        other.send_signal(signal.SIGUSR1)
        out, _ = other.communicate(timeout=30)
        assert (other.returncode, out) == (0, "SIGUSR1\n")
    finally:
        if other.poll() is None:
            other.kill()
            other.wait()
