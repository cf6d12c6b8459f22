"""The aggregations of ``aggregate`` and ``windowed`` tables: pure transforms from a batch of
events (or of a table's changes) to partial aggregates per group, and the MERGE rules that fold
them into the stored table with the consumed version.

Semantics follow Kafka Streams: count, sum, min, max, avg, count_distinct, earliest, latest and
collect per key, or per value of a ``group_by`` field (re-keying); records whose key, value or
group is null are ignored. Over the stream every event counts (KGroupedStream); over the stream
read as a table only each key's latest value counts, and an update takes the old value back
before adding the new one (KGroupedTable).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from lakehouse.contracts.fields import Field
from lakehouse.contracts.model import (
    WINDOW_END,
    WINDOW_START,
    Aggregation,
    Contract,
    TableSpec,
    aggregate_field,
)
from lakehouse.runtime.objectstore import Location
from lakehouse.storage import Txn, WriteResult, delta_spark
from lakehouse.storage.gates import PublishGate
from lakehouse.streams.schema import TOMBSTONE, key_spark_type, spark_type
from lakehouse.tables.common import arrival_order

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame
    from pyspark.sql.types import DataType, StructField, StructType


def _state_columns(a: Aggregation) -> tuple[str, str]:
    """Hidden columns an ``avg`` keeps so that later batches can fold into it."""
    return f"__{a.name}_sum", f"__{a.name}_count"


def _distinct_column(a: Aggregation) -> str:
    """Hidden column of a ``count_distinct``: the distinct values seen so far."""
    return f"__{a.name}_values"


MEMBERS = "__members"  # a group of an input read as a table: how many keys are in it now


def _running_sum(contract: Contract, a: Aggregation) -> Field:
    """The hidden running sum of an ``avg``: a decimal's exact sum, else a double."""
    f = contract.field(a.field or "")
    if f.type == "decimal":
        return aggregate_field(contract, Aggregation(a.name, "sum", a.field))
    return Field(a.name, "double")


def _summand(contract: Contract, a: Aggregation) -> Column:
    """An ``avg``'s field as its running sum adds it up."""
    from pyspark.sql import functions as F

    value = F.col(a.field or "")
    return value if contract.field(a.field or "").type == "decimal" else value.cast("double")


def partial_aggregates(contract: Contract, spec: TableSpec) -> list[Column]:
    """Spark aggregate expressions of one batch's partial aggregates, named as the table's
    columns (hidden ``__`` state columns included); :func:`merge_rules` folds them into the
    stored ones. earliest/latest/collect follow arrival order (:data:`ARRIVAL`) and ignore nulls,
    as ksqlDB's EARLIEST_BY_OFFSET, LATEST_BY_OFFSET and COLLECT_LIST do. ``contract`` is the
    table's input stream."""
    from pyspark.sql import functions as F

    exprs = []
    for a in spec.aggregations:
        value = F.col(a.field or "")
        if a.fn == "count":
            exprs.append(F.count(value if a.field else F.lit(1)).alias(a.name))
        elif a.fn == "avg":
            total, count = _state_columns(a)
            exprs += [
                F.sum(_summand(contract, a)).alias(total),
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
    """Per-group partial aggregates of a stream batch, ignoring tombstones and null groups
    (:func:`taken`); ``by`` adds grouping columns (a windowed table's window). ``contract`` is the
    table's input stream (``Contract.input``)."""
    from pyspark.sql import functions as F

    group = spec.group_by or contract.key_name
    return (
        events.filter(taken(contract, spec))
        .groupBy(F.col(group), *by)
        .agg(*partial_aggregates(contract, spec))
    )


def taken(contract: Contract, spec: TableSpec) -> Column:
    """The records an aggregation of a stream takes: not a tombstone, and with a group (the
    record key, or the ``group_by`` field's value). A re-keyed aggregation takes a record whose
    own key is null, as Kafka Streams' ``groupBy`` does: only the new key matters."""
    from pyspark.sql import functions as F

    return ~F.col(TOMBSTONE) & F.col(spec.group_by or contract.key_name).isNotNull()


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
            typed = spark_type(aggregate_field(contract, a))  # a decimal's, not its product's
            exprs += [
                F.sum(value * sign).cast(typed).alias(a.name),
                F.sum(F.when(value.isNotNull(), sign).otherwise(0)).alias(count),
            ]
            nonzero += [F.coalesce(F.col(a.name) != 0, F.lit(False)), F.col(count) != 0]
        else:  # avg
            total, count = _state_columns(a)
            exprs += [
                F.sum(_summand(contract, a) * sign)
                .cast(spark_type(_running_sum(contract, a)))
                .alias(total),
                F.sum(F.when(value.isNotNull(), sign).otherwise(0)).alias(count),
            ]
            nonzero += [F.col(count) != 0, F.coalesce(F.col(total) != 0, F.lit(False))]
    changed = nonzero[0]
    for cond in nonzero[1:]:
        changed = changed | cond
    return both.groupBy(group).agg(*exprs).filter(changed)


def _agg_type(contract: Contract, a: Aggregation) -> DataType:
    from pyspark.sql import types as T

    if a.fn == "collect":
        return T.ArrayType(spark_type(contract.field(a.field or "")), True)
    return spark_type(aggregate_field(contract, a))


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
                T.StructField(total, spark_type(_running_sum(contract, a)), True),
                T.StructField(count, T.LongType(), True),
            ]
        elif a.fn == "sum" and spec.read_as == "table":
            fields.append(T.StructField(_state_columns(a)[1], T.LongType(), True))
        elif a.fn == "count_distinct":
            element = spark_type(contract.field(a.field or ""))
            fields.append(T.StructField(_distinct_column(a), T.ArrayType(element, True), True))
    if spec.read_as == "table":
        fields.append(T.StructField(MEMBERS, T.LongType(), True))
    return fields


def group_field(contract: Contract, spec: TableSpec) -> StructField:
    """The (non-null) key column of an aggregate: the input's key, or the re-keying field."""
    from pyspark.sql.types import StructField

    if spec.group_by:
        return StructField(spec.group_by, spark_type(contract.field(spec.group_by)), False)
    return StructField(contract.key_name, key_spark_type(contract), False)


def table_schema(contract: Contract, spec: TableSpec, *, windowed: bool = False) -> StructType:
    """The schema of an aggregate table, keyed by its group and (``windowed``) its window;
    ``contract`` is the table's input stream (``Contract.input``)."""
    from pyspark.sql.types import StructField, StructType, TimestampType

    keys = [group_field(contract, spec)]
    if windowed:
        keys += [
            StructField(WINDOW_START, TimestampType(), False),
            StructField(WINDOW_END, TimestampType(), False),
        ]
    return StructType([*keys, *aggregation_fields(contract, spec)])


def _add(t: str, s: str) -> str:
    return f"CASE WHEN {t} IS NULL THEN {s} WHEN {s} IS NULL THEN {t} ELSE {t} + {s} END"


def _combine(a: Aggregation, table: bool = False) -> dict[str, str]:
    """Spark SQL folding a batch's partial aggregate into the stored one in a MERGE, per column.
    Deltas of an input read as a table may be negative; the same sums apply. A batch always arrives after
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


def merge_rules(contract: Contract, spec: TableSpec, *, windowed: bool = False) -> MergeRules:
    """The merge of an aggregate table, keyed by its group and (``windowed``) its window
    (``contract`` is the table's input stream). An aggregate of an input read as a table
    deletes a group when its last key leaves it."""
    keys = [group_field(contract, spec).name]
    if windowed:
        keys += [WINDOW_START, WINDOW_END]
    update: dict[str, str] = {}
    insert: dict[str, str] = {k: f"s.{k}" for k in keys}
    for a in spec.aggregations:
        update.update(_combine(a, spec.read_as == "table"))
        insert.update(_insert(a, spec.read_as == "table"))
    update = _decimals_as_stored(contract, spec, update, windowed)
    insert = _decimals_as_stored(contract, spec, insert, windowed)
    if spec.read_as != "table":
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


def _decimals_as_stored(
    contract: Contract, spec: TableSpec, columns: dict[str, str], windowed: bool
) -> dict[str, str]:
    """Each decimal column's expression cast to the column's type: Spark widens arithmetic on
    decimals (a decimal(22,2) plus a decimal(22,2) is a decimal(23,2), a division keeps more
    digits after the point than an average's column), and the table keeps its types. An
    average rounds half up to its scale there, as Spark's avg does."""
    from pyspark.sql.types import DecimalType

    types = {f.name: f.dataType for f in table_schema(contract, spec, windowed=windowed).fields}
    return {
        name: f"CAST(({sql}) AS {kind.simpleString()})"
        if isinstance(kind := types.get(name), DecimalType)
        else sql
        for name, sql in columns.items()
    }


def merge_aggregate(
    batch: DataFrame,
    path: Location,
    stream: Contract,
    spec: TableSpec,
    txn: Txn,
    meta: dict[str, Any],
    gate: PublishGate | None = None,
) -> WriteResult:
    """Fold a batch of partial aggregates (or the deltas of an input read as a table) into an aggregate table
    by its :func:`merge_rules`."""
    rules = merge_rules(stream, spec)
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
        gate=gate,
    )
