"""Rows made by Python tasks that read their input themselves (no JVM round trip for it).

Some jobs read their input files themselves (bronze parses landing segments with pyarrow):
pushing those bytes into the JVM only to hand them back to Python would double the cost. Here
Spark only schedules the work: each task gets a few JSON work items and yields Arrow tables of
rows plus side facts (small JSON: counts, bad lines); the rows become a DataFrame that the job
gates and writes with delta-spark.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import pyarrow as pa

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

# (work item, emit) -> iterator of Arrow tables of rows; `emit` records a side fact.
TaskFn = Callable[[dict[str, Any], Callable[[dict[str, Any]], None]], Iterator[pa.Table]]

SIDE = "__side"


@contextmanager
def rows_from_tasks(
    spark: SparkSession,
    items: Sequence[Mapping[str, Any]],
    fn: TaskFn,
    schema: pa.Schema,
    *,
    parallelism: int | None = None,
) -> Iterator[tuple[DataFrame, list[dict[str, Any]]]]:
    """Run ``fn`` over ``items`` in Spark tasks, ``parallelism`` of them (default: the task slots
    Spark has), each taking a contiguous slice of the items in order; give the ``with`` block
    the rows they yield, with ``schema``, as a DataFrame, and their side output, collected.

    Not one task per item: a Python task costs tens of milliseconds to start. One Spark job runs
    the tasks; the rows are kept (``persist``, on disk) for what the block does with them (a
    gate, a write), so nothing is computed twice, and released after it. The tasks are the
    partitions of a ``range`` over the items' indexes (contiguous by construction), and each
    finds its items in the list the function carries: no SparkContext, so a Spark Connect
    session works too."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F
    from pyspark.sql.pandas.types import from_arrow_schema

    from lakehouse.runtime.spark import task_slots

    loose = pa.schema([f.with_nullable(True) for f in schema])
    out = loose.append(pa.field(SIDE, pa.string()))
    spark_schema = from_arrow_schema(out)
    if not items:
        yield spark.createDataFrame([], from_arrow_schema(loose)), []
        return
    work = [json.dumps(i) for i in items]

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        side: list[dict[str, Any]] = []
        for batch in batches:
            for index in batch.column("id").to_pylist():
                for table in fn(json.loads(work[index]), side.append):
                    rows = table.select(loose.names).cast(loose)
                    nulls = pa.nulls(rows.num_rows, pa.string())
                    yield from rows.append_column(SIDE, nulls).to_batches()
        if side:
            n = len(side)
            columns = [pa.nulls(n, f.type) for f in loose]
            facts = pa.array([json.dumps(s) for s in side], pa.string())
            yield pa.RecordBatch.from_arrays([*columns, facts], schema=out)

    slices = min(len(items), parallelism or task_slots(spark))
    # On disk, not in memory first: Spark's memory store keeps what it has unrolled of a block
    # while it spills the rest, and a batch of millions of records (gigabytes) then ran a 2 GiB
    # driver out of heap. Local disk reads come from the page cache when they fit.
    done = (
        spark.range(0, len(items), 1, slices)
        .mapInArrow(run, spark_schema)
        .persist(StorageLevel.DISK_ONLY)
    )
    try:
        facts = done.filter(F.col(SIDE).isNotNull()).select(SIDE).collect()
        yield done.filter(F.col(SIDE).isNull()).drop(SIDE), [json.loads(r[0]) for r in facts]
    finally:
        done.unpersist()
