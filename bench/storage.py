"""Storage layer benchmark: writing and reading Delta through Spark vs delta-rs directly.

    python bench/storage.py [--rows 10000000]

Input: bronze-like records (key, ~150-byte JSON value, topic, partition, offset, timestamp,
timestampType, headers) as Parquet files. Each path runs in its own process so peak memory is
its own:

* write, ours: ``spark.read.parquet(input)`` -> ``DeltaStore.write`` (Spark Python data source:
  executors write Parquet, the driver commits with delta-rs);
* write, peer: ``deltalake.write_deltalake`` fed by a pyarrow dataset scanner over the same files;
* read, ours: ``DeltaStore.read`` (snapshot file list from delta-rs, Spark's Parquet reader) vs
  ``spark.read.parquet`` of the same files, both aggregating every value byte, same session;
* the Python handover floor: after its write, the ``ours`` worker times the same rows handed to
  Python tasks as Arrow (``mapInArrow`` that only counts them). Any write through a Python data
  source pays at least that, so its ratio against ``write_deltalake`` bounds what the data source
  can reach on this machine.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import Figure, report, run_worker, tree_peak_rss_mib

FILES = 8


def make_input(root: Path, rows: int) -> None:
    """Bronze-like rows as Parquet: deterministic, moderately compressible values."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    root.mkdir(parents=True)
    per_file = -(-rows // FILES)
    rng = np.random.default_rng(7)
    offset = 0
    for i in range(FILES):
        n = min(per_file, rows - offset)
        if n <= 0:
            break
        users = pa.array(rng.integers(0, 1_000_000, n)).cast(pa.string())
        places = pa.array(rng.integers(0, 5_000, n)).cast(pa.string())
        value = pc.binary_join_element_wise(
            '{"user":"user-',
            users,
            '","location":"City-',
            places,
            '","device":"android","app_version":"4.12.1","note":"',
            pc.utf8_upper(users),
            '-checked-in-at-the-usual-place"}',
            "",
        )
        table = pa.table(
            {
                "key": pc.binary_join_element_wise("user-", users, "").cast(pa.binary()),
                "value": value.cast(pa.binary()),
                "topic": pa.array(["user-locations"] * n),
                "partition": pa.array(rng.integers(0, 12, n).astype("int32")),
                "offset": pa.array(np.arange(offset, offset + n, dtype="int64")),
                "timestamp": pa.array(
                    (1_700_000_000_000_000 + np.arange(offset, offset + n) * 1000).astype("int64")
                ).cast(pa.timestamp("us", tz="UTC")),
                "timestampType": pa.array(np.zeros(n, dtype="int32")),
                "headers": pa.array(
                    [[]] * n, pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
                ),
            }
        )
        pq.write_table(table, root / f"input-{i}.parquet")
        offset += n


def worker_spark_write(src: Path, table: Path) -> dict[str, float]:
    from lakehouse.spark import get_session
    from lakehouse.storage import DeltaStore

    spark = get_session("local[*]", app_name="bench-write")
    store = DeltaStore(spark)
    df = spark.read.parquet(str(src))
    # The first write of a session starts the data source's Python workers and warms the JVM;
    # a long-running job pays that once. Measure it apart from the steady-state write.
    started = time.perf_counter()
    store.write(df.limit(10_000), table.with_name(table.name + "_warmup"))
    warmup = time.perf_counter() - started
    started = time.perf_counter()
    store.write(df, table)
    elapsed = time.perf_counter() - started
    peak = tree_peak_rss_mib()
    # The floor of any write through a Python data source: the same rows handed from Spark's
    # JVM to Python tasks as Arrow, and nothing done with them. Measured after the write, with
    # the JVM warm, so it is a lower bound.
    started = time.perf_counter()
    df.mapInArrow(_count_rows, "rows long").collect()
    floor = time.perf_counter() - started
    spark.stop()
    return {"seconds": elapsed, "warmup_seconds": warmup, "peak_mib": peak, "floor": floor}


def _count_rows(batches: Iterator[Any]) -> Iterator[Any]:
    import pyarrow as pa

    rows = sum(b.num_rows for b in batches)
    yield pa.RecordBatch.from_pydict({"rows": [rows]})


def worker_deltalake_write(src: Path, table: Path) -> dict[str, float]:
    import pyarrow.dataset as ds
    from deltalake import write_deltalake

    started = time.perf_counter()
    reader = ds.dataset(str(src)).scanner(batch_size=65_536).to_reader()
    write_deltalake(
        str(table), reader, mode="append", configuration={"delta.enableChangeDataFeed": "true"}
    )
    elapsed = time.perf_counter() - started
    return {"seconds": elapsed, "peak_mib": tree_peak_rss_mib()}


def worker_read(table: Path) -> dict[str, float]:
    from pyspark.sql import functions as F

    from lakehouse.spark import get_session
    from lakehouse.storage import DeltaStore
    from lakehouse.storage.store import _load

    spark = get_session("local[*]", app_name="bench-read")
    store = DeltaStore(spark)
    files = _load(table).file_uris()

    def scan(df: object) -> float:
        started = time.perf_counter()
        df.agg(F.count("*"), F.sum(F.length("value"))).collect()  # type: ignore[attr-defined]
        return time.perf_counter() - started

    ours, peer = [], []
    for _ in range(3):  # alternate, keep the best: the JVM warms up on the first rounds
        ours.append(scan(store.read(table)))
        peer.append(scan(spark.read.parquet(*files)))
    spark.stop()
    return {"ours": min(ours), "peer": min(peer)}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--workdir", type=Path)
    parser.add_argument("--worker", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        import json

        kind, *paths = args.worker
        fn = {
            "spark_write": worker_spark_write,
            "deltalake_write": worker_deltalake_write,
            "read": worker_read,
        }[kind]
        print(json.dumps(fn(*map(Path, paths))))
        return

    work = args.workdir or Path(tempfile.mkdtemp(prefix="bench-storage-"))
    try:
        src = work / "input"
        if not src.exists():
            make_input(src, args.rows)
        ours_t, peer_t = work / "spark_table", work / "deltalake_table"
        for t in (ours_t, peer_t):
            shutil.rmtree(t, ignore_errors=True)
        ours = run_worker(Path(__file__), "--worker", "spark_write", str(src), str(ours_t))
        peer = run_worker(Path(__file__), "--worker", "deltalake_write", str(src), str(peer_t))
        reads = run_worker(Path(__file__), "--worker", "read", str(ours_t))
        n = args.rows
        cores = os.cpu_count() or 1
        figures = [
            Figure(
                "storage.write.rows_per_s",
                n / ours["seconds"],
                "rows/s",
                "write_deltalake",
                n / peer["seconds"],
            ),
            Figure(
                "storage.write.rows_per_s_per_core",
                n / ours["seconds"] / cores,
                "rows/s/core",
                "write_deltalake",
                n / peer["seconds"] / cores,
            ),
            Figure(
                "storage.write.python_handover_floor.rows_per_s",
                n / ours["floor"],
                "rows/s",
                "write_deltalake",
                n / peer["seconds"],
            ),
            Figure(
                "storage.write.peak_memory",
                ours["peak_mib"],
                "MiB",
                "write_deltalake",
                peer["peak_mib"],
                higher_is_better=False,
            ),
            Figure(
                "storage.read.rows_per_s",
                n / reads["ours"],
                "rows/s",
                "spark.read.parquet",
                n / reads["peer"],
            ),
        ]
        report(figures, "storage", {"rows": n, "cores": cores})
        warmup = ours["warmup_seconds"]
        print(f"(first write of a Spark session, 10K rows: {warmup:.1f} s, not counted)")
        print("(peak memory: Python driver + JVM, or the delta-rs process)")
    finally:
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
