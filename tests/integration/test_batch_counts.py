"""What a warm batch makes the Spark server do, counted from its event log
(``LAKEHOUSE_SPARK_EVENT_LOG``, :mod:`lakehouse.runtime.eventlog`): a lakehouse and a server of
its own, since the batch adds records to the tables other tests read."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from lakehouse.quality.ledger import read_ledger
from lakehouse.runtime import eventlog, server
from lakehouse.runtime.config import Settings
from lakehouse.runtime.process import free_port
from lakehouse.runtime.spark import EVENT_LOG_ENV
from lakes import DEMO_TABLES, shipped_topic

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def counted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Settings]:
    """The JSON topic with the gold tables `make demo` prints, its samples, and a server writing
    its event log to ``<root>/events``."""
    root = tmp_path_factory.mktemp("counted")
    contracts = shipped_topic(root / "contracts", "user-locations", DEMO_TABLES)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LAKEHOUSE_HOME", str(root / "lakehouse"))
        mp.setenv("LAKEHOUSE_CONTRACTS", str(contracts))
        mp.setenv(server.PORT_ENV, str(free_port()))
        mp.setenv(EVENT_LOG_ENV, str(root / "events"))
        settings = Settings.from_env()
        subprocess.run(
            [sys.executable, "-m", "lakehouse.cli", "sample", "--topic", "user-locations"],
            check=True,
            capture_output=True,
        )
        server.start(settings, only="pipeline")
        try:
            yield settings
        finally:
            server.stop(settings)


def _lakehouse(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "lakehouse.cli", *args],
        env={**os.environ, "LAKEHOUSE_HOME": str(settings.home)},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


# The most Spark jobs one warm 20-record batch of a gold table may take, issue 72's goal: a
# small batch is planned so that each query is one job (runtime.spark.SMALL_BATCH_CONF).
# Measured (bench/batch_jobs.py, the shipped settings): 8 for each of these two tables; 20 and
# 19 when every batch was planned with adaptive execution.
JOBS_PER_GOLD_TABLE = 8


def test_a_batch_is_counted_by_layer_and_table(counted: Settings) -> None:
    """A warm 20-record batch of the JSON topic, counted from the server's event log: every job
    carries its layer's or its gold table's tag, each table's jobs stay under the ceiling, and
    each table written gets exactly one commit (the ledger too: one for the whole run). Every
    batch row of the ledger carries the lag its batch knew from its plan."""
    events = counted.home.parent / "events"
    warm = _lakehouse(counted, "run", "--topic", "user-locations")  # its tables exist, warm
    assert warm.returncode == 0, warm.stderr[-3000:]
    more = _lakehouse(counted, "sample", "--topic", "user-locations", "--records", "20")
    assert more.returncode == 0, more.stderr[-3000:]
    since, before = eventlog.mark(events), eventlog.table_versions(counted.home)
    started = datetime.now(UTC)
    done = _lakehouse(counted, "run", "--topic", "user-locations")
    assert done.returncode == 0, done.stderr[-3000:]
    used = eventlog.usage(events, since)
    adaptive = eventlog.adaptive_sql(events, since)
    made = eventlog.commits(before, eventlog.table_versions(counted.home))

    gold = {f"lakehouse:gold:{t}" for t in DEMO_TABLES}
    layers = {"lakehouse:bronze:user-locations", "lakehouse:silver:user-locations"}
    assert set(used) <= gold | layers | {eventlog.UNTAGGED}, sorted(used)
    assert gold | layers <= set(used), sorted(used)
    for tag in gold:
        assert 0 < used[tag].jobs <= JOBS_PER_GOLD_TABLE, (tag, used[tag].jobs)
        assert len(used[tag].sql) <= used[tag].jobs
    for tag in gold | {"lakehouse:silver:user-locations"}:  # 20 rows: a small batch
        assert not used[tag].sql & adaptive, (tag, sorted(used[tag].sql & adaptive))
    assert made == {
        "tables/bronze/user-locations": 1,
        "tables/silver/user_locations": 1,
        **{f"tables/gold/{t}": 1 for t in DEMO_TABLES},
        "quality/ledger": 1,
    }, made

    batch = {  # this run's batch rows
        (r["layer"], r["table"]): r
        for r in read_ledger(counted).to_pylist()
        if r["kind"] == "batch" and r["validated_at"] >= started
    }
    assert {t for (layer, t) in batch if layer == "gold"} == set(DEMO_TABLES), sorted(batch)
    assert {k: (r["lag"], r["lag_unit"]) for k, r in batch.items()} == {
        ("bronze", "user-locations"): (0, "records"),
        ("silver", "user_locations"): (0, "versions"),
        **{("gold", t): (0, "versions") for t in DEMO_TABLES},
    }


def test_a_batch_over_the_small_batch_rows_is_planned_adaptively(counted: Settings) -> None:
    """The same 20-record batch with LAKEHOUSE_SPARK_SMALL_BATCH_ROWS below its rows: silver
    and every gold table plan their MERGEs with adaptive execution again (the server's
    setting), and the next small batch does not."""
    events = counted.home.parent / "events"
    for limit, planned in (("5", True), ("1000", False)):
        more = _lakehouse(counted, "sample", "--topic", "user-locations", "--records", "20")
        assert more.returncode == 0, more.stderr[-3000:]
        since = eventlog.mark(events)
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("LAKEHOUSE_SPARK_SMALL_BATCH_ROWS", limit)
            done = _lakehouse(counted, "run", "--topic", "user-locations")
        assert done.returncode == 0, done.stderr[-3000:]
        used, adaptive = eventlog.usage(events, since), eventlog.adaptive_sql(events, since)
        tags = {f"lakehouse:gold:{t}" for t in DEMO_TABLES} | {"lakehouse:silver:user-locations"}
        assert {t: bool(used[t].sql & adaptive) for t in tags} == dict.fromkeys(tags, planned)
