"""A writer process for the crash and concurrency tests: appends numbered batches to a table
with delta-spark, holding the table's commit lock for each append, as the layer jobs do.

    python writer_proc.py TABLE --app APP --batches B --rows R [--first-id N]

With ``--app``, each batch is an exactly-once write (Txn(app, batch)); on start the process
resumes after the table's recorded version for that app, as a restarted job would.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from lakehouse.runtime.config import Settings
from lakehouse.runtime.spark import get_session
from lakehouse.storage import DeltaStore, Txn, delta_spark


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("table", type=Path)
    p.add_argument("--app")
    p.add_argument("--batches", type=int, required=True)
    p.add_argument("--rows", type=int, required=True)
    p.add_argument("--first-id", type=int, default=0)
    args = p.parse_args()

    from pyspark.sql import functions as F

    settings = Settings.from_env()
    spark = get_session("local[2]", app_name="writer-proc")
    store = DeltaStore(spark)
    done = store.transaction_version(args.table, args.app) if args.app else None
    start = 1 if done is None else done + 1
    for batch in range(start, args.batches + 1):
        lo = args.first_id + (batch - 1) * args.rows
        df = (
            spark.range(lo, lo + args.rows, numPartitions=2)
            .withColumn("batch", F.lit(batch))
            .withColumn("payload", F.sha2(F.col("id").cast("string"), 256))
        )
        txn = Txn(args.app, batch) if args.app else None
        with delta_spark.table_lock(settings, args.table):
            delta_spark.append(df, args.table, txn=txn, create=df.schema)
        print(f"committed batch {batch}", flush=True)
    spark.stop()


if __name__ == "__main__":
    main()
