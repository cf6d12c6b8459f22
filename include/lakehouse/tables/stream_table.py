"""``stream-table`` joins (KStream-KTable with a *versioned* table): an append-only result
stream.

Each event of this stream (not a tombstone) is joined with the other topic read as a versioned table:
of the other stream's records with the event's join key (the record key, or the ``on_field``)
that come before the event in Kafka Streams' order, the one with the greatest event time at or
before the event's (ties: the later offset). A tombstone there means the key was deleted from
that time on (no value). ``inner`` drops events without a value, ``left`` keeps them with null
columns, an event whose join key is null included (Kafka Streams 3.7+, KIP-962). Identity:
(partition, offset).

Kafka's order across the two inputs: a task that reads a partition of each picks the record with
the smaller timestamp next, so that the other side's record x comes before the event e exactly
when x's partition time (the largest event time of its partition up to x) is at most e's (ties:
the table first). The join keeps this side's partition times in its commit metadata. Among the
other side's records it has, that rule does not depend on how this join's micro-batches are cut,
nor on a refresh: an out-of-order update of the table (an older event time after a newer one)
affects only the events that follow it in that order, and an event already joined is never
emitted again. What no rule can know is the other side's records it does not have yet: an event
whose partition time is ahead of every record the other stream has is joined with the table as
far as it has got (the versions consumed are recorded in the commit), which is Kafka Streams'
behaviour with its default ``max.task.idle.ms`` (0: process what has arrived; waiting instead
would hold events back for as long as the other topic is idle).

With ``table:`` the other side is one of the other topic's ``history`` tables (KIP-914's join
against a versioned table whose versions are kept as a table): each event joins the version valid
at its event time (``valid_from <= t < valid_to``) among the versions the history table has when
the event is joined; that table's version is recorded in the commit. An out-of-order update the
history table already has is found (it took its place in the key's versions); one it gets later
does not rewrite a row already joined, as in Kafka Streams. The history table's own rules apply
to what is a version: its ``track`` fields, its ``sequence_by`` (a timestamp; a long one has no
event time to compare with and is refused), and its retention (records it put in its late table
are no version).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from lakehouse.contracts.catalog import Catalog
from lakehouse.contracts.model import VALID_FROM, VALID_TO, Contract, Join, TableSpec
from lakehouse.runtime.config import Settings
from lakehouse.runtime.objectstore import Location
from lakehouse.storage import DeltaStore, delta_spark
from lakehouse.streams.schema import EVENT_TIME, TOMBSTONE, key_spark_type
from lakehouse.tables.common import (
    GoldResult,
    StreamTimes,
    event_time,
    input_meta,
    pending,
    read_input,
    stream_app,
    stream_times_meta,
    stream_times_of,
    with_partition_time,
)
from lakehouse.tables.joined import (
    JOIN_META,
    KEY,
    PT,
    TIME,
    JoinKind,
    JoinResult,
    conform,
    join_key,
    join_of,
    millis,
    txns,
)
from lakehouse.tables.kind import Context, Input, plan_stream, stream_input

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


@dataclass(frozen=True)
class Batch:
    start: int
    end: int
    events: DataFrame  # with ``__t`` and ``__pt``
    stream_times: StreamTimes  # this side's partition times after the batch
    table: DataFrame | None  # the other stream's every record, with ``__t`` and ``__pt``;
    # with ``table:``, the history table's rows
    other_version: int | None


def _versions(settings: Settings, j: Join) -> Input | None:
    """The history table a join reads (``table:``), or None: it reads the other stream."""
    if j.table is None:
        return None
    return Input(f"gold.{j.table}", settings.gold_path(j.table), f"gold.{j.table}")


class StreamTable(JoinKind):
    name = "stream-table"

    def inputs(
        self, settings: Settings, catalog: Catalog, contract: Contract, spec: TableSpec
    ) -> tuple[Input, ...]:
        versions = _versions(settings, join_of(spec))
        if versions is None:
            return super().inputs(settings, catalog, contract, spec)
        return (stream_input(contract, spec, settings), versions)

    def _other_side(self, ctx: Context) -> Input:
        versions = _versions(ctx.settings, join_of(ctx.spec))
        if versions is not None:
            return versions
        other = self.other(ctx)
        return Input(
            f"silver.{other.stream}", ctx.settings.silver_path(other.stream), stream_app(other)
        )

    def read(self, ctx: Context) -> Batch | None:
        todo = ctx.pending()
        if todo is None:
            return None
        start, end = todo
        other = self.other(ctx)
        side = self._other_side(ctx)
        other_version = ctx.store.version(side.path)
        table = None
        if other_version is not None:
            table = ctx.store.read(side.path, version=other_version)
            if join_of(ctx.spec).table is None:
                table = with_partition_time_all(table, other)
        before = _partition_times_at(
            ctx.store, ctx.settings, ctx.contract, ctx.spec, ctx.out.gold, start - 1
        )
        events, after = with_partition_time(
            read_input(ctx.store, ctx.settings, ctx.contract, ctx.spec, start, end).withColumn(
                TIME, millis(event_time(ctx.contract))
            ),
            TIME,
            PT,
            ctx.contract.key_name,
            before,
        )
        return Batch(start, end, events, after, table, other_version)

    def transform(self, ctx: Context, batch: Batch) -> DataFrame:
        j = join_of(ctx.spec)
        join = as_of_join if j.table is None else versioned_join
        joined = join(batch.events, batch.table, ctx.contract, self.other(ctx), j)
        return conform(joined, ctx.store.spark_schema(ctx.out.gold))

    def plan(self, ctx: Context) -> list[str]:
        side = self._other_side(ctx)
        todo = pending(ctx.store, ctx.out.gold, side.app, side.path)
        new = "no new versions" if todo is None else f"versions {todo[0]}..{todo[1]}"
        return plan_stream(ctx, also=f"; {side.name} (the join's other side): {new}")

    def commit(self, ctx: Context, batch: Batch, changes: DataFrame) -> GoldResult:
        other_app = self._other_side(ctx).app
        rows = changes.cache()
        meta = {
            **input_meta(ctx.app, batch.start, batch.end),
            JOIN_META: {
                "table": other_app,
                "version": batch.other_version,
                "stream_time": stream_times_meta(batch.stream_times),
            },
        }
        positions = txns((ctx.app, batch.end), (other_app, batch.other_version))
        n = rows.count()
        result = delta_spark.append(
            rows, ctx.out.gold, txn=positions, metadata=meta, gate=ctx.out.gate
        )
        rows.unpersist()
        v = batch.other_version
        return JoinResult(
            ctx.spec.name,
            (batch.start, batch.end),
            n,
            result.committed,
            table_version=result.table_version,
            other=other_app,
            other_versions=None if v is None else (v, v),
        )


def _partition_times_at(
    store: DeltaStore,
    settings: Settings,
    contract: Contract,
    spec: TableSpec,
    gold: Location,
    consumed: int,
) -> StreamTimes:
    """This side's partition times after input version ``consumed``: from the join commit that
    consumed it, else (a rebuild, or a table written before they were kept) computed again from
    the input, of which they are a function."""
    from pyspark.sql import functions as F

    if consumed < 0:
        return {}
    position = store.latest_metadata(gold, "lakehouse.source")
    meta = store.latest_metadata(gold, JOIN_META)
    if position and position["versions"][1] == consumed and meta and "stream_time" in meta:
        return stream_times_of(meta["stream_time"])
    events = read_input(store, settings, contract, spec, 0, consumed)
    tops = events.groupBy("partition").agg(F.max(millis(event_time(contract))).alias("m"))
    return {r["partition"]: r["m"] for r in tops.collect() if r["m"] is not None}


def with_partition_time_all(records: DataFrame, contract: Contract) -> DataFrame:
    """A whole stream's records with ``__t`` (event time, ms) and ``__pt``: its partition's
    time at each, the running maximum of event time in offset order (every record counts, as
    every record moves a Kafka Streams task's partition time)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    order = (
        Window.partitionBy("partition")
        .orderBy("offset")
        .rowsBetween(Window.unboundedPreceding, Window.currentRow)
    )
    timed = records.withColumn(TIME, millis(event_time(contract)))
    return timed.withColumn(PT, F.max(TIME).over(order))


def as_of_join(
    events: DataFrame, table: DataFrame | None, contract: Contract, other: Contract, j: Join
) -> DataFrame:
    """Each event (not a tombstone) with the other stream's value for its join key as of its
    event time, the other stream read as a versioned table, in Kafka Streams' order across the
    two inputs (see the module docstring). Both inputs carry ``__t`` (event time, ms) and
    ``__pt`` (their partition's time at the record). Pure.

    An event with a null join key has no value: an inner join drops it, a left join keeps it
    with nulls (Kafka Streams 3.7+, KIP-962)."""
    from pyspark.sql import functions as F

    jk, mine, valid = _joinable(events, contract, j)
    if table is None:  # the other stream does not exist yet: no key has a value
        return _unmatched(valid, mine, j)
    key_type = key_spark_type(other)
    left = valid.select(
        F.col(jk).cast(key_type).alias(KEY),
        F.col(TIME).alias("__et"),
        F.col(PT).alias("__ept"),
        F.struct(*mine).alias("__e"),
    )
    records = table.filter(F.col(other.key_name).isNotNull()).join(
        left.select(F.col(KEY).alias(other.key_name)).distinct(), other.key_name, "left_semi"
    )
    right = records.select(
        F.col(other.key_name).cast(key_type).alias("__rk"),
        F.col(TIME).alias("__rt"),
        F.col(PT).alias("__rpt"),
        F.struct(F.col(TIME), F.col("offset"), F.col("partition")).alias("__order"),
        F.struct(F.col(TOMBSTONE).alias("dead"), *(F.col(f) for f in j.fields)).alias("__v"),
    )
    # The table's version at the event: of the other side's records that precede the event in
    # Kafka's order (partition time at or before the event's) and are at or before its event
    # time, the latest (by event time, then offset).
    visible = (
        (F.col("__rk") == F.col(KEY))
        & (F.col("__rt") <= F.col("__et"))
        & (F.col("__rpt") <= F.col("__ept"))
    )
    identity = [F.col("__e.partition"), F.col("__e.offset")]
    found = (
        left.join(right, visible, "left")
        .groupBy(*identity)
        .agg(F.first("__e").alias("__e"), F.max_by("__v", "__order").alias("__found"))
    )
    joined = found.select("__e", F.when(~F.col("__found.dead"), F.col("__found")).alias("__m"))
    if j.how == "inner":
        joined = joined.filter(F.col("__m").isNotNull())
    return joined.select(
        *(F.col(f"__e.{c}").alias(c) for c in mine),
        *(F.col(f"__m.{f}").alias(j.column(f)) for f in j.fields),
    )


def _joinable(events: DataFrame, contract: Contract, j: Join) -> tuple[str, list[str], DataFrame]:
    """The event side of a stream-table join: its join key column, the columns it keeps, and
    the events that can join (no tombstone; an inner join also needs a join key)."""
    from pyspark.sql import functions as F

    jk = join_key(contract, j)
    mine = list(dict.fromkeys([*contract.columns, "partition", "offset", "timestamp", EVENT_TIME]))
    keyed = F.col(jk).isNotNull()
    return jk, mine, events.filter(~F.col(TOMBSTONE) & (keyed if j.how == "inner" else F.lit(True)))


def _unmatched(valid: DataFrame, mine: list[str], j: Join) -> DataFrame:
    """The result when the other side has no table yet: a left join keeps every event."""
    return valid.select(*mine) if j.how == "left" else valid.limit(0).select(*mine)


def versioned_join(
    events: DataFrame, versions: DataFrame | None, contract: Contract, other: Contract, j: Join
) -> DataFrame:
    """Each event (not a tombstone) with the version of its join key valid at its event time
    in the other topic's history table (``valid_from <= t < valid_to``, an open ``valid_to``
    for the current version): at most one, since a key's versions do not overlap. An event with
    a null join key or no event time has none: an inner join drops it, a left join keeps it with
    nulls. Pure."""
    from pyspark.sql import functions as F

    jk, mine, valid = _joinable(events, contract, j)
    if versions is None:  # the history table does not exist yet: no key has a value
        return _unmatched(valid, mine, j)
    key_type = key_spark_type(other)
    left = valid.select(
        F.col(jk).cast(key_type).alias(KEY), F.col(TIME).alias("__et"), F.struct(*mine).alias("__e")
    )
    right = versions.select(
        F.col(other.key_name).cast(key_type).alias("__rk"),
        F.unix_millis(F.col(VALID_FROM)).alias("__from"),
        F.unix_millis(F.col(VALID_TO)).alias("__to"),
        F.struct(*(F.col(f) for f in j.fields)).alias("__m"),
    )
    valid_then = (
        (F.col("__rk") == F.col(KEY))
        & (F.col("__from") <= F.col("__et"))
        & (F.col("__to").isNull() | (F.col("__et") < F.col("__to")))
    )
    joined = left.join(right, valid_then, "inner" if j.how == "inner" else "left")
    return joined.select(
        *(F.col(f"__e.{c}").alias(c) for c in mine),
        *(F.col(f"__m.{f}").alias(j.column(f)) for f in j.fields),
    )


KIND = StreamTable()
