"""Gold: a table is an aggregated stream (Kafka Streams' KTable), and its Delta change data feed
is its changelog.

Semantics follow Kafka Streams:

* ``latest`` (a KTable read from a stream): the latest value per key, in offset order within a
  partition; a tombstone (null value) deletes the key; a record with a null key is ignored.
* ``aggregate`` (a grouped aggregation): count/sum/min/max/avg per key, or per value of a
  ``group_by`` field (re-keying); records whose key, value or group is null are ignored. Over
  the ``stream`` every event counts (KGroupedStream); over the stream read as a ``table`` only
  each key's latest value counts, and an update takes the old value back before adding the new
  one (KGroupedTable): key k1 with values 2 then 5 sums to 7 as a stream and to 5 as a table.
  A table source keeps each key's latest value in a state table beside the gold table.

Each micro-batch reads the stream's change feed from the last version consumed, reduces it to one
row per key (pure transforms below), and merges that into the table in one commit that also
records the consumed stream version.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from lakehouse.config import Settings
from lakehouse.contracts import (
    WINDOW_END,
    WINDOW_START,
    Aggregation,
    Catalog,
    Contract,
    Field,
    TableSpec,
    aggregate_type,
)
from lakehouse.objectstore import Location
from lakehouse.storage import DeltaStore, Txn, WriteResult, delta_spark
from lakehouse.streams import TOMBSTONE, key_spark_type, spark_type

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.types import DataType, StructField, StructType

# Arrival order of a stream's records: the stream commit that brought them, then partition and
# offset. It does not depend on how micro-batches were cut, so incremental runs and a full
# refresh see the same order (earliest/latest/collect, windows' stream time).
ARRIVAL = ("_commit_version", "partition", "offset")


def source_app(contract: Contract) -> str:
    """The app id under which a table records the stream version it consumed."""
    return f"silver.{contract.stream}"


def input_app(contract: Contract, spec: TableSpec) -> str:
    """The app id of a table's input: the topic's stream, or the table whose changelog it reads."""
    return f"gold.{spec.changelog}" if spec.changelog else source_app(contract)


@dataclass(frozen=True)
class Outputs:
    """Where one gold table's build writes: the table, its private state (e.g. each key's latest
    value for a table source), and its late-records side table (windowed tables). A full refresh
    builds into a scratch set of these and then folds the result into the real ones."""

    gold: Location
    state: Location
    late: Location


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


# -- pure transforms: stream batch -> one row per key ------------------------------------------


def latest_per_key(events: DataFrame, contract: Contract) -> DataFrame:
    """The last event per key of a batch; tombstones kept (they delete), null keys dropped.

    Within a partition the order is the offset. A key normally lives in one partition (the
    default partitioner hashes the key); if producers placed it in several, the partition whose
    latest event has the later timestamp wins, as Kafka Streams picks the earlier-timestamped
    record first when it interleaves partitions.
    """
    from pyspark.sql import functions as F

    key = contract.key_name
    value_cols = [f.name for f in contract.fields]
    keyed = events.filter(F.col(key).isNotNull())
    # The last offset of each key in each partition, from the narrow columns alone (an
    # aggregation over whole rows sorts every row of the batch), then those records' rows: a
    # key's events in a batch are many, its partitions few.
    last = keyed.groupBy(key, "partition").agg(F.max("offset").alias("offset"))
    rows = keyed.select(key, "partition", "offset", "timestamp", *value_cols, TOMBSTONE)
    per_partition = rows.join(F.broadcast(last), [key, "partition", "offset"], "left_semi")
    row = F.struct(*[F.col(c) for c in [*value_cols, TOMBSTONE]])
    ordered = F.struct(F.col("timestamp"), F.col("partition"), F.col("offset"), row.alias("r"))
    best = per_partition.groupBy(key).agg(F.max(ordered).alias("w"))
    return best.select(key, *[F.col(f"w.r.{c}").alias(c) for c in [*value_cols, TOMBSTONE]])


def _state_columns(a: Aggregation) -> tuple[str, str]:
    """Hidden columns an ``avg`` keeps so that later batches can fold into it."""
    return f"__{a.name}_sum", f"__{a.name}_count"


def _distinct_column(a: Aggregation) -> str:
    """Hidden column of a ``count_distinct``: the distinct values seen so far."""
    return f"__{a.name}_values"


MEMBERS = "__members"  # a table source's group: how many keys are in it now


def arrival_order() -> Column:
    from pyspark.sql import functions as F

    return F.struct(*(F.col(c) for c in ARRIVAL))


def partial_aggregates(spec: TableSpec) -> list[Column]:
    """Spark aggregate expressions of one batch's partial aggregates, named as the table's
    columns (hidden ``__`` state columns included); :func:`merge_rules` folds them into the
    stored ones. earliest/latest/collect follow arrival order (:data:`ARRIVAL`) and ignore nulls,
    as ksqlDB's EARLIEST_BY_OFFSET, LATEST_BY_OFFSET and COLLECT_LIST do."""
    from pyspark.sql import functions as F

    exprs = []
    for a in spec.aggregations:
        value = F.col(a.field or "")
        if a.fn == "count":
            exprs.append(F.count(value if a.field else F.lit(1)).alias(a.name))
        elif a.fn == "avg":
            total, count = _state_columns(a)
            exprs += [
                F.sum(value.cast("double")).alias(total),
                F.count(value).alias(count),
                F.avg(value).alias(a.name),
            ]
        elif a.fn == "count_distinct":
            values = F.array_sort(F.collect_set(value))
            exprs += [values.alias(_distinct_column(a)), F.size(values).alias(a.name)]
        elif a.fn in {"earliest", "latest"}:
            pick = F.min_by if a.fn == "earliest" else F.max_by
            exprs.append(pick(value, F.when(value.isNotNull(), arrival_order())).alias(a.name))
        elif a.fn == "collect":
            pairs = F.array_sort(
                F.collect_list(
                    F.when(
                        value.isNotNull(), F.struct(arrival_order().alias("o"), value.alias("v"))
                    )
                )
            )
            exprs.append(F.transform(pairs, lambda p: p["v"]).alias(a.name))
        else:
            fn = {"sum": F.sum, "min": F.min, "max": F.max}[a.fn]
            exprs.append(fn(value).alias(a.name))
    return exprs


def aggregate_per_key(
    events: DataFrame, contract: Contract, spec: TableSpec, by: Sequence[Column] = ()
) -> DataFrame:
    """Per-group partial aggregates of a stream batch, ignoring null keys, tombstones and null
    groups; ``by`` adds grouping columns (a windowed table's window). ``contract`` is the
    table's input stream (``Contract.input``)."""
    from pyspark.sql import functions as F

    group = spec.group_by or contract.key_name
    valid = events.filter(
        F.col(contract.key_name).isNotNull() & ~F.col(TOMBSTONE) & F.col(group).isNotNull()
    )
    return valid.groupBy(F.col(group), *by).agg(*partial_aggregates(spec))


def table_deltas(
    latest: DataFrame, previous: DataFrame, contract: Contract, spec: TableSpec
) -> DataFrame:
    """What a batch of a *table* changes per group (KGroupedTable): for every key in ``latest``
    (one row per key: the batch's last value, tombstones included) take back the contribution of
    its ``previous`` value (from the state table) and add its new one. ``__members`` counts the
    keys joining (+) and leaving (-) each group; a group left by its last key is deleted, so the
    table equals one computed from the current keys alone. Groups whose change nets to nothing
    are dropped. Pure."""
    from pyspark.sql import functions as F

    key, group = contract.key_name, spec.group_by or contract.key_name
    fields = sorted({a.field for a in spec.aggregations if a.field} | {group} - {key})
    cols = [key, *fields]
    old = previous.join(latest.select(key), key, "left_semi").select(
        *cols, F.lit(-1).alias("_sign")
    )
    new = latest.filter(~F.col(TOMBSTONE)).select(*cols, F.lit(1).alias("_sign"))
    both = old.unionByName(new).filter(F.col(group).isNotNull())
    sign = F.col("_sign")
    exprs = [F.sum(sign).alias(MEMBERS)]
    nonzero = [F.col(MEMBERS) != 0]
    for a in spec.aggregations:
        value = F.col(a.field or "")
        if a.fn == "count":
            counted = F.when(value.isNotNull(), sign).otherwise(0) if a.field else sign
            exprs.append(F.sum(counted).alias(a.name))
            nonzero.append(F.col(a.name) != 0)
        elif a.fn == "sum":
            # with how many non-null values: a sum whose values all left is null, not 0
            _, count = _state_columns(a)
            exprs += [
                F.sum(value * sign).alias(a.name),
                F.sum(F.when(value.isNotNull(), sign).otherwise(0)).alias(count),
            ]
            nonzero += [F.coalesce(F.col(a.name) != 0, F.lit(False)), F.col(count) != 0]
        else:  # avg
            total, count = _state_columns(a)
            exprs += [
                F.sum(value.cast("double") * sign).alias(total),
                F.sum(F.when(value.isNotNull(), sign).otherwise(0)).alias(count),
            ]
            nonzero += [F.col(count) != 0, F.coalesce(F.col(total) != 0, F.lit(False))]
    changed = nonzero[0]
    for cond in nonzero[1:]:
        changed = changed | cond
    return both.groupBy(group).agg(*exprs).filter(changed)


# -- table schemas and merge rules --------------------------------------------------------------


def _agg_type(contract: Contract, a: Aggregation) -> DataType:
    from pyspark.sql import types as T

    if a.fn == "collect":
        return T.ArrayType(spark_type(contract.field(a.field or "")), True)
    return spark_type(Field(a.name, aggregate_type(contract, a)))


def aggregation_fields(contract: Contract, spec: TableSpec) -> list[StructField]:
    """The columns of a table's aggregations, hidden state columns included (``contract`` is the
    table's input stream)."""
    from pyspark.sql import types as T

    fields = []
    for a in spec.aggregations:
        fields.append(T.StructField(a.name, _agg_type(contract, a), True))
        if a.fn == "avg":
            total, count = _state_columns(a)
            fields += [
                T.StructField(total, T.DoubleType(), True),
                T.StructField(count, T.LongType(), True),
            ]
        elif a.fn == "sum" and spec.source == "table":
            fields.append(T.StructField(_state_columns(a)[1], T.LongType(), True))
        elif a.fn == "count_distinct":
            element = spark_type(contract.field(a.field or ""))
            fields.append(T.StructField(_distinct_column(a), T.ArrayType(element, True), True))
    if spec.source == "table":
        fields.append(T.StructField(MEMBERS, T.LongType(), True))
    return fields


def group_field(contract: Contract, spec: TableSpec) -> StructField:
    """The (non-null) key column of an aggregate: the input's key, or the re-keying field."""
    from pyspark.sql.types import StructField

    if spec.group_by:
        return StructField(spec.group_by, spark_type(contract.field(spec.group_by)), False)
    return StructField(contract.key_name, key_spark_type(contract), False)


def table_schema(contract: Contract, spec: TableSpec) -> StructType:
    """The schema of a latest or (windowed) aggregate table; ``contract`` is the table's input
    stream (``Contract.input``)."""
    from pyspark.sql.types import StructField, StructType, TimestampType

    if spec.kind == "latest":
        key = StructField(contract.key_name, key_spark_type(contract), False)
        return StructType(
            [key, *(StructField(f.name, spark_type(f), True) for f in contract.fields)]
        )
    keys = [group_field(contract, spec)]
    if spec.window is not None:
        keys += [
            StructField(WINDOW_START, TimestampType(), False),
            StructField(WINDOW_END, TimestampType(), False),
        ]
    return StructType([*keys, *aggregation_fields(contract, spec)])


def _add(t: str, s: str) -> str:
    return f"CASE WHEN {t} IS NULL THEN {s} WHEN {s} IS NULL THEN {t} ELSE {t} + {s} END"


def _combine(a: Aggregation, table: bool = False) -> dict[str, str]:
    """Spark SQL folding a batch's partial aggregate into the stored one in a MERGE, per column.
    Deltas of a table source may be negative; the same sums apply. A batch always arrives after
    what is stored, so earliest keeps the stored value and latest takes the batch's."""
    t, s = f"t.{a.name}", f"s.{a.name}"
    if a.fn == "sum" and table:  # values can leave: null once no non-null value is left
        _, count = _state_columns(a)
        new_count = _add(f"t.{count}", f"s.{count}")
        return {
            count: new_count,
            a.name: f"CASE WHEN ({new_count}) = 0 THEN NULL ELSE {_add(t, s)} END",
        }
    if a.fn in {"count", "sum"}:
        return {a.name: _add(t, s)}
    if a.fn == "avg":
        total, count = _state_columns(a)
        new_total, new_count = _add(f"t.{total}", f"s.{total}"), _add(f"t.{count}", f"s.{count}")
        return {
            total: new_total,
            count: new_count,
            a.name: f"CASE WHEN ({new_count}) = 0 THEN NULL ELSE ({new_total}) / ({new_count}) END",
        }
    if a.fn == "count_distinct":
        values = _distinct_column(a)
        union = f"array_sort(array_union(t.{values}, s.{values}))"
        return {values: union, a.name: f"cardinality({union})"}
    if a.fn == "earliest":
        return {a.name: f"CASE WHEN {t} IS NULL THEN {s} ELSE {t} END"}
    if a.fn == "latest":
        return {a.name: f"CASE WHEN {s} IS NULL THEN {t} ELSE {s} END"}
    if a.fn == "collect":
        return {
            a.name: f"CASE WHEN {t} IS NULL THEN {s} WHEN {s} IS NULL THEN {t} "
            f"ELSE concat({t}, {s}) END"
        }
    op = "<" if a.fn == "min" else ">"
    return {
        a.name: f"CASE WHEN {t} IS NULL OR ({s} IS NOT NULL AND {s} {op} {t}) THEN {s} ELSE {t} END"
    }


def _insert(a: Aggregation, table: bool = False) -> dict[str, str]:
    if a.fn == "avg":
        total, count = _state_columns(a)
        return {
            total: f"s.{total}",
            count: f"s.{count}",
            a.name: f"CASE WHEN s.{count} = 0 THEN NULL ELSE s.{total} / s.{count} END",
        }
    if a.fn == "count_distinct":
        return {_distinct_column(a): f"s.{_distinct_column(a)}", a.name: f"s.{a.name}"}
    if a.fn == "sum" and table:
        _, count = _state_columns(a)
        return {
            count: f"s.{count}",
            a.name: f"CASE WHEN s.{count} = 0 THEN NULL ELSE s.{a.name} END",
        }
    return {a.name: f"s.{a.name}"}


@dataclass(frozen=True)
class MergeRules:
    """How a batch of partial aggregates (one row per table key) folds into the stored table."""

    on: list[str]
    update: dict[str, str]
    insert: dict[str, str]
    delete_when: str | None = None
    insert_when: str | None = None


def merge_rules(contract: Contract, spec: TableSpec) -> MergeRules:
    """The merge of an aggregate table (``contract`` is the table's input stream). A table
    source deletes a group when its last key leaves it."""
    keys = [group_field(contract, spec).name]
    if spec.window is not None:
        keys += [WINDOW_START, WINDOW_END]
    update: dict[str, str] = {}
    insert: dict[str, str] = {k: f"s.{k}" for k in keys}
    for a in spec.aggregations:
        update.update(_combine(a, spec.source == "table"))
        insert.update(_insert(a, spec.source == "table"))
    if spec.source != "table":
        return MergeRules(keys, update, insert)
    update[MEMBERS] = _add(f"t.{MEMBERS}", f"s.{MEMBERS}")
    insert[MEMBERS] = f"s.{MEMBERS}"
    return MergeRules(
        keys,
        update,
        insert,
        delete_when=f"t.{MEMBERS} + s.{MEMBERS} = 0",
        insert_when=f"s.{MEMBERS} > 0",
    )


@dataclass
class GoldResult:
    table: str
    source_versions: tuple[int, int] | None
    keys_changed: int = 0  # the table's rows the batch inserted, updated or deleted
    committed: bool = False

    def summary(self) -> str:
        if self.source_versions is None:
            return f"gold {self.table}: stream has no new versions"
        lo, hi = self.source_versions
        state = "committed" if self.committed else "already applied (skipped)"
        return f"gold {self.table}: stream versions {lo}..{hi} {state}: {self.keys_changed} keys changed"


LATEST = TableSpec(name="state", kind="latest")


def merge_latest(
    batch: DataFrame, path: Location, contract: Contract, txn: Txn, meta: dict[str, Any]
) -> WriteResult:
    """Upsert one row per key; a tombstone deletes the key."""
    key = contract.key_name
    values = [f.name for f in contract.fields]
    return delta_spark.merge(
        batch,
        path,
        on=[key],
        delete_when=f"s.{TOMBSTONE}",
        update={c: f"s.{c}" for c in values},
        insert={c: f"s.{c}" for c in [key, *values]},
        insert_when=f"NOT s.{TOMBSTONE}",
        txn=txn,
        metadata=meta,
    )


def merge_aggregate(
    batch: DataFrame,
    path: Location,
    source: Contract,
    spec: TableSpec,
    txn: Txn,
    meta: dict[str, Any],
) -> WriteResult:
    """Fold a batch of partial aggregates (or a table source's deltas) into an aggregate table
    by its :func:`merge_rules`."""
    rules = merge_rules(source, spec)
    return delta_spark.merge(
        batch,
        path,
        on=rules.on,
        update=rules.update,
        insert=rules.insert,
        delete_when=rules.delete_when,
        insert_when=rules.insert_when,
        txn=txn,
        metadata=meta,
    )


def source_meta(app: str, start: int, end: int) -> dict[str, Any]:
    """Commit metadata naming the input versions a commit consumed."""
    return {"lakehouse.source": {"table": app, "versions": [start, end]}}


def catch_up_state(
    store: DeltaStore,
    settings: Settings,
    contract: Contract,
    spec: TableSpec,
    out: Outputs,
    upto: int | None,
) -> Location:
    """A table source's state (each key's latest value) must stand where the gold table does.
    The gold commit comes first; if a run died before the state's, fold the missing versions in
    now (the state depends on the stream alone, so this is exact). The caller holds the state's
    :func:`~lakehouse.storage.delta_spark.table_lock`."""
    source, app = contract.input(spec), input_app(contract, spec)
    delta_spark.create_table(store.spark, out.state, table_schema(source, LATEST))
    have = store.transaction_version(out.state, app)
    start = 0 if have is None else have + 1
    if upto is not None and start <= upto:
        batch = latest_per_key(read_input(store, settings, contract, spec, start, upto), source)
        merge_latest(batch, out.state, source, Txn(app, upto), source_meta(app, start, upto))
    return out.state


def pending(
    store: DeltaStore, path: Location, app: str, source: Location, upto: int | None = None
) -> tuple[int, int] | None:
    """The input versions a table has yet to consume (``start``, ``end``), or None when it is
    up to date. ``upto`` caps the end (a reprocess rebuilding the table as of that version)."""
    head = store.version(source)
    if upto is not None:
        head = upto if head is None else min(head, upto)
    consumed = store.transaction_version(path, app)
    start = 0 if consumed is None else consumed + 1
    if head is None or start > head:
        return None
    return start, head


def build_table(
    spark: SparkSession,
    settings: Settings,
    contract: Contract,
    spec: TableSpec,
    catalog: Catalog | None = None,
    *,
    out: Outputs | None = None,
    upto: int | None = None,
) -> GoldResult:
    """Fold the input's new versions (up to ``upto``, default all) into one gold table: one
    micro-batch, one commit. ``out`` redirects the writes (a full refresh builds into scratch
    tables); ``catalog`` resolves the other side of a join."""
    out = out or outputs(settings, spec)
    if spec.join is not None:
        from lakehouse import joins

        return joins.build_join(
            spark, settings, catalog or Catalog.of([contract]), contract, spec, out, upto
        )
    if spec.window is not None:
        from lakehouse import windows

        return windows.build_windowed(spark, settings, contract, spec, out, upto)
    # One committing driver per table: the gold table's lock, then its state's.
    with delta_spark.table_lock(out.gold), delta_spark.table_lock(out.state):
        return _build_table(DeltaStore(spark), settings, contract, spec, out, upto)


def _build_table(
    store: DeltaStore,
    settings: Settings,
    contract: Contract,
    spec: TableSpec,
    out: Outputs,
    upto: int | None,
) -> GoldResult:
    source, app = contract.input(spec), input_app(contract, spec)
    delta_spark.create_table(store.spark, out.gold, table_schema(source, spec))
    consumed = store.transaction_version(out.gold, app)
    if spec.source == "table":
        catch_up_state(store, settings, contract, spec, out, consumed)
    todo = pending(store, out.gold, app, input_path(settings, contract, spec), upto)
    if todo is None:
        return GoldResult(spec.name, None)
    start, end = todo
    txn, meta = Txn(app, end), source_meta(app, start, end)
    events = read_input(store, settings, contract, spec, start, end)
    if spec.kind == "latest":
        batch = latest_per_key(events, source)
        result = merge_latest(batch, out.gold, source, txn, meta)
    elif spec.source == "table":
        # The keys' latest values feed both the deltas and the state: computed once.
        latest = latest_per_key(events, source).cache()
        try:
            batch = table_deltas(latest, store.read(out.state), source, spec)
            result = merge_aggregate(batch, out.gold, source, spec, txn, meta)
            merge_latest(latest, out.state, source, txn, meta)
        finally:
            latest.unpersist()
    else:
        batch = aggregate_per_key(events, source, spec)
        result = merge_aggregate(batch, out.gold, source, spec, txn, meta)
    return GoldResult(spec.name, (start, end), result.source_rows or 0, result.committed)


def build(
    spark: SparkSession, settings: Settings, contract: Contract, catalog: Catalog | None = None
) -> list[GoldResult]:
    """Every table of a contract, in declaration order (a changelog source comes first)."""
    return [build_table(spark, settings, contract, spec, catalog) for spec in contract.tables]
