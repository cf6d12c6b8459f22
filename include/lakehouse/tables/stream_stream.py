"""``stream-stream`` joins (KStream-KStream, inner).

Every pair of events of this stream and the other
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

from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from lakehouse.contracts.model import Contract, Join
from lakehouse.storage import delta_spark
from lakehouse.streams.schema import EVENT_TIME, TOMBSTONE
from lakehouse.tables.common import (
    GoldResult,
    event_time,
    input_path,
    pending,
    read_input,
    stream_app,
)
from lakehouse.tables.joined import (
    KEY,
    TIME,
    JoinKind,
    JoinResult,
    conform,
    join_key,
    join_meta,
    join_of,
    records_upto,
    txns,
)
from lakehouse.tables.keyed import LATEST
from lakehouse.tables.kind import Context

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


@dataclass(frozen=True)
class Batch:
    todo: tuple[int, int] | None  # this side's new versions
    other_todo: tuple[int, int] | None  # the other side's
    consumed: int | None
    other_consumed: int | None
    new: DataFrame | None  # this side's new events
    everything: DataFrame | None  # the other side up to the end of its batch
    old: DataFrame | None  # this side's events consumed before
    new_other: DataFrame | None  # the other side's new events


class StreamStream(JoinKind):
    name = "stream-stream"

    def read(self, ctx: Context) -> Batch | None:
        other = self.other(ctx)
        other_app = stream_app(other)
        path = input_path(ctx.settings, ctx.contract, ctx.spec)
        other_path = ctx.settings.silver_path(other.stream)
        consumed = ctx.store.transaction_version(ctx.out.gold, ctx.app)
        other_consumed = ctx.store.transaction_version(ctx.out.gold, other_app)
        todo = ctx.pending()
        other_todo = pending(ctx.store, ctx.out.gold, other_app, other_path)
        if todo is None and other_todo is None:
            return None
        other_end = other_todo[1] if other_todo else other_consumed
        new = everything = old = new_other = None
        if todo is not None:  # new events of this side x the other side up to its head
            new = read_input(ctx.store, ctx.settings, ctx.contract, ctx.spec, *todo)
            everything = records_upto(ctx.store, other_path, other_end)
        if other_todo is not None:  # events of this side consumed before x new events of the other
            old = records_upto(ctx.store, path, consumed)
            if old is not None:
                new_other = read_input(ctx.store, ctx.settings, other, LATEST, *other_todo)
        return Batch(todo, other_todo, consumed, other_consumed, new, everything, old, new_other)

    def transform(self, ctx: Context, batch: Batch) -> DataFrame:
        other, j = self.other(ctx), join_of(ctx.spec)
        schema = ctx.store.spark_schema(ctx.out.gold)
        rows = None
        for mine, theirs in ((batch.new, batch.everything), (batch.old, batch.new_other)):
            if mine is not None and theirs is not None:
                part = conform(window_join(mine, theirs, ctx.contract, other, j), schema)
                rows = part if rows is None else rows.unionByName(part)
        return rows if rows is not None else ctx.spark.createDataFrame([], schema)

    def commit(self, ctx: Context, batch: Batch, changes: DataFrame) -> GoldResult:
        other_app = stream_app(self.other(ctx))
        rows = changes.cache()
        end = batch.todo[1] if batch.todo else batch.consumed
        other_end = batch.other_todo[1] if batch.other_todo else batch.other_consumed
        positions = txns((ctx.app, end), (other_app, other_end))
        meta = join_meta(ctx.app, batch.todo, other_app, batch.other_todo)
        n = rows.count()
        result = delta_spark.append(
            rows, ctx.out.gold, txn=positions, metadata=meta, gate=ctx.out.gate
        )
        rows.unpersist()
        return JoinResult(
            ctx.spec.name,
            batch.todo,
            n,
            result.committed,
            table_version=result.table_version,
            other=other_app,
            other_versions=batch.other_todo,
        )


def window_join(
    mine: DataFrame, theirs: DataFrame, contract: Contract, other: Contract, j: Join
) -> DataFrame:
    """Pairs of events with equal keys (null keys and tombstones ignored) at most ``within``
    apart in event time, as the join table's columns. Pure but for one small aggregate: the
    other side is first cut to the time span this side's events can reach, which lets the
    Parquet reader skip what lies outside (Kafka's window store keeps no more)."""
    from pyspark.sql import functions as F

    jk = join_key(contract, j)
    a = mine.filter(F.col(jk).isNotNull() & ~F.col(TOMBSTONE)).withColumn(
        TIME, event_time(contract)
    )
    span = a.agg(F.min(F.unix_millis(TIME)), F.max(F.unix_millis(TIME))).first()
    if span is None or span[0] is None:
        return a.limit(0)
    lo, hi = span[0] - j.within_ms, span[1] + j.within_ms
    t = event_time(other)
    b = theirs.filter(
        F.col(other.key_name).isNotNull()
        & ~F.col(TOMBSTONE)
        & (t >= F.lit(_instant(lo)))
        & (t <= F.lit(_instant(hi)))
    ).select(
        F.col(other.key_name).alias(KEY),
        t.alias("__bt"),
        *(F.col(f).alias(j.column(f)) for f in j.fields),
        *(F.col(c).alias(j.column(c)) for c in ("partition", "offset")),
        t.alias(j.column(EVENT_TIME)),
    )
    close = F.abs(F.unix_millis(TIME) - F.unix_millis("__bt")) <= j.within_ms
    pairs = a.join(b, (F.col(jk) == F.col(KEY)) & close)
    return pairs.drop(KEY, "__bt").withColumn(EVENT_TIME, F.col(TIME))


def _instant(ms: int) -> datetime:
    """Epoch milliseconds as an aware datetime (a Spark timestamp literal)."""
    from datetime import UTC

    return datetime.fromtimestamp(ms / 1000, tz=UTC)


KIND = StreamStream()
