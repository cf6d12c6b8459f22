"""kill -9 of a writer at random points, then restart from the recorded version: nothing lost,
nothing doubled, every version readable, orphaned files invisible. And several writer processes
appending at once lose nothing."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from delta_log import added_files

from lakehouse.storage import DeltaStore, delta_spark
from lakes import KILLS, S3Store

pytestmark = pytest.mark.integration

WRITER = Path(__file__).with_name("writer_proc.py")
BATCHES = 12
ROWS = 100_000


def _start(table: Path, *args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, str(WRITER), str(table), *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # its own process group: the JVM and Python workers die with it
    )


def _kill(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _orphans(table: Path) -> set[str]:
    if not (table / "_delta_log").is_dir():
        return {p.name for p in table.glob("*.parquet")}
    return {p.name for p in table.glob("*.parquet")} - added_files(table)


def _kill_when_uncommitted_files_appear(
    proc: subprocess.Popen[bytes], table: Path, limit: float
) -> bool:
    """Kill as soon as data files exist that no commit references yet (tasks wrote, the driver
    has not committed). Returns whether that moment was caught before ``limit`` seconds."""
    before = _orphans(table)
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline and proc.poll() is None:
        if _orphans(table) - before:
            _kill(proc)
            return True
        time.sleep(0.005)
    _kill(proc)
    return False


@pytest.mark.reliability
@pytest.mark.heavy  # about 3 minutes of a CI worker; CI's short rounds keep the ingest's kill -9 below
def test_kill_9_at_random_points_then_resume(spark: Any, tmp_path: Path) -> None:
    rng = random.Random(20261122)
    table = tmp_path / "t"
    caught_mid_commit = 0
    for i in range(KILLS):
        proc = _start(table, "--app", "crash", "--batches", str(BATCHES), "--rows", str(ROWS))
        if i % 2 == 0:
            time.sleep(rng.uniform(0.5, 9.0))  # anywhere: start-up, writing, committing
            _kill(proc)
        else:
            caught_mid_commit += _kill_when_uncommitted_files_appear(proc, table, limit=30)
    # Let one run finish the job.
    proc = _start(table, "--app", "crash", "--batches", str(BATCHES), "--rows", str(ROWS))
    assert proc.wait(timeout=600) == 0

    print(
        f"{KILLS} kills, {caught_mid_commit} between file writes and commit; "
        f"{len(_orphans(table))} orphaned files left for vacuum"
    )
    assert caught_mid_commit >= 3, "the kill never landed between file writes and the commit"
    store = DeltaStore(spark)
    df = store.read(table)
    assert df.count() == BATCHES * ROWS
    assert df.select("id").distinct().count() == BATCHES * ROWS
    assert store.transaction_version(table, "crash") == BATCHES
    from deltalake import DeltaTable

    latest = DeltaTable(str(table)).version()
    for v in range(latest + 1):
        rows = DeltaTable(str(table), version=v).to_pyarrow_dataset().count_rows()
        assert rows % ROWS == 0  # every version holds whole batches only


@pytest.mark.reliability  # writers racing: a fault round
@pytest.mark.heavy  # three writer JVMs, about 3 minutes of a worker: make reliability's, not CI's
def test_processes_appending_at_once_lose_nothing(spark: Any, tmp_path: Path) -> None:
    table = tmp_path / "t"
    # The table exists before the writers start, so they race on appends, not on creation.
    schema = spark.createDataFrame([], "id long, batch int, payload string").schema
    delta_spark.create_table(spark, table, schema)
    procs = [
        _start(table, "--batches", "4", "--rows", "2500", "--first-id", str(w * 1_000_000))
        for w in range(3)
    ]
    for p in procs:
        assert p.wait(timeout=600) == 0
    df = DeltaStore(spark).read(table)
    assert df.count() == 3 * 4 * 2500
    assert df.select("id").distinct().count() == 3 * 4 * 2500


INGEST_CONTRACT = """\
topic: t
partitions: 3
key: {format: string, name: k}
value: {format: json, fields: [{name: v, type: long}]}
stream: {name: t_stream}
"""


# On S3: make reliability's and make test-s3's, not CI's short rounds (too long for CI's 45 minutes).
@pytest.mark.reliability
@pytest.mark.parametrize(
    "storage", ["local", pytest.param("s3", marks=[pytest.mark.s3, pytest.mark.heavy])]
)
def test_kill_9_of_the_ingest_then_rerun(
    spark: Any, tmp_path: Path, storage: str, request: pytest.FixtureRequest
) -> None:
    """Bronze == produced, no duplicates, every bad line quarantined exactly once: with the
    landing files and the tables on local files, and in the test bucket."""
    from lakehouse.runtime import objectstore
    from lakehouse.runtime.config import Settings
    from lakehouse.topics.landing import Producer, Record

    contracts = tmp_path / "contracts"
    contracts.mkdir()
    (contracts / "t.yaml").write_text(INGEST_CONTRACT)
    data = None
    if storage == "s3":
        store: S3Store = request.getfixturevalue("s3_server")
        data = f"s3://{store.bucket}/kill/{tmp_path.name}"
    lake = Settings.from_env(tmp_path / "home", contracts, data)
    env = {**os.environ, "LAKEHOUSE_HOME": str(lake.home), "LAKEHOUSE_CONTRACTS": str(contracts)}
    env["LAKEHOUSE_DATA"] = str(lake.data_root)
    ingest = [
        str(Path(sys.executable).parent / "lakehouse"),
        "run",
        "--topic",
        "t",
        "--layer",
        "bronze",
    ]
    producer = Producer(lake, "t", 3)
    rng = random.Random(4)
    produced = 0
    for i in range(KILLS):
        producer.send_batch(
            Record(f"k{n}".encode(), b'{"v":1}', partition=n % 2)
            for n in range(produced, produced + 20_000)
        )
        produced += 20_000
        # A damaged segment in partition 2 (no producer writes there): one bad line each.
        objectstore.write_bytes(
            lake.topic_dir("t") / "partition=2" / f"t+2+{i:010d}.json", b"garbage\n"
        )
        proc = subprocess.Popen(
            ingest,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        time.sleep(rng.uniform(0.5, 8.0))
        _kill(proc)
    final = subprocess.run(
        ingest, env=env, capture_output=True, text=True, timeout=600, check=False
    )
    assert final.returncode == 0, final.stderr[-3000:]

    store = DeltaStore(spark)
    rows = store.read(lake.bronze_path("t"))
    assert rows.count() == produced
    assert rows.select("partition", "offset").distinct().count() == produced
    quarantined = store.read(lake.quarantine_path("bronze", "t")).collect()
    assert len(quarantined) == KILLS
    assert len({(q.source_file, q.line) for q in quarantined}) == KILLS


@pytest.mark.reliability  # writers racing: a fault round
@pytest.mark.heavy  # two ingest JVMs and reruns, about 2.5 minutes: make reliability's, not CI's
def test_two_ingests_of_one_topic_at_once_commit_each_batch_once(
    spark: Any, tmp_path: Path
) -> None:
    """Two bronze jobs of one topic started together (an Airflow retry beside a task still
    running): one commits, the other waits for the table's lock and then finds nothing new or
    the next batch; no record is lost or doubled, and no batch is committed twice."""
    from deltalake import DeltaTable

    from lakehouse.runtime.config import Settings
    from lakehouse.storage.log import commit_metadata
    from lakehouse.topics.bronze_table import BATCH_KEY
    from lakehouse.topics.landing import Producer, Record

    contracts = tmp_path / "contracts"
    contracts.mkdir()
    (contracts / "t.yaml").write_text(INGEST_CONTRACT)
    lake = Settings.from_env(tmp_path / "home", contracts)
    env = {**os.environ, "LAKEHOUSE_HOME": str(lake.home), "LAKEHOUSE_CONTRACTS": str(contracts)}
    ingest = [str(Path(sys.executable).parent / "lakehouse"), "run", "--topic", "t"]
    ingest += ["--layer", "bronze"]
    producer = Producer(lake, "t", 3)
    produced = 0
    for _ in range(2):
        producer.send_batch(
            Record(f"k{n}".encode(), b'{"v":1}', partition=n % 3)
            for n in range(produced, produced + 5_000)
        )
        produced += 5_000
        jobs = [
            subprocess.Popen(ingest, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            for _ in range(2)
        ]
        outputs = [job.communicate(timeout=600)[0].decode() for job in jobs]
        assert [job.returncode for job in jobs] == [0, 0], outputs

    rows = DeltaStore(spark).read(lake.bronze_path("t"))
    assert rows.count() == produced
    assert rows.select("partition", "offset").distinct().count() == produced
    history = DeltaTable(str(lake.bronze_path("t"))).history()
    batches = [commit_metadata(c, BATCH_KEY) for c in history]
    ids = sorted(b["batch_id"] for b in batches if b is not None)
    assert ids == [0, 1]
