"""What every gold table shares: where its input and outputs live, reading its input's change
feed, arrival order, the input versions it has yet to consume, and its result.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from lakehouse.contracts.model import (
    Contract,
    TableSpec,
)
from lakehouse.quality.ledger import PUBLISHED, BatchOutcome
from lakehouse.runtime.config import Settings
from lakehouse.runtime.objectstore import Location
from lakehouse.storage import DeltaStore
from lakehouse.storage.gates import PublishGate
from lakehouse.streams.schema import EVENT_TIME, TOMBSTONE, spark_type

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame


# Arrival order of a stream's records: the stream commit that brought them, then partition and
# offset. It does not depend on how micro-batches were cut, so incremental runs and a full
# refresh see the same order (earliest/latest/collect, windows' stream time).
ARRIVAL = ("_commit_version", "partition", "offset")


def stream_app(contract: Contract) -> str:
    """The app id under which a table records the version of the stream it consumed."""
    return f"silver.{contract.stream}"


def input_app(contract: Contract, spec: TableSpec) -> str:
    """The app id of a table's input: the topic's stream, or the table whose changelog it reads."""
    return f"gold.{spec.changelog}" if spec.changelog else stream_app(contract)


@dataclass(frozen=True)
class Outputs:
    """Where one gold table's build writes: the table, its private state (e.g. each key's latest
    value for an input read as a table), and its late-records side table (windowed tables). A full refresh
    builds into a scratch set of these and then folds the result into the real ones."""

    gold: Location
    state: Location
    late: Location
    # The gold table's gate: every write to ``gold`` is judged by it (none for a scratch build).
    gate: PublishGate | None = None


def outputs(settings: Settings, spec: TableSpec) -> Outputs:
    return Outputs(
        settings.gold_path(spec.name), settings.state_path(spec.name), settings.late_path(spec.name)
    )


def input_path(settings: Settings, contract: Contract, spec: TableSpec) -> Location:
    """The Delta table a gold table reads the change feed of."""
    if spec.changelog:
        return settings.gold_path(spec.changelog)
    return settings.silver_path(contract.stream)


def read_input(
    store: DeltaStore, settings: Settings, contract: Contract, spec: TableSpec, start: int, end: int
) -> DataFrame:
    """The input records committed in versions ``start..end``, shaped as the stream of
    ``contract.input(spec)``: its columns, ``tombstone``, ``partition``, ``offset``,
    ``timestamp``, ``event_time``, and ``_commit_version``."""
    from pyspark.sql import functions as F

    changes = store.changes(input_path(settings, contract, spec), start, end)
    if not spec.changelog:
        return changes.filter(F.col("_change_type") == "insert")
    return changelog_as_stream(changes, contract.input(spec))


def changelog_as_stream(changes: DataFrame, stream: Contract) -> DataFrame:
    """A table's change feed read as a stream (the stream-table duality): each insert or
    update's post-image is a record, each delete a tombstone for its key. The commit version is
    the offset (a key changes at most once per commit) and the commit time the timestamp."""
    from pyspark.sql import functions as F

    kept = changes.filter(F.col("_change_type").isin("insert", "update_postimage", "delete"))
    deleted = F.col("_change_type") == "delete"
    values = [
        F.when(deleted, F.lit(None)).otherwise(F.col(f.name)).cast(spark_type(f)).alias(f.name)
        for f in stream.fields
    ]
    return kept.select(
        F.col(stream.key_name),
        *values,
        deleted.alias(TOMBSTONE),
        F.lit(0).cast("int").alias("partition"),
        F.col("_commit_version").alias("offset"),
        F.col("_commit_timestamp").alias("timestamp"),
        F.col("_commit_timestamp").alias("event_time"),
        F.col("_commit_version"),
    )


StreamTimes = dict[int, int]  # partition -> the largest event time (ms) seen in it


def event_time(contract: Contract) -> Column:
    """An event's time: the stream's event_time (the record timestamp where the contract's
    event-time field is itself called event_time and is null)."""
    from pyspark.sql import functions as F

    if contract.event_time == EVENT_TIME:
        return F.coalesce(F.col(EVENT_TIME), F.col("timestamp"))
    return F.col(EVENT_TIME)


def with_partition_time(
    records: DataFrame, time: str, out: str, key: str, before: StreamTimes
) -> tuple[DataFrame, StreamTimes]:
    """Add ``out``: the stream time of each record's partition at it (Kafka Streams' partition
    time: the running maximum of ``time``, in ms, over the partition's records in (commit
    version, offset, ``key``) order, the record itself included), starting from ``before``;
    and the stream times after them. A null ``time`` does not move it.

    Rather than one window over the whole batch (a single Spark partition), the running maximum
    is taken within each (commit version, partition) run, in parallel, and the maximum of the
    same partition's earlier runs (a handful of numbers, computed on the driver) is added to it.
    """
    from pyspark.sql import Window as W
    from pyspark.sql import functions as F

    runs = ["_commit_version", "partition"]
    per_run = sorted(
        (r["_commit_version"], r["partition"], r["m"])
        for r in records.groupBy(*runs).agg(F.max(time).alias("m")).collect()
    )
    prefix: list[tuple[int, int, int | None]] = []
    seen = dict(before)
    for version, partition, top in per_run:
        prefix.append((version, partition, seen.get(partition)))
        if top is not None:
            seen[partition] = max(seen.get(partition, top), top)
    starts = records.sparkSession.createDataFrame(
        prefix, "_commit_version long, partition int, __before long"
    )
    order = W.partitionBy(*runs).orderBy("offset", key).rowsBetween(W.unboundedPreceding, 0)
    placed = (
        records.join(F.broadcast(starts), runs, "left")
        .withColumn(out, F.greatest(F.col("__before"), F.max(time).over(order)))
        .drop("__before")
    )
    return placed, seen


_UNITS = (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000))


def format_duration(ms: int) -> str:
    """A duration as the contract writes it: the largest unit that divides it (90000 -> 90s)."""
    if ms == 0:
        return "0s"
    for unit, size in _UNITS:
        if ms % size == 0:
            return f"{ms // size}{unit}"
    return f"{ms}ms"


def stream_time_column(times: StreamTimes, partition: Column) -> Column:
    """The stream time (ms) of the row's ``partition`` in ``times``; null where it has none."""
    from pyspark.sql import functions as F

    if not times:
        return F.lit(None).cast("long")
    pairs = [F.lit(x) for p, t in sorted(times.items()) for x in (p, t)]
    return F.element_at(F.create_map(*pairs), partition).cast("long")


def stream_times_meta(times: StreamTimes) -> dict[str, int]:
    """Stream times as commit metadata (JSON: partitions as strings)."""
    return {str(p): t for p, t in sorted(times.items())}


def stream_times_of(meta: Any) -> StreamTimes:
    """Stream times from commit metadata written by :func:`stream_times_meta`."""
    if not isinstance(meta, dict):
        raise TypeError(f"stream times are a mapping, not {meta!r}")
    return {int(p): int(t) for p, t in meta.items()}


def arrival_order() -> Column:
    from pyspark.sql import functions as F

    return F.struct(*(F.col(c) for c in ARRIVAL))


@dataclass
class GoldResult:
    table: str
    input_versions: tuple[int, int] | None
    keys_changed: int = 0  # the table's rows the batch inserted, updated or deleted
    committed: bool = False
    table_version: int | None = None  # the version the batch committed
    late: int | None = None  # records the batch sent to ``late_table`` (a windowed table)
    late_table: str | None = None
    # Input versions still to read after the batch, as planned (None: not known; measured).
    lag: int | None = None

    def batch(self) -> BatchOutcome | None:
        """The batch's outcome for the ledger (None: no batch, or one committed before)."""
        if not self.committed:
            return None
        return BatchOutcome(
            "gold",
            self.table,
            PUBLISHED,
            self.keys_changed,
            self.table_version,
            late=self.late,
            late_table=self.late_table,
            lag=self.lag,
            lag_unit=None if self.lag is None else "versions",
        )

    def summary(self) -> str:
        if self.input_versions is None:
            return f"gold {self.table}: stream has no new versions"
        lo, hi = self.input_versions
        state = "committed" if self.committed else "already applied (skipped)"
        return f"gold {self.table}: stream versions {lo}..{hi} {state}: {self.keys_changed} keys changed"


def input_meta(app: str, start: int, end: int) -> dict[str, Any]:
    """Commit metadata naming the input versions a commit consumed."""
    return {"lakehouse.source": {"table": app, "versions": [start, end]}}


def pending(
    store: DeltaStore, path: Location, app: str, input_table: Location, upto: int | None = None
) -> tuple[int, int] | None:
    """The input versions a table has yet to consume (``start``, ``end``), or None when it is
    up to date. ``upto`` caps the end (a reprocess rebuilding the table as of that version)."""
    head = store.version(input_table)
    if upto is not None:
        head = upto if head is None else min(head, upto)
    consumed = store.transaction_version(path, app)
    start = 0 if consumed is None else consumed + 1
    if head is None or start > head:
        return None
    return start, head
