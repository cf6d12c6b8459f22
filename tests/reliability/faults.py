"""Helpers of the fault-injection tests: a lakehouse root with a small contract and deterministic
landing batches, the layer jobs started the way Airflow's operator starts them (or as clients of
the lakehouse's Spark server), kill -9 of a whole job or of the server, and every table of a root
compared with another root's as multisets of rows.

Size: ``LAKEHOUSE_RELIABILITY_KILLS`` kills (``lakes.KILLS``: 1 by hand, 20 in ``make reliability``);
``LAKEHOUSE_RELIABILITY_SEED`` replays a run's kill points (the seed is printed, and named in
every failure)."""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lakes
from lakehouse.runtime.config import REPO_ROOT, Settings
from lakehouse.runtime.spark import conf_args, submit_conf
from lakehouse.topics.landing import Producer, Record

TOPIC = "clicks"
STREAM = "clicks_stream"
PARTITIONS = 3
USERS = 300
RECORDS = 3000  # per landing batch, besides the damaged segment's records
CITIES = ("Berlin", "Lima", "Oslo", "Quito", "Rome", "Seoul")
TS0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z, in ms: record timestamps are fixed, not "now"
LAYERS = ("bronze", "silver", "gold")

# JSON values; a latest-per-key table, a stream aggregate, and an aggregate of the stream read as
# a table (re-keyed by city, with its private state table); a silver `quarantine` expectation,
# so silver's quarantine takes expectation failures beside the records that do not decode, and
# the silver job writes the data-quality ledger.
CONTRACT = f"""\
topic: {TOPIC}
description: Check-ins with an amount, for the fault-injection tests.
partitions: {PARTITIONS}
key: {{format: string, name: user}}
value:
  format: json
  fields:
    - {{name: city, type: string, nullable: true}}
    - {{name: amount, type: long, nullable: true}}
stream: {{name: {STREAM}}}
tables:
  - {{name: clicks_latest, kind: latest}}
  - name: clicks_per_user
    kind: aggregate
    aggregations:
      - {{name: n, fn: count}}
      - {{name: total, fn: sum, field: amount}}
  - name: users_per_city
    kind: aggregate
    source: table
    group_by: city
    aggregations:
      - {{name: users, fn: count}}
expectations:
  silver:
    - {{name: amount_range, expect: between, column: amount, min: 0, max: 999, severity: quarantine}}
"""

# The tables each layer's job writes, in the order it commits them.
LAYER_TABLES: dict[str, tuple[str, ...]] = {
    "bronze": (f"bronze.{TOPIC}", f"quarantine.bronze.{TOPIC}"),
    "silver": (f"quarantine.silver.{STREAM}", f"silver.{STREAM}"),
    "gold": (
        "gold.clicks_latest",
        "gold.clicks_per_user",
        "gold.users_per_city",
        "state.users_per_city",
    ),
}
# Columns that legitimately differ between two runs over the same landing data: when the ingest
# ran (wall-clock time of the job). Nothing else is left out (bronze's ``_batch_id`` neither:
# the tests cut bronze's batches as the clean run does); paths that embed the lakehouse root
# (bronze's source file names) are compared relative to it.
EXCLUDED: dict[str, tuple[str, ...]] = {
    f"bronze.{TOPIC}": ("_ingested_at",),
    f"quarantine.bronze.{TOPIC}": ("_ingested_at",),
}
# Kills per layer (tests/lakes.py): 20 in `make reliability`, which runs these rounds (`make
# test` does not: a cold JVM per job makes them long); 1 when a test module is run by hand.
KILLS = lakes.KILLS
SEED = int(
    os.environ.get("LAKEHOUSE_RELIABILITY_SEED", str(random.SystemRandom().randrange(10**6)))
)
# Landing batches: enough for kills over several batches, few enough for CI.
BATCHES = 2 if KILLS < 10 else 3
_COMMIT = re.compile(r"^(\d{20})\.json$")
# What a Delta log holds when nothing went wrong: commits, their checksums, checkpoints, the
# pointer to the last one, and the local filesystem's hidden checksum of each (``.<name>.crc``).
_LOG_ENTRY = re.compile(
    r"^\.?(\d{20}\.(json|crc)|\d{20}\.checkpoint\..*|_last_checkpoint)(\.crc)?$"
)
_LOG_FOLDERS = ("_staged_commits", "_commits", "_sidecars")
_TAG = "LAKEHOUSE_FAULT_TAG"
_runs = itertools.count()


@dataclass(frozen=True)
class Lake:
    """One lakehouse root (its own landing, tables and contract)."""

    root: Path

    @property
    def settings(self) -> Settings:
        return Settings.from_env(self.root / "home", self.root / "contracts")

    def tables(self) -> dict[str, Path]:
        s = self.settings
        return {
            f"bronze.{TOPIC}": s.bronze_path(TOPIC),
            f"quarantine.bronze.{TOPIC}": s.quarantine_path("bronze", TOPIC),
            f"silver.{STREAM}": s.silver_path(STREAM),
            f"quarantine.silver.{STREAM}": s.quarantine_path("silver", STREAM),
            "gold.clicks_latest": s.gold_path("clicks_latest"),
            "gold.clicks_per_user": s.gold_path("clicks_per_user"),
            "gold.users_per_city": s.gold_path("users_per_city"),
            "state.users_per_city": s.state_path("users_per_city"),
        }

    def every_delta_table(self) -> dict[str, Path]:
        """The pipeline's tables and the data-quality ledger."""
        return {**self.tables(), "ledger": self.settings.ledger_path}


def make_lake(root: Path) -> Lake:
    contracts = root / "contracts"
    contracts.mkdir(parents=True, exist_ok=True)
    (contracts / f"{TOPIC}.yaml").write_text(CONTRACT)
    (root / "logs").mkdir(exist_ok=True)
    return Lake(root)


# -- landing -------------------------------------------------------------------------------------


def produce(lake: Lake, batch: int) -> None:
    """Landing batch ``batch``: the same bytes, offsets and timestamps in every root. Keyed
    check-ins with null keys, tombstones, values that are not JSON (silver's quarantine) and
    amounts out of range (the `quarantine` expectation), then a segment with a damaged line
    (bronze's quarantine) between two good records."""
    rng = random.Random(1000 + batch)
    records = []
    for i in range(RECORDS):
        key = None if rng.random() < 0.01 else f"u{rng.randrange(USERS)}".encode()
        kind = rng.random()
        value: bytes | None
        if kind < 0.03:
            value = None
        elif kind < 0.05:
            value = b'{"city": "Oslo", "amount": '
        elif kind < 0.08:
            value = json.dumps({"city": rng.choice(CITIES), "amount": 5000 + i}).encode()
        else:
            value = json.dumps({"city": rng.choice(CITIES), "amount": rng.randrange(1000)}).encode()
        records.append(Record(key, value, timestamp_ms=TS0 + batch * 10_000_000 + i))
    producer = Producer(lake.settings, TOPIC, PARTITIONS)
    producer.send_batch(records)

    def damaged(start: int) -> tuple[bytes, int]:
        def line(offset: int) -> bytes:
            envelope = {
                "offset": offset,
                "timestamp": TS0 + batch * 10_000_000 + RECORDS + offset,
                "timestampType": "CreateTime",
                "key": f"u{offset % USERS}",
                "value": json.dumps({"city": "Lima", "amount": 1}),
            }
            return json.dumps(envelope).encode() + b"\n"

        return line(start) + b"\x00 not a record \xff\n" + line(start + 1), 2

    producer.write_segment(batch % PARTITIONS, damaged)


# -- jobs ----------------------------------------------------------------------------------------


def run_id(batch: int) -> str:
    """The id Airflow gives the scheduled run of a batch (passed as --dag-run-id)."""
    return f"scheduled__2026-01-01T00:{batch:02d}:00+00:00"


@dataclass(frozen=True)
class Kill:
    kind: str  # "random": at a moment of the run; "commit": right after its first data commit
    fraction: float = 0.0  # "random": the moment, as a fraction of the job's measured duration


def kill_plan(rng: random.Random, kills: int) -> list[Kill]:
    """``kills`` kills: a third at the job's first data commit (the moment a layer that writes
    several tables has written one of them), the others at random moments spread over the job's
    run (one drawn in each of equal slices of its measured duration, in random order), so they
    land in start-up, reading, writing and committing alike."""
    n_commit = (kills + 2) // 3
    n_random = kills - n_commit
    fractions = [rng.uniform(i / n_random, (i + 1) / n_random) for i in range(n_random)]
    rng.shuffle(fractions)
    return [Kill("commit")] * n_commit + [Kill("random", f) for f in fractions]


def job_command(layer: str, dag_run_id: str, topic: str = TOPIC) -> list[str]:
    """The command LayerJobOperator has SparkSubmitOperator run (a ``lakehouse_spark``
    connection of type ``spark`` at ``local[2]``; no Params, so no flags after the run id)."""
    python = sys.executable
    return [
        str(Path(python).parent / "spark-submit"),
        *("--master", "local[2]"),
        *conf_args(submit_conf()),
        *("--name", f"lakehouse-{layer}-{topic}"),
        str(REPO_ROOT / "jobs" / "run_layer.py"),
        *("--topic", topic, "--layer", layer),
        *("--dag-run-id", dag_run_id),
    ]


@functools.cache
def _java_home() -> str | None:
    from lakehouse.runtime.process import ensure_java

    ensure_java()  # spark-submit's launcher needs JAVA_HOME or java on the PATH
    return os.environ.get("JAVA_HOME")


def _environment(
    lake: Lake, layer: str, dag_run_id: str, tag: str, topic: str = TOPIC
) -> dict[str, str]:
    """The task's environment: the operator's env_vars, Airflow's context variables, and a tag
    that every process of the job inherits (to find them all when it is killed)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "LAKEHOUSE_"))}
    bin_dir = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join([bin_dir, env.get("PATH", "")])
    java_home = _java_home()
    if java_home:
        env["JAVA_HOME"] = java_home
    env |= {
        "LAKEHOUSE_HOME": str(lake.settings.home),
        "LAKEHOUSE_CONTRACTS": str(lake.settings.contracts_dir),
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "AIRFLOW_CTX_DAG_ID": f"pipeline__{topic}",
        "AIRFLOW_CTX_TASK_ID": layer,
        "AIRFLOW_CTX_DAG_RUN_ID": dag_run_id,
        _TAG: tag,
    }
    return env


@dataclass
class Job:
    """One layer job started in a process group of its own."""

    layer: str
    proc: subprocess.Popen[bytes]
    log: Path
    tag: str
    started: float

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def running(self) -> bool:
        return self.proc.poll() is None

    def wait(self, timeout: float = 900) -> int:
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"{self.layer} job ran over {timeout} s:\n{self.tail()}") from None
        self._sweep()  # the job is over: its PySpark daemon must not outlive it
        return code

    def kill(self) -> bool:
        """kill -9 of the job's process group (spark-submit's JVM and the Python driver), and of
        every other process of the job: PySpark's worker daemon puts itself and its workers in a
        group of their own, and those workers run the Delta commits of Spark writes, so they
        die at the same moment too (as on a crashed machine). Returns whether the job was still
        running."""
        running = self.running()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self._sweep()
        self.proc.wait()
        return running

    def _sweep(self) -> None:
        deadline = time.monotonic() + 30
        while left := processes_tagged(self.tag):
            for pid in left:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            if time.monotonic() > deadline:
                raise AssertionError(f"processes of the {self.layer} job outlive it: {left}")
            time.sleep(0.02)

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def tail(self, chars: int = 4000) -> str:
        return f"--- {self.log} ---\n" + self.output()[-chars:]


def client_command(layer: str, topic: str = TOPIC) -> list[str]:
    """`lakehouse run` of one layer: a Spark Connect client of the lakehouse's server when that
    runs (it says so: :data:`ON_SERVER`), else a job with a Spark of its own. The DAG run's id
    comes from Airflow's context variables, as in a task."""
    return [sys.executable, "-m", "lakehouse.cli", "run", "--topic", topic, "--layer", layer]


ON_SERVER = "on the Spark server at sc://localhost:"  # what `lakehouse run` says on the server


def start_job(
    lake: Lake,
    layer: str,
    dag_run_id: str,
    *,
    client: bool = False,
    topic: str = TOPIC,
    env: Mapping[str, str] | None = None,
) -> Job:
    """Start a layer's job of ``topic`` (default: the contract of :func:`make_lake`):
    spark-submit, as Airflow's operator does; with ``client``, `lakehouse run`
    (:func:`client_command`). ``env``: variables added to the task's environment, which has
    none of this process's ``LAKEHOUSE_`` ones (e.g. ``LAKEHOUSE_DATA`` and the store's
    settings, for a lakehouse in a bucket)."""
    tag = uuid.uuid4().hex
    log = lake.root / "logs" / f"{next(_runs):04d}-{layer}.log"
    command = client_command(layer, topic) if client else job_command(layer, dag_run_id, topic)
    with log.open("wb") as out:
        proc = subprocess.Popen(
            command,
            env=_environment(lake, layer, dag_run_id, tag, topic) | dict(env or {}),
            cwd=lake.root,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group, as a task's process would be
        )
    return Job(layer, proc, log, tag, time.monotonic())


def run_job(
    lake: Lake, layer: str, dag_run_id: str, *, client: bool = False, topic: str = TOPIC
) -> tuple[Job, float]:
    """Run a job (:func:`start_job`) to its end; it must succeed. Returns it and its duration
    (s)."""
    job = start_job(lake, layer, dag_run_id, client=client, topic=topic)
    code = job.wait()
    took = job.elapsed()
    assert code == 0, f"{layer} job exited with {code}:\n{job.tail()}"
    return job, took


def processes_tagged(tag: str) -> list[int]:
    """Live (not zombie) processes whose environment carries the job's tag (Linux's /proc;
    elsewhere none are found, and a kill reaches the job's process group only)."""
    needle = f"{_TAG}={tag}".encode()
    found: list[int] = []
    if not os.path.isdir("/proc"):
        return found
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            environ = Path(entry.path, "environ").read_bytes()
            stat = Path(entry.path, "stat").read_text()
        except OSError:
            continue
        state = stat.rsplit(")", 1)[-1].split()[0]
        if needle in environ.split(b"\0") and state != "Z":
            found.append(int(entry.name))
    return found


# -- the tables, read back -----------------------------------------------------------------------


def commit_versions(path: Path) -> set[int]:
    """The versions whose commit files are in a table's log (none: no table)."""
    log = path / "_delta_log"
    if not log.is_dir():
        return set()
    return {int(m.group(1)) for e in os.scandir(log) if (m := _COMMIT.match(e.name))}


def log_leftovers(path: Path) -> list[str]:
    """What a table's ``_delta_log`` holds besides commits, checksums and checkpoints (e.g. a
    commit's temporary file left by a writer that died while writing it)."""
    log = path / "_delta_log"
    if not log.is_dir():
        return []
    odd = []
    for entry in os.scandir(log):
        if entry.is_dir():
            inside = os.listdir(entry.path)
            if entry.name not in _LOG_FOLDERS or inside:
                odd += [f"{entry.name}/{name}" for name in inside] or [entry.name + "/"]
        elif not _LOG_ENTRY.match(entry.name):
            odd.append(entry.name)
    return sorted(odd)


def newest(path: Path) -> int | None:
    return max(commit_versions(path), default=None)


def versions(lake: Lake) -> dict[str, int | None]:
    return {name: newest(path) for name, path in lake.every_delta_table().items()}


def orphans(path: Path) -> int:
    """Data files on disk that no commit adds (left by writers that died before committing)."""
    return len(orphan_files(path))


def orphan_files(path: Path) -> set[str]:
    """The names of the data files of :func:`orphans`."""
    if not path.is_dir():
        return set()
    added: set[str] = set()
    for commit in (path / "_delta_log").glob("*.json"):
        for line in commit.read_text().splitlines():
            action = json.loads(line) if line.strip() else {}
            if "add" in action:
                added.add(Path(action["add"]["path"]).name)
    return {p.name for p in path.rglob("*.parquet")} - added


def _freeze(value: Any, home: str) -> Any:
    if isinstance(value, dict):
        return tuple(sorted((k, _freeze(v, home)) for k, v in value.items()))
    if isinstance(value, list):
        return tuple(_freeze(v, home) for v in value)
    if isinstance(value, str) and value.startswith(home):
        return "$LAKEHOUSE_HOME" + value[len(home) :]
    return value


def rows(lake: Lake, name: str, version: int | None = None) -> tuple[list[str], Counter[Any]]:
    """A table's columns (less :data:`EXCLUDED`) and its rows as a multiset, read by delta-rs
    at ``version`` (default: the latest); an absent table has no columns and no rows."""
    from lakehouse.storage import read_arrow

    path = lake.tables()[name]
    if newest(path) is None:
        return [], Counter()
    data = read_arrow(path, version=version)
    columns = sorted(c for c in data.column_names if c not in EXCLUDED.get(name, ()))
    home = str(lake.settings.home)
    frozen = (tuple(_freeze(r[c], home) for c in columns) for r in data.to_pylist())
    return columns, Counter(frozen)


def differences(
    reference: Lake, lake: Lake, at: Mapping[str, int | None] | None = None
) -> tuple[list[str], dict[str, int]]:
    """Every table of ``lake`` against ``reference`` (as of the versions ``at``, else its
    latest): the problems found (rows lost, rows duplicated or unexpected, other columns) and
    each table's row count."""
    problems: list[str] = []
    counts: dict[str, int] = {}
    for name in reference.tables():
        version = None if at is None else at[name]
        if at is not None and version is None:
            want_columns: list[str] = []
            want: Counter[Any] = Counter()
        else:
            want_columns, want = rows(reference, name, version)
        got_columns, got = rows(lake, name)
        counts[name] = got.total()
        if want.total() and got_columns != want_columns:
            problems.append(f"{name}: columns {got_columns}, expected {want_columns}")
            continue
        lost, extra = want - got, got - want
        if lost or extra:
            problems.append(
                f"{name}: {got.total()} rows, expected {want.total()}: {lost.total()} lost "
                f"(e.g. {_sample(lost)}), {extra.total()} extra or duplicated "
                f"(e.g. {_sample(extra)}); columns {want_columns or got_columns}"
            )
    return problems, counts


def assert_same_tables(
    reference: Lake, lake: Lake, at: Mapping[str, int | None] | None, context: str
) -> dict[str, int]:
    """Every table of ``lake`` equals the clean run's in ``reference`` (as of the versions
    ``at``, else its last), and so do the ledger's verdicts on the batches published; returns
    each table's row count."""
    problems, counts = differences(reference, lake, at)
    assert not problems, f"{context}: tables differ from the clean run's:\n" + "\n".join(problems)
    assert all(counts[name] > 0 for name in reference.tables()), counts  # not vacuous
    want, _ = published_verdicts(reference, None if at is None else at["ledger"])
    got, twice = published_verdicts(lake)
    assert got == want and want, f"{context}: published verdicts {got}, expected {want}"
    assert twice == [], f"{context}: verdicts recorded twice: {twice}"
    return counts


def _sample(rows: Counter[Any]) -> list[Any]:
    return [r for r, _ in itertools.islice(rows.items(), 2)]


def read_every_version(lake: Lake) -> dict[str, int]:
    """Load and read every version of every Delta table of a root (each data file of each
    snapshot is read); returns the number of versions of each."""
    from deltalake import DeltaTable

    from lakehouse.storage import read_arrow

    read = {}
    for name, path in lake.every_delta_table().items():
        if newest(path) is None:
            continue
        latest = DeltaTable(str(path)).version()
        for v in range(latest + 1):
            assert DeltaTable(str(path), version=v).version() == v
            read_arrow(path, version=v)
        read[name] = latest + 1
    return read


def invariants(lake: Lake, positions: bool = True) -> list[str]:
    """What must hold within one root, whatever happened to its jobs: each landing record once
    in bronze; each bronze record in exactly one of silver and silver's quarantine; and, with
    ``positions`` (no maintenance commits since), every reader at the head of what it reads."""
    from deltalake import DeltaTable

    from lakehouse.storage import read_arrow

    t = lake.tables()
    problems = []

    def records(name: str) -> Counter[tuple[int, int]]:
        if newest(t[name]) is None:
            return Counter()
        data = read_arrow(t[name]).select(["partition", "offset"]).to_pylist()
        return Counter((r["partition"], r["offset"]) for r in data)

    bronze = records(f"bronze.{TOPIC}")
    doubled = [k for k, n in bronze.items() if n > 1]
    if doubled:
        problems.append(f"bronze holds {len(doubled)} records more than once, e.g. {doubled[:3]}")
    decoded = records(f"silver.{STREAM}") + records(f"quarantine.silver.{STREAM}")
    if decoded != bronze:
        problems.append(
            f"silver + its quarantine vs bronze: {(bronze - decoded).total()} records in "
            f"neither, {(decoded - bronze).total()} extra or in both"
        )
    if not positions:
        return problems
    readers = {f"silver.{STREAM}": f"bronze.{TOPIC}"}
    readers |= dict.fromkeys(LAYER_TABLES["gold"], f"silver.{STREAM}")
    for reader, source in readers.items():
        position = DeltaTable(str(t[reader])).transaction_version(source)
        head = DeltaTable(str(t[source])).version()
        if position != head:
            problems.append(f"{reader} has read {source} up to version {position}, not {head}")
    return problems


def published_verdicts(
    lake: Lake, version: int | None = None
) -> tuple[dict[tuple[str, str], tuple[int, int]], list[Any]]:
    """The data-quality ledger's verdicts on published batches (as of its ``version``): per
    table and expectation, the rows judged and the rows unexpected, summed (the sums do not
    depend on how the batches were cut); and the verdicts recorded more than once."""
    from lakehouse.storage import read_arrow

    path = lake.settings.ledger_path
    if newest(path) is None:
        return {}, []
    rows = [r for r in read_arrow(path, version=version).to_pylist() if r["published"]]
    sums: dict[tuple[str, str], tuple[int, int]] = {}
    for r in rows:
        judged, unexpected = sums.get((r["table"], r["expectation"]), (0, 0))
        sums[(r["table"], r["expectation"])] = (
            judged + (r["element_count"] or 0),
            unexpected + (r["unexpected_count"] or 0),
        )
    once = Counter((r["run_id"], r["table"], r["validated_at"], r["expectation"]) for r in rows)
    return sums, [k for k, n in once.items() if n > 1]


def layer_state(lake: Lake, layer: str) -> dict[str, int | None]:
    return {name: newest(lake.tables()[name]) for name in LAYER_TABLES[layer]}


def advanced(before: Mapping[str, int | None], after: Mapping[str, int | None]) -> list[str]:
    """The tables with commits in ``after`` that ``before`` did not have."""
    return [n for n, v in after.items() if v is not None and ((b := before[n]) is None or v > b)]


def wait_for_output(job: Job, text: str) -> bool:
    """Wait (while the job runs) until its output holds ``text``; True if it came."""
    while job.running():
        if text in job.output():
            return True
        time.sleep(0.01)
    return text in job.output()


def wait_for_data_commit(job: Job, tables: Iterable[Path], seen: Mapping[Path, set[int]]) -> bool:
    """Wait (while the job runs) until one of ``tables`` has a data commit it did not have
    before (version >= 1: version 0 only creates a table); True if one came."""
    watched: Sequence[Path] = list(tables)
    while job.running():
        for path in watched:
            if any(v >= 1 for v in commit_versions(path) - seen[path]):
                return True
        time.sleep(0.003)
    return False
