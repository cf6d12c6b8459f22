"""Fault injection on the layer jobs, run as Airflow's operator runs them (spark-submit of
jobs/run_layer.py with the DAG run's id): kill -9 of each layer's job at random points, then
rerun; the same task rerun three times, and two copies of it at once; table maintenance
(compaction, vacuum, checkpoints) while the jobs write. Each time, every table (bronze, silver,
both quarantines, gold and the gold state table) must equal a clean run's as a multiset of rows
(nothing lost, nothing doubled), and every version of every Delta table must stay readable.
Left out of the comparison: bronze's ``_ingested_at`` (when the ingest ran). The data-quality
ledger is not compared row by row (each row carries its validation's time and job run, and a
killed try may have validated a batch it never published); its verdicts on published batches
must judge the same rows as the clean run's, each recorded once.

Size: ``LAKEHOUSE_RELIABILITY_KILLS`` kills per layer (default 1; ``make reliability``, which
runs this module, sets 20); ``LAKEHOUSE_RELIABILITY_SEED`` replays a run's kill points (the seed
is printed, and named in every failure). The same kills of the Spark server under the layers' clients:
test_server_faults.py.

What is proven elsewhere is not repeated here: kill -9 of a storage writer and of the bronze
ingest in-process (tests/integration/test_crash_safety.py), maintenance during appends at the
storage level (tests/integration/test_storage.py::test_maintenance_during_appends_keeps_exact_rows),
and a failing `fail` expectation leaving every downstream version unchanged: silver's gate
leaves silver, its quarantine and gold at their versions
(tests/integration/test_quality_gates.py::test_fail_on_silver_publishes_nothing_and_stops_the_run),
gold's and bronze's leave their tables (test_fail_on_gold_judges_the_rows_after_the_merge,
test_fail_on_bronze_leaves_no_version_and_no_files), and through Airflow the failed task stops
the run before the next layer (tests/e2e/test_airflow.py::
test_failed_gate_fails_the_dag_run_publishes_nothing_and_notifies).
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from faults import (
    BATCHES,
    KILLS,
    LAYER_TABLES,
    LAYERS,
    SEED,
    STREAM,
    Job,
    Kill,
    Lake,
    advanced,
    assert_same_tables,
    commit_versions,
    invariants,
    kill_plan,
    layer_state,
    make_lake,
    orphans,
    produce,
    read_every_version,
    run_id,
    run_job,
    start_job,
    versions,
    wait_for_data_commit,
)

pytestmark = [
    pytest.mark.reliability,
    pytest.mark.integration,  # Spark and Java: not part of `make unit`
    # About 22 minutes of a CI worker at one kill per layer (the clean run alone, a cold
    # spark-submit per layer job, about 8): `make reliability` runs them, CI's short rounds not.
    pytest.mark.heavy,
    pytest.mark.timeout(1800 + KILLS * len(LAYERS) * 90),
]


@dataclass
class Rerun:
    """One of the second and third runs of a task of the reference run's first DAG run."""

    layer: str
    code: int
    committed: list[str]  # tables it added commits to
    same_ledger: bool  # the run's rows in the data-quality ledger are those of the first run
    same_verdict: bool  # and the gate task's verdict on silver reads the same
    tail: str


@dataclass
class Reference:
    """The clean run: per landing batch, each layer's job in order. In the first DAG run each
    task is run three times in a row (run, then cleared and run again, twice): the reruns must
    change nothing, so the reference is also a single run's."""

    lake: Lake
    durations: dict[str, list[float]] = field(default_factory=dict)  # per layer, per batch
    after: list[dict[str, int | None]] = field(default_factory=list)  # versions after a batch
    reruns: list[Rerun] = field(default_factory=list)
    silver_verdict: list[str] = field(default_factory=list)


def _ledger_rows(lake: Lake, dag_run_id: str) -> list[str]:
    from lakehouse.quality.ledger import read_ledger

    return sorted(map(str, read_ledger(lake.settings, dag_run_id=dag_run_id).to_pylist()))


def _silver_verdict(lake: Lake, dag_run_id: str) -> list[str]:
    from lakehouse.quality.reports import layer_verdict

    return layer_verdict(lake.settings, dag_run_id, "silver", [STREAM])[0]


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Reference:
    ref = Reference(make_lake(tmp_path_factory.mktemp("reference")))
    lake = ref.lake
    for batch in range(BATCHES):
        produce(lake, batch)
        for layer in LAYERS:
            _, took = run_job(lake, layer, run_id(batch))
            ref.durations.setdefault(layer, []).append(took)
            if batch > 0:
                continue
            once = versions(lake), _ledger_rows(lake, run_id(0)), _silver_verdict(lake, run_id(0))
            for _ in range(2):
                job = start_job(lake, layer, run_id(0))
                code = job.wait()
                ref.reruns.append(
                    Rerun(
                        layer,
                        code,
                        advanced(once[0], versions(lake)),
                        _ledger_rows(lake, run_id(0)) == once[1],
                        _silver_verdict(lake, run_id(0)) == once[2],
                        job.tail(),
                    )
                )
        ref.after.append(versions(lake))
    ref.silver_verdict = _silver_verdict(lake, run_id(0))
    print(f"reference run: job durations (s) {_rounded(ref.durations)}")
    return ref


def _rounded(durations: dict[str, list[float]]) -> dict[str, list[float]]:
    return {k: [round(v, 1) for v in vs] for k, vs in durations.items()}


# -- kill -9 of each layer's job --------------------------------------------------------------


@dataclass
class KillLog:
    lines: list[str] = field(default_factory=list)
    kills: dict[str, int] = field(default_factory=dict)
    between_commits: int = 0

    def text(self) -> str:
        return f"seed {SEED}\n" + "\n".join(self.lines)


def _attempt(
    lake: Lake, layer: str, batch: int, kill: Kill, measured: dict[str, float], log: KillLog
) -> bool:
    """Start the layer's job and kill -9 it as planned; True if it was killed while running.
    A job that ends first is measured: the next kills of its layer are drawn within that."""
    tables = [lake.tables()[n] for n in LAYER_TABLES[layer]]
    seen = {p: commit_versions(p) for p in tables}
    before = layer_state(lake, layer)
    delay = kill.fraction * measured[layer]
    job: Job = start_job(lake, layer, run_id(batch))
    if kill.kind == "commit":
        wait_for_data_commit(job, tables, seen)
    else:
        while job.running() and job.elapsed() < delay:
            time.sleep(0.01)
    at = job.elapsed()
    killed = job.kill()
    what = "at its first commit" if kill.kind == "commit" else f"after {delay:4.1f} s"
    if not killed:
        code = job.proc.returncode
        measured[layer] = at
        log.lines.append(f"        {layer:6} batch {batch} {what}: ended first (exit {code})")
        assert code == 0, f"{layer} job failed unkilled:\n{job.tail()}\n{log.text()}"
        return False
    after = layer_state(lake, layer)
    moved = advanced(before, after)
    order = LAYER_TABLES[layer]
    # The layer's first table committed and its last not: the job died between its commits.
    between = order[0] in moved and order[-1] not in moved
    log.kills[layer] = log.kills.get(layer, 0) + 1
    log.between_commits += between
    state = (
        f"committed {', '.join(moved)}" + (" (between its commits)" if between else "")
        if moved
        else "nothing committed"
    )
    stray = sum(orphans(p) for p in tables)
    log.lines.append(
        f"kill -9 {layer:6} batch {batch} {what} (at {at:4.1f} s): {state}; "
        f"{stray} uncommitted data files on disk"
    )
    return True


def _finish(lake: Lake, layer: str, batch: int, measured: dict[str, float], log: KillLog) -> None:
    """The rerun after the kills: it must succeed (a task's retry)."""
    job = start_job(lake, layer, run_id(batch))
    code = job.wait()
    measured[layer] = job.elapsed()
    log.lines.append(f"   rerun {layer:6} batch {batch}: exit {code} after {job.elapsed():.1f} s")
    assert code == 0, f"the rerun of {layer} failed:\n{job.tail()}\n{log.text()}"


def _kills_in(layer: str, batch: int) -> bool:
    """The batches in which a layer's job is killed: bronze and silver in every one; gold once
    the stream has data (after silver's first rerun to success) and in the last."""
    return layer != "gold" or batch % 2 == 1 or batch == BATCHES - 1


def _finishes_in(layer: str, batch: int) -> bool:
    """The batches after whose kills a layer's job is rerun to success: bronze every one (so
    bronze's batches are cut as in the clean run's and ``_batch_id`` compares); silver every
    other one, the first not, and the last; gold only in the last. A job left killed meets new
    input in its next run (a failed DAG run, then the next scheduled one): silver's rerun after
    new bronze batches, gold's after new stream versions."""
    return layer == "bronze" or batch == BATCHES - 1 or (layer == "silver" and batch % 2 == 1)


def test_kill_9_of_each_layer_job_then_rerun(reference: Reference, tmp_path: Path) -> None:
    """Landing batches arrive one by one; in each, the layers' jobs are started and killed as
    planned (:func:`faults.kill_plan`, :func:`_kills_in`), then rerun to success
    (:func:`_finishes_in`). Every kill that finds the job already ended is made up for by
    another later. Finally every table equals the clean run's (the stream and the tables do not
    depend on how their input was cut into batches), and every version of every table reads."""
    print(f"seed {SEED}: {KILLS} kills per layer over {BATCHES} landing batches")
    rng = random.Random(SEED)
    lake = make_lake(tmp_path / "killed")
    log = KillLog()
    last = BATCHES - 1
    # The job's duration, first as the clean run measured it, then as each of its runs here
    # that ended by itself did (this machine's load changes).
    measured = {layer: max(reference.durations[layer]) for layer in LAYERS}
    # Per layer and batch, the kills; the one at a commit first, while the batch has all its
    # work to do. The reruns killed after it at random moments mostly die before finishing
    # that work, so in a batch that does not end with a rerun to success, the half-done state
    # is usually what the next batch's runs meet.
    plans: dict[str, dict[int, list[Kill]]] = {}
    for layer in LAYERS:
        batches = [b for b in range(BATCHES) if _kills_in(layer, b)]
        plans[layer] = {b: [] for b in batches}
        for i, kill in enumerate(kill_plan(rng, KILLS)):
            plans[layer][batches[i % len(batches)]].append(kill)
        for kills in plans[layer].values():
            kills.sort(key=lambda k: k.kind != "commit")
    owed = dict.fromkeys(LAYERS, 0)  # kills that found the job ended, to make up for
    tries = dict.fromkeys(LAYERS, 0)

    def another() -> Kill:
        return Kill("random", rng.uniform(0, 0.9))

    for batch in range(BATCHES):
        produce(lake, batch)
        for layer in LAYERS:
            if batch in plans[layer]:
                todo = [another() for _ in range(owed[layer])] + plans[layer][batch]
                owed[layer] = 0
                while todo:
                    kill = todo.pop(0)
                    tries[layer] += 1
                    if _attempt(lake, layer, batch, kill, measured, log):
                        continue
                    if batch < last:
                        owed[layer] += 1
                    elif tries[layer] < 4 * KILLS:
                        todo.append(another())
            if _finishes_in(layer, batch):
                _finish(lake, layer, batch, measured, log)
    print(log.text())

    assert all(log.kills.get(layer, 0) >= KILLS for layer in LAYERS), (
        f"kills per layer {log.kills}, wanted {KILLS} each\n{log.text()}"
    )
    assert log.between_commits >= 1, f"no kill landed between a job's commits\n{log.text()}"
    counts = assert_same_tables(reference.lake, lake, None, f"after kill -9 (seed {SEED})")
    assert (problems := invariants(lake)) == [], f"{problems}\n{log.text()}"
    readable = read_every_version(lake)
    print(f"rows per table {counts}; versions read per table {readable}")


# -- the same task run three times, and twice at once ------------------------------------------


def test_the_same_task_run_three_times_equals_one_run(reference: Reference) -> None:
    """Each layer's task of one DAG run, run three times in a row with the same run id (a task
    cleared, or retried after it succeeded), in the reference run: the second and third runs
    succeed and commit nothing to any table, the ledger keeps the first run's verdicts only,
    and the gate task reads the same verdict."""
    assert [r.layer for r in reference.reruns] == [layer for layer in LAYERS for _ in range(2)]
    for rerun in reference.reruns:
        assert rerun.code == 0, rerun.tail
        assert rerun.committed == [], f"a rerun of {rerun.layer} committed: {rerun.tail}"
        assert rerun.same_ledger and rerun.same_verdict, rerun.tail
    # Not vacuous: the first silver run judged a batch (amounts out of range were quarantined).
    assert reference.silver_verdict[0].startswith(f"silver.{STREAM}: 0/1 checks met; published")


# Bronze's two ingests at once are tests/integration/test_crash_safety.py's.
def test_two_copies_of_a_task_at_once_equal_one_run(reference: Reference, tmp_path: Path) -> None:
    """Two copies of each layer's task of one DAG run start at the same moment (the first run
    of the topic: the tables are created in the race too). A copy may lose the race with a
    typed conflict (Airflow retries it: the retry must succeed); the tables equal a single
    run's."""
    lake = make_lake(tmp_path / "twice")
    produce(lake, 0)
    outcomes = []
    for layer in LAYERS:
        jobs = [start_job(lake, layer, run_id(0)) for _ in range(2)]
        codes = [job.wait() for job in jobs]
        outcomes.append(f"{layer}: exits {codes}")
        assert 0 in codes, "\n".join(job.tail() for job in jobs)  # one of them wins
        for job, code in zip(jobs, codes, strict=True):
            if code != 0:
                assert "ConcurrentWriteError" in job.output(), job.tail()
        if any(codes):
            run_job(lake, layer, run_id(0))
            outcomes.append(f"{layer}: the retry succeeded")
    print("; ".join(outcomes))
    assert_same_tables(reference.lake, lake, reference.after[0], "after two copies at once")
    assert (problems := invariants(lake)) == [], problems
    read_every_version(lake)


# -- maintenance while the jobs write ----------------------------------------------------------


@dataclass
class Maintainer:
    """`lakehouse maintain` in a loop (the same function, in a thread): compaction, vacuum with
    the shortest safe retention, checkpoints and log cleanup of every table of the topic, then
    of the ledger. (The retention is 1 h, so vacuum deletes nothing of a run this short: what it
    shows is that vacuum leaves the files of writes in flight alone.)"""

    lake: Lake
    spark: Any
    passes: int = 0
    compacted: Counter[str] = field(default_factory=Counter)  # files, per table
    while_writing: Counter[str] = field(default_factory=Counter)  # of which during a job
    conflicts: list[str] = field(default_factory=list)
    errors: list[BaseException] = field(default_factory=list)
    writing: threading.Event = field(default_factory=threading.Event)
    stop: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None

    def start(self) -> None:
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def finish(self) -> None:
        self.stop.set()
        if self.thread is not None:
            self.thread.join(timeout=600)

    def run(self) -> None:
        from lakehouse.contracts.catalog import Catalog
        from lakehouse.errors import ConcurrentWriteError
        from lakehouse.pipeline.runner import maintain_topics

        catalog = Catalog.load(self.lake.settings.contracts_dir)
        names = {str(path): name for name, path in self.lake.every_delta_table().items()}
        while not self.stop.is_set():
            for ledger in (False, True):
                writing = self.writing.is_set()
                try:
                    reports = maintain_topics(
                        self.spark,
                        self.lake.settings,
                        catalog,
                        retention_hours=1,
                        ledger=ledger,
                        echo=_quiet,
                    )
                except ConcurrentWriteError as exc:  # lost a race
                    self.conflicts.append(f"{type(exc).__name__}: {str(exc)[:200]}")
                    continue
                except Exception as exc:
                    self.errors.append(exc)
                    return
                for report in reports:
                    name = names.get(report.table, report.table)
                    self.compacted[name] += report.files_compacted
                    if writing:
                        self.while_writing[name] += report.files_compacted
            self.passes += 1
            time.sleep(0.5)


def _quiet(_: str) -> None:
    pass


@pytest.fixture
def maintainer(spark: Any, tmp_path: Path) -> Iterator[Maintainer]:
    worker = Maintainer(make_lake(tmp_path / "maintained"), spark)
    worker.start()
    yield worker
    worker.finish()


def test_maintenance_while_the_jobs_write(reference: Reference, maintainer: Maintainer) -> None:
    """The clean run's batches and jobs, while tables are compacted, vacuumed and checkpointed
    over and over: the same rows, exactly, and every version readable. A job whose commit loses
    a race to a compaction fails with a typed conflict and is retried, as Airflow would (two
    retries)."""
    lake = maintainer.lake
    retried = []
    for batch in range(BATCHES):
        produce(lake, batch)
        for layer in LAYERS:
            for attempt in range(3):
                maintainer.writing.set()
                job = start_job(lake, layer, run_id(batch))
                code = job.wait()
                maintainer.writing.clear()
                if code == 0:
                    break
                assert "ConcurrentWriteError" in job.output() and attempt < 2, job.tail()
                retried.append(f"{layer} batch {batch}")
    maintainer.finish()
    print(
        f"{maintainer.passes} maintenance passes; files compacted per table "
        f"{dict(+maintainer.compacted)}, of which while a job ran {dict(+maintainer.while_writing)}; "
        f"{len(maintainer.conflicts)} passes lost a race to a commit; jobs retried after a "
        f"conflict: {retried or 'none'}"
    )
    assert not maintainer.errors, maintainer.errors
    assert maintainer.while_writing.total() > 0, "nothing was compacted while a job ran"
    assert_same_tables(reference.lake, lake, None, "with maintenance during the writes")
    assert (problems := invariants(lake, positions=False)) == [], problems
    read_every_version(lake)
