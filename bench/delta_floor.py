"""The least time delta-spark takes for the commits a three-layer micro-batch needs, on a warm
session of this machine: the floor under issue 28's warm micro-batch goal (1 s for 10K records
through bronze, silver and gold).

    python bench/delta_floor.py [--rows 10000] [--batches 10] [--warmup 6]

One local session with the platform's settings (``lakehouse.runtime.spark.get_session``, two
cores), two empty tables with the change feed on (as every pipeline table has). Each batch is
``--rows`` rows, 90% of their keys new; it is

* appended to the first table with a DataFrame write that records its position
  (``txnAppId`` / ``txnVersion``): what bronze and silver each commit, at the least;
* merged into the second table on its key (update or insert) with its position in the
  session's ``spark.databricks.delta.write.txnAppId`` / ``txnVersion``: what one gold table
  commits, at the least.

No parsing, no decoding, no gate, no state table: a real batch does all of that on top. The
floor of a three-layer batch is two appends and one MERGE; the figures are the p50 of the
``--batches`` measured batches after ``--warmup`` ones, and the floor set against the goal
(ratio = goal / floor, so < 1: the goal is below what the engine alone takes here), printed
and kept in ``bench/results/delta_floor.json`` with every batch's times.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import Figure, report

GOAL_S = 1.0  # issue 28: a warm 10K-record micro-batch, three layers, gates on, p50


def measure(root: Path, rows: int, total: int) -> tuple[list[float], list[float]]:
    from lakehouse.runtime.spark import get_session

    spark = get_session("local[2]", app_name="bench-delta-floor")
    appended, merged = root / "appended", root / "merged"
    for path, columns in (
        (appended, "id BIGINT, v STRING"),
        (merged, "id BIGINT, v STRING, n BIGINT"),
    ):
        spark.sql(
            f"CREATE TABLE delta.`{path}` ({columns}) USING delta "
            "TBLPROPERTIES (delta.enableChangeDataFeed = true)"
        )
    append_s: list[float] = []
    merge_s: list[float] = []
    step = rows * 9 // 10  # each batch's first tenth of keys are the last batch's
    for i in range(total):
        batch = spark.range(i * step, i * step + rows).selectExpr("id", "cast(id AS STRING) AS v")
        started = time.perf_counter()
        (
            batch.write.format("delta")
            .mode("append")
            .option("txnAppId", "floor-append")
            .option("txnVersion", i)
            .save(str(appended))
        )
        append_s.append(time.perf_counter() - started)
        batch.createOrReplaceTempView("floor_batch")
        started = time.perf_counter()
        spark.conf.set("spark.databricks.delta.write.txnAppId", "floor-merge")
        spark.conf.set("spark.databricks.delta.write.txnVersion", str(i))
        spark.sql(
            f"MERGE INTO delta.`{merged}` AS t USING floor_batch AS s ON t.id = s.id "
            "WHEN MATCHED THEN UPDATE SET v = s.v, n = t.n + 1 "
            "WHEN NOT MATCHED THEN INSERT (id, v, n) VALUES (s.id, s.v, 1)"
        ).collect()
        merge_s.append(time.perf_counter() - started)
    spark.conf.unset("spark.databricks.delta.write.txnAppId")
    spark.conf.unset("spark.databricks.delta.write.txnVersion")
    expected = (total - 1) * step + rows
    got = spark.read.format("delta").load(str(merged)).count()
    if got != expected:
        raise RuntimeError(f"the merged table has {got} rows, expected {expected}")
    spark.stop()
    return append_s, merge_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=10_000, help="rows per batch")
    parser.add_argument("--batches", type=int, default=10, help="measured batches")
    parser.add_argument("--warmup", type=int, default=6, help="batches before, not counted")
    args = parser.parse_args()
    if args.rows < 10 or args.batches < 1 or args.warmup < 0:
        parser.error("--rows must be at least 10, --batches positive, --warmup not negative")
    root = Path(tempfile.mkdtemp(prefix="bench-delta-floor-"))
    try:
        append_s, merge_s = measure(root, args.rows, args.warmup + args.batches)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    counted = slice(args.warmup, None)
    append_p50 = statistics.median(append_s[counted])
    merge_p50 = statistics.median(merge_s[counted])
    print(
        f"({args.rows} rows per batch, p50 of {args.batches} warm batches after {args.warmup}: "
        f"append with its position {append_p50:.3f} s (min {min(append_s[counted]):.3f}), "
        f"MERGE with its position {merge_p50:.3f} s (min {min(merge_s[counted]):.3f}))"
    )
    floor = Figure(
        "delta_floor.three_layer_commits.p50",
        2 * append_p50 + merge_p50,
        "s",
        "issue 28's goal for the whole batch",
        GOAL_S,
        higher_is_better=False,
    )
    context = {
        "rows": args.rows,
        "batches": args.batches,
        "warmup": args.warmup,
        "append_s": append_s,
        "merge_s": merge_s,
    }
    report([floor], "delta_floor", context)


if __name__ == "__main__":
    main()
