"""Gold's Arrow path: a micro-batch of a stream folded into a table in the driver, without Spark.

A gold micro-batch is mostly fixed cost when Spark does it: a scan of the change feed's files,
a shuffle for the aggregation, and the partial aggregates collected back to the driver for the
delta-rs merge. For the common tables (the latest value per key, and grouped count, sum, min,
max, avg, earliest and latest over the stream) polars computes the same partial aggregates from
the same files in a fraction of that, and the merge that follows is the same one.

The rules are those of :mod:`lakehouse.tables`, written again over polars frames:

* records with a null key are ignored; an aggregation also ignores tombstones and null groups;
* the latest value per key is the last offset of each key's partition, and across partitions
  the one with the later (timestamp, partition, offset);
* earliest/latest follow arrival order (:data:`lakehouse.tables.ARRIVAL`) and skip nulls;
* a sum of only nulls is null; an average is the sum of the values as doubles over their count.

Where the two could disagree the batch goes to Spark instead (:class:`Unclean`): a NaN in a
field whose min or max is taken (Spark ranks NaN above every number), or a sum of longs that
might overflow (Spark fails the job). Tests build every supported table both ways and compare.

Imports neither deltalake nor pyspark: it is given the files to read and returns Arrow.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.parquet as pq

if TYPE_CHECKING:
    import polars as pl

    from lakehouse.contracts import Contract, TableSpec

TOMBSTONE = "tombstone"
COMMIT_VERSION = "_commit_version"
ARRIVAL = [COMMIT_VERSION, "partition", "offset"]
SUPPORTED = frozenset({"count", "sum", "min", "max", "avg", "earliest", "latest"})


class Unclean(Exception):
    """The batch holds values on which this path and Spark's could disagree."""


def why_not(spec: TableSpec) -> str | None:
    """Why a table's batches cannot take this path (None: they can)."""
    if spec.join is not None or spec.window is not None:
        return "joins and windows"
    if spec.changelog is not None:
        return "a changelog source"
    if spec.kind == "latest":
        return None
    if spec.source == "table":
        return "a table source"
    other = sorted({a.fn for a in spec.aggregations} - SUPPORTED)
    if other:
        return f"{', '.join(other)} aggregations"
    return None


def input_columns(source: Contract, spec: TableSpec) -> list[str]:
    """The stream's columns a table's batch reads (the arrival columns included)."""
    key = source.key_name
    if spec.kind == "latest":
        values = [f.name for f in source.fields]
        return [key, *values, TOMBSTONE, "partition", "offset", "timestamp"]
    used = {a.field for a in spec.aggregations if a.field}
    if spec.group_by:
        used.add(spec.group_by)
    fields = [f.name for f in source.fields if f.name in used and f.name != key]
    arrival = (
        ["partition", "offset"]
        if any(a.fn in {"earliest", "latest"} for a in spec.aggregations)
        else []
    )
    return [key, *fields, TOMBSTONE, *arrival]


def read_files(
    files: Sequence[tuple[str, int]], schema: pa.Schema, columns: Sequence[str]
) -> pl.DataFrame:
    """The rows of the stream's data ``files`` (path, commit version), ``columns`` of them, typed
    by the stream's ``schema``, with the commit version as ``_commit_version``. A column a file
    lacks (written before the contract added it) is null, as Spark reads it."""

    wanted = pa.schema([schema.field(c) for c in columns])
    parts = []
    for path, version in files:
        have = set(pq.read_schema(path).names)
        table = pq.read_table(path, columns=[c for c in columns if c in have])
        for f in wanted:
            if f.name not in have:
                table = table.append_column(f.name, pa.nulls(table.num_rows, f.type))
        table = table.select(list(columns)).cast(wanted)
        parts.append(
            table.append_column(COMMIT_VERSION, pa.array([version] * table.num_rows, pa.int64()))
        )
    if not parts:
        empty = pa.schema([*wanted, pa.field(COMMIT_VERSION, pa.int64())]).empty_table()
        return _frame(empty)
    return _frame(pa.concat_tables(parts))


def _frame(table: pa.Table) -> pl.DataFrame:
    import polars as pl

    frame = pl.from_arrow(table)
    assert isinstance(frame, pl.DataFrame)
    return frame


def latest_rows(events: pl.DataFrame, source: Contract) -> pl.DataFrame:
    """One row per non-null key: its value fields and tombstone from its latest record (see
    :func:`lakehouse.tables.latest_per_key`)."""
    import polars as pl

    key = source.key_name
    keep = [key, *(f.name for f in source.fields), TOMBSTONE]
    keyed = events.filter(pl.col(key).is_not_null())
    # Each key's last record per partition, then the latest of those by (timestamp,
    # partition, offset): a group keeps its rows in the frame's order, so `last` after a sort
    # takes the greatest. Nulls sort first, as they compare lowest in Spark's max of a struct.
    per_partition = keyed.sort("offset").group_by([key, "partition"], maintain_order=True).last()
    ordered = per_partition.sort(["timestamp", "partition", "offset"])
    return ordered.group_by(key, maintain_order=True).last().select(keep)


def partial_aggregates(events: pl.DataFrame, source: Contract, spec: TableSpec) -> pl.DataFrame:
    """Per group, a batch's partial aggregates named as the table's columns (an average's hidden
    sum and count included): what :func:`lakehouse.tables.aggregate_per_key` gives. Raises
    :class:`Unclean` for values on which Spark's result could differ."""
    import polars as pl

    key = source.key_name
    group = spec.group_by or key
    valid = events.filter(
        pl.col(key).is_not_null() & ~pl.col(TOMBSTONE) & pl.col(group).is_not_null()
    )
    _refuse_disagreements(valid, source, spec)
    if any(a.fn in {"earliest", "latest"} for a in spec.aggregations):
        valid = valid.sort(ARRIVAL)
    exprs: list[pl.Expr] = []
    for a in spec.aggregations:
        value = pl.col(a.field or "")
        present = value.count()
        if a.fn == "count":
            exprs.append((present if a.field else pl.len()).cast(pl.Int64).alias(a.name))
        elif a.fn == "sum":
            kind = pl.Float64 if source.field(a.field or "").type == "double" else pl.Int64
            total = value.cast(kind).sum()
            exprs.append(pl.when(present > 0).then(total).alias(a.name))
        elif a.fn == "avg":
            from lakehouse.tables import _state_columns

            total_name, count_name = _state_columns(a)
            total = pl.when(present > 0).then(value.cast(pl.Float64).sum())
            exprs += [
                total.alias(total_name),
                present.cast(pl.Int64).alias(count_name),
                (total / present).alias(a.name),
            ]
        elif a.fn in {"min", "max"}:
            exprs.append((value.min() if a.fn == "min" else value.max()).alias(a.name))
        else:  # earliest / latest, in arrival order (the frame is sorted by it)
            kept = value.drop_nulls()
            exprs.append((kept.first() if a.fn == "earliest" else kept.last()).alias(a.name))
    return valid.group_by(group, maintain_order=True).agg(exprs)


def _refuse_disagreements(valid: pl.DataFrame, source: Contract, spec: TableSpec) -> None:
    import polars as pl

    for a in spec.aggregations:
        if not a.field:
            continue
        kind = source.field(a.field).type
        column = valid.get_column(a.field)
        if a.fn in {"min", "max"} and kind == "double" and column.is_nan().any():
            raise Unclean(f"NaN in {a.field!r}, whose {a.fn} is taken")
        if a.fn == "sum" and kind in {"long", "int"}:
            # Spark fails a sum that overflows a long; polars would wrap. No sum can overflow
            # while the largest magnitude times the number of values stays below 2**62 (in
            # doubles: abs() of the smallest long overflows as a long).
            biggest = column.cast(pl.Float64).abs().max()
            if biggest is not None and float(biggest) * column.count() >= 2.0**62:  # type: ignore[arg-type]
                raise Unclean(f"the sum of {a.field!r} might overflow")


def to_arrow(frame: pl.DataFrame, schema: pa.Schema) -> pa.Table:
    """A polars result as the Arrow table Spark would have collected (``schema``'s types)."""
    import polars as pl

    table = frame.to_arrow(compat_level=pl.CompatLevel.oldest())
    nullable = pa.schema([f.with_nullable(True) for f in schema])
    return table.select(nullable.names).cast(nullable)
