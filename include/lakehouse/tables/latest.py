"""``latest`` tables: the stream read as a table (Kafka Streams' KTable), each key's latest value.

In offset order within a partition, the last record of each key wins; a tombstone (null value)
deletes the key; a record with a null key is ignored. A micro-batch reads the stream's change
feed from the last version consumed, reduces it to one row per key
(:func:`lakehouse.tables.keyed.latest_per_key`, pure), and merges that into the table in one
commit that records the consumed version.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from lakehouse.contracts.catalog import Catalog
from lakehouse.contracts.model import Contract, TableSpec
from lakehouse.runtime.config import Settings
from lakehouse.storage import DeltaStore, Txn, delta_spark
from lakehouse.tables.common import GoldResult, Outputs, input_meta, read_input
from lakehouse.tables.keyed import latest_per_key, latest_schema, merge_latest
from lakehouse.tables.kind import Context, Input, SideTable, plan_stream, stream_input

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


@dataclass(frozen=True)
class Batch:
    start: int
    end: int
    events: DataFrame


class Latest:
    name = "latest"

    def inputs(
        self, settings: Settings, catalog: Catalog, contract: Contract, spec: TableSpec
    ) -> tuple[Input, ...]:
        return (stream_input(contract, spec, settings),)

    def side_tables(self, spec: TableSpec, out: Outputs) -> tuple[SideTable, ...]:
        return ()

    def create(self, ctx: Context) -> None:
        delta_spark.create_table(
            ctx.spark, ctx.out.gold, latest_schema(ctx.stream), gate=ctx.out.gate
        )

    def unfinished(self, ctx: Context) -> None:
        return None

    def read(self, ctx: Context) -> Batch | None:
        todo = ctx.pending()
        if todo is None:
            return None
        events = read_input(ctx.store, ctx.settings, ctx.contract, ctx.spec, *todo)
        return Batch(*todo, events)

    def transform(self, ctx: Context, batch: Batch) -> DataFrame:
        return latest_per_key(batch.events, ctx.stream)

    def commit(self, ctx: Context, batch: Batch, changes: DataFrame) -> GoldResult:
        txn, meta = Txn(ctx.app, batch.end), input_meta(ctx.app, batch.start, batch.end)
        result = merge_latest(changes, ctx.out.gold, ctx.stream, txn, meta, ctx.out.gate)
        return GoldResult(
            ctx.spec.name,
            (batch.start, batch.end),
            result.source_rows or 0,
            result.committed,
            table_version=result.table_version,
        )

    def needs_rebuild(self, store: DeltaStore, spec: TableSpec, out: Outputs) -> bool:
        return False

    def plan(self, ctx: Context) -> list[str]:
        return plan_stream(ctx)


KIND = Latest()
