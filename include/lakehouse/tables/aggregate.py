"""``aggregate`` tables: a stream aggregated per key (Kafka Streams' grouped aggregation).

count, sum, min, max, avg, count_distinct, earliest, latest and collect per key, or per value of a
``group_by`` field (re-keying), ignoring records whose key, value or group is null
(:mod:`lakehouse.tables.aggregations`). Over the ``stream`` every event counts (KGroupedStream):
a batch's partial aggregates (pure) fold into the stored ones in one MERGE. Over the stream read
as a ``table`` only each key's latest value counts (KGroupedTable): the table keeps each key's
latest value in a state table beside it, and a batch's change per group takes back each changed
key's previous value and adds its new one (:func:`~lakehouse.tables.aggregations.table_deltas`,
pure); the gold commit comes first, then the state's, each recording the same stream version, and
a run that died between the two folds the missing versions into the state first
(:func:`~lakehouse.tables.keyed.catch_up_state`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from lakehouse.contracts.model import Contract, TableSpec
from lakehouse.runtime.objectstore import Location
from lakehouse.storage import Txn, WriteResult, delta_spark
from lakehouse.storage.gates import PublishGate
from lakehouse.tables.aggregations import aggregate_per_key, merge_rules, table_deltas, table_schema
from lakehouse.tables.common import GoldResult, Outputs, input_meta, read_input
from lakehouse.tables.keyed import catch_up_state, latest_per_key, merge_latest
from lakehouse.tables.kind import Context, SideTable, StreamKind

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


@dataclass(frozen=True)
class Batch:
    start: int
    end: int
    events: DataFrame
    state: DataFrame | None  # each key's latest value before the batch (an input read as a table)


@dataclass(frozen=True)
class Changes:
    rows: DataFrame  # partial aggregates (or deltas) per group
    latest: DataFrame | None  # the batch's latest value per key, for the state


def merge_aggregate(
    batch: DataFrame,
    path: Location,
    stream: Contract,
    spec: TableSpec,
    txn: Txn,
    meta: dict[str, Any],
    gate: PublishGate | None = None,
) -> WriteResult:
    """Fold a batch of partial aggregates (or the deltas of an input read as a table) into an
    aggregate table by its :func:`~lakehouse.tables.aggregations.merge_rules`."""
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


class Aggregate(StreamKind):
    name = "aggregate"

    def side_tables(self, spec: TableSpec, out: Outputs) -> tuple[SideTable, ...]:
        return (SideTable("state", f"state.{spec.name}", out.state),)

    def create(self, ctx: Context) -> None:
        schema = table_schema(ctx.stream, ctx.spec)
        delta_spark.create_table(ctx.spark, ctx.out.gold, schema, gate=ctx.out.gate)
        if ctx.spec.read_as == "table":
            # The state must stand where the gold table does (a run may have died between).
            consumed = ctx.store.transaction_version(ctx.out.gold, ctx.app)
            catch_up_state(ctx.store, ctx.settings, ctx.contract, ctx.spec, ctx.out, consumed)

    def read(self, ctx: Context) -> Batch | None:
        todo = ctx.pending()
        if todo is None:
            return None
        events = read_input(ctx.store, ctx.settings, ctx.contract, ctx.spec, *todo)
        state = ctx.store.read(ctx.out.state) if ctx.spec.read_as == "table" else None
        return Batch(*todo, events, state)

    def transform(self, ctx: Context, batch: Batch) -> Changes:
        if batch.state is None:
            return Changes(aggregate_per_key(batch.events, ctx.stream, ctx.spec), None)
        # The keys' latest values feed both the deltas and the state: computed once.
        latest = latest_per_key(batch.events, ctx.stream).cache()
        return Changes(table_deltas(latest, batch.state, ctx.stream, ctx.spec), latest)

    def commit(self, ctx: Context, batch: Batch, changes: Changes) -> GoldResult:
        txn, meta = Txn(ctx.app, batch.end), input_meta(ctx.app, batch.start, batch.end)
        try:
            result = merge_aggregate(
                changes.rows, ctx.out.gold, ctx.stream, ctx.spec, txn, meta, ctx.out.gate
            )
            if changes.latest is not None:
                merge_latest(changes.latest, ctx.out.state, ctx.stream, txn, meta)
        finally:
            if changes.latest is not None:
                changes.latest.unpersist()
        return GoldResult(
            ctx.spec.name,
            (batch.start, batch.end),
            result.source_rows or 0,
            result.committed,
            table_version=result.table_version,
        )


KIND = Aggregate()
