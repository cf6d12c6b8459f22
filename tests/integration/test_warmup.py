"""The warm-up of a Spark server that has just started (:mod:`lakehouse.runtime.warmup`,
:mod:`lakehouse.pipeline.warmup`): batches of the shipped contracts on a scratch lake of the
server's own, which leave the lake, its ledger and the metastore's names as they were. A
lakehouse and a server of their own, started without a warm-up (the tests' default), which the
tests then run."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from lakehouse.contracts.catalog import Catalog
from lakehouse.pipeline import warmup as batches
from lakehouse.runtime import objectstore, server, warmup
from lakehouse.runtime.config import Settings
from lakehouse.runtime.process import alive, free_port, read_record

pytestmark = pytest.mark.integration

WARM = """
import sys
from lakehouse.pipeline import warmup
from lakehouse.runtime.config import Settings
from lakehouse.runtime import server
from lakehouse.storage import metastore
settings = Settings.from_env()
warmup.warm(settings, batches=1)
print("GX imported here:", "great_expectations" in sys.modules)
spark = server.connect(settings)
print("names in the metastore:", sorted(map(str, metastore.names(spark))))
spark.stop()
"""


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Settings]:
    """A lakehouse with the shipped samples landed and no table yet, and its server."""
    root = tmp_path_factory.mktemp("warmup")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LAKEHOUSE_HOME", str(root / "lakehouse"))
        mp.setenv(server.PORT_ENV, str(free_port()))
        mp.setenv(warmup.WARMUP_ENV, "off")
        settings = Settings.from_env()
        subprocess.run(
            [sys.executable, "-m", "lakehouse.cli", "sample"], check=True, capture_output=True
        )
        server.start(settings, only="pipeline")
        try:
            yield settings
        finally:
            server.stop(settings)


def _told(settings: Settings) -> str:
    """The end of the warm-up's log and its record, for a failed assertion to show."""
    log = warmup.log_path(settings)
    said = log.read_text(errors="replace")[-3000:] if log.exists() else "(no log)"
    return f"record: {read_record(warmup.record_path(settings))}\nlog: {said}"


def _files(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_size for p in root.rglob("*") if p.is_file()}


def test_a_warm_up_runs_every_table_on_a_scratch_lake_and_remakes_a_stale_one(
    lake: Settings,
) -> None:
    """The warm-up's batch makes every table of the shipped contracts in its scratch lake,
    validated in the server's validation service; a scratch lake it cannot run on (here a
    broken commit in a kept bronze table) is made again from empty. The lake's landing is
    unchanged, and it has no table, no ledger and no name in the metastore."""
    landing = _files(Path(str(lake.landing_root)))
    scratch = batches.scratch(lake)
    stale = Path(str(scratch.bronze_path("user-locations"))) / "_delta_log"
    stale.mkdir(parents=True)
    (stale / "00000000000000000000.json").write_text("{not a commit\n")

    done = subprocess.run(
        [sys.executable, "-c", WARM],
        env={**os.environ, "LAKEHOUSE_HOME": str(lake.home)},
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    said = done.stdout.splitlines()
    assert any("making it again" in line for line in said), done.stdout[-2000:]
    assert "warm-up batch 1 of 1" in done.stdout
    # The gates' batches went to the server's validation service: this process never loaded GX.
    assert "GX imported here: False" in said

    catalog = Catalog.load(batches.SHIPPED)
    from deltalake import DeltaTable

    for contract in catalog:
        for spec in contract.tables:
            path = scratch.gold_path(spec.name)
            assert DeltaTable(str(path)).version() >= 0, spec.name
        commits = DeltaTable(str(scratch.bronze_path(contract.topic))).history()
        assert len(commits) >= 1  # the broken log is gone: a table made anew
    assert DeltaTable(str(scratch.ledger_path)).to_pyarrow_table().num_rows > 0

    assert _files(Path(str(lake.landing_root))) == landing
    for real in (lake.tables_root, lake.ledger_path, lake.registry_path):
        assert not objectstore.exists(real), real
    # (Asked in the warm-up's process: this one may hold a Spark of its own from another test.)
    assert "names in the metastore: []" in said


def test_the_start_warms_in_the_background_and_the_stop_ends_it(
    lake: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """By default the warm-up runs beside a started server, and status says so; stopping the
    server ends it, and status then says it ended before it finished."""
    monkeypatch.delenv(warmup.WARMUP_ENV)
    assert warmup.mode() == "background"
    began = warmup.start(lake)
    assert began is not None and began.state == "warming"
    pid = read_record(warmup.record_path(lake))["pid"]
    assert isinstance(pid, int) and alive(pid), _told(lake)
    described = server.status(lake).describe()
    assert "warm-up: running since" in described, f"{described}\n{_told(lake)}"

    time.sleep(5)  # it has connected and begun its batch
    assert server.stop(lake)
    deadline = time.monotonic() + 10  # (this process reaps it: its child)
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not alive(pid), _told(lake)
    ended = warmup.state(lake)
    assert ended is not None and ended.state == "ended", f"{ended}\n{_told(lake)}"
