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

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lakehouse.config import Settings
from lakehouse.contracts import Aggregation, Contract, TableSpec
from lakehouse.storage import CDF_PROPERTIES, DeltaStore, Txn, WriteResult
from lakehouse.streams import TOMBSTONE, key_spark_type, spark_type

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import DataType, StructType


def source_app(contract: Contract) -> str:
    return f"silver.{contract.stream}"


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
    row = F.struct(*[F.col(c) for c in [*value_cols, TOMBSTONE, "timestamp", "partition"]])
    per_partition = keyed.groupBy(key, "partition").agg(F.max_by(row, F.col("offset")).alias("r"))
    ordered = F.struct(F.col("r.timestamp"), F.col("r.partition"), F.col("r"))
    best = per_partition.groupBy(key).agg(F.max(ordered).alias("w"))
    return best.select(key, *[F.col(f"w.r.{c}").alias(c) for c in [*value_cols, TOMBSTONE]])


def _state_columns(a: Aggregation) -> tuple[str, str]:
    """Hidden columns an ``avg`` keeps so that later batches can fold into it."""
    return f"__{a.name}_sum", f"__{a.name}_count"


def aggregate_per_key(events: DataFrame, contract: Contract, spec: TableSpec) -> DataFrame:
    """Per-group partial aggregates of a stream batch, ignoring null keys, tombstones and null
    groups. ``avg`` comes with its sum and count, which the merge folds."""
    from pyspark.sql import functions as F

    group = contract.table_key(spec)
    valid = events.filter(
        F.col(contract.key_name).isNotNull() & ~F.col(TOMBSTONE) & F.col(group).isNotNull()
    )
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
        else:
            fn = {"sum": F.sum, "min": F.min, "max": F.max}[a.fn]
            exprs.append(fn(value).alias(a.name))
    return valid.groupBy(group).agg(*exprs)


def table_deltas(
    latest: DataFrame, previous: DataFrame, contract: Contract, spec: TableSpec
) -> DataFrame:
    """What a batch of a *table* changes per group (KGroupedTable): for every key in ``latest``
    (one row per key: the batch's last value, tombstones included) take back the contribution of
    its ``previous`` value (from the state table) and add its new one. Groups whose change nets
    to nothing are dropped. Pure."""
    from pyspark.sql import functions as F

    key, group = contract.key_name, contract.table_key(spec)
    fields = sorted({a.field for a in spec.aggregations if a.field} | {group} - {key})
    cols = [key, *fields]
    old = previous.join(latest.select(key), key, "left_semi").select(
        *cols, F.lit(-1).alias("_sign")
    )
    new = latest.filter(~F.col(TOMBSTONE)).select(*cols, F.lit(1).alias("_sign"))
    both = old.unionByName(new).filter(F.col(group).isNotNull())
    sign = F.col("_sign")
    exprs = []
    nonzero = []
    for a in spec.aggregations:
        value = F.col(a.field or "")
        if a.fn == "count":
            counted = F.when(value.isNotNull(), sign).otherwise(0) if a.field else sign
            exprs.append(F.sum(counted).alias(a.name))
            nonzero.append(F.col(a.name) != 0)
        elif a.fn == "sum":
            exprs.append(F.sum(value * sign).alias(a.name))
            nonzero.append(F.coalesce(F.col(a.name) != 0, F.lit(False)))
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

    if a.fn == "count":
        return T.LongType()
    if a.fn == "avg":
        return T.DoubleType()
    f = contract.field(a.field or "")
    if a.fn == "sum":
        return T.DoubleType() if f.type == "double" else T.LongType()
    return spark_type(f)


def table_schema(contract: Contract, spec: TableSpec) -> StructType:
    from pyspark.sql.types import DoubleType, LongType, StructField, StructType

    if spec.kind == "latest":
        key = StructField(contract.key_name, key_spark_type(contract), False)
        return StructType(
            [key, *(StructField(f.name, spark_type(f), True) for f in contract.fields)]
        )
    if spec.group_by:
        key = StructField(spec.group_by, spark_type(contract.field(spec.group_by)), False)
    else:
        key = StructField(contract.key_name, key_spark_type(contract), False)
    fields = [key]
    for a in spec.aggregations:
        fields.append(StructField(a.name, _agg_type(contract, a), True))
        if a.fn == "avg":
            total, count = _state_columns(a)
            fields += [StructField(total, DoubleType(), True), StructField(count, LongType(), True)]
    return StructType(fields)


def _add(t: str, s: str) -> str:
    return f"CASE WHEN {t} IS NULL THEN {s} WHEN {s} IS NULL THEN {t} ELSE {t} + {s} END"


def _combine(a: Aggregation) -> dict[str, str]:
    """SQL (delta-rs merge) folding a batch's partial aggregate into the stored one, per column.
    Deltas of a table source may be negative; the same sums apply."""
    t, s = f"t.{a.name}", f"s.{a.name}"
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
    op = "<" if a.fn == "min" else ">"
    return {
        a.name: f"CASE WHEN {t} IS NULL OR ({s} IS NOT NULL AND {s} {op} {t}) THEN {s} ELSE {t} END"
    }


def _insert(a: Aggregation) -> dict[str, str]:
    if a.fn == "avg":
        total, count = _state_columns(a)
        return {
            total: f"s.{total}",
            count: f"s.{count}",
            a.name: f"CASE WHEN s.{count} = 0 THEN NULL ELSE s.{total} / s.{count} END",
        }
    return {a.name: f"s.{a.name}"}


@dataclass
class GoldResult:
    table: str
    source_versions: tuple[int, int] | None
    keys_changed: int = 0
    committed: bool = False

    def summary(self) -> str:
        if self.source_versions is None:
            return f"gold {self.table}: stream has no new versions"
        lo, hi = self.source_versions
        state = "committed" if self.committed else "already applied (skipped)"
        return f"gold {self.table}: stream versions {lo}..{hi} {state}: {self.keys_changed} keys changed"


LATEST = TableSpec(name="state", kind="latest")


def _merge_latest(
    store: DeltaStore,
    batch: DataFrame,
    path: Path,
    contract: Contract,
    txn: Txn,
    meta: dict[str, Any],
) -> WriteResult:
    """Upsert one row per key; a tombstone deletes the key."""
    key = contract.key_name
    values = [f.name for f in contract.fields]
    return store.merge(
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


def _source_meta(contract: Contract, start: int, end: int) -> dict[str, Any]:
    return {"lakehouse.source": {"table": f"silver.{contract.stream}", "versions": [start, end]}}


def _inserts(store: DeltaStore, silver: Path, start: int, end: int) -> DataFrame:
    from pyspark.sql import functions as F

    return store.changes(silver, start, end).filter(F.col("_change_type") == "insert")


def _catch_up_state(
    store: DeltaStore, settings: Settings, contract: Contract, spec: TableSpec, upto: int | None
) -> Path:
    """A table source's state (each key's latest value) must stand where the gold table does.
    The gold commit comes first; if a run died before the state's, fold the missing versions in
    now (the state depends on the stream alone, so this is exact)."""
    state = settings.state_path(spec.name)
    store.create(state, table_schema(contract, LATEST), properties=CDF_PROPERTIES)
    have = store.transaction_version(state, source_app(contract))
    start = 0 if have is None else have + 1
    if upto is not None and start <= upto:
        silver = settings.silver_path(contract.stream)
        batch = latest_per_key(_inserts(store, silver, start, upto), contract)
        txn = Txn(source_app(contract), upto)
        _merge_latest(store, batch, state, contract, txn, _source_meta(contract, start, upto))
    return state


def build_table(
    spark: SparkSession, settings: Settings, contract: Contract, spec: TableSpec
) -> GoldResult:
    """Fold the stream's new versions into one gold table (one micro-batch, one commit)."""
    store = DeltaStore(spark)
    silver_path = settings.silver_path(contract.stream)
    path = settings.gold_path(spec.name)
    head = store.version(silver_path)
    store.create(path, table_schema(contract, spec), properties=CDF_PROPERTIES)
    consumed = store.transaction_version(path, source_app(contract))
    state = None
    if spec.source == "table":
        state = _catch_up_state(store, settings, contract, spec, consumed)
    start = 0 if consumed is None else consumed + 1
    if head is None or start > head:
        return GoldResult(spec.name, None)

    events = _inserts(store, silver_path, start, head)
    txn = Txn(source_app(contract), head)
    meta = _source_meta(contract, start, head)
    if spec.kind == "latest":
        batch = latest_per_key(events, contract).cache()
        result = _merge_latest(store, batch, path, contract, txn, meta)
    else:
        group = contract.table_key(spec)
        latest = None
        if state is not None:
            latest = latest_per_key(events, contract).cache()
            batch = table_deltas(latest, store.read(state), contract, spec).cache()
        else:
            batch = aggregate_per_key(events, contract, spec).cache()
        update: dict[str, str] = {}
        insert: dict[str, str] = {group: f"s.{group}"}
        for a in spec.aggregations:
            update.update(_combine(a))
            insert.update(_insert(a))
        result = store.merge(
            batch, path, on=[group], update=update, insert=insert, txn=txn, metadata=meta
        )
        if state is not None and latest is not None:
            _merge_latest(store, latest, state, contract, txn, meta)
            latest.unpersist()
    changed = batch.count()
    batch.unpersist()
    return GoldResult(spec.name, (start, head), changed, result.committed)


def build(spark: SparkSession, settings: Settings, contract: Contract) -> list[GoldResult]:
    return [build_table(spark, settings, contract, spec) for spec in contract.tables]
