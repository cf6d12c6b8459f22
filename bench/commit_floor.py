"""The floor under a micro-batch: the commits it cannot avoid, made by a plain delta-spark client
of the same warm Spark server, with nothing else (no reads of the topic, no decoding, no gate,
no position, no ledger rows of ours).

    python bench/commit_floor.py --home HOME --scratch DIR TABLE [TABLE ...]

Each ``TABLE`` is a Delta table's folder relative to ``HOME`` (``tables/gold/user_moves``,
``quality/ledger``), one per table the batch wrote. Before the clock runs, each is copied with
``SHALLOW CLONE`` (the same schema, table properties, constraints and files) into a new folder
under ``--scratch``, removed at the end. Then, timed, each copy gets one commit of ``--rows`` of its
own rows, in the batch's order: the landing tables (bronze, silver) one after the other, the
gold tables and their state tables ``--parallel`` at a time (as the batch builds them), the
ledger last. A table the batch appends to (bronze, silver, the ledger, late records) gets an
append; every other one a ``MERGE`` of those rows matched on their comparable columns (update
when matched, insert when not): a MERGE that rewrites the files holding them, as a real one does.

Prints the wall time of the timed part in seconds on its last line (``floor <s>``); run by
``bench/before_after.py`` after each of "ours"'s batches, with that side's environment.
"""

from __future__ import annotations

import argparse
import shutil
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

APPENDED = ("tables/bronze/", "tables/silver/", "tables/late/", "tables/quarantine/")
LEDGER = "quality/ledger"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--home", type=Path, required=True)
    parser.add_argument("--scratch", type=Path, required=True)
    parser.add_argument("--rows", type=int, default=20)
    parser.add_argument("--parallel", type=int, default=4)
    parser.add_argument("tables", nargs="+")
    args = parser.parse_args()

    from lakehouse.runtime import server
    from lakehouse.runtime.config import Settings

    spark = server.connect(Settings.from_env())
    scratch = args.scratch / uuid.uuid4().hex
    try:
        took = timed(spark, args, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print(f"floor {took:.3f}", flush=True)


def timed(spark: SparkSession, args: argparse.Namespace, scratch: Path) -> float:
    """Clone the tables into ``scratch``, then make their commits: the seconds those took."""
    from pyspark.sql.types import MapType

    copies = {}
    for table in args.tables:
        copy = scratch / table.replace("/", "__")
        spark.sql(f"CREATE TABLE delta.`{copy}` SHALLOW CLONE delta.`{args.home / table}`")
        copies[table] = copy

    def commit(table: str) -> None:
        copy = copies[table]
        rows = spark.read.format("delta").load(str(copy)).limit(args.rows)
        if table.startswith(APPENDED) or table == LEDGER:
            rows.write.format("delta").mode("append").save(str(copy))
            return
        on = [f.name for f in rows.schema.fields if not isinstance(f.dataType, MapType)]
        view = f"floor_{table.replace('/', '_')}"
        rows.dropDuplicates(on).createOrReplaceTempView(view)
        match = " AND ".join(f"t.`{c}` <=> s.`{c}`" for c in on)
        spark.sql(
            f"MERGE INTO delta.`{copy}` AS t USING {view} AS s ON {match} "
            "WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *"
        ).collect()

    landing = [t for t in args.tables if t.startswith(("tables/bronze/", "tables/silver/"))]
    last = [t for t in args.tables if t == LEDGER]
    middle = [t for t in args.tables if t not in landing and t not in last]
    landing.sort(key=lambda t: not t.startswith("tables/bronze/"))
    started = time.perf_counter()
    for table in landing:
        commit(table)
    with ThreadPoolExecutor(max_workers=args.parallel) as pool:
        list(pool.map(commit, middle))
    for table in last:
        commit(table)
    return time.perf_counter() - started


if __name__ == "__main__":
    main()
