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

from lakehouse.storage import Txn, delta_spark
from lakehouse.tables.common import GoldResult, input_meta, read_input
from lakehouse.tables.keyed import latest_per_key, latest_schema, merge_latest
from lakehouse.tables.kind import Context, StreamKind

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


@dataclass(frozen=True)
class Batch:
    start: int
    end: int
    events: DataFrame


class Latest(StreamKind):
    name = "latest"

    def create(self, ctx: Context) -> None:
        delta_spark.create_table(
            ctx.spark, ctx.out.gold, latest_schema(ctx.stream), gate=ctx.out.gate
        )

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


KIND = Latest()
