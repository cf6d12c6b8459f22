"""``table-table`` joins (KTable-KTable).

Both streams read as tables (latest value per key in offset
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
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from lakehouse.contracts.model import Contract, Join, TableSpec
from lakehouse.storage import Txn, delta_spark
from lakehouse.streams.schema import TOMBSTONE
from lakehouse.tables.common import GoldResult, Outputs, input_meta, pending, read_input, stream_app
from lakehouse.tables.joined import (
    KEY,
    JoinKind,
    JoinResult,
    join_key,
    join_meta,
    join_of,
    other_state_path,
    txns,
)
from lakehouse.tables.keyed import LATEST, catch_up_state, latest_per_key, merge_latest
from lakehouse.tables.kind import Context, SideTable

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

_PRESENT = "__present"


@dataclass(frozen=True)
class Batch:
    todo: tuple[int, int] | None  # this side's new versions
    other_todo: tuple[int, int] | None  # the other side's
    consumed: int | None
    other_consumed: int | None
    mine: DataFrame | None  # this side's latest value per changed key (cached)
    theirs: DataFrame | None  # the other side's
    state: DataFrame
    other_state: DataFrame
    gold: DataFrame


class TableTable(JoinKind):
    name = "table-table"

    def side_tables(self, spec: TableSpec, out: Outputs) -> tuple[SideTable, ...]:
        return (
            SideTable("state", f"state.{spec.name}", out.state),
            SideTable("state", f"state.{spec.name}__other", other_state_path(out)),
        )

    def create(self, ctx: Context) -> None:
        super().create(ctx)
        other, other_app = self.other(ctx), stream_app(self.other(ctx))
        # Both states must stand where the gold table does (a run may have died between commits).
        consumed = ctx.store.transaction_version(ctx.out.gold, ctx.app)
        other_consumed = ctx.store.transaction_version(ctx.out.gold, other_app)
        other_out = replace(ctx.out, state=other_state_path(ctx.out))
        catch_up_state(ctx.store, ctx.settings, ctx.contract, ctx.spec, ctx.out, consumed)
        catch_up_state(ctx.store, ctx.settings, other, LATEST, other_out, other_consumed)

    def read(self, ctx: Context) -> Batch | None:
        other = self.other(ctx)
        other_app = stream_app(other)
        todo = ctx.pending()
        other_todo = pending(
            ctx.store, ctx.out.gold, other_app, ctx.settings.silver_path(other.stream)
        )
        if todo is None and other_todo is None:
            return None

        def changes(c: Contract, s: TableSpec, span: tuple[int, int] | None) -> DataFrame | None:
            if span is None:
                return None
            return latest_per_key(read_input(ctx.store, ctx.settings, c, s, *span), c).cache()

        return Batch(
            todo,
            other_todo,
            ctx.store.transaction_version(ctx.out.gold, ctx.app),
            ctx.store.transaction_version(ctx.out.gold, other_app),
            changes(ctx.contract, ctx.spec, todo),
            changes(other, LATEST, other_todo),
            ctx.store.read(ctx.out.state),
            ctx.store.read(other_state_path(ctx.out)),
            ctx.store.read(ctx.out.gold),
        )

    def transform(self, ctx: Context, batch: Batch) -> DataFrame:
        rows = table_join_changes(
            batch.state,
            batch.mine,
            batch.other_state,
            batch.theirs,
            ctx.contract,
            self.other(ctx),
            join_of(ctx.spec),
        )
        return _drop_unchanged(rows, batch.gold, ctx.contract.key_name, ctx.spec, ctx.contract)

    def commit(self, ctx: Context, batch: Batch, changes: DataFrame) -> GoldResult:
        other = self.other(ctx)
        app, other_app = ctx.app, stream_app(other)
        key = ctx.contract.key_name
        rows = changes.cache()
        end = batch.todo[1] if batch.todo else batch.consumed
        other_end = batch.other_todo[1] if batch.other_todo else batch.other_consumed
        positions = txns((app, end), (other_app, other_end))
        meta = join_meta(app, batch.todo, other_app, batch.other_todo)
        n = rows.count()
        values = [c for c in ctx.contract.table_columns(ctx.spec) if c != key]
        # A MERGE commits even when the batch is empty: the positions move on.
        result = delta_spark.merge(
            rows,
            ctx.out.gold,
            on=[key],
            delete_when=f"NOT s.{_PRESENT}",
            update={c: f"s.{c}" for c in values},
            insert={c: f"s.{c}" for c in [key, *values]},
            insert_when=f"s.{_PRESENT}",
            txn=positions,
            metadata=meta,
            gate=ctx.out.gate,
        )
        rows.unpersist()
        for side, c, span, state, side_app in (
            (batch.mine, ctx.contract, batch.todo, ctx.out.state, app),
            (batch.theirs, other, batch.other_todo, other_state_path(ctx.out), other_app),
        ):
            if side is not None and span is not None:
                merge_latest(side, state, c, Txn(side_app, span[1]), input_meta(side_app, *span))
                side.unpersist()
        return JoinResult(
            ctx.spec.name,
            batch.todo,
            n,
            result.committed,
            table_version=result.table_version,
            other=other_app,
            other_versions=batch.other_todo,
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

    key, jk = contract.key_name, join_key(contract, j)
    mine, theirs = _apply(state, latest, contract), _apply(other_state, other_latest, other)
    affected = []
    if latest is not None:
        affected.append(latest.select(key))
    if other_latest is not None:
        changed = other_latest.select(F.col(other.key_name).alias(KEY)).distinct()
        hit = mine.join(changed, F.col(jk) == F.col(KEY), "left_semi").select(key)
        affected.append(hit)
    keys = affected[0]
    for more in affected[1:]:
        keys = keys.unionByName(more)
    keys = keys.distinct()
    rows = mine.join(keys, key, "left_semi")
    values = theirs.select(
        F.col(other.key_name).alias(KEY), *(F.col(f).alias(j.column(f)) for f in j.fields)
    )
    joined = rows.join(values, F.col(jk) == F.col(KEY), j.how).drop(KEY)
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


KIND = TableTable()
