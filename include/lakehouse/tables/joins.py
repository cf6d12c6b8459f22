"""Gold joins: a stream or table of this topic joined with another topic's stream or table, as
Kafka Streams joins them. Every micro-batch is one exactly-once commit recording, as Delta app
transactions, the versions of *both* inputs it consumed (``tables.input_app`` for this side,
``tables.stream_app(other)`` for the other); a rerun of the same batch is a no-op.

**stream-table** (KStream-KTable with a *versioned* table): an append-only result stream. Each
event of this stream (not a tombstone) is joined with the other topic read as a versioned table:
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

**table-table** (KTable-KTable): both streams read as tables (latest value per key in offset
order, tombstones delete, null keys ignored), joined by this side's key, or, with ``on_field``,
by a field of this side matched against the other side's key (a foreign-key join, KTable-KTable
FK join; a null foreign key has no match). The output is keyed by this side's key: ``inner`` has a
row where both sides have a value, ``left`` one for every key of this side (the other's columns
null when it has none). Each micro-batch consumes both change feeds since the versions consumed,
keeps each side's latest value per key in a state table (this side in ``Outputs.state``, the
other beside it with a ``__other`` suffix), recomputes the rows of the keys whose result may have
changed, and merges them: an update, an insert, or a delete when the row disappeared (inner:
either side deleted; left: this side deleted). Rows whose result did not change are not
rewritten, so the change feed shows real updates and deletes only. The gold commit comes first;
a run that died before the state commits is caught up from the stream on the next run.

**stream-stream** (KStream-KStream, inner): every pair of events of this stream and the other
with equal keys (this key or ``on_field`` against the other key; null keys and tombstones
ignored) whose event times are at most ``within`` apart, however late either arrives: Kafka
Streams' ``JoinWindows.ofTimeDifferenceAndGrace(within, grace)`` with a grace longer than any
history, so no record is ever too late and no stream time is needed; the pairs do not depend on
the order or the micro-batches in which the two sides arrive.
Incremental without duplicates: a batch appends (new events of this side x every event of the
other side up to its head now) and (events of this side consumed before x new events of the
other side). Identity: (partition, offset, prefix+partition, prefix+offset). A left
stream-stream join is refused: Kafka emits its null results only once the window has closed,
which needs a grace period and a stream time this contract does not declare.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any

from lakehouse.contracts.catalog import Catalog
from lakehouse.contracts.model import Contract, Join, TableSpec
from lakehouse.runtime.config import Settings
from lakehouse.runtime.objectstore import Location
from lakehouse.storage import DeltaStore, Txn, delta_spark
from lakehouse.streams.schema import EVENT_TIME, TOMBSTONE, key_spark_type, spark_type
from lakehouse.tables.aggregates import LATEST, catch_up_state, latest_per_key, merge_latest
from lakehouse.tables.common import (
    GoldResult,
    Outputs,
    StreamTimes,
    input_app,
    input_meta,
    input_path,
    pending,
    read_input,
    stream_app,
    stream_times_meta,
    stream_times_of,
    with_partition_time,
)

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.types import DataType, StructType

JOIN_META = "lakehouse.join"  # commit metadata: the other side's versions a commit consumed
_KEY, _TIME = "__k", "__t"
_PT = "__pt"  # a record's partition time (ms): Kafka Streams' order across the two inputs
_PRESENT = "__present"


@dataclass
class JoinResult(GoldResult):
    """A join's micro-batch: this side's versions (``input_versions``) and the other's."""

    other: str = ""
    other_versions: tuple[int, int] | None = None

    def summary(self) -> str:
        if self.input_versions is None and self.other_versions is None:
            return f"gold {self.table}: neither input has new versions"

        def span(v: tuple[int, int] | None) -> str:
            return "no new versions" if v is None else f"versions {v[0]}..{v[1]}"

        state = "committed" if self.committed else "already applied (skipped)"
        return (
            f"gold {self.table}: stream {span(self.input_versions)}, {self.other} "
            f"{span(self.other_versions)} {state}: {self.keys_changed} rows written"
        )


def other_state_path(out: Outputs) -> Location:
    """A table-table join's state of the other side (each of its keys' latest value)."""
    return out.state.with_name(out.state.name + "__other")


def build_join(
    spark: SparkSession,
    settings: Settings,
    catalog: Catalog,
    contract: Contract,
    spec: TableSpec,
    out: Outputs,
    upto: int | None,
) -> GoldResult:
    """One micro-batch of a join table (see the module docstring). ``upto`` caps this side's
    input version; the other side is read at its head."""
    j = spec.join
    assert j is not None
    other = catalog.topic(j.other)
    # One committing driver per table: the join table's lock, then its two states'.
    with (
        delta_spark.table_lock(settings, out.gold),
        delta_spark.table_lock(settings, out.state),
        delta_spark.table_lock(settings, other_state_path(out)),
    ):
        store = DeltaStore(spark)
        delta_spark.create_table(spark, out.gold, join_schema(contract, other, spec), gate=out.gate)
        if j.type == "stream-table":
            return _stream_table(store, settings, contract, other, spec, out, upto)
        if j.type == "table-table":
            return _table_table(store, settings, contract, other, spec, out, upto)
        return _stream_stream(store, settings, contract, other, spec, out, upto)


# -- schema and shared pieces -------------------------------------------------------------------


def join_schema(contract: Contract, other: Contract, spec: TableSpec) -> StructType:
    """The join table's schema: ``Contract.table_columns`` in order, the identity columns
    (``Contract.table_key_columns``) not null."""
    from pyspark.sql import types as T

    j = spec.join
    assert j is not None
    types: dict[str, DataType] = {"partition": T.IntegerType(), "offset": T.LongType()}
    types |= {"timestamp": T.TimestampType(), EVENT_TIME: T.TimestampType()}
    types |= {j.column(c): types[c] for c in ("partition", "offset", EVENT_TIME)}
    types[contract.key_name] = key_spark_type(contract)
    types |= {f.name: spark_type(f) for f in contract.fields}
    types |= {j.column(f): spark_type(other.field(f)) for f in j.fields}
    identity = set(contract.table_key_columns(spec))
    return T.StructType(
        [T.StructField(c, types[c], c not in identity) for c in contract.table_columns(spec)]
    )


def _event_time(contract: Contract) -> Column:
    """An event's time: the stream's event_time (the record timestamp where the contract's
    event-time field is itself called event_time and is null)."""
    from pyspark.sql import functions as F

    if contract.event_time == EVENT_TIME:
        return F.coalesce(F.col(EVENT_TIME), F.col("timestamp"))
    return F.col(EVENT_TIME)


def _millis(col: Column) -> Column:
    from pyspark.sql import functions as F

    return F.unix_millis(col)


def _join_key(contract: Contract, j: Join) -> str:
    return j.on or contract.key_name


def _conform(df: DataFrame, schema: StructType) -> DataFrame:
    """``df`` as ``schema``: its columns in order and types; absent ones null (a stream read at
    an older version may not have a column its contract added later)."""
    from pyspark.sql import functions as F

    have = set(df.columns)
    return df.select(
        *(
            (F.col(f.name) if f.name in have else F.lit(None)).cast(f.dataType).alias(f.name)
            for f in schema.fields
        )
    )


def _records_upto(store: DeltaStore, path: Location, version: int | None) -> DataFrame | None:
    """Every record a stream (append-only, unique on partition and offset) had at ``version``:
    the current snapshot without what later versions added. Old versions' files and commits
    may be gone after maintenance, so the stream is never read *at* an old version."""
    from pyspark.sql import functions as F

    head = store.version(path)
    if version is None or head is None:
        return None
    snapshot = store.read(path, version=head)
    if version >= head:
        return snapshot
    newer = store.changes(path, version + 1, head).filter(F.col("_change_type") == "insert")
    return snapshot.join(newer.select("partition", "offset"), ["partition", "offset"], "left_anti")


def _meta(
    app: str, span: tuple[int, int] | None, other_app: str, other_span: tuple[int, int] | None
) -> dict[str, Any]:
    """Commit metadata: the versions of each input a commit consumed (None: none new)."""
    return {
        "lakehouse.source": {"table": app, "versions": list(span) if span else None},
        JOIN_META: {"table": other_app, "versions": list(other_span) if other_span else None},
    }


def _txns(*positions: tuple[str, int | None]) -> list[Txn]:
    """The positions a commit records, one per app id (a self-join reads one stream twice)."""
    latest: dict[str, int] = {}
    for app, v in positions:
        if v is not None:
            latest[app] = max(v, latest.get(app, v))
    return [Txn(app, v) for app, v in latest.items()]


# -- stream-table -------------------------------------------------------------------------------


def _stream_table(
    store: DeltaStore,
    settings: Settings,
    contract: Contract,
    other: Contract,
    spec: TableSpec,
    out: Outputs,
    upto: int | None,
) -> GoldResult:
    j = spec.join
    assert j is not None
    app, other_app = input_app(contract, spec), stream_app(other)
    todo = pending(store, out.gold, app, input_path(settings, contract, spec), upto)
    if todo is None:
        return JoinResult(spec.name, None, other=other_app)
    start, end = todo
    other_path = settings.silver_path(other.stream)
    other_version = store.version(other_path)
    table = None
    if other_version is not None:
        table = with_partition_time_all(store.read(other_path, version=other_version), other)
    before = _partition_times_at(store, settings, contract, spec, out.gold, start - 1)
    events, after = with_partition_time(
        read_input(store, settings, contract, spec, start, end).withColumn(
            _TIME, _millis(_event_time(contract))
        ),
        _TIME,
        _PT,
        contract.key_name,
        before,
    )
    schema = store.spark_schema(out.gold)
    rows = _conform(as_of_join(events, table, contract, other, j), schema).cache()
    meta = {
        **input_meta(app, start, end),
        JOIN_META: {
            "table": other_app,
            "version": other_version,
            "stream_time": stream_times_meta(after),
        },
    }
    txns = _txns((app, end), (other_app, other_version))
    n = rows.count()
    result = delta_spark.append(rows, out.gold, txn=txns, metadata=meta, gate=out.gate)
    rows.unpersist()
    versions = None if other_version is None else (other_version, other_version)
    return JoinResult(
        spec.name,
        (start, end),
        n,
        result.committed,
        table_version=result.table_version,
        other=other_app,
        other_versions=versions,
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
    tops = events.groupBy("partition").agg(F.max(_millis(_event_time(contract))).alias("m"))
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
    timed = records.withColumn(_TIME, _millis(_event_time(contract)))
    return timed.withColumn(_PT, F.max(_TIME).over(order))


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

    jk = _join_key(contract, j)
    mine = list(dict.fromkeys([*contract.columns, "partition", "offset", "timestamp", EVENT_TIME]))
    keyed = F.col(jk).isNotNull()
    valid = events.filter(~F.col(TOMBSTONE) & (keyed if j.how == "inner" else F.lit(True)))
    if table is None:  # the other stream does not exist yet: no key has a value
        return valid.select(*mine) if j.how == "left" else valid.limit(0).select(*mine)
    key_type = key_spark_type(other)
    left = valid.select(
        F.col(jk).cast(key_type).alias(_KEY),
        F.col(_TIME).alias("__et"),
        F.col(_PT).alias("__ept"),
        F.struct(*mine).alias("__e"),
    )
    records = table.filter(F.col(other.key_name).isNotNull()).join(
        left.select(F.col(_KEY).alias(other.key_name)).distinct(), other.key_name, "left_semi"
    )
    right = records.select(
        F.col(other.key_name).cast(key_type).alias("__rk"),
        F.col(_TIME).alias("__rt"),
        F.col(_PT).alias("__rpt"),
        F.struct(F.col(_TIME), F.col("offset"), F.col("partition")).alias("__order"),
        F.struct(F.col(TOMBSTONE).alias("dead"), *(F.col(f) for f in j.fields)).alias("__v"),
    )
    # The table's version at the event: of the other side's records that precede the event in
    # Kafka's order (partition time at or before the event's) and are at or before its event
    # time, the latest (by event time, then offset).
    visible = (
        (F.col("__rk") == F.col(_KEY))
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


# -- table-table --------------------------------------------------------------------------------


def _table_table(
    store: DeltaStore,
    settings: Settings,
    contract: Contract,
    other: Contract,
    spec: TableSpec,
    out: Outputs,
    upto: int | None,
) -> GoldResult:
    j = spec.join
    assert j is not None
    app, other_app = input_app(contract, spec), stream_app(other)
    other_out = replace(out, state=other_state_path(out))
    consumed = store.transaction_version(out.gold, app)
    other_consumed = store.transaction_version(out.gold, other_app)
    # Both states must stand where the gold table does (a run may have died between commits).
    catch_up_state(store, settings, contract, spec, out, consumed)
    catch_up_state(store, settings, other, LATEST, other_out, other_consumed)
    todo = pending(store, out.gold, app, input_path(settings, contract, spec), upto)
    other_todo = pending(store, out.gold, other_app, settings.silver_path(other.stream))
    if todo is None and other_todo is None:
        return JoinResult(spec.name, None, other=other_app)

    def changes(c: Contract, s: TableSpec, span: tuple[int, int] | None) -> DataFrame | None:
        if span is None:
            return None
        return latest_per_key(read_input(store, settings, c, s, *span), c).cache()

    mine, theirs = changes(contract, spec, todo), changes(other, LATEST, other_todo)
    batch = table_join_changes(
        store.read(out.state), mine, store.read(other_out.state), theirs, contract, other, j
    )
    key = contract.key_name
    batch = _drop_unchanged(batch, store.read(out.gold), key, spec, contract).cache()
    end = todo[1] if todo else consumed
    other_end = other_todo[1] if other_todo else other_consumed
    txns = _txns((app, end), (other_app, other_end))
    meta = _meta(app, todo, other_app, other_todo)
    n = batch.count()
    values = [c for c in contract.table_columns(spec) if c != key]
    # A MERGE commits even when the batch is empty: the positions move on.
    result = delta_spark.merge(
        batch,
        out.gold,
        on=[key],
        delete_when=f"NOT s.{_PRESENT}",
        update={c: f"s.{c}" for c in values},
        insert={c: f"s.{c}" for c in [key, *values]},
        insert_when=f"s.{_PRESENT}",
        txn=txns,
        metadata=meta,
        gate=out.gate,
    )
    batch.unpersist()
    for side, c, span, state, side_app in (
        (mine, contract, todo, out.state, app),
        (theirs, other, other_todo, other_out.state, other_app),
    ):
        if side is not None and span is not None:
            merge_latest(side, state, c, Txn(side_app, span[1]), input_meta(side_app, *span))
            side.unpersist()
    return JoinResult(
        spec.name,
        todo,
        n,
        result.committed,
        table_version=result.table_version,
        other=other_app,
        other_versions=other_todo,
    )


def _apply(state: DataFrame, latest: DataFrame | None, c: Contract) -> DataFrame:
    """A table's state after a batch (one row per key, tombstones included): the new values
    replace the old ones, tombstones delete."""
    from pyspark.sql import functions as F

    if latest is None:
        return state
    kept = state.join(latest.select(c.key_name), c.key_name, "left_anti")
    return kept.unionByName(latest.filter(~F.col(TOMBSTONE)).drop(TOMBSTONE))


def table_join_changes(
    state: DataFrame,
    latest: DataFrame | None,
    other_state: DataFrame,
    other_latest: DataFrame | None,
    contract: Contract,
    other: Contract,
    j: Join,
) -> DataFrame:
    """The join's rows for every key of this side whose result may have changed, given each
    side's state (latest value per key before the batch) and batch (``latest_per_key`` of its
    new records, or None). One row per such key: this side's key, the table's columns, and
    ``__present`` (false: the key has no row now). Pure.

    Changed keys: this side's changed keys, and its keys whose join key (the key, or the
    ``on_field``) is a changed key of the other side."""
    from pyspark.sql import functions as F

    key, jk = contract.key_name, _join_key(contract, j)
    mine, theirs = _apply(state, latest, contract), _apply(other_state, other_latest, other)
    affected = []
    if latest is not None:
        affected.append(latest.select(key))
    if other_latest is not None:
        changed = other_latest.select(F.col(other.key_name).alias(_KEY)).distinct()
        hit = mine.join(changed, F.col(jk) == F.col(_KEY), "left_semi").select(key)
        affected.append(hit)
    keys = affected[0]
    for more in affected[1:]:
        keys = keys.unionByName(more)
    keys = keys.distinct()
    rows = mine.join(keys, key, "left_semi")
    values = theirs.select(
        F.col(other.key_name).alias(_KEY), *(F.col(f).alias(j.column(f)) for f in j.fields)
    )
    joined = rows.join(values, F.col(jk) == F.col(_KEY), j.how).drop(_KEY)
    joined = joined.withColumn(_PRESENT, F.lit(True))
    result = keys.join(joined, key, "left")
    return result.withColumn(_PRESENT, F.coalesce(F.col(_PRESENT), F.lit(False)))


def _drop_unchanged(
    batch: DataFrame, gold: DataFrame, key: str, spec: TableSpec, contract: Contract
) -> DataFrame:
    """Keep the rows that change the table: new, different, or deleted."""
    from pyspark.sql import functions as F

    values = [c for c in contract.table_columns(spec) if c != key]
    current = gold.select(key, *(F.col(c).alias(f"__old_{c}") for c in values)).withColumn(
        "__stored", F.lit(True)
    )
    both = batch.join(current, key, "left")
    stored = F.col("__stored").isNotNull()
    same = F.lit(True)
    for c in values:
        same = same & F.col(c).eqNullSafe(F.col(f"__old_{c}"))
    unchanged = (F.col(_PRESENT) & stored & same) | (~F.col(_PRESENT) & ~stored)
    return both.filter(~unchanged).select(key, *values, _PRESENT)


# -- stream-stream ------------------------------------------------------------------------------


def _stream_stream(
    store: DeltaStore,
    settings: Settings,
    contract: Contract,
    other: Contract,
    spec: TableSpec,
    out: Outputs,
    upto: int | None,
) -> GoldResult:
    j = spec.join
    assert j is not None
    app, other_app = input_app(contract, spec), stream_app(other)
    path, other_path = input_path(settings, contract, spec), settings.silver_path(other.stream)
    consumed = store.transaction_version(out.gold, app)
    other_consumed = store.transaction_version(out.gold, other_app)
    todo = pending(store, out.gold, app, path, upto)
    other_todo = pending(store, out.gold, other_app, other_path)
    if todo is None and other_todo is None:
        return JoinResult(spec.name, None, other=other_app)
    other_end = other_todo[1] if other_todo else other_consumed
    parts: list[DataFrame] = []
    if todo is not None:  # new events of this side x the other side up to its head
        new = read_input(store, settings, contract, spec, *todo)
        everything = _records_upto(store, other_path, other_end)
        if everything is not None:
            parts.append(window_join(new, everything, contract, other, j))
    if other_todo is not None:  # events of this side consumed before x new events of the other
        old = _records_upto(store, path, consumed)
        if old is not None:
            new_other = read_input(store, settings, other, LATEST, *other_todo)
            parts.append(window_join(old, new_other, contract, other, j))
    schema = store.spark_schema(out.gold)
    rows = None
    for part in parts:
        part = _conform(part, schema)
        rows = part if rows is None else rows.unionByName(part)
    if rows is None:
        rows = store.spark.createDataFrame([], schema)
    rows = rows.cache()
    end = todo[1] if todo else consumed
    txns = _txns((app, end), (other_app, other_end))
    meta = _meta(app, todo, other_app, other_todo)
    n = rows.count()
    result = delta_spark.append(rows, out.gold, txn=txns, metadata=meta, gate=out.gate)
    rows.unpersist()
    return JoinResult(
        spec.name,
        todo,
        n,
        result.committed,
        table_version=result.table_version,
        other=other_app,
        other_versions=other_todo,
    )


def window_join(
    mine: DataFrame, theirs: DataFrame, contract: Contract, other: Contract, j: Join
) -> DataFrame:
    """Pairs of events with equal keys (null keys and tombstones ignored) at most ``within``
    apart in event time, as the join table's columns. Pure but for one small aggregate: the
    other side is first cut to the time span this side's events can reach, which lets the
    Parquet reader skip what lies outside (Kafka's window store keeps no more)."""
    from pyspark.sql import functions as F

    jk = _join_key(contract, j)
    a = mine.filter(F.col(jk).isNotNull() & ~F.col(TOMBSTONE)).withColumn(
        _TIME, _event_time(contract)
    )
    span = a.agg(F.min(F.unix_millis(_TIME)), F.max(F.unix_millis(_TIME))).first()
    if span is None or span[0] is None:
        return a.limit(0)
    lo, hi = span[0] - j.within_ms, span[1] + j.within_ms
    t = _event_time(other)
    b = theirs.filter(
        F.col(other.key_name).isNotNull()
        & ~F.col(TOMBSTONE)
        & (t >= F.lit(_instant(lo)))
        & (t <= F.lit(_instant(hi)))
    ).select(
        F.col(other.key_name).alias(_KEY),
        t.alias("__bt"),
        *(F.col(f).alias(j.column(f)) for f in j.fields),
        *(F.col(c).alias(j.column(c)) for c in ("partition", "offset")),
        t.alias(j.column(EVENT_TIME)),
    )
    close = F.abs(F.unix_millis(_TIME) - F.unix_millis("__bt")) <= j.within_ms
    pairs = a.join(b, (F.col(jk) == F.col(_KEY)) & close)
    return pairs.drop(_KEY, "__bt").withColumn(EVENT_TIME, F.col(_TIME))


def _instant(ms: int) -> datetime:
    """Epoch milliseconds as an aware datetime (a Spark timestamp literal)."""
    from datetime import UTC

    return datetime.fromtimestamp(ms / 1000, tz=UTC)
