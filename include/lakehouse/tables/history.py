"""``history`` tables: each key's versions (a versioned table, Kafka Streams' KIP-889; a slowly
changing dimension of type 2, Lakeflow's ``STORED AS SCD TYPE 2``).

One row per version of a key: the key, the value's fields, ``valid_from``, ``valid_to``
(exclusive; null while the version is current) and ``is_current``. A version's time is the
record's event time, or the value of the table's ``sequence_by`` field (a timestamp or a long,
whose type ``valid_from`` and ``valid_to`` then have).

The versions of a key are its records ordered by their time (its *timeline*), not by their
arrival, as Kafka Streams' versioned store keeps them:

* a record takes its place in the timeline whatever its arrival: one older than the key's current
  version splits the interval it falls in (the version before it now ends at its time, it ends
  where the next one begins);
* a tombstone (null value) at time t ends the version valid at t (its ``valid_to`` is t) and
  starts none: the key has no value from t until its next record;
* two records of a key with the same time: the later one (by arrival: stream commit, partition,
  offset) replaces the earlier, as a versioned store's put at the same timestamp does;
* with ``track``, a version is a run of consecutive records whose tracked fields are equal: a
  change of the other fields updates the version in place (it keeps its ``valid_from`` and takes
  the latest record's other fields), as ``TRACK HISTORY ON`` does;
* a record with a null key is ignored (a table has no null key); one without a time (no event
  time, or a null ``sequence_by`` value) cannot be placed and goes to the late-records table
  with that reason.

History retention (``history_retention``), Kafka Streams' rule for a versioned store (which is
also its grace period): each partition has its stream time, the largest time of its records so far
in offset order (:func:`lakehouse.tables.common.with_partition_time`), and a record whose time is
older than its partition's stream time minus the retention is not placed: it goes to the
late-records table (``late.<table>``) with its partition's stream time and the reason. Without a
retention every record is placed. Unlike Kafka's store, the table keeps every version it placed
(Kafka's store may drop versions older than the retention; ``show --as-of-event-time`` answers
any time here).

State: the table keeps every key's timeline (its placed records, one per key and time) in a state
table (``state.<table>``). A batch reads the timelines of the keys it touches, places its records
in them, recomputes those keys' versions (:func:`versions`, pure) and merges into the table only
the rows that changed (updated, inserted, or deleted where a version's interval moved), so the
change data feed, the table's changelog, shows the real changes only.

Exactly once: the state commits first, then the late records, then the table, each with the same
position (``Txn``) and the table's commit with the stream times after the batch. A run that died
between them redoes the batch: the state's and the late table's commits are skipped as already
applied, and the table's rows are computed from the state, which already holds the batch's
records, to the same result.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from lakehouse.contracts.model import (
    IS_CURRENT,
    VALID_FROM,
    VALID_TO,
    Contract,
    TableSpec,
)
from lakehouse.runtime.spark import is_empty
from lakehouse.storage import Txn, delta_spark
from lakehouse.streams.schema import TOMBSTONE, key_spark_type, spark_type
from lakehouse.tables import common
from lakehouse.tables.common import GoldResult, Outputs, StreamTimes, format_duration
from lakehouse.tables.kind import Context, SideTable, StreamKind

if TYPE_CHECKING:
    from datetime import datetime

    import pyarrow as pa
    from pyspark.sql import Column, DataFrame
    from pyspark.sql.types import DataType, StructType

HISTORY_META = "lakehouse.history"  # the table's commit metadata: versions, stream times after
STREAM_TIME, REASON = "stream_time", "reason"
NO_TIME = "no event time"
# The state's columns beside the stream's: a record's time (ms, or the sequence field's long)
# and its arrival (stream commit, then partition and offset, which the stream's own are).
TIME, ARRIVED = "__time", "__arrived"
_ST, _OP, _RUN = "__st", "__op", "__run"


# -- the table's shape ---------------------------------------------------------------------------


def time_type(stream: Contract, spec: TableSpec) -> DataType:
    """The type of a version's bounds: a timestamp, or the ``sequence_by`` field's long."""
    from pyspark.sql import types as T

    return T.LongType() if numbered(stream, spec) else T.TimestampType()


def numbered(stream: Contract, spec: TableSpec) -> bool:
    """Whether the versions are numbered by a long ``sequence_by`` (else they are times)."""
    return spec.sequence_by is not None and stream.field(spec.sequence_by).type == "long"


def table_schema(stream: Contract, spec: TableSpec) -> StructType:
    """The key (not null), the value's fields, ``valid_from`` (not null), ``valid_to`` and
    ``is_current``."""
    from pyspark.sql import types as T

    bound = time_type(stream, spec)
    return T.StructType(
        [
            T.StructField(stream.key_name, key_spark_type(stream), False),
            *(T.StructField(f.name, spark_type(f), True) for f in stream.fields),
            T.StructField(VALID_FROM, bound, False),
            T.StructField(VALID_TO, bound, True),
            T.StructField(IS_CURRENT, T.BooleanType(), False),
        ]
    )


def state_schema(stream: Contract) -> StructType:
    """A key's timeline: the key, the value's fields, the tombstone flag, the record's time
    (epoch ms, or the sequence field's long) and its arrival (stream commit, partition,
    offset)."""
    from pyspark.sql import types as T

    return T.StructType(
        [
            T.StructField(stream.key_name, key_spark_type(stream), False),
            *(T.StructField(f.name, spark_type(f), True) for f in stream.fields),
            T.StructField(TOMBSTONE, T.BooleanType(), False),
            T.StructField(TIME, T.LongType(), False),
            T.StructField(
                ARRIVED,
                T.StructType(
                    [
                        T.StructField("version", T.LongType(), False),
                        T.StructField("partition", T.IntegerType(), False),
                        T.StructField("offset", T.LongType(), False),
                    ]
                ),
                False,
            ),
        ]
    )


def late_schema(stream: Contract, spec: TableSpec) -> StructType:
    """A late record: the stream's columns, the stream time it was judged by, and why."""
    from pyspark.sql import types as T

    from lakehouse.streams.schema import stream_schema

    return T.StructType(
        [
            *stream_schema(stream).fields,
            T.StructField(STREAM_TIME, time_type(stream, spec), True),
            T.StructField(REASON, T.StringType(), True),
        ]
    )


# -- pure transforms -----------------------------------------------------------------------------


def _bound(ms: Column, long: bool) -> Column:
    """A time (ms, or a long sequence value) as a version bound."""
    from pyspark.sql import functions as F

    return ms if long else F.timestamp_millis(ms)


def record_time(stream: Contract, spec: TableSpec) -> Column:
    """A record's time as a long: its event time in epoch ms, or the ``sequence_by`` field's
    value (a timestamp's in ms)."""
    from pyspark.sql import functions as F

    if spec.sequence_by is None:
        return F.unix_millis(common.event_time(stream))
    if stream.field(spec.sequence_by).type == "long":
        return F.col(spec.sequence_by).cast("long")
    return F.unix_millis(F.col(spec.sequence_by))


def place(
    events: DataFrame, stream: Contract, spec: TableSpec, before: StreamTimes
) -> tuple[DataFrame, DataFrame, StreamTimes]:
    """A batch's records judged: the timeline entries they make (one per key and time, the
    latest arrival winning), the late records (shaped as :func:`late_schema`), and the stream
    times after the batch. Records with a null key are ignored. Pure but for the stream times
    (:func:`lakehouse.tables.common.with_partition_time`)."""
    from pyspark.sql import Window as W
    from pyspark.sql import functions as F

    key = stream.key_name
    keyed = events.filter(F.col(key).isNotNull()).withColumn(TIME, record_time(stream, spec))
    timed, after = common.with_partition_time(keyed, TIME, _ST, key, before)
    arrived = F.struct(
        F.col("_commit_version").alias("version"),
        F.col("partition").cast("int").alias("partition"),
        F.col("offset").alias("offset"),
    )
    timed = timed.withColumn(ARRIVED, arrived)
    long = numbered(stream, spec)
    no_time = F.col(TIME).isNull()
    retention = spec.retention_ms
    too_old = F.lit(False) if retention is None else F.col(TIME) < F.col(_ST) - F.lit(retention)
    what = f"no {spec.sequence_by}" if spec.sequence_by else NO_TIME
    kept = format_duration(retention or 0)
    reason = F.when(no_time, F.lit(what)).otherwise(
        F.concat(
            F.lit(f"older than its partition's stream time minus the history retention {kept} "),
            F.lit("(stream time "),
            _shown(F.col(_ST), long),
            F.lit(")"),
        )
    )
    late_columns = late_schema(stream, spec)
    late = timed.filter(no_time | too_old).select(
        *(
            (
                F.when(~no_time, _bound(F.col(_ST), long))
                if f.name == STREAM_TIME
                else reason
                if f.name == REASON
                else F.col(f.name)
            )
            .cast(f.dataType)
            .alias(f.name)
            for f in late_columns.fields
        )
    )
    placed = timed.filter(~no_time & ~too_old)
    last = W.partitionBy(key, TIME).orderBy(F.col(ARRIVED).desc())
    entries = (
        placed.withColumn("__n", F.row_number().over(last))
        .filter(F.col("__n") == 1)
        .select(*(f.name for f in state_schema(stream).fields))
    )
    return entries, late, after


def _shown(col: Column, long: bool) -> Column:
    from pyspark.sql import functions as F

    if long:
        return col.cast("string")
    return F.date_format(F.timestamp_millis(col), "yyyy-MM-dd'T'HH:mm:ss.SSSXXX")


def timelines(stored: DataFrame, entries: DataFrame, key: str) -> DataFrame:
    """The stored timelines of the keys ``entries`` touch, with the entries placed in them: an
    entry replaces a stored one of the same key and time (it arrived later). Pure."""
    touched = stored.join(entries.select(key).distinct(), key, "left_semi")
    kept = touched.join(entries.select(key, TIME), [key, TIME], "left_anti")
    return kept.unionByName(entries)


def versions(timeline: DataFrame, stream: Contract, spec: TableSpec) -> DataFrame:
    """Each key's versions from its timeline, shaped as :func:`table_schema`: a version per
    record (with ``track``: per run of records with equal tracked fields), from its time to the
    next record's (a tombstone ends a version and starts none). Pure."""
    from pyspark.sql import Window as W
    from pyspark.sql import functions as F

    key, long = stream.key_name, numbered(stream, spec)
    fields = [f.name for f in stream.fields]
    by_time = W.partitionBy(key).orderBy(TIME)
    if spec.track:
        tracked = F.struct(*(F.col(f) for f in spec.track))
        before = W.partitionBy(key).orderBy(TIME)
        new_run = (
            F.lag(TOMBSTONE).over(before).isNull()
            | F.lag(TOMBSTONE).over(before)
            | F.col(TOMBSTONE)
            | ~F.lag(tracked).over(before).eqNullSafe(tracked)
        )
        runs = timeline.withColumn(
            _RUN, F.sum(new_run.cast("int")).over(by_time.rowsBetween(W.unboundedPreceding, 0))
        )
        # A run: its first record's time, its last record's fields, its tombstone flag.
        last = F.max_by(F.struct(*(F.col(f) for f in fields)), F.col(TIME))
        timeline = runs.groupBy(key, _RUN).agg(
            F.min(TIME).alias(TIME), F.first(TOMBSTONE).alias(TOMBSTONE), last.alias("__last")
        )
        timeline = timeline.select(
            key, TIME, TOMBSTONE, *(F.col(f"__last.{f}").alias(f) for f in fields)
        )
    bounded = timeline.withColumn("__next", F.lead(TIME).over(by_time))
    rows = bounded.filter(~F.col(TOMBSTONE))
    return rows.select(
        F.col(key),
        *(F.col(f) for f in fields),
        _bound(F.col(TIME), long).alias(VALID_FROM),
        _bound(F.col("__next"), long).alias(VALID_TO),
        F.col("__next").isNull().alias(IS_CURRENT),
    )


def changed_rows(new: DataFrame, old: DataFrame, key: str) -> DataFrame:
    """The rows that change the table for the keys recomputed: each new row that is not stored
    as it is (``__op`` upsert), each stored row whose version is gone (``__op`` delete). Pure."""
    from pyspark.sql import functions as F

    ids = [key, VALID_FROM]
    values = [c for c in new.columns if c not in ids]
    stored = old.select(*ids, *(F.col(c).alias(f"__old_{c}") for c in values)).withColumn(
        "__stored", F.lit(True)
    )
    same = F.lit(True)
    for c in values:
        same = same & F.col(c).eqNullSafe(F.col(f"__old_{c}"))
    upserts = (
        new.join(stored, ids, "left")
        .filter(F.col("__stored").isNull() | ~same)
        .select(*new.columns)
        .withColumn(_OP, F.lit("upsert"))
    )
    gone = old.join(new.select(*ids), ids, "left_anti").withColumn(_OP, F.lit("delete"))
    return upserts.unionByName(gone.select(*new.columns, _OP))


# -- the kind ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Batch:
    start: int
    end: int
    stream_times: StreamTimes  # before the batch
    events: DataFrame
    state: DataFrame  # the timelines
    gold: DataFrame  # the table's rows


@dataclass(frozen=True)
class Changes:
    entries: DataFrame  # timeline entries to merge into the state
    late: DataFrame
    rows: DataFrame  # the table's changes (``__op``)
    stream_times: StreamTimes  # after the batch
    cached: list[DataFrame]


class History(StreamKind):
    name = "history"

    def side_tables(self, spec: TableSpec, out: Outputs) -> tuple[SideTable, ...]:
        return (
            SideTable("state", f"state.{spec.name}", out.state),
            SideTable("late", f"late.{spec.name}", out.late),
        )

    def create(self, ctx: Context) -> None:
        stream, spec = ctx.stream, ctx.spec
        delta_spark.create_table(
            ctx.spark, ctx.out.gold, table_schema(stream, spec), gate=ctx.out.gate
        )
        delta_spark.create_table(ctx.spark, ctx.out.state, state_schema(stream))
        delta_spark.create_table(ctx.spark, ctx.out.late, late_schema(stream, spec))

    def unfinished(self, ctx: Context) -> None:
        # Redone by the next batch: the state and late commits come first and are skipped as
        # applied (see the module docstring).
        return None

    def read(self, ctx: Context) -> Batch | None:
        todo = ctx.pending()
        if todo is None:
            return None
        start, end = todo
        events = common.read_input(ctx.store, ctx.settings, ctx.contract, ctx.spec, start, end)
        return Batch(
            start,
            end,
            self._stream_times_at(ctx, start - 1),
            events,
            ctx.store.read(ctx.out.state),
            ctx.store.read(ctx.out.gold),
        )

    def _stream_times_at(self, ctx: Context, consumed: int) -> StreamTimes:
        """The stream times after input version ``consumed``: from the table's commit that
        consumed it, else computed again from the input (of which they are a function)."""
        from pyspark.sql import functions as F

        if consumed < 0:
            return {}
        meta = ctx.store.latest_metadata(ctx.out.gold, HISTORY_META)
        if meta and meta["versions"][1] == consumed:
            return common.stream_times_of(meta["stream_time"])
        events = common.read_input(ctx.store, ctx.settings, ctx.contract, ctx.spec, 0, consumed)
        key = ctx.stream.key_name
        times = events.filter(F.col(key).isNotNull()).withColumn(
            TIME, record_time(ctx.stream, ctx.spec)
        )
        tops = times.groupBy("partition").agg(F.max(TIME).alias("m")).collect()
        return {r["partition"]: r["m"] for r in tops if r["m"] is not None}

    def transform(self, ctx: Context, batch: Batch) -> Changes:
        stream, spec, key = ctx.stream, ctx.spec, ctx.stream.key_name
        entries, late, after = place(batch.events, stream, spec, batch.stream_times)
        entries = entries.cache()
        timeline = timelines(batch.state, entries, key)
        new = versions(timeline, stream, spec)
        old = batch.gold.join(entries.select(key).distinct(), key, "left_semi")
        rows = changed_rows(new, old, key).cache()
        return Changes(entries, late, rows, after, [entries, rows])

    def commit(self, ctx: Context, batch: Batch, changes: Changes) -> GoldResult:
        key, out, app = ctx.stream.key_name, ctx.out, ctx.app
        position = common.input_meta(app, batch.start, batch.end)
        txn = Txn(app, batch.end)
        columns = [f.name for f in state_schema(ctx.stream).fields]
        try:
            delta_spark.merge(
                changes.entries,
                out.state,
                on=[key, TIME],
                update={c: f"s.{c}" for c in columns if c not in (key, TIME)},
                insert={c: f"s.{c}" for c in columns},
                txn=txn,
                metadata=position,
            )
            late = 0
            if not is_empty(changes.late):
                written = delta_spark.append(changes.late, out.late, txn=txn, metadata=position)
                late = written.rows_written or 0
            values = [c for c in ctx.contract.table_columns(ctx.spec) if c not in (key, VALID_FROM)]
            meta = {
                **position,
                HISTORY_META: {
                    "versions": [batch.start, batch.end],
                    "stream_time": common.stream_times_meta(changes.stream_times),
                },
            }
            result = delta_spark.merge(
                changes.rows,
                out.gold,
                on=[key, VALID_FROM],
                update={c: f"s.{c}" for c in values},
                insert={c: f"s.{c}" for c in [key, VALID_FROM, *values]},
                delete_when=f"s.{_OP} = 'delete'",
                insert_when=f"s.{_OP} = 'upsert'",
                txn=txn,
                metadata=meta,
                gate=out.gate,
            )
        finally:
            for df in changes.cached:
                df.unpersist()
        return GoldResult(
            ctx.spec.name,
            (batch.start, batch.end),
            result.source_rows or 0,
            result.committed,
            table_version=result.table_version,
            late=late,
            late_table=f"late.{ctx.spec.name}",
        )


KIND = History()


def valid_at(rows: pa.Table, when: datetime | int) -> pa.Table:
    """A history table's versions valid at ``when`` (a datetime, or an int for a long
    ``sequence_by``): each key's value then, as Kafka Streams' ``get(key, asOfTimestamp)``
    answers, read from the table's rows (no Spark)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    at = pa.scalar(when, type=rows.schema.field(VALID_FROM).type)
    ends = rows[VALID_TO]
    # Kleene's or: an open valid_to (null) is true whatever the comparison with it says.
    valid = pc.and_(
        pc.less_equal(rows[VALID_FROM], at),
        pc.or_kleene(pc.is_null(ends), pc.greater(ends, at)),
    )
    return rows.filter(valid)
