"""Gold: a table is an aggregated stream (Kafka Streams' KTable), and its Delta change data feed
is its changelog.

Semantics follow Kafka Streams:

* ``latest`` (a KTable read from a stream): the latest value per key, in offset order within a
  partition; a tombstone (null value) deletes the key; a record with a null key is ignored.
* ``aggregate`` (a grouped stream aggregation): count/sum/min/max per key; records whose key or
  value is null are ignored.

Each micro-batch reads the stream's change feed from the last version consumed, reduces it to one
row per key (pure transforms below), and merges that into the table in one commit that also
records the consumed stream version.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from lakehouse.config import Settings
from lakehouse.contracts import Aggregation, Contract, TableSpec
from lakehouse.storage import CDF_PROPERTIES, DeltaStore, Txn
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


def aggregate_per_key(events: DataFrame, contract: Contract, spec: TableSpec) -> DataFrame:
    """Per-key partial aggregates of a batch, ignoring null keys and null values (tombstones)."""
    from pyspark.sql import functions as F

    key = contract.key_name
    valid = events.filter(F.col(key).isNotNull() & ~F.col(TOMBSTONE))
    exprs = []
    for a in spec.aggregations:
        if a.fn == "count":
            exprs.append(F.count(F.col(a.field) if a.field else F.lit(1)).alias(a.name))
        else:
            fn = {"sum": F.sum, "min": F.min, "max": F.max}[a.fn]
            exprs.append(fn(F.col(a.field or "")).alias(a.name))
    return valid.groupBy(key).agg(*exprs)


# -- table schemas and merge rules --------------------------------------------------------------


def _agg_type(contract: Contract, a: Aggregation) -> DataType:
    from pyspark.sql import types as T

    if a.fn == "count":
        return T.LongType()
    f = contract.field(a.field or "")
    if a.fn == "sum":
        return T.DoubleType() if f.type == "double" else T.LongType()
    return spark_type(f)


def table_schema(contract: Contract, spec: TableSpec) -> StructType:
    from pyspark.sql.types import StructField, StructType

    key = StructField(contract.key_name, key_spark_type(contract), False)
    if spec.kind == "latest":
        return StructType(
            [key, *(StructField(f.name, spark_type(f), True) for f in contract.fields)]
        )
    return StructType(
        [key, *(StructField(a.name, _agg_type(contract, a), True) for a in spec.aggregations)]
    )


def _combine(a: Aggregation) -> str:
    """SQL (delta-rs merge) that folds a batch's partial aggregate into the stored one."""
    t, s = f"t.{a.name}", f"s.{a.name}"
    if a.fn in {"count", "sum"}:
        return f"CASE WHEN {t} IS NULL THEN {s} WHEN {s} IS NULL THEN {t} ELSE {t} + {s} END"
    op = "<" if a.fn == "min" else ">"
    return f"CASE WHEN {t} IS NULL OR ({s} IS NOT NULL AND {s} {op} {t}) THEN {s} ELSE {t} END"


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


def build_table(
    spark: SparkSession, settings: Settings, contract: Contract, spec: TableSpec
) -> GoldResult:
    """Fold the stream's new versions into one gold table (one micro-batch, one commit)."""
    from pyspark.sql import functions as F

    store = DeltaStore(spark)
    silver_path = settings.silver_path(contract.stream)
    path = settings.gold_path(spec.name)
    head = store.version(silver_path)
    store.create(path, table_schema(contract, spec), properties=CDF_PROPERTIES)
    consumed = store.transaction_version(path, source_app(contract))
    start = 0 if consumed is None else consumed + 1
    if head is None or start > head:
        return GoldResult(spec.name, None)

    events = store.changes(silver_path, start, head).filter(F.col("_change_type") == "insert")
    key = contract.key_name
    txn = Txn(source_app(contract), head)
    meta = {"lakehouse.source": {"table": f"silver.{contract.stream}", "versions": [start, head]}}
    if spec.kind == "latest":
        batch = latest_per_key(events, contract).cache()
        values = [f.name for f in contract.fields]
        result = store.merge(
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
    else:
        batch = aggregate_per_key(events, contract, spec).cache()
        result = store.merge(
            batch,
            path,
            on=[key],
            update={a.name: _combine(a) for a in spec.aggregations},
            insert={c: f"s.{c}" for c in [key, *(a.name for a in spec.aggregations)]},
            txn=txn,
            metadata=meta,
        )
    changed = batch.count()
    batch.unpersist()
    return GoldResult(spec.name, (start, head), changed, result.committed)


def build(spark: SparkSession, settings: Settings, contract: Contract) -> list[GoldResult]:
    return [build_table(spark, settings, contract, spec) for spec in contract.tables]
