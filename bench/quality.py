"""Gate cost benchmark: a micro-batch through bronze, silver and gold with and without the
contract's data-quality gates.

    python bench/quality.py [--batch 10000] [--batches 10] [--warmup 4] [--keys 100000]
                            [--profile [N]] [--workdir DIR]

One topic (JSON values, a string key ``user``, fields ``city`` string, ``amount`` long and
``occurred_at`` timestamp, the event time; 3 partitions; one tombstone in a thousand records)
with two gold tables: ``bench_quality_totals`` (aggregate: ``n`` = count, ``total`` = sum of
``amount``) and ``bench_quality_latest`` (latest value per user). The contract is written twice,
each copy in its own contracts folder with its own ``LAKEHOUSE_HOME``:

* ungated (the peer): no ``expectations:`` and no ``quality:`` block, so no gate is active;
* gated: the expectations below on every layer, plus ``quality: {freshness: 1h, volume:
  {factor: 10}}``. None of them is broken by the generated data (nothing is quarantined and no
  batch fails; the run checks that), so both variants publish the same rows.

  ====== ================================================================================
  bronze partition between 0..2 (fail; also a Delta CHECK constraint), key not_null (warn)
  silver user not_null (quarantine), user match_regex (warn), amount between (warn),
         city in_set (warn), city length_between (warn), row_count_between (fail)
  gold   latest: user unique (fail; table-level: judges the table as it would be after the
         batch); totals: n between >= 1 (fail; also a Delta CHECK constraint)
  ====== ================================================================================

Each variant runs in its own worker process (its own JVM and Spark session on ``local[2]``, its
own GX context, imports and Delta log caches), so neither warms the other's caches. The driver
starts both, has them run the ``--warmup`` batches (default 4) at the same time (not counted:
they start the session, import and set up GX, create the tables and warm the JVM's JIT; with
2, the next batches were still slower in both variants), and then runs the measured
batches in lockstep: batch I is run by one worker, then by the other (which goes first
alternates), the idle worker waiting on its stdin. Running the variants one after the other
would let a change in the machine's background load between the two runs (this is a shared
2-core machine) pass for gate cost; in lockstep, both see the same conditions within seconds.

For each batch a worker produces ``--batch`` records into landing (same seed for both variants;
not timed), then times ``runner.run_layer`` for bronze, silver and gold, each separately, as
the scheduler runs them (one run per layer, each a new ``RunInfo``). ``--keys`` is the number of
distinct users the records draw from (uniformly); the gold tables grow towards it, which matters
for the table-level ``unique`` check, since it judges the whole latest table each batch.

Figures: per layer and for the three together, the p50 (numpy's linear interpolation) of the
gated per-batch wall time, with the ungated p50 as the peer (ratio = ungated / gated, so < 1:
gates cost time) and the overhead gated / ungated - 1. Goal from the issue: gates add at most
30%, per layer and in total.

Correctness: after the runs both variants' gold tables (every column, sorted by key) and silver
streams must be identical, the gated run must have quarantined nothing, and its ledger must hold
a passing result for each of its expectations in every measured batch.

``--profile [N]`` runs N more batches (3 if N is not given; not counted in the figures) after
the measured ones, in both workers; in the gated worker the gate's parts are timed by wrapping,
in that process only, ``Gate.check``, ``verdict.run_suite`` (split into the Spark -> Arrow
collect of a small Spark batch, done by the wrapper just as run_suite would do it, GX's suite
and definition set-up ``verdict._validation`` or ``gx.get_context``, GX's
``ValidationDefinition.run``, and the rest: pandas conversion, reading the results),
``gate.volume_outcome``, ``Gate.record`` (``ledger.write_ledger``, ``ledger.save_result``),
the dry-run merge ``store._merge_outcome`` and ``store._table_after``,
``runner.sync_constraints`` and ``runner.check_freshness``. A function
the library no longer has is skipped and named. Times are means per batch, inclusive, with the
exclusive (self) time beside them. What the wrapped parts do not explain of the layer's extra
time (gated minus ungated, same batches) is gate work inside the jobs themselves (for silver:
counting the judged rows, and keeping the raw key/value bytes in the cached batch while a
quarantine expectation may route rows), or noise.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import Figure, report, tree_peak_rss_mib

CORES = 2
PARTITIONS = 3
TOPIC = "bench-quality"
STREAM = "bench_quality"
TOTALS = "bench_quality_totals"
LATEST = "bench_quality_latest"
LAYERS = ("bronze", "silver", "gold")
VARIANTS = ("ungated", "gated")
GOAL = 0.30  # gates may add at most 30% to a layer's batch time
TOMBSTONE_EVERY = 1000
BASE_MS = 1_700_000_000_000
STEP_MS = 10
CITIES = (
    "Paris", "Sydney", "Rome", "Lima", "Berlin", "Oslo", "Lagos", "Quito", "Hanoi", "Austin",
    "Dakar", "Porto", "Seoul", "Perth", "Cairo", "Delhi", "Tunis", "Minsk", "Riga", "Kyoto",
)  # fmt: skip
PEER = "same pipeline, no gates"

CONTRACT = f"""\
topic: {TOPIC}
partitions: {PARTITIONS}
key: {{format: string, name: user}}
value:
  format: json
  fields:
    - {{name: city, type: string}}
    - {{name: amount, type: long}}
    - {{name: occurred_at, type: timestamp}}
event_time: occurred_at
stream: {{name: {STREAM}}}
tables:
  - name: {TOTALS}
    kind: aggregate
    aggregations:
      - {{name: n, fn: count}}
      - {{name: total, fn: sum, field: amount}}
  - name: {LATEST}
    kind: latest
"""

GATES = f"""\
expectations:
  bronze:
    - {{name: partition_in_range, expect: between, column: partition, min: 0, max: {PARTITIONS - 1}, severity: fail}}
    - {{name: key_present, expect: not_null, column: key, severity: warn}}
  silver:
    - {{name: user_present, expect: not_null, column: user, severity: quarantine}}
    - {{name: user_shape, expect: match_regex, column: user, pattern: '^user-[0-9]{{6}}$', severity: warn}}
    - {{name: amount_range, expect: between, column: amount, min: 0, max: 1000000, severity: warn}}
    - {{name: city_known, expect: in_set, column: city, values: [{", ".join(CITIES)}], severity: warn}}
    - {{name: city_length, expect: length_between, column: city, min: 1, max: 40, severity: warn}}
    - {{name: batch_size, expect: row_count_between, min: 1, max: 1000000, severity: fail}}
  gold:
    - {{name: one_row_per_user, table: {LATEST}, expect: unique, column: user, severity: fail}}
    - {{name: counts_positive, table: {TOTALS}, expect: between, column: n, min: 1, severity: fail}}
quality:
  freshness: 1h
  volume: {{factor: 10}}
"""


def _settings(work: Path, variant: str) -> Any:
    from lakehouse.runtime.config import Settings

    root = work / variant
    return Settings.from_env(home=root / "home", contracts_dir=root / "contracts")


def write_contracts(work: Path) -> None:
    for variant in VARIANTS:
        folder = work / variant / "contracts"
        shutil.rmtree(work / variant, ignore_errors=True)
        folder.mkdir(parents=True)
        text = CONTRACT + (GATES if variant == "gated" else "")
        (folder / f"{TOPIC}.yaml").write_text(text)


# -- landing records (not timed) -------------------------------------------------------------


def batch_records(index: int, batch: int, keys: int) -> list[Any]:
    """Micro-batch ``index``: ``batch`` records, the same for a given index in every process."""
    import numpy as np

    from lakehouse.topics.landing import Record

    rng = np.random.default_rng(1000 + index)
    users = rng.integers(0, keys, batch)
    cities = rng.integers(0, len(CITIES), batch)
    amounts = rng.integers(0, 10_000, batch)
    first = index * batch
    out = []
    for n in range(batch):
        seq = first + n
        ms = BASE_MS + seq * STEP_MS
        value = None
        if seq % TOMBSTONE_EVERY != TOMBSTONE_EVERY - 1:
            at = datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat(timespec="milliseconds")
            doc = {
                "city": CITIES[cities[n]],
                "amount": int(amounts[n]),
                "occurred_at": at.replace("+00:00", "Z"),
            }
            value = json.dumps(doc, separators=(",", ":")).encode()
        out.append(Record(key=f"user-{users[n]:06d}".encode(), value=value, timestamp_ms=ms))
    return out


# -- profiling (gated worker, --profile batch only) ------------------------------------------


class Timers:
    """Inclusive and exclusive (self) seconds and calls of named, possibly nested, sections."""

    def __init__(self) -> None:
        self.incl: dict[str, float] = {}
        self.excl: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        self.top_level = 0.0  # seconds in sections not nested in another one
        self.missing: set[str] = set()  # sections whose function the library no longer has
        self._stack: list[list[float]] = []  # per open section: [children's seconds]

    @contextmanager
    def section(self, name: str) -> Iterator[None]:
        self._stack.append([0.0])
        started = time.perf_counter()
        try:
            yield
        finally:
            elapsed = time.perf_counter() - started
            children = self._stack.pop()[0]
            if self._stack:
                self._stack[-1][0] += elapsed
            else:
                self.top_level += elapsed
            self.incl[name] = self.incl.get(name, 0.0) + elapsed
            self.excl[name] = self.excl.get(name, 0.0) + elapsed - children
            self.calls[name] = self.calls.get(name, 0) + 1

    def dump(self) -> dict[str, Any]:
        return {
            "top_level_s": self.top_level,
            "missing": sorted(self.missing),
            "sections": {
                k: {"incl_s": self.incl[k], "self_s": self.excl[k], "calls": self.calls[k]}
                for k in self.incl
            },
        }

    def wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            with self.section(name):
                return fn(*args, **kwargs)

        return timed


@contextmanager
def instrumented(timers: Timers) -> Iterator[None]:
    """Wrap the gate's parts with timers (restored on exit); behaviour is unchanged."""
    import great_expectations as gx
    import pyarrow as pa
    from great_expectations.core.validation_definition import ValidationDefinition

    from lakehouse.pipeline import runner
    from lakehouse.quality import gate, ledger, verdict
    from lakehouse.quality.expectations import pandas_max_rows
    from lakehouse.storage import store

    original_run_suite = verdict.run_suite

    def run_suite(name: str, expectations: Any, batch: Any, rows: int, **kw: Any) -> Any:
        with timers.section("quality.run_suite"):
            if not isinstance(batch, pa.Table) and rows <= pandas_max_rows():
                # What run_suite does first for a small Spark batch, timed on its own.
                with timers.section("run_suite: Spark batch -> Arrow (toArrow)"):
                    batch = batch.toArrow()
            return original_run_suite(name, expectations, batch, rows, **kw)

    # (object, attribute, label); the library changes, so what is not there is skipped.
    wanted: list[tuple[Any, str, str]] = [
        (gx, "get_context", "run_suite: gx.get_context"),
        (verdict, "_validation", "run_suite: GX suite/definition set-up (verdict._validation)"),
        (ValidationDefinition, "run", "run_suite: GX ValidationDefinition.run"),
        (gate, "volume_outcome", "gate.volume_outcome"),
        (ledger, "write_ledger", "ledger.write_ledger"),
        (gate, "save_result", "gate.save_result"),
        (gate.Gate, "check", "Gate.check"),
        (gate.Gate, "record", "Gate.record"),
        (store, "_merge_outcome", "store._merge_outcome"),
        (store, "_table_after", "store._table_after"),
        (runner, "sync_constraints", "runner.sync_constraints"),
        (runner, "check_freshness", "runner.check_freshness"),
    ]
    # The gate calls run_suite by the name it imported.
    patches: list[tuple[Any, str, Any]] = [(gate, "run_suite", run_suite)]
    for obj, attr, label in wanted:
        if hasattr(obj, attr):
            patches.append((obj, attr, timers.wrap(label, getattr(obj, attr))))
        else:
            timers.missing.add(label)
    saved = [(obj, attr, getattr(obj, attr)) for obj, attr, _ in patches]
    try:
        for obj, attr, new in patches:
            setattr(obj, attr, new)
        yield
    finally:
        for obj, attr, old in saved:
            setattr(obj, attr, old)


# -- the worker ------------------------------------------------------------------------------


def _digest(table: Any, sort_keys: list[str]) -> dict[str, Any]:
    """Rows and a checksum of every column's values, rows sorted by ``sort_keys``."""
    table = table.sort_by([(k, "ascending") for k in sort_keys])
    text = json.dumps(
        {name: table.column(name).to_pylist() for name in sorted(table.column_names)},
        default=str,
    )
    return {"rows": table.num_rows, "sha256": hashlib.sha256(text.encode()).hexdigest()[:16]}


def table_facts(settings: Any) -> dict[str, Any]:
    from deltalake import DeltaTable

    def read(path: Path) -> Any:
        return DeltaTable(str(path)).to_pyarrow_table()

    def count(path: Path) -> int:
        if not (path / "_delta_log").is_dir():
            return 0
        return int(read(path).num_rows)

    return {
        "gold": {
            TOTALS: _digest(read(settings.gold_path(TOTALS)), ["user"]),
            LATEST: _digest(read(settings.gold_path(LATEST)), ["user"]),
        },
        "silver": _digest(read(settings.silver_path(STREAM)), ["partition", "offset"]),
        "bronze_rows": count(settings.bronze_path(TOPIC)),
        "quarantined": {
            "bronze": count(settings.quarantine_path("bronze", TOPIC)),
            "silver": count(settings.quarantine_path("silver", STREAM)),
        },
    }


def ledger_facts(settings: Any) -> dict[str, Any]:
    """Per expectation (layer.table.expectation): validations, failures, engines."""
    from lakehouse.quality.ledger import read_ledger

    rows = read_ledger(settings).to_pylist()
    out: dict[str, dict[str, Any]] = {}
    for r in rows:
        key = f"{r['layer']}.{r['table']}.{r['expectation']}"
        entry = out.setdefault(key, {"validations": 0, "failed": 0, "engines": []})
        entry["validations"] += 1
        entry["failed"] += 0 if r["success"] else 1
        if r["engine"] not in entry["engines"]:
            entry["engines"].append(r["engine"])
    return {"rows": len(rows), "expectations": out}


REPLY = "@@"  # a worker's replies on stdout start with this; any other line is ignored


def _reply(kind: str, payload: Any) -> None:
    print(f"{REPLY}{kind} {json.dumps(payload)}", flush=True)


def worker(work: Path, variant: str, batch: int, keys: int, profile_from: int) -> None:
    """Serve the driver's commands on stdin, one reply line each: ``batch I`` (produce batch
    I, then time run_layer for bronze, silver and gold), ``finish`` (facts, then exit)."""
    from lakehouse.contracts.catalog import Catalog
    from lakehouse.pipeline.runner import run_layer
    from lakehouse.runtime.spark import get_session
    from lakehouse.topics.landing import Producer

    settings = _settings(work, variant)
    catalog = Catalog.load(settings.contracts_dir)
    contract = catalog.topic(TOPIC)
    producer = Producer(settings, TOPIC, contract.partitions)
    started = time.perf_counter()
    spark = get_session(f"local[{CORES}]", app_name=f"bench-quality-{variant}")
    _reply("ready", {"session_start_s": time.perf_counter() - started})
    echoed: list[str] = []
    timers = {layer: Timers() for layer in LAYERS}  # summed over the profiled batches
    while True:
        word, *rest = (sys.stdin.readline() or "finish").split()
        if word == "finish":
            break
        i = int(rest[0])
        producer.send_batch(batch_records(i, batch, keys))
        profiling = variant == "gated" and 0 <= profile_from <= i
        seconds: dict[str, float] = {}
        for layer in LAYERS:
            lines: list[str] = []
            with instrumented(timers[layer]) if profiling else _nothing():
                started = time.perf_counter()
                run_layer(spark, settings, contract, layer, catalog, echo=lines.append)
                seconds[layer] = time.perf_counter() - started
            echoed += lines
        _reply("done", seconds)
    peak = tree_peak_rss_mib()
    spark.stop()
    _reply(
        "result",
        {
            "peak_mib": peak,
            "facts": table_facts(settings),
            "ledger": ledger_facts(settings),
            "profile": {layer: t.dump() for layer, t in timers.items() if t.incl},
            "gate_lines": [line for line in echoed if line.startswith("quality ")][-8:],
            "warnings": [
                line for line in echoed if line.lstrip().startswith(("WARN", "FAIL", "QUARANTINE"))
            ],
        },
    )


class Worker:
    """One variant's worker process, driven command by command (its stderr goes to a file)."""

    def __init__(self, script: Path, work: Path, variant: str, args: argparse.Namespace) -> None:
        import subprocess

        self.variant = variant
        self.log = work / f"{variant}.stderr"
        self._err = self.log.open("w")
        self.proc = subprocess.Popen(
            [
                sys.executable, str(script), "--worker", variant, str(work), str(args.batch),
                str(args.keys), str(args.profile_from),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._err,
            text=True,
        )  # fmt: skip

    def send(self, command: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()

    def receive(self, kind: str) -> Any:
        assert self.proc.stdout is not None
        for line in iter(self.proc.stdout.readline, ""):
            if line.startswith(REPLY):
                got, _, payload = line[len(REPLY) :].partition(" ")
                if got != kind:
                    raise RuntimeError(f"{self.variant} worker: expected {kind}, got {line!r}")
                return json.loads(payload)
        self.proc.wait()
        tail = self.log.read_text(errors="replace")[-4000:]
        raise RuntimeError(f"{self.variant} worker exited ({self.proc.returncode}):\n{tail}")

    def close(self, *, kill: bool = False) -> int | None:
        """Wait for the worker to exit (after ``finish``), or end it now with ``kill``."""
        import subprocess

        if self.proc.poll() is None:
            if kill:
                self.proc.kill()
            try:
                self.proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._err.close()
        return self.proc.returncode


@contextmanager
def _nothing() -> Iterator[None]:
    yield


# -- the report ------------------------------------------------------------------------------


def _p50(values: list[float]) -> float:
    import numpy as np

    return float(np.percentile(values, 50))


def check(ungated: dict[str, Any], gated: dict[str, Any], measured_batches: int) -> None:
    a, b = ungated["facts"], gated["facts"]
    problems = []
    for part in ("gold", "silver", "bronze_rows"):
        if a[part] != b[part]:
            problems.append(f"{part} differs: ungated {a[part]}, gated {b[part]}")
    for variant, facts in (("ungated", a), ("gated", b)):
        if any(facts["quarantined"].values()):
            problems.append(f"{variant} quarantined records: {facts['quarantined']}")
    if ungated["ledger"]["rows"]:
        problems.append("the ungated run wrote to the ledger: some gate was active")
    if gated["warnings"]:
        problems.append(f"gate warnings in the gated run: {gated['warnings'][:5]}")
    expectations = gated["ledger"]["expectations"]
    wanted = GATES.count("- {name: ")  # the gated contract's expectations
    if len([k for k in expectations if not k.endswith((".volume", ".freshness"))]) != wanted:
        problems.append(f"expected {wanted} expectations in the ledger: {sorted(expectations)}")
    for key, entry in expectations.items():
        if entry["failed"]:
            problems.append(f"{key}: {entry['failed']} failed validation(s)")
        if entry["validations"] < measured_batches:
            problems.append(f"{key}: only {entry['validations']} validation(s)")
    if problems:
        raise SystemExit(
            "quality bench: variants are not like for like:\n  " + "\n  ".join(problems)
        )


def profile_notes(
    profile: dict[str, Any], gated: list[dict[str, float]], ungated: list[dict[str, float]]
) -> tuple[list[str], dict[str, Any]]:
    """Per layer, means over the profiled batches: the gated and ungated (same batches) time,
    the wrapped gate parts, and what of the extra time they do not explain."""
    lines: list[str] = []
    summary: dict[str, Any] = {}
    n = len(gated)
    for layer, prof in profile.items():
        mine = sum(b[layer] for b in gated) / n
        plain = sum(b[layer] for b in ungated) / n
        extra, top = mine - plain, prof["top_level_s"] / n
        lines.append(
            f"(profile {layer}, mean of {n} batch(es): gated {mine:.3f} s, ungated {plain:.3f} s, "
            f"extra {extra:.3f} s; wrapped gate parts {top:.3f} s; the rest, {extra - top:.3f} s, "
            "is gate work inside the job itself, or noise)"
        )
        sections = {
            name: {"incl_s": v["incl_s"] / n, "self_s": v["self_s"] / n, "calls": v["calls"] / n}
            for name, v in prof["sections"].items()
        }
        for name, v in sorted(sections.items(), key=lambda kv: -kv[1]["incl_s"]):
            lines.append(
                f"(    {name:60} {v['incl_s']:6.3f} s incl {v['self_s']:6.3f} s self "
                f"x{v['calls']:g})"
            )
        if prof["missing"]:
            lines.append(f"(    not found in the library, not timed: {', '.join(prof['missing'])})")
        summary[layer] = {
            "batches": n,
            "gated_s": mine,
            "ungated_s": plain,
            "extra_s": extra,
            "wrapped_top_level_s": top,
            "unexplained_s": extra - top,
            "sections_per_batch": sections,
            "missing": prof["missing"],
        }
    return lines, summary


def run_variants(script: Path, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Both workers: started and warmed up at once, then batch by batch in turn (which variant
    goes first alternates), then their facts. Returns per variant the result and the times."""
    total = args.warmup + args.batches + args.profile
    workers = {v: Worker(script, work, v, args) for v in VARIANTS}
    out: dict[str, Any] = {v: {"batches": []} for v in VARIANTS}
    try:
        for v, w in workers.items():
            out[v] |= w.receive("ready")
        started = time.perf_counter()
        for i in range(args.warmup):  # not timed: the workers may share the cores here
            for w in workers.values():
                w.send(f"batch {i}")
            for v, w in workers.items():
                out[v]["batches"].append(w.receive("done"))
        print(f"(warm-up: {time.perf_counter() - started:.1f} s, both workers at once)")
        started = time.perf_counter()
        for i in range(args.warmup, total):
            for v in VARIANTS if i % 2 == 0 else VARIANTS[::-1]:
                workers[v].send(f"batch {i}")
                out[v]["batches"].append(workers[v].receive("done"))
        print(f"(measured batches: {time.perf_counter() - started:.1f} s, one worker at a time)")
        for w in workers.values():
            w.send("finish")
        for v, w in workers.items():
            out[v] |= w.receive("result")
    except BaseException:
        for w in workers.values():
            w.close(kill=True)
        raise
    for v, w in workers.items():
        code = w.close()
        if code:
            print(f"({v} worker exited with {code} after its last reply; see {w.log})")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--batch", type=int, default=10_000, help="records per micro-batch")
    parser.add_argument("--batches", type=int, default=10, help="measured micro-batches")
    parser.add_argument("--warmup", type=int, default=4, help="micro-batches before, not counted")
    parser.add_argument("--keys", type=int, default=100_000, help="distinct users in the records")
    parser.add_argument(
        "--profile",
        type=int,
        nargs="?",
        const=3,
        default=0,
        metavar="N",
        help="N more batches (3 if not given) after the measured ones, the gate's parts timed",
    )
    parser.add_argument("--workdir", type=Path, help="keep the variants' lakehouses here")
    parser.add_argument("--worker", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        variant, work, batch, keys, profile_from = args.worker
        worker(Path(work), variant, int(batch), int(keys), int(profile_from))
        return
    if args.batches < 1 or args.warmup < 0 or args.batch < 1 or args.keys < 1 or args.profile < 0:
        parser.error("--batch, --batches and --keys must be positive, --warmup not negative")
    args.profile_from = args.warmup + args.batches if args.profile else -1
    work = (args.workdir or Path(tempfile.mkdtemp(prefix="bench-quality-"))).resolve()
    try:
        write_contracts(work)
        load_before = os.getloadavg()
        started = time.perf_counter()
        results = run_variants(Path(__file__), work, args)
        wall = time.perf_counter() - started
        load_after = os.getloadavg()
        ungated, gated = results["ungated"], results["gated"]
        check(ungated, gated, args.batches)
        measured = slice(args.warmup, args.warmup + args.batches)
        per_batch: dict[str, dict[str, list[float]]] = {}
        for variant, res in results.items():
            batches = res["batches"][measured]
            times = {layer: [b[layer] for b in batches] for layer in LAYERS}
            times["total"] = [sum(b.values()) for b in batches]
            per_batch[variant] = times
        figures: list[Figure] = []
        overhead: dict[str, float] = {}
        met: dict[str, bool] = {}
        notes: list[str] = []
        for part in (*LAYERS, "total"):
            mine, peer = _p50(per_batch["gated"][part]), _p50(per_batch["ungated"][part])
            figures.append(Figure(f"gate_cost.{part}.p50", mine, "s", PEER, peer, False))
            overhead[part] = mine / peer - 1
            met[part] = overhead[part] <= GOAL
            notes.append(
                f"gate overhead {part}: {100 * overhead[part]:+.1f}% (p50 {mine:.3f} s vs "
                f"{peer:.3f} s); goal <= {100 * GOAL:.0f}%: {'met' if met[part] else 'NOT met'}"
            )
        from lakehouse.quality.expectations import pandas_max_rows

        context: dict[str, Any] = {
            "cores": os.cpu_count(),
            "spark_cores": CORES,
            "load_average_1_5_15": {
                "before": [round(x, 2) for x in load_before],
                "after": [round(x, 2) for x in load_after],
            },
            "batch": args.batch,
            "batches_measured": args.batches,
            "warmup_batches": args.warmup,
            "keys": args.keys,
            "partitions": PARTITIONS,
            "tombstone_every": TOMBSTONE_EVERY,
            "gx_pandas_max_rows": pandas_max_rows(),
            "goal_max_overhead": GOAL,
            "overhead_pct": {k: round(100 * v, 1) for k, v in overhead.items()},
            "goal_met": met,
            "goal_met_all": all(met.values()),
            "batch_s": {
                v: {k: [round(s, 3) for s in xs] for k, xs in per_batch[v].items()}
                for v in VARIANTS
            },
            "warmup_batch_s": {
                v: [
                    {k: round(s, 3) for k, s in b.items()}
                    for b in results[v]["batches"][: measured.start]
                ]
                for v in VARIANTS
            },
            "session_start_s": {v: round(results[v]["session_start_s"], 1) for v in VARIANTS},
            "peak_mib": {v: round(results[v]["peak_mib"]) for v in VARIANTS},
            "wall_s": round(wall, 1),
            "final_tables": gated["facts"],
            "ledger": gated["ledger"],
            "schedule": "two worker processes (own JVM each), warmed up at once, then each "
            "measured batch run by one worker at a time, alternating which variant goes first",
        }
        if args.profile:
            lines, context["profile"] = profile_notes(
                gated["profile"],
                gated["batches"][args.profile_from :],
                ungated["batches"][args.profile_from :],
            )
            notes += lines
        report(figures, "quality", context)

        def fmt(values: list[float]) -> str:
            return " ".join(f"{v:.2f}" for v in values)

        print(
            f"({args.warmup} warm-up batch(es) of {args.batch} records first, not counted; "
            f"{args.batches} measured; {args.keys} keys, gold tables end at "
            f"{gated['facts']['gold'][LATEST]['rows']} rows; both variants' tables identical; "
            f"load average {load_before[0]:.1f} before, {load_after[0]:.1f} after)"
        )
        for v in VARIANTS:
            for part in (*LAYERS, "total"):
                print(f"({v} {part} per batch s: {fmt(per_batch[v][part])})")
        for line in gated["gate_lines"]:
            print(f"(last gate lines: {line})")
        for line in notes:
            print(line)
    finally:
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
