"""Writing a table from Python tasks that produce their own rows (no JVM round trip).

Some writers read their input themselves (bronze parses landing files with pyarrow): pushing
those rows into the JVM only to hand them back to Python for the data source would double the
cost. Here Spark only schedules the work: each task gets a few JSON work items, produces Arrow
tables, writes them as the table's Parquet files, and returns the file descriptors plus any side
output (small JSON facts: counts, bad lines). The driver then commits all files in one Delta
transaction with :func:`commit_staged`, exactly as the data source does.

Files of a task that fails, or of a job that is not committed, are never referenced by the log:
they stay invisible and vacuum removes them.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from lakehouse.storage.files import DataFile, TableFileWriter

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

# (work item, emit) -> iterator of Arrow tables to write; `emit` records a side-output fact.
TaskFn = Callable[[dict[str, Any], Callable[[dict[str, Any]], None]], Iterator[pa.Table]]


@dataclass
class Staged:
    files: list[DataFile]
    side: list[dict[str, Any]]


def _run_items(fn: TaskFn, items: Sequence[Mapping[str, Any]], writer: TableFileWriter) -> Staged:
    side: list[dict[str, Any]] = []

    def rows() -> Iterator[pa.Table]:
        for item in items:
            yield from fn(dict(item), side.append)

    return Staged(writer.write_batches(rows()), side)


def _task_runner(fn: TaskFn, table_root: str, schema_ipc: bytes, partition_by: list[str]) -> Any:
    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        schema = pa.ipc.read_schema(pa.py_buffer(schema_ipc))
        items = [json.loads(s) for b in batches for s in b.column("item").to_pylist()]
        staged = _run_items(fn, items, TableFileWriter(table_root, schema, partition_by))
        out = [("file", json.dumps(asdict(f))) for f in staged.files]
        out += [("side", json.dumps(s)) for s in staged.side]
        yield pa.RecordBatch.from_pydict(
            {"kind": [k for k, _ in out], "payload": [p for _, p in out]},
            schema=pa.schema([("kind", pa.string()), ("payload", pa.string())]),
        )

    return run


def stage_with_tasks(
    spark: SparkSession,
    items: Sequence[Mapping[str, Any]],
    fn: TaskFn,
    *,
    table_root: Path,
    schema: pa.Schema,
    partition_by: Sequence[str] = (),
    parallelism: int | None = None,
) -> Staged:
    """Run ``fn`` over ``items`` in Spark tasks, ``parallelism`` of them (default: Spark's,
    the cores it has), each taking a contiguous slice of the items in order; each task writes
    the rows it produces into ``table_root`` as data files. Nothing is committed.

    Not one task per item: a Python task costs tens of milliseconds to start, which was most of
    a small micro-batch's time (twelve partitions' items took 0.6 s in twelve tasks and 0.16 s
    in two), and the items a task takes share its files, so a small batch writes fewer files."""
    if not items:
        return Staged([], [])
    slices = min(len(items), parallelism or spark.sparkContext.defaultParallelism)
    rows = spark.sparkContext.parallelize([(json.dumps(i),) for i in items], slices)
    df = spark.createDataFrame(rows, "item string")
    runner = _task_runner(fn, str(table_root), schema.serialize().to_pybytes(), list(partition_by))
    result = df.mapInArrow(runner, "kind string, payload string").collect()
    files = [DataFile(**json.loads(r["payload"])) for r in result if r["kind"] == "file"]
    side = [json.loads(r["payload"]) for r in result if r["kind"] == "side"]
    return Staged(files, side)


def stage_in_driver(
    items: Sequence[Mapping[str, Any]],
    fn: TaskFn,
    *,
    table_root: Path,
    schema: pa.Schema,
    partition_by: Sequence[str] = (),
) -> Staged:
    """:func:`stage_with_tasks` without Spark: ``fn`` runs here, over every item in order. For
    work so small that a Spark job (and the Python workers it may start) costs more than it."""
    return _run_items(fn, items, TableFileWriter(str(table_root), schema, list(partition_by)))


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
    """Run ``fn`` over ``items`` in Spark tasks (sliced as :func:`stage_with_tasks` does); give
    the ``with`` block the rows it yields, with ``schema``, as a DataFrame, and its side output,
    collected.

    One Spark job runs the tasks; the rows are kept (``persist``) for what the block does with
    them (a gate, a write), so nothing is computed twice, and released after it."""
    from pyspark.sql import functions as F
    from pyspark.sql.pandas.types import from_arrow_schema

    loose = pa.schema([f.with_nullable(True) for f in schema])
    out = loose.append(pa.field(SIDE, pa.string()))
    spark_schema = from_arrow_schema(out)
    if not items:
        yield spark.createDataFrame([], from_arrow_schema(loose)), []
        return

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        side: list[dict[str, Any]] = []
        for batch in batches:
            for raw in batch.column("item").to_pylist():
                for table in fn(json.loads(raw), side.append):
                    rows = table.select(loose.names).cast(loose)
                    nulls = pa.nulls(rows.num_rows, pa.string())
                    yield from rows.append_column(SIDE, nulls).to_batches()
        if side:
            n = len(side)
            columns = [pa.nulls(n, f.type) for f in loose]
            facts = pa.array([json.dumps(s) for s in side], pa.string())
            yield pa.RecordBatch.from_arrays([*columns, facts], schema=out)

    slices = min(len(items), parallelism or spark.sparkContext.defaultParallelism)
    work = spark.sparkContext.parallelize([(json.dumps(i),) for i in items], slices)
    done = spark.createDataFrame(work, "item string").mapInArrow(run, spark_schema).persist()
    try:
        facts = done.filter(F.col(SIDE).isNotNull()).select(SIDE).collect()
        yield done.filter(F.col(SIDE).isNull()).drop(SIDE), [json.loads(r[0]) for r in facts]
    finally:
        done.unpersist()
