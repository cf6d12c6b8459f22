"""Gold table benchmark: micro-batch latency and full build of an aggregate table.

    python bench/gold.py [--keys 1000000] [--batch 10000] [--batches 20] [--warmup 2]
                         [--events 10000000] [--workdir DIR] [--skip-latency] [--skip-full]

The gold table (contract inline below) is an ``aggregate`` keyed by the record key ``user``
(a string): ``n`` = count of events, ``total`` = sum of the long field ``amount``. The silver
streams are written directly in the stream's schema (``streams.stream_schema`` of the contract:
key, value fields, tombstone, partition, offset, timestamp, event_time) by ``write_deltalake``
with the change data feed on, as the silver job would leave them; one event in a thousand is a
tombstone (both paths ignore those). Preparing is not timed. Each path runs in its own process.

1. Micro-batch latency. Silver holds one event for each of ``--keys`` keys and the gold table
   already holds those keys (built once by ``build_table``, kept as a pristine copy and restored
   before each run). Then ``--warmup`` + ``--batches`` micro-batches of ``--batch`` events
   (80% existing keys, 20% new ones) are appended to silver, one version each.

   * ours: after each append, ``tables.build_table`` on ``local[2]``: the change feed of the
     silver versions not yet consumed, aggregated by Spark (``tables.aggregate_per_key``), then
     a delta-spark MERGE in one commit that records the consumed version. The session is warmed
     on a tiny stream first.
   * peer: a copy of the same seeded gold table (same files, change feed on). For each of the
     same silver versions: ``DeltaTable.load_cdf`` of that version, polars ``group_by``, and
     ``DeltaTable.merge`` (``when_matched_update`` adding, ``when_not_matched_insert``), polars
     capped to 2 threads.

   Figures: p50 and p95 (numpy's linear interpolation) of the per-batch wall time over the
   ``--batches`` measured batches; the first ``--warmup`` batches (default 2) are warm-up and
   not counted, for either path. Goal from the issue: our p50 <= 2 s for a 10K batch.

2. Full build. ``--events`` events over ``--keys`` keys (uniform) in silver, appended in
   versions of 1M events.

   * ours: one ``build_table`` from nothing (no gold table yet) on ``local[2]``: aggregated
     and merged as above.
   * peer: ``polars.scan_delta`` of the silver snapshot (the stream is append-only, so the
     snapshot is the whole change feed), ``group_by``, ``write_deltalake`` of the result into a
     new table (change feed on), polars capped to 2 threads.

   Both paths' worker processes are kept on 2 CPUs (``common.pin_cores``) on a bigger machine,
   so polars and the JVM size their thread pools alike.

   Figures: events/s per core (both divided by the same 2 cores), wall seconds, peak RSS of
   each worker's process tree.

Ratios follow bench/common.py: ratio > 1 means ours is better (for latencies, peer / ours).
Both paths' gold tables are checked to hold the same keys, counts and sums. ``--workdir`` keeps
the prepared silver streams and the seeded gold table for the next run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import Figure, pin_cores, report, run_worker, tree_peak_rss_mib

CORES = 2
PARTITIONS = 12
TOMBSTONE_EVERY = 1000
NEW_KEY_SHARE = 0.2  # of each micro-batch's events
ROUND_EVENTS = 1_000_000  # events per silver version of the full-build stream
WARM_EVENTS = 1000
LATENCY_GOAL_S = 2.0
T0_US = 1_700_000_000_000_000  # first event's timestamp, microseconds since the epoch
STEP_US = 10_000
KINDS = ("latency", "full", "warm")
PEER_LATENCY = "polars group_by+deltalake merge"
PEER_FULL = "polars scan_delta+write_deltalake"


def _topic(kind: str) -> str:
    return f"bench-gold-{kind}"


def _stream(kind: str) -> str:
    return f"bench_gold_{kind}"


def _table(kind: str) -> str:
    return f"bench_gold_{kind}_totals"


def _contract(kind: str) -> str:
    return (
        f"topic: {_topic(kind)}\n"
        f"partitions: {PARTITIONS}\n"
        "key: {format: string, name: user}\n"
        "value: {format: json, fields: [{name: amount, type: long}]}\n"
        f"stream: {{name: {_stream(kind)}}}\n"
        "tables:\n"
        f"  - name: {_table(kind)}\n"
        "    kind: aggregate\n"
        "    aggregations:\n"
        "      - {name: n, fn: count}\n"
        "      - {name: total, fn: sum, field: amount}\n"
    )


def _settings(work: Path) -> Any:
    from lakehouse.runtime.config import Settings

    return Settings.from_env(work / "home", work / "contracts")


def _contract_and_spec(work: Path, kind: str) -> tuple[Any, Any]:
    from lakehouse.contracts.catalog import Catalog

    contract = Catalog.load(work / "contracts").topic(_topic(kind))
    return contract, contract.tables[0]


def _write_contracts(work: Path) -> None:
    contracts = work / "contracts"
    contracts.mkdir(parents=True, exist_ok=True)
    for kind in KINDS:
        (contracts / f"{_topic(kind)}.yaml").write_text(_contract(kind))


# -- silver events (not timed) -------------------------------------------------------------------


def _arrow_schema(contract: Any) -> Any:
    """The silver stream's Arrow schema, as the silver job writes it."""
    from pyspark.sql.pandas.types import to_arrow_schema

    from lakehouse.streams.schema import stream_schema

    return to_arrow_schema(stream_schema(contract), timezone="UTC")


def events_table(schema: Any, ids: Any, first_seq: int, tombstones: bool, seed: int) -> Any:
    """Silver rows for the key ids ``ids`` (user-00000042 ...), sequence numbers (offsets and
    timestamps) from ``first_seq``; with ``tombstones``, one event in TOMBSTONE_EVERY is one."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    n = len(ids)
    rng = np.random.default_rng(seed)
    seq = np.arange(first_seq, first_seq + n, dtype=np.int64)
    tomb = (seq % TOMBSTONE_EVERY == TOMBSTONE_EVERY - 1) if tombstones else np.zeros(n, dtype=bool)
    user = pc.binary_join_element_wise(
        "user-", pc.utf8_lpad(pa.array(ids, pa.int64()).cast(pa.string()), 8, "0"), ""
    )
    amount = pa.array(rng.integers(0, 1000, n, dtype=np.int64), mask=tomb)
    ts = pa.array(T0_US + seq * STEP_US, pa.timestamp("us", tz="UTC"))
    columns = {
        "user": user,
        "amount": amount,
        "tombstone": pa.array(tomb),
        "partition": pa.array((np.asarray(ids) % PARTITIONS).astype(np.int32)),
        "offset": pa.array(seq),
        "timestamp": ts,
        "event_time": ts,
    }
    return pa.Table.from_arrays([columns[f.name] for f in schema], schema=schema)


def batch_ids(keys: int, batch: int, index: int) -> Any:
    """Key ids of micro-batch ``index``: NEW_KEY_SHARE new keys, the rest existing, shuffled."""
    import numpy as np

    rng = np.random.default_rng(1000 + index)
    new = int(batch * NEW_KEY_SHARE)
    first_new = keys + index * new
    ids = np.concatenate(
        [np.arange(first_new, first_new + new), rng.integers(0, keys, batch - new)]
    )
    rng.shuffle(ids)
    return ids


def _write_stream(path: Path, tables: Any) -> None:
    """Append each table as one version of a new silver stream (change feed on)."""
    from deltalake import write_deltalake

    from lakehouse.storage import CDF_PROPERTIES

    shutil.rmtree(path, ignore_errors=True)
    for table in tables:
        write_deltalake(str(path), table, mode="append", configuration=dict(CDF_PROPERTIES))


def _full_tables(schema: Any, events: int, keys: int) -> Any:
    import numpy as np

    rng = np.random.default_rng(7)
    for start in range(0, events, ROUND_EVENTS):
        n = min(ROUND_EVENTS, events - start)
        yield events_table(schema, rng.integers(0, keys, n), start, True, seed=start + 1)


def worker_prepare(work: Path, keys: int, events: int, kinds: list[str]) -> dict[str, Any]:
    """Silver streams (and the latency table's seeded gold table, a pristine copy under
    ``seed/``) of the requested kinds; already prepared ones are kept."""
    import numpy as np

    from lakehouse.runtime.spark import get_session
    from lakehouse.tables.gold import build_table

    _write_contracts(work)
    settings = _settings(work)
    done_file = work / "prepared.json"
    done: dict[str, Any] = json.loads(done_file.read_text()) if done_file.exists() else {}
    wanted = {"warm": [WARM_EVENTS], "latency": [keys], "full": [events, keys]}
    timings: dict[str, float] = {}
    for kind in ["warm", *kinds]:
        if done.get(kind) == wanted[kind]:
            continue
        done.pop(kind, None)
        done_file.write_text(json.dumps(done))
        contract, spec = _contract_and_spec(work, kind)
        schema = _arrow_schema(contract)
        silver = settings.silver_path(contract.stream)
        started = time.perf_counter()
        if kind == "warm":
            _write_stream(silver, [events_table(schema, np.arange(WARM_EVENTS) % 100, 0, True, 3)])
        elif kind == "full":
            _write_stream(silver, _full_tables(schema, events, keys))
        else:
            seed = work / "seed"
            shutil.rmtree(seed, ignore_errors=True)
            shutil.rmtree(settings.gold_path(spec.name), ignore_errors=True)
            ids = np.random.default_rng(5).permutation(keys)
            _write_stream(silver, [events_table(schema, ids, 0, False, seed=2)])
            spark = get_session(f"local[{CORES}]", app_name="bench-gold-prepare")
            build_table(spark, settings, contract, spec)
            spark.stop()
            shutil.copytree(silver, seed / "silver")
            shutil.copytree(settings.gold_path(spec.name), seed / "gold")
        timings[kind] = round(time.perf_counter() - started, 1)
        done[kind] = wanted[kind]
        done_file.write_text(json.dumps(done))
    return timings


# -- ours ----------------------------------------------------------------------------------------


def _warm_session(work: Path) -> tuple[Any, float]:
    """A local[2] session, warmed by a build of the tiny warm-up stream (not timed)."""
    from lakehouse.runtime.spark import get_session
    from lakehouse.tables.gold import build_table

    settings = _settings(work)
    contract, spec = _contract_and_spec(work, "warm")
    spark = get_session(f"local[{CORES}]", app_name="bench-gold")
    shutil.rmtree(settings.gold_path(spec.name), ignore_errors=True)
    started = time.perf_counter()
    build_table(spark, settings, contract, spec)
    return spark, time.perf_counter() - started


def _reset_latency(work: Path) -> None:
    """The latency table's silver stream and gold table as seeded, for both paths."""
    settings = _settings(work)
    contract, spec = _contract_and_spec(work, "latency")
    for src, dst in (
        (work / "seed" / "silver", settings.silver_path(contract.stream)),
        (work / "seed" / "gold", settings.gold_path(spec.name)),
        (work / "seed" / "gold", work / "peer_latency"),
    ):
        shutil.rmtree(dst, ignore_errors=True)
        shutil.copytree(src, dst)


def worker_latency_ours(work: Path, keys: int, batch: int, batches: int) -> dict[str, Any]:
    """Append each micro-batch to silver (not timed), then time ``build_table``."""
    from deltalake import DeltaTable, write_deltalake

    from lakehouse.tables.gold import build_table

    settings = _settings(work)
    contract, spec = _contract_and_spec(work, "latency")
    schema = _arrow_schema(contract)
    silver = settings.silver_path(contract.stream)
    spark, warmup = _warm_session(work)
    seq = keys
    seconds: list[float] = []
    versions: list[int] = []
    changed: list[int] = []
    for i in range(batches):
        ids = batch_ids(keys, batch, i)
        table = events_table(schema, ids, seq, True, seed=10_000 + i)
        write_deltalake(str(silver), table, mode="append")
        seq += batch
        version = int(DeltaTable(str(silver)).version())
        started = time.perf_counter()
        result = build_table(spark, settings, contract, spec)
        seconds.append(time.perf_counter() - started)
        if result.input_versions != (version, version) or not result.committed:
            raise RuntimeError(f"batch {i}: expected version {version} committed: {result}")
        versions.append(version)
        changed.append(result.keys_changed)
    peak = tree_peak_rss_mib()
    spark.stop()
    return {
        "seconds": seconds,
        "versions": versions,
        "keys_changed": changed,
        "warmup": warmup,
        "peak_mib": peak,
    }


def worker_full_ours(work: Path) -> dict[str, Any]:
    from lakehouse.tables.gold import build_table

    settings = _settings(work)
    contract, spec = _contract_and_spec(work, "full")
    spark, warmup = _warm_session(work)
    shutil.rmtree(settings.gold_path(spec.name), ignore_errors=True)
    started = time.perf_counter()
    result = build_table(spark, settings, contract, spec)
    elapsed = time.perf_counter() - started
    peak = tree_peak_rss_mib()
    spark.stop()
    return {
        "seconds": elapsed,
        "keys": result.keys_changed,
        "versions": result.input_versions,
        "warmup": warmup,
        "peak_mib": peak,
    }


# -- peer ----------------------------------------------------------------------------------------


def _peer_aggregate(events: Any) -> Any:
    """polars: count and sum per key, tombstones and null keys left out."""
    import polars as pl

    return (
        events.filter(pl.col("user").is_not_null() & ~pl.col("tombstone"))
        .group_by("user")
        .agg(pl.len().cast(pl.Int64).alias("n"), pl.col("amount").sum().alias("total"))
    )


def worker_latency_peer(work: Path, versions: list[int]) -> dict[str, Any]:
    os.environ["POLARS_MAX_THREADS"] = str(CORES)  # before polars is imported
    import polars as pl
    import pyarrow as pa
    from deltalake import DeltaTable

    settings = _settings(work)
    silver = str(settings.silver_path(_stream("latency")))
    target = str(work / "peer_latency")
    seconds: list[float] = []
    changed: list[int] = []
    for version in versions:
        started = time.perf_counter()
        feed = DeltaTable(silver).load_cdf(starting_version=version, ending_version=version)
        events = pl.from_arrow(pa.table(feed))
        assert isinstance(events, pl.DataFrame)
        batch = _peer_aggregate(events.filter(pl.col("_change_type") == "insert"))
        (
            DeltaTable(target)
            .merge(batch.to_arrow(), "t.user = s.user", source_alias="s", target_alias="t")
            .when_matched_update({"n": "t.n + s.n", "total": "t.total + s.total"})
            .when_not_matched_insert({"user": "s.user", "n": "s.n", "total": "s.total"})
            .execute()
        )
        seconds.append(time.perf_counter() - started)
        changed.append(batch.height)
    return {"seconds": seconds, "keys_changed": changed, "peak_mib": tree_peak_rss_mib()}


def worker_full_peer(work: Path) -> dict[str, Any]:
    os.environ["POLARS_MAX_THREADS"] = str(CORES)  # before polars is imported
    import polars as pl
    from deltalake import write_deltalake

    from lakehouse.storage import CDF_PROPERTIES

    settings = _settings(work)
    silver = str(settings.silver_path(_stream("full")))
    target = work / "peer_full"
    shutil.rmtree(target, ignore_errors=True)
    started = time.perf_counter()
    frame = _peer_aggregate(pl.scan_delta(silver).select("user", "amount", "tombstone"))
    result = frame.collect(engine="streaming")
    write_deltalake(
        str(target), result.to_arrow(), mode="overwrite", configuration=dict(CDF_PROPERTIES)
    )
    elapsed = time.perf_counter() - started
    return {"seconds": elapsed, "keys": result.height, "peak_mib": tree_peak_rss_mib()}


# -- checks and report ---------------------------------------------------------------------------


def table_facts(path: Path) -> dict[str, Any]:
    """Keys, summed counts and summed totals of a gold table, read with deltalake."""
    import pyarrow.compute as pc
    from deltalake import DeltaTable

    table = DeltaTable(str(path)).to_pyarrow_table(columns=["user", "n", "total"])
    return {
        "keys": table.num_rows,
        "distinct": pc.count_distinct(table.column("user")).as_py(),
        "n": pc.sum(table.column("n")).as_py(),
        "total": pc.sum(table.column("total")).as_py(),
    }


def _check(what: str, ours: Path, peer: Path) -> dict[str, Any]:
    mine, theirs = table_facts(ours), table_facts(peer)
    if mine != theirs or mine["keys"] != mine["distinct"]:
        raise SystemExit(f"gold {what}: tables differ: ours {mine}, peer {theirs}")
    return mine


def _percentile(values: list[float], q: float) -> float:
    import numpy as np

    return float(np.percentile(values, q))


def run_latency(
    script: Path, work: Path, args: argparse.Namespace, context: dict[str, Any]
) -> tuple[list[Figure], list[str]]:
    settings = _settings(work)
    _reset_latency(work)
    total = args.warmup + args.batches
    ours = run_worker(
        script,
        "--worker", "latency-ours", str(work), str(args.keys), str(args.batch), str(total),
    )  # fmt: skip
    peer = run_worker(
        script, "--worker", "latency-peer", str(work), ",".join(map(str, ours["versions"]))
    )
    facts = _check("latency", settings.gold_path(_table("latency")), work / "peer_latency")
    if ours["keys_changed"] != peer["keys_changed"]:
        raise SystemExit(f"gold latency: keys per batch differ: {ours} {peer}")
    mine, theirs = ours["seconds"][args.warmup :], peer["seconds"][args.warmup :]
    figures = []
    for q in (50, 95):
        figures.append(
            Figure(
                f"gold.batch_{args.batch}.p{q}_latency",
                _percentile(mine, q),
                "s",
                PEER_LATENCY,
                _percentile(theirs, q),
                higher_is_better=False,
            )
        )
    p50 = figures[0].value
    context |= {
        "keys": args.keys,
        "batch": args.batch,
        "batches_measured": args.batches,
        "warmup_batches": args.warmup,
        "new_key_share": NEW_KEY_SHARE,
        "latency_goal_s": LATENCY_GOAL_S,
        "latency_goal_met": p50 <= LATENCY_GOAL_S,
        "ours_batch_s": [round(s, 3) for s in ours["seconds"]],
        "peer_batch_s": [round(s, 3) for s in peer["seconds"]],
        "latency_session_warmup_s": round(ours["warmup"], 1),
        "latency_final_table": facts,
    }

    def fmt(values: list[float]) -> str:
        return " ".join(f"{v:.2f}" for v in values)

    notes = [
        f"(latency: {args.warmup} warm-up batch(es) first, not counted; {args.batches} measured; "
        f"Spark session warm-up build of {WARM_EVENTS} events: {ours['warmup']:.1f} s, not counted)",
        f"(ours per batch s: {fmt(ours['seconds'])})",
        f"(peer per batch s: {fmt(peer['seconds'])})",
        f"latency goal p50 <= {LATENCY_GOAL_S} s for a {args.batch} event batch: "
        f"{'met' if p50 <= LATENCY_GOAL_S else 'NOT met'} ({p50:.2f} s)",
    ]
    return figures, notes


def run_full(
    script: Path, work: Path, args: argparse.Namespace, context: dict[str, Any]
) -> tuple[list[Figure], list[str]]:
    settings = _settings(work)
    ours = run_worker(script, "--worker", "full-ours", str(work), timeout=6 * 3600)
    peer = run_worker(script, "--worker", "full-peer", str(work), timeout=6 * 3600)
    facts = _check("full", settings.gold_path(_table("full")), work / "peer_full")
    if not ours["keys"] == peer["keys"] == facts["keys"]:
        raise SystemExit(f"gold full: key counts differ: ours {ours}, peer {peer}, {facts}")
    n = args.events
    figures = [
        Figure(
            "gold.full_build.events_per_s_per_core",
            n / ours["seconds"] / CORES,
            "events/s/core",
            PEER_FULL,
            n / peer["seconds"] / CORES,
        ),
        Figure(
            "gold.full_build.wall_time", ours["seconds"], "s", PEER_FULL, peer["seconds"], False
        ),
        Figure(
            "gold.full_build.peak_memory",
            ours["peak_mib"],
            "MiB",
            PEER_FULL,
            peer["peak_mib"],
            higher_is_better=False,
        ),
    ]
    context |= {
        "events": n,
        "full_keys": facts["keys"],
        "events_per_silver_version": ROUND_EVENTS,
        "full_session_warmup_s": round(ours["warmup"], 1),
    }
    notes = [
        f"(full build: {n} events, {facts['keys']} keys, silver versions "
        f"{ours['versions'][0]}..{ours['versions'][1]}; Spark session warm-up build of "
        f"{WARM_EVENTS} events: {ours['warmup']:.1f} s, not counted)"
    ]
    return figures, notes


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--keys", type=int, default=1_000_000, help="keys already in the table")
    parser.add_argument("--batch", type=int, default=10_000, help="events per micro-batch")
    parser.add_argument("--batches", type=int, default=20, help="measured micro-batches")
    parser.add_argument("--warmup", type=int, default=2, help="micro-batches before, not counted")
    parser.add_argument("--events", type=int, default=10_000_000, help="events of the full build")
    parser.add_argument("--workdir", type=Path, help="keep (and reuse) the prepared input here")
    parser.add_argument("--skip-latency", action="store_true")
    parser.add_argument("--skip-full", action="store_true")
    parser.add_argument("--worker", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        pin_cores(CORES)  # both paths, and our JVM, on the same number of cores
        kind, work_dir, *rest = args.worker
        work = Path(work_dir)
        out: dict[str, Any]
        if kind == "prepare":
            out = worker_prepare(work, int(rest[0]), int(rest[1]), rest[2].split(","))
        elif kind == "latency-ours":
            out = worker_latency_ours(work, int(rest[0]), int(rest[1]), int(rest[2]))
        elif kind == "latency-peer":
            out = worker_latency_peer(work, [int(v) for v in rest[0].split(",")])
        else:
            out = {"full-ours": worker_full_ours, "full-peer": worker_full_peer}[kind](work)
        print(json.dumps(out))
        return
    if args.batches < 1 or args.warmup < 0 or args.batch < 1 or args.keys < 1 or args.events < 1:
        parser.error("--keys, --batch, --batches and --events must be positive")
    kinds = [
        k for k, skip in (("latency", args.skip_latency), ("full", args.skip_full)) if not skip
    ]
    if not kinds:
        parser.error("nothing to run: both --skip-latency and --skip-full given")
    work = (args.workdir or Path(tempfile.mkdtemp(prefix="bench-gold-"))).resolve()
    script = Path(__file__)
    try:
        started = time.perf_counter()
        prep = run_worker(
            script,
            "--worker", "prepare", str(work), str(args.keys), str(args.events), ",".join(kinds),
            timeout=6 * 3600,
        )  # fmt: skip
        for kind, seconds in prep.items():
            print(f"(prepared {kind} in {seconds} s)")
        print(f"(preparation {time.perf_counter() - started:.1f} s, not counted)")
        figures: list[Figure] = []
        notes: list[str] = []
        context: dict[str, Any] = {"cores": CORES, "tombstone_every": TOMBSTONE_EVERY}
        if "latency" in kinds:
            f, n = run_latency(script, work, args, context)
            figures += f
            notes += n
        if "full" in kinds:
            f, n = run_full(script, work, args, context)
            figures += f
            notes += n
        report(figures, "gold", context)
        for line in notes:
            print(line)
    finally:
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
