"""Faults of a bronze ingest from a Kafka broker (issue 29, point 7): kill -9 of the ingest itself
at random points, and kill -9 of the broker under it; each time a rerun (the broker restarted
first, on its own storage). Bronze must then equal what was produced, offset by offset: each
(partition, offset) the broker acknowledged exactly once, with its key, value, timestamp and
headers; each batch committed once, and every version of the table holding whole batches.

The ingest is the job Airflow's operator runs (spark-submit of jobs/run_layer.py on a local Spark,
:func:`faults.start_job`) for a contract whose source is the broker. More records are produced
before each round, so the kills meet the job in different states: starting, planning, reading,
writing, committing, or meeting what a killed run left. The ingest's kills use the test session's
broker (``kafka_broker``); the broker's kills a broker of the test's own (lakehouse.runtime.broker in a
temporary folder), restarted on the same port and storage.

A broker that does not answer when the ingest starts: tests/integration/test_kafka_source.py::
test_an_unreachable_broker_fails_the_ingest_in_bounded_time_and_commits_nothing; through
Airflow, whose retry succeeds once the broker is back: tests/e2e/test_airflow.py::
test_a_task_whose_broker_is_down_fails_and_its_retry_succeeds.

Size: ``LAKEHOUSE_RELIABILITY_KILLS`` kills in each test (``lakes.KILLS``: 1 in CI), at most 10, the
issue's count, which ``make reliability`` reaches. Every round here is ``heavy`` (not in CI's
short rounds): each ingest is a JVM of its own, about 3 minutes even at one kill, and a round
whose broker dies under Spark's read waits out the Kafka clients' timeouts (see
:data:`FAIL_BOUND_S`).
``LAKEHOUSE_RELIABILITY_SEED`` replays the kill points (the seed is printed, and named in every
failure).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import signal
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from faults import (
    SEED,
    Job,
    Kill,
    Lake,
    commit_versions,
    kill_plan,
    log_leftovers,
    newest,
    orphans,
    run_id,
    run_job,
    start_job,
    wait_for_data_commit,
)

from lakehouse.contracts.catalog import Catalog
from lakehouse.contracts.model import Contract
from lakehouse.runtime.broker import Broker, BrokerError
from lakehouse.runtime.process import alive, free_port
from lakehouse.topics import kafka
from lakehouse.topics.landing import Record
from lakes import KILLS

ROUNDS = min(KILLS, 10)
TOPIC = "orders"
PARTITIONS = 3
RECORDS = 30_000  # produced before each round
TS0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z, in ms
# An ingest whose broker died must have failed by then. What it waits for, at Kafka's defaults:
# Spark's offset reader in the driver makes fetchOffset.numRetries (3) attempts of
# default.api.timeout.ms each (bronze sets 15 s; the Java client's default is 60 s, which took up
# to 190 s here); its consumers in the tasks give up after one; the platform's own admin
# requests after kafka.TIMEOUT_S (15 s) each. The bound leaves room for a loaded machine.
FAIL_BOUND_S = 300.0

pytestmark = [
    pytest.mark.reliability,
    pytest.mark.integration,  # Spark, Java and a broker: not part of `make unit`
    pytest.mark.timeout(900 + ROUNDS * 600),
]


def _contract_text(kafka_topic: str, servers: str) -> str:
    return (
        f"topic: {TOPIC}\n"
        "description: Orders from a Kafka broker, for the fault tests.\n"
        f"partitions: {PARTITIONS}\n"
        "key: {format: string, name: customer}\n"
        "value: {format: json, fields: [{name: amount, type: long, nullable: true}]}\n"
        "stream: {name: orders_stream}\n"
        f"kafka: {{topic: {kafka_topic}, bootstrap_servers: '{servers}'}}\n"
    )


def _kafka_lake(root: Path, servers: str) -> tuple[Lake, Contract]:
    """A lakehouse root whose one topic is read from a new topic of the broker at ``servers``."""
    (root / "contracts").mkdir(parents=True)
    (root / "logs").mkdir()
    kafka_topic = f"{TOPIC}-{uuid.uuid4().hex[:8]}"
    (root / "contracts" / f"{TOPIC}.yaml").write_text(_contract_text(kafka_topic, servers))
    lake = Lake(root)
    contract = Catalog.load(lake.settings.contracts_dir).topic(TOPIC)
    assert kafka.create_topic(kafka.client(lake.settings, contract), PARTITIONS)
    return lake, contract


def _records(batch: int) -> list[Record]:
    """Batch ``batch``'s records, the same in every run: keyed (so spread by the key's hash) and
    keyless, tombstones, values of varied sizes, headers (one without a value) on some."""
    rng = random.Random(batch)
    records = []
    for i in range(RECORDS):
        n = batch * RECORDS + i
        key = None if rng.random() < 0.02 else f"customer-{rng.randrange(500)}".encode()
        value = (
            None
            if rng.random() < 0.02
            else json.dumps({"amount": n, "note": "x" * rng.randrange(200)}).encode()
        )
        headers: tuple[tuple[str, bytes | None], ...] = ()
        if rng.random() < 0.1:
            headers = (("trace", f"t-{n}".encode()), ("empty", None))
        records.append(Record(key, value, TS0 + n, headers))
    return records


@dataclass
class Produced:
    """What the broker acknowledged, by (partition, offset)."""

    records: dict[tuple[int, int], Record] = field(default_factory=dict)
    batches: int = 0

    def send(self, lake: Lake, contract: Contract) -> None:
        records = _records(self.batches)
        client = kafka.client(lake.settings, contract)
        sent = kafka.Producer(client, PARTITIONS).send_batch(records)
        for rec, meta in zip(records, sent, strict=True):
            assert (meta.partition, meta.offset) not in self.records, meta
            self.records[(meta.partition, meta.offset)] = rec
        self.batches += 1


def bronze_problems(lake: Lake, produced: Produced) -> list[str]:
    """Bronze against what was produced, offset by offset."""
    from lakehouse.storage import read_arrow

    columns = ["partition", "offset", "key", "value", "timestamp", "headers"]
    rows = read_arrow(lake.settings.bronze_path(TOPIC)).select(columns).to_pylist()
    seen = Counter((r["partition"], r["offset"]) for r in rows)
    problems = []
    if doubled := sorted(k for k, n in seen.items() if n > 1):
        problems.append(f"{len(doubled)} offsets more than once in bronze, e.g. {doubled[:3]}")
    if missing := sorted(produced.records.keys() - seen.keys()):
        problems.append(f"{len(missing)} produced offsets not in bronze, e.g. {missing[:3]}")
    if extra := sorted(seen.keys() - produced.records.keys()):
        problems.append(f"{len(extra)} offsets in bronze never produced, e.g. {extra[:3]}")
    differ = []
    for r in rows:
        rec = produced.records.get((r["partition"], r["offset"]))
        if rec is None:
            continue
        got = (
            r["key"],
            r["value"],
            round(r["timestamp"].timestamp() * 1000),
            tuple((h["key"], h["value"]) for h in r["headers"]),
        )
        if got != (rec.key, rec.value, rec.timestamp_ms, rec.headers):
            differ.append((r["partition"], r["offset"]))
    if differ:
        problems.append(f"{len(differ)} records differ from what was produced, e.g. {differ[:3]}")
    return problems


def batch_problems(path: Path) -> list[str]:
    """Each batch committed once, in order, as the table's app transaction says; and every
    version holding the whole batches committed up to it, and no others."""
    from deltalake import DeltaTable

    from lakehouse.storage.log import commit_metadata
    from lakehouse.topics.bronze_table import BATCH_KEY, BRONZE_APP

    table = DeltaTable(str(path))
    committed = sorted(
        (c["version"], b["batch_id"])
        for c in table.history()
        if (b := commit_metadata(c, BATCH_KEY)) is not None
    )
    ids = [batch for _, batch in committed]
    problems = []
    if ids != list(range(len(ids))):
        problems.append(f"batches committed in the log, in order: {ids}")
    if ids and table.transaction_version(BRONZE_APP) != ids[-1]:
        problems.append(f"app transaction {table.transaction_version(BRONZE_APP)}, not {ids[-1]}")
    final = _batch_counts(path, None)
    for version in range(table.version() + 1):
        want = {b: final.get(b) for v, b in committed if v <= version}
        got = _batch_counts(path, version)
        if got != want:
            problems.append(f"version {version} holds batches {got}, expected {want}")
    return problems


def _batch_counts(path: Path, version: int | None) -> dict[int, int]:
    from deltalake import DeltaTable

    table = DeltaTable(str(path), version=version)
    ids = table.to_pyarrow_dataset().to_table(columns=["_batch_id"]).column(0).to_pylist()
    return dict(Counter(ids))


def _error(job: Job) -> str:
    """What the job said last about its failure (its ``error:`` line, or the last exception)."""
    lines = [
        line.strip()
        for line in job.output().splitlines()
        if re.match(r"^(error: |\S*(Error|Exception)\b)", line.strip())
    ]
    return lines[-1][:300] if lines else "(no error line)"


def _wait_or_kill(job: Job, kill: Kill, measured: float, table: Path) -> None:
    """Wait for the planned moment of ``kill`` (the job's first data commit, or a fraction of
    its measured duration) or for the job's end, whichever comes first."""
    if kill.kind == "commit":
        wait_for_data_commit(job, [table], {table: commit_versions(table)})
        return
    while job.running() and job.elapsed() < kill.fraction * measured:
        time.sleep(0.01)


def _assert_bronze(lake: Lake, produced: Produced, log: list[str]) -> None:
    path = lake.settings.bronze_path(TOPIC)
    problems = bronze_problems(lake, produced) + batch_problems(path)
    assert problems == [], "\n".join(problems + log)
    # A writer killed while writing a commit leaves its temporary file: reported, not an error.
    print(
        f"bronze: {len(produced.records)} records in {len(commit_versions(path))} versions; "
        f"left by the kills: {orphans(path)} uncommitted data files, in _delta_log "
        f"{log_leftovers(path) or 'nothing odd'}"
    )


# -- kill -9 of the ingest ---------------------------------------------------------------------


@pytest.mark.heavy  # a JVM per ingest, about 3 minutes even at one kill: not CI's short rounds
def test_kill_9_of_the_ingest_at_random_points_then_rerun(
    kafka_broker: Any, tmp_path: Path
) -> None:
    """Records are produced before each round; the ingest is started and killed as planned
    (:func:`faults.kill_plan`: a third right after its Delta commit, the others at random
    moments of its measured duration), and rerun to its end every other round and at the end.
    A kill that finds the job ended is made up for by another."""
    rng = random.Random(SEED)
    lake, contract = _kafka_lake(tmp_path / "lake", kafka_broker.bootstrap_servers)
    path = lake.settings.bronze_path(TOPIC)
    produced = Produced()
    log = [f"seed {SEED}: {ROUNDS} kills of the ingest"]
    produced.send(lake, contract)
    _, measured = run_job(lake, "bronze", run_id(0), topic=TOPIC)
    log.append(f"first ingest, unkilled: {measured:.1f} s")
    todo, killed, tries = kill_plan(rng, ROUNDS), 0, 0
    while todo:
        kill = todo.pop(0)
        tries += 1
        produced.send(lake, contract)
        before = newest(path)
        job = start_job(lake, "bronze", run_id(produced.batches), topic=TOPIC)
        _wait_or_kill(job, kill, measured, path)
        at = job.elapsed()
        what = (
            "at its commit" if kill.kind == "commit" else f"after {kill.fraction * measured:4.1f} s"
        )
        if job.kill():
            killed += 1
            state = "committed" if newest(path) != before else "nothing committed"
            log.append(
                f"kill -9 of the ingest {what} (at {at:4.1f} s): {state}; "
                f"{orphans(path)} uncommitted data files on disk"
            )
        else:
            code = job.proc.returncode
            log.append(f"         the ingest {what}: ended first (exit {code})")
            assert code == 0, f"the ingest failed unkilled:\n{job.tail()}\n" + "\n".join(log)
            measured = at
            if tries < 3 * ROUNDS:
                todo.append(Kill("random", rng.uniform(0, 0.9)))
        if tries % 2 == 0 or not todo:
            _, took = run_job(lake, "bronze", run_id(produced.batches), topic=TOPIC)
            log.append(f"   rerun of the ingest: done in {took:.1f} s")
    print("\n".join(log))

    assert killed >= ROUNDS, f"{killed} kills, wanted {ROUNDS}\n" + "\n".join(log)
    _assert_bronze(lake, produced, log)


# -- kill -9 of the broker ---------------------------------------------------------------------


@dataclass
class OwnBroker:
    """A broker of the test's own, restarted on the same port and storage after each kill."""

    broker: Broker
    port: int

    @classmethod
    def start(cls, root: Path) -> OwnBroker:
        broker, attempts = Broker(root), 3
        while True:
            # A free port can be taken before the broker binds it: then another is tried.
            port = free_port()
            try:
                broker.start(port)
                return cls(broker, port)
            except BrokerError:
                attempts -= 1
                if not attempts:
                    raise

    @property
    def servers(self) -> str:
        return f"127.0.0.1:{self.port}"

    def kill(self) -> None:
        """kill -9 of the broker's process group (its JVM)."""
        pid = self.broker.status().pid
        assert pid is not None, "the broker is not running"
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while alive(pid):
            assert time.monotonic() < deadline, f"the broker's pid {pid} outlives kill -9"
            time.sleep(0.02)

    def restart(self) -> float:
        started = time.monotonic()
        self.broker.start(self.port)
        return time.monotonic() - started


@pytest.fixture
def own_broker(tmp_path: Path) -> Iterator[OwnBroker]:
    broker = OwnBroker.start(tmp_path / "kafka")
    try:
        yield broker
    finally:
        broker.broker.stop()


# Three minutes at two kills: not in CI's short rounds, as the other layer-job rounds.
@pytest.mark.heavy
def test_kill_9_of_the_broker_during_an_ingest_then_restart_and_rerun(
    own_broker: OwnBroker, tmp_path: Path
) -> None:
    """Records are produced before each round; the ingest is started and the broker killed as
    planned (right after the ingest's Delta commit, or at a random moment of its measured
    duration). An ingest that had not committed must fail within :data:`FAIL_BOUND_S` and
    commit nothing; one that had committed must succeed (the consumer group only mirrors the
    position: a warning). The broker restarts on its storage and port, and the rerun succeeds."""
    rng = random.Random(SEED + 1)
    lake, contract = _kafka_lake(tmp_path / "lake", own_broker.servers)
    path = lake.settings.bronze_path(TOPIC)
    produced = Produced()
    log = [f"seed {SEED}: {ROUNDS} kills of the broker"]
    produced.send(lake, contract)
    _, measured = run_job(lake, "bronze", run_id(0), topic=TOPIC)
    log.append(f"first ingest, unkilled: {measured:.1f} s")
    todo, killed, tries, failed_in = kill_plan(rng, ROUNDS), 0, 0, []
    while todo:
        kill = todo.pop(0)
        tries += 1
        produced.send(lake, contract)
        before = commit_versions(path)
        job = start_job(lake, "bronze", run_id(produced.batches), topic=TOPIC)
        _wait_or_kill(job, kill, measured, path)
        what = (
            "at its commit" if kill.kind == "commit" else f"after {kill.fraction * measured:4.1f} s"
        )
        if not job.running():
            code = job.wait()
            log.append(f"         the broker {what}: the ingest ended first (exit {code})")
            assert code == 0, f"the ingest failed unkilled:\n{job.tail()}\n" + "\n".join(log)
            measured = job.elapsed()
            if tries < 3 * ROUNDS:
                todo.append(Kill("random", rng.uniform(0, 0.9)))
            continue
        own_broker.kill()
        killed += 1
        at = job.elapsed()
        code = job.wait(timeout=FAIL_BOUND_S)
        took = job.elapsed() - at
        committed = commit_versions(path) != before
        log.append(
            f"kill -9 of the broker {what} (at {at:4.1f} s of the ingest): the ingest "
            f"{'committed, ' if committed else 'committed nothing, '}exit {code} "
            f"{took:.1f} s after the kill: {_error(job) if code else 'ok'}"
        )
        context = f"{job.tail()}\n" + "\n".join(log)
        if committed:
            assert code == 0, f"the ingest committed, then failed:\n{context}"
        else:
            assert code != 0, f"the ingest succeeded without committing:\n{context}"
            assert log_leftovers(path) == [], context
            failed_in.append(took)
        restart = own_broker.restart()
        _, rerun = run_job(lake, "bronze", run_id(produced.batches), topic=TOPIC)
        log.append(f"   broker restarted in {restart:.1f} s; the rerun done in {rerun:.1f} s")
    print("\n".join(log))

    assert killed >= ROUNDS, f"{killed} kills, wanted {ROUNDS}\n" + "\n".join(log)
    _assert_bronze(lake, produced, log)
    print(f"failed ingests ended {[round(t, 1) for t in failed_in]} s after the broker's kill")
