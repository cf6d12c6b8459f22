"""Bronze ingest benchmark: landing segments -> bronze Delta table.

    python bench/bronze.py [--records 10000000]

Input: generated check-ins of ~300-byte JSON values over 12 partitions, written by the project's
producer (envelope segments). Each path runs in its own process:

* ours: ``bronze.ingest`` (Spark tasks parse the segments, whole partitions each, and skip
  re-delivered offsets; delta-spark appends them in one Delta commit with the new offsets). The
  Spark session is started and warmed on a tiny topic first; the figure is the ingest itself.
* peer: the same semantics written plainly with polars + deltalake: ``pl.read_ndjson`` per
  segment, the same columns, duplicates of (partition, offset) dropped, streamed into one
  ``write_deltalake`` commit.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import Figure, report, run_worker, tree_peak_rss_mib

TOPIC = "bench-checkins"
PARTITIONS = 12
CONTRACT = f"""\
topic: {TOPIC}
partitions: {PARTITIONS}
key: {{format: string, name: username}}
value: {{format: json, fields: [{{name: location, type: string}}, {{name: note, type: string}}]}}
stream: {{name: bench_checkins}}
"""
WARM = "bench-warmup"


def _settings(work: Path) -> object:
    from lakehouse.runtime.config import Settings

    return Settings.from_env(work / "home", work / "contracts")


def prepare(work: Path, records: int) -> None:
    from lakehouse.topics.landing import generate_user_locations

    contracts = work / "contracts"
    contracts.mkdir(parents=True)
    (contracts / f"{TOPIC}.yaml").write_text(CONTRACT)
    (contracts / f"{WARM}.yaml").write_text(
        CONTRACT.replace(TOPIC, WARM).replace("bench_checkins", "bench_warmup")
    )
    settings = _settings(work)
    generate_user_locations(settings, TOPIC, PARTITIONS, records, value_bytes=300)  # type: ignore[arg-type]
    generate_user_locations(settings, WARM, PARTITIONS, 1000, value_bytes=300)  # type: ignore[arg-type]


def worker_ours(work: Path) -> dict[str, float]:
    from lakehouse.contracts.catalog import Catalog
    from lakehouse.runtime.spark import get_session
    from lakehouse.topics import bronze

    settings = _settings(work)
    catalog = Catalog.load(settings.contracts_dir)  # type: ignore[attr-defined]
    spark = get_session("local[*]", app_name="bench-bronze")
    started = time.perf_counter()
    bronze.ingest(spark, settings, catalog.topic(WARM))  # type: ignore[arg-type]
    warmup = time.perf_counter() - started
    started = time.perf_counter()
    result = bronze.ingest(spark, settings, catalog.topic(TOPIC))  # type: ignore[arg-type]
    elapsed = time.perf_counter() - started
    peak = tree_peak_rss_mib()
    spark.stop()
    return {"seconds": elapsed, "records": result.records, "warmup": warmup, "peak_mib": peak}


def worker_peer(work: Path) -> dict[str, float]:
    import polars as pl
    import pyarrow as pa
    from deltalake import write_deltalake

    from lakehouse.topics.landing import list_segments

    settings = _settings(work)
    segments = list_segments(settings, TOPIC)  # type: ignore[arg-type]
    schema = {
        "offset": pl.Int64,
        "timestamp": pl.Int64,
        "timestampType": pl.Utf8,
        "key": pl.Utf8,
        "value": pl.Utf8,
    }
    header = pl.Struct({"key": pl.Utf8, "value": pl.Binary})
    records = 0

    def batches() -> Iterator[pa.RecordBatch]:
        nonlocal records
        for p in range(PARTITIONS):
            frames = []
            for seg in [s for s in segments if s.partition == p]:
                frames.append(
                    pl.read_ndjson(seg.path, schema=schema).with_columns(
                        pl.lit(str(seg.path)).alias("_source_file")
                    )
                )
            if not frames:
                continue
            df = (
                pl.concat(frames)
                .unique(subset=["offset"], keep="first", maintain_order=True)
                .select(
                    pl.col("key").cast(pl.Binary),
                    pl.col("value").cast(pl.Binary),
                    pl.lit(TOPIC).alias("topic"),
                    pl.lit(p, dtype=pl.Int32).alias("partition"),
                    pl.col("offset"),
                    pl.from_epoch("timestamp", time_unit="ms")
                    .dt.cast_time_unit("us")
                    .dt.replace_time_zone("UTC")
                    .alias("timestamp"),
                    pl.when(pl.col("timestampType") == "LogAppendTime")
                    .then(1)
                    .otherwise(0)
                    .cast(pl.Int32)
                    .alias("timestampType"),
                    pl.lit([], dtype=pl.List(header)).alias("headers"),
                    pl.col("_source_file"),
                )
            )
            records += df.height
            yield from df.to_arrow().to_batches()

    started = time.perf_counter()
    gen = batches()
    head = next(gen)  # the reader's schema is the first batch's
    reader = pa.RecordBatchReader.from_batches(head.schema, _chain(head, gen))
    write_deltalake(
        str(work / "peer_bronze"),
        reader,
        mode="append",
        configuration={"delta.enableChangeDataFeed": "true"},
    )
    elapsed = time.perf_counter() - started
    return {"seconds": elapsed, "records": records, "peak_mib": tree_peak_rss_mib()}


def _chain(head: object, rest: Iterator[object]) -> Iterator[object]:
    yield head
    yield from rest


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--records", type=int, default=10_000_000)
    parser.add_argument("--workdir", type=Path)
    parser.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        kind, work = args.worker
        fn = {"ours": worker_ours, "peer": worker_peer}[kind]
        print(json.dumps(fn(Path(work))))
        return
    work = args.workdir or Path(tempfile.mkdtemp(prefix="bench-bronze-"))
    try:
        if not (work / "contracts").exists():
            started = time.perf_counter()
            prepare(work, args.records)
            print(f"(generated {args.records} records in {time.perf_counter() - started:.1f} s)")
        shutil.rmtree(work / "home" / "tables", ignore_errors=True)
        shutil.rmtree(work / "peer_bronze", ignore_errors=True)
        ours = run_worker(Path(__file__), "--worker", "ours", str(work))
        peer = run_worker(Path(__file__), "--worker", "peer", str(work))
        assert ours["records"] == peer["records"] == args.records, (ours, peer)
        cores = os.cpu_count() or 1
        n = args.records
        figures = [
            Figure(
                "bronze.ingest.records_per_s_per_core",
                n / ours["seconds"] / cores,
                "records/s/core",
                "polars+deltalake",
                n / peer["seconds"] / cores,
            ),
            Figure(
                "bronze.ingest.peak_memory",
                ours["peak_mib"],
                "MiB",
                "polars+deltalake",
                peer["peak_mib"],
                higher_is_better=False,
            ),
        ]
        report(figures, "bronze", {"records": n, "cores": cores, "partitions": PARTITIONS})
        warmup = ours["warmup"]
        print(f"(Spark session warm-up ingest of 1000 records: {warmup:.1f} s, not counted)")
    finally:
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
