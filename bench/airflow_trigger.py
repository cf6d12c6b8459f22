"""Trigger-to-gold benchmark: a 10K-record micro-batch through a running Airflow whose layer
tasks are clients of the lakehouse's Spark server, against the same three layers run directly as
clients of the same server; the difference is Airflow's overhead.

    python bench/airflow_trigger.py [--records 10000] [--repeats 3] [--workdir DIR] [--no-submit]

One topic (``bench-trigger``: JSON values with a ``location``, key = username, 3 partitions)
with two gold tables, ``bench_trigger_latest`` (latest location per user) and
``bench_trigger_counts`` (check-ins per user), plus a silver ``warn`` and a gold ``fail``
expectation, so the quality gates run as in the shipped contracts. Every path shares one
lakehouse root and one Spark server (`lakehouse spark start`, local[2], started before anything
is timed and left running). Before anything is timed, a first batch goes through ``lakehouse
run`` (a client of the server), so the measured batches are incremental micro-batches into
existing tables, not table creation. Each measured batch is ``--records`` fresh records (a new
seed each, over the same 500 users) written to landing before the clock starts.

* ours, Airflow: Airflow 3 as tests/e2e/airflow_stack.py runs it (scheduler, DAG processor and
  API server as three processes; LocalExecutor on a PostgreSQL cluster started for the
  benchmark; the lakehouse's environment, so the
  ``lakehouse_spark`` connection is the server's), started once and left running; the topic's
  pipeline DAG unpaused; interval runs off (``[scheduler] use_job_schedule``), so only the
  triggered runs run. The clock starts at ``POST /api/v2/dags/pipeline__bench-trigger/dagRuns``
  with an empty conf (the call the UI's Trigger button makes) and stops when both gold tables'
  Delta logs hold this run's last commit: **trigger-to-gold**. The DAG run's own duration (its
  start to end date, from the API; it also holds the gate tasks and the Data Docs report after
  gold) and the wait until the API reports it finished are kept as well.
* direct, on the server: ``lakehouse run --topic bench-trigger --layer L`` for bronze, silver
  and gold, one process after another, each a client of the server as the Airflow tasks are.
  The clock starts before the first; trigger-to-gold stops the same way; wall time is until the
  gold process exits.
* direct, spark-submit (unless ``--no-submit``): what each task was before the server, and what
  a ``lakehouse_spark`` connection of type ``spark`` still does: ``spark-submit
  jobs/run_layer.py --topic bench-trigger --layer L`` three times, a JVM each, with the command
  line the operator builds.

The gold tables are watched by listing their ``_delta_log`` every 0.1 s (a new
``<version>.json`` is a new Delta version; negligible load), in the measuring process for every
path; their versions before and after are read with ``deltalake``. Rounds rotate which path goes
first (``--repeats`` rounds, one batch per path each). Figures are p50s (numpy, linear
interpolation); Airflow's overhead = p50 trigger-to-gold (Airflow) - p50 trigger-to-gold
(direct, on the server). Goal from issue 28: trigger-to-gold <= 10 s for a 10K batch.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
# The running Airflow of the end-to-end tests (no pytest in it).
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "e2e"))

from airflow_stack import Airflow, clean_environment, free_port, running_airflow

from common import Figure, report
from lakehouse.runtime.spark import conf_args, submit_conf

REPO = Path(__file__).resolve().parents[1]
TOPIC = "bench-trigger"
DAG_ID = f"pipeline__{TOPIC}"
TABLES = ("bench_trigger_latest", "bench_trigger_counts")
PARTITIONS = 3
USERS = 500
SPARK_MASTER = "local[2]"
GOAL_S = 10.0
POLL_S = 0.1
LAYER_TASKS = ("bronze", "silver", "gold")
CONTRACT = f"""\
topic: {TOPIC}
description: Check-ins, for the trigger-to-gold benchmark.
partitions: {PARTITIONS}
key: {{format: string, name: username}}
value:
  format: json
  fields:
    - {{name: location, type: string, nullable: true}}
stream: {{name: bench_trigger}}
tables:
  - {{name: {TABLES[0]}, kind: latest}}
  - name: {TABLES[1]}
    kind: aggregate
    aggregations:
      - {{name: count, fn: count}}
expectations:
  silver:
    - {{name: username_present, expect: not_null, column: username, severity: warn}}
  gold:
    - {{name: one_row_per_user, table: {TABLES[0]}, expect: unique, column: username, severity: fail}}
"""
_COMMIT = re.compile(r"^(\d{20})\.json$")


def _settings(work: Path) -> Any:
    from lakehouse.runtime.config import Settings

    return Settings.from_env(work / "lakehouse", work / "contracts")


def _produce(settings: Any, records: int, seed: int) -> None:
    from lakehouse.topics.landing import generate_user_locations

    written = generate_user_locations(settings, TOPIC, PARTITIONS, records, users=USERS, seed=seed)
    if written != records:
        raise RuntimeError(f"produced {written} of {records} records")


def _delta_version(path: Path) -> int:
    from deltalake import DeltaTable

    return int(DeltaTable(str(path)).version())


def _newest_commit(path: Path) -> int:
    """The newest version in a Delta log, from the commit files' names."""
    newest = -1
    with os.scandir(path / "_delta_log") as entries:
        for entry in entries:
            found = _COMMIT.match(entry.name)
            if found:
                newest = max(newest, int(found.group(1)))
    return newest


class GoldWatch:
    """Notes when each gold table's newest commit appeared, from ``start`` on (a thread)."""

    def __init__(self, paths: list[Path]) -> None:
        self.paths = paths
        self.before = {p: _delta_version(p) for p in paths}
        self.seen = {p: (self.before[p], 0.0) for p in paths}  # version, seconds after start
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.start = 0.0

    def begin(self) -> None:
        self.start = time.perf_counter()
        self._thread.start()

    def _scan(self) -> None:
        for path in self.paths:
            newest = _newest_commit(path)
            if newest > self.seen[path][0]:
                self.seen[path] = (newest, time.perf_counter() - self.start)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._scan()
            self._stop.wait(POLL_S)

    def finish(self) -> float:
        """Seconds from start until every table's last commit appeared (each must have one)."""
        self._stop.set()
        self._thread.join()
        self._scan()
        stale = [p.name for p in self.paths if self.seen[p][0] <= self.before[p]]
        if stale:
            raise RuntimeError(f"gold tables without a new version: {stale}")
        for path in self.paths:
            if _delta_version(path) != self.seen[path][0]:
                raise RuntimeError(f"{path.name}: the log listing and deltalake disagree")
        return max(at for _, at in self.seen.values())


def _seconds(start: str, end: str) -> float:
    return (datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds()


def _timeline(run: dict[str, Any], tasks: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Each task's queued, start and end times in seconds after the run was queued (where the
    gaps between tasks go)."""
    origin = run["queued_at"]
    out: dict[str, Any] = {}
    for name, t in sorted(tasks.items(), key=lambda kv: kv[1].get("start_date") or "~"):
        if not t.get("start_date"):
            continue
        out[name] = {
            key: round(_seconds(origin, t[field]), 2)
            for key, field in (
                ("queued", "queued_when"),
                ("start", "start_date"),
                ("end", "end_date"),
            )
            if t.get(field)
        }
    return out


def run_airflow(airflow: Airflow, paths: list[Path]) -> dict[str, Any]:
    """One batch, triggered through the REST API."""
    watch = GoldWatch(paths)
    watch.begin()
    run = airflow.trigger(DAG_ID)
    run_id = run["dag_run_id"]
    while True:
        run = airflow.dag_run(DAG_ID, run_id)
        if run["state"] in ("success", "failed"):
            done = time.perf_counter() - watch.start
            break
        airflow.check_alive()
        if time.perf_counter() - watch.start > 900:
            raise RuntimeError(f"run {run_id} not finished after 900 s")
        time.sleep(0.5)
    tasks = {t["task_id"]: t for t in airflow.task_instances(DAG_ID, run_id)}
    if run["state"] != "success":
        states = {name: t["state"] for name, t in tasks.items()}
        raise RuntimeError(f"run {run_id} {run['state']}: {states}")
    to_gold = watch.finish()
    layer_s = {name: float(tasks[name]["duration"] or 0.0) for name in LAYER_TASKS}
    return {
        "timeline": _timeline(run, tasks),
        "run_id": run_id,
        "trigger_to_gold_s": to_gold,
        "trigger_to_finished_s": done,
        "run_duration_s": _seconds(run["start_date"], run["end_date"]),
        "queued_s": _seconds(run["queued_at"], run["start_date"]),
        "layer_task_s": layer_s,
        "versions": {p.name: [watch.before[p], watch.seen[p][0]] for p in paths},
    }


def spark_submit(layer: str) -> list[str]:
    """The command the DAG's LayerJobOperator has SparkSubmitOperator run (without the Params'
    flags and the run id)."""
    return [
        str(Path(sys.executable).parent / "spark-submit"),
        *("--master", SPARK_MASTER),
        *conf_args(submit_conf()),
        *("--name", f"lakehouse-{layer}-{TOPIC}"),
        str(REPO / "jobs" / "run_layer.py"),
        *("--topic", TOPIC, "--layer", layer),
    ]


def client(layer: str) -> list[str]:
    """A layer as ``lakehouse run --layer``: a client of the server, as the Airflow tasks are."""
    return [
        str(Path(sys.executable).parent / "lakehouse"),
        "run",
        "--topic",
        TOPIC,
        "--layer",
        layer,
    ]


def run_layers(
    settings: Any, logs: Path, label: str, command: Callable[[str], list[str]]
) -> dict[str, float]:
    """The three layers, one ``command(layer)`` process after another, each logged to
    ``logs/<label>-<layer>.log``: the seconds each took. One that fails raises with the end of
    its log; a client that did not run on the server too."""
    env = clean_environment(settings)
    seconds: dict[str, float] = {}
    for layer in LAYER_TASKS:
        log = logs / f"{label}-{layer}.log"
        started = time.perf_counter()
        with log.open("w") as out:
            proc = subprocess.run(
                command(layer),
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                timeout=900,
                check=False,
            )
        seconds[layer] = time.perf_counter() - started
        text = log.read_text()
        if proc.returncode != 0 or (command is client and "on the Spark server" not in text):
            raise RuntimeError(f"{label}: {layer} failed ({proc.returncode}):\n{text[-3000:]}")
    return seconds


def run_direct(settings: Any, paths: list[Path], logs: Path, *, submit: bool) -> dict[str, Any]:
    """One batch, the three layers one after another: clients of the server, or spark-submits."""
    watch = GoldWatch(paths)
    watch.begin()
    jobs = (
        run_layers(settings, logs, "submit", spark_submit)
        if submit
        else run_layers(settings, logs, "direct", client)
    )
    wall = time.perf_counter() - watch.start
    return {
        "trigger_to_gold_s": watch.finish(),
        "wall_s": wall,
        "job_s": jobs,
        "versions": {p.name: [watch.before[p], watch.seen[p][0]] for p in paths},
    }


def _p50(values: list[float]) -> float:
    import numpy as np

    return float(np.percentile(values, 50))


def _setup(work: Path, records: int) -> Any:
    """The contract, and a first batch through ``lakehouse run`` (creates the tables)."""
    contracts = work / "contracts"
    contracts.mkdir(parents=True, exist_ok=True)
    (contracts / f"{TOPIC}.yaml").write_text(CONTRACT)
    settings = _settings(work)
    _produce(settings, records, seed=0)
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "lakehouse"), "run", "--topic", TOPIC],
        env=clean_environment(settings),
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"lakehouse run failed:\n{proc.stderr[-3000:]}")
    return settings


def _stop_on_sigterm() -> None:
    """SIGTERM unwinds like Ctrl-C, so the Airflow processes are stopped on the way out."""

    def handler(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, handler)


def batch_command_line(
    doc: str | None, repeats: str, prefix: str
) -> tuple[argparse.Namespace, Path, Path]:
    """The command line of a benchmark of 10K-record micro-batches through the layer jobs:
    ``--records``, ``--repeats`` (``repeats`` says of what),
    ``--workdir``; and its work and log folders (a temporary work folder named ``prefix...``
    when ``--workdir`` is not given)."""
    parser = argparse.ArgumentParser(
        description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--records", type=int, default=10_000, help="records per batch")
    parser.add_argument("--repeats", type=int, default=3, help=repeats)
    parser.add_argument("--workdir", type=Path, help="keep the lakehouse and logs here")
    parser.add_argument(
        "--no-submit", action="store_true", help="leave out the spark-submit path (a JVM per layer)"
    )
    args = parser.parse_args()
    if args.records < 1 or args.repeats < 1:
        parser.error("--records and --repeats must be positive")
    work = (args.workdir or Path(tempfile.mkdtemp(prefix=prefix))).resolve()
    logs = work / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    return args, work, logs


def main() -> None:
    args, work, logs = batch_command_line(
        __doc__, "measured batches per path", "bench-airflow-trigger-"
    )
    _stop_on_sigterm()
    from lakehouse.runtime import server

    settings = None
    try:
        started = time.perf_counter()
        os.environ[server.PORT_ENV] = str(free_port())
        settings = _settings(work)
        shutil.rmtree(settings.home, ignore_errors=True)
        server.start(settings)
        print(f"(Spark server up in {time.perf_counter() - started:.1f} s, not counted)")
        started = time.perf_counter()
        _setup(work, args.records)
        paths = [settings.gold_path(t) for t in TABLES]
        print(
            f"(setup: first batch through `lakehouse run` in {time.perf_counter() - started:.1f} s)"
        )
        load_before = os.getloadavg()
        started = time.perf_counter()
        extra = {"AIRFLOW__SCHEDULER__USE_JOB_SCHEDULE": "False"}
        with running_airflow(settings, logs / "airflow", extra_env=extra) as airflow:
            print(f"(Airflow up in {time.perf_counter() - started:.1f} s, not counted)")
            airflow.wait_for_dag(DAG_ID)
            airflow.set_paused(DAG_ID, False)
            runs: dict[str, list[dict[str, Any]]] = {"airflow": [], "direct": [], "submit": []}
            kinds = ["airflow", "direct"] + ([] if args.no_submit else ["submit"])
            seed = 1
            for round_ in range(args.repeats):
                order = kinds[round_ % len(kinds) :] + kinds[: round_ % len(kinds)]
                for path in order:
                    _produce(settings, args.records, seed=seed)
                    seed += 1
                    if path == "airflow":
                        r = run_airflow(airflow, paths)
                        said = f"run {r['run_duration_s']:.1f} s, finished after {r['trigger_to_finished_s']:.1f} s"
                    else:
                        r = run_direct(settings, paths, logs, submit=path == "submit")
                        said = f"wall {r['wall_s']:.1f} s"
                    runs[path].append(r)
                    print(
                        f"(round {round_ + 1} {path}: trigger-to-gold "
                        f"{r['trigger_to_gold_s']:.1f} s, {said})",
                        flush=True,
                    )
        load_after = os.getloadavg()
        figures, context, notes = summarize(runs, args)
        context["load_average_1_5_15"] = {
            "before": [round(x, 2) for x in load_before],
            "after": [round(x, 2) for x in load_after],
        }
        report(figures, "airflow_trigger", context)
        for line in notes:
            print(line)
    finally:
        if settings is not None:
            server.stop(settings)
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)


def summarize(
    runs: dict[str, list[dict[str, Any]]], args: argparse.Namespace
) -> tuple[list[Figure], dict[str, Any], list[str]]:
    def col(rows: list[dict[str, Any]], key: str) -> list[float]:
        return [float(r[key]) for r in rows]

    ours, peer, submit = runs["airflow"], runs["direct"], runs["submit"]
    peer_name = "lakehouse run x3 on the server, no Airflow"
    submit_name = "spark-submit x3, no Airflow"
    to_gold = _p50(col(ours, "trigger_to_gold_s"))
    peer_to_gold = _p50(col(peer, "trigger_to_gold_s"))
    peer_wall = _p50(col(peer, "wall_s"))
    figures = [
        Figure("airflow_trigger.trigger_to_gold.p50", to_gold, "s", peer_name, peer_to_gold, False),
        Figure(
            "airflow_trigger.trigger_to_run_finished.p50",
            _p50(col(ours, "trigger_to_finished_s")),
            "s",
            peer_name,
            peer_wall,
            False,
        ),
        Figure(
            "airflow_trigger.dag_run_duration.p50",
            _p50(col(ours, "run_duration_s")),
            "s",
            peer_name,
            peer_wall,
            False,
        ),
    ]
    if submit:
        figures.append(
            Figure(
                "airflow_trigger.trigger_to_gold_vs_spark_submit.p50",
                to_gold,
                "s",
                submit_name,
                _p50(col(submit, "trigger_to_gold_s")),
                False,
            )
        )
    overhead = to_gold - peer_to_gold
    in_tasks = {layer: _p50([r["layer_task_s"][layer] for r in ours]) for layer in LAYER_TASKS}
    direct_jobs = {layer: _p50([r["job_s"][layer] for r in peer]) for layer in LAYER_TASKS}
    met = to_gold <= GOAL_S
    context: dict[str, Any] = {
        "records": args.records,
        "repeats": args.repeats,
        "cores": os.cpu_count(),
        "spark_master": SPARK_MASTER,
        "executor": "LocalExecutor (PostgreSQL)",
        "gold_tables": list(TABLES),
        "goal_trigger_to_gold_s": GOAL_S,
        "goal_met": met,
        "airflow_overhead_p50_s": round(overhead, 2),
        "airflow_layer_task_p50_s": {k: round(v, 2) for k, v in in_tasks.items()},
        "direct_layer_p50_s": {k: round(v, 2) for k, v in direct_jobs.items()},
        "airflow_runs": ours,
        "direct_runs": peer,
        "spark_submit_runs": submit,
        "schedule": "one batch per path per round, rotating which path goes first",
    }

    def fmt(values: list[float]) -> str:
        return " ".join(f"{v:.1f}" for v in values)

    notes = [
        f"(trigger-to-gold per run s: airflow {fmt(col(ours, 'trigger_to_gold_s'))}; "
        f"direct on the server {fmt(col(peer, 'trigger_to_gold_s'))}"
        + (f"; spark-submit {fmt(col(submit, 'trigger_to_gold_s'))}" if submit else "")
        + ")",
        f"(airflow queued before start p50: {_p50(col(ours, 'queued_s')):.1f} s; layer tasks "
        f"p50 s: "
        + ", ".join(f"{k} {v:.1f}" for k, v in in_tasks.items())
        + "; direct layers p50 s: "
        + ", ".join(f"{k} {v:.1f}" for k, v in direct_jobs.items())
        + ")",
        f"Airflow overhead (p50 trigger-to-gold, Airflow - direct on the server): {overhead:.1f} s",
        f"goal trigger-to-gold <= {GOAL_S:.0f} s for a {args.records}-record batch: "
        f"{'met' if met else 'NOT met'} (p50 {to_gold:.1f} s)",
    ]
    return figures, context, notes


if __name__ == "__main__":
    main()
