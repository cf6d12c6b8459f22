"""What the three joins share (:mod:`~lakehouse.tables.stream_table`,
:mod:`~lakehouse.tables.table_table`, :mod:`~lakehouse.tables.stream_stream`): a stream or table of
this topic joined with another topic's stream or table, as Kafka Streams joins them. Every
micro-batch is one exactly-once commit recording, as Delta app transactions, the versions of
*both* inputs it consumed (``tables.input_app`` for this side, ``tables.stream_app(other)`` for
the other); a rerun of the same batch is a no-op. The join kinds' common part (:class:`JoinKind`)
is what they read, their schema, and their dry run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from lakehouse.contracts.catalog import Catalog
from lakehouse.contracts.model import Contract, Join, TableSpec
from lakehouse.runtime.config import Settings
from lakehouse.runtime.objectstore import Location
from lakehouse.storage import DeltaStore, Txn, delta_spark
from lakehouse.streams.schema import EVENT_TIME, key_spark_type, spark_type
from lakehouse.tables.common import GoldResult, Outputs, pending, stream_app
from lakehouse.tables.kind import Context, Input, SideTable, plan_stream, stream_input

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame
    from pyspark.sql.types import DataType, StructType

JOIN_META = "lakehouse.join"  # commit metadata: the other side's versions a commit consumed
KEY, TIME = "__k", "__t"
PT = "__pt"  # a record's partition time (ms): Kafka Streams' order across the two inputs


@dataclass
class JoinResult(GoldResult):
    """A join's micro-batch: this side's versions (``input_versions``) and the other's."""

    other: str = ""
    other_versions: tuple[int, int] | None = None

    def summary(self) -> str:
        if self.input_versions is None and self.other_versions is None:
            return f"gold {self.table}: neither input has new versions"

        def span(v: tuple[int, int] | None) -> str:
            return "no new versions" if v is None else f"versions {v[0]}..{v[1]}"

        state = "committed" if self.committed else "already applied (skipped)"
        return (
            f"gold {self.table}: stream {span(self.input_versions)}, {self.other} "
            f"{span(self.other_versions)} {state}: {self.keys_changed} rows written"
        )


def other_state_path(out: Outputs) -> Location:
    """A table-table join's state of the other side (each of its keys' latest value)."""
    return out.state.with_name(out.state.name + "__other")


def join_schema(contract: Contract, other: Contract, spec: TableSpec) -> StructType:
    """The join table's schema: ``Contract.table_columns`` in order, the identity columns
    (``Contract.table_key_columns``) not null."""
    from pyspark.sql import types as T

    j = spec.join
    assert j is not None
    types: dict[str, DataType] = {"partition": T.IntegerType(), "offset": T.LongType()}
    types |= {"timestamp": T.TimestampType(), EVENT_TIME: T.TimestampType()}
    types |= {j.column(c): types[c] for c in ("partition", "offset", EVENT_TIME)}
    types[contract.key_name] = key_spark_type(contract)
    types |= {f.name: spark_type(f) for f in contract.fields}
    types |= {j.column(f): spark_type(other.field(f)) for f in j.fields}
    identity = set(contract.table_key_columns(spec))
    return T.StructType(
        [T.StructField(c, types[c], c not in identity) for c in contract.table_columns(spec)]
    )


def millis(col: Column) -> Column:
    from pyspark.sql import functions as F

    return F.unix_millis(col)


def join_key(contract: Contract, j: Join) -> str:
    return j.on or contract.key_name


def conform(df: DataFrame, schema: StructType) -> DataFrame:
    """``df`` as ``schema``: its columns in order and types; absent ones null (a stream read at
    an older version may not have a column its contract added later)."""
    from pyspark.sql import functions as F

    have = set(df.columns)
    return df.select(
        *(
            (F.col(f.name) if f.name in have else F.lit(None)).cast(f.dataType).alias(f.name)
            for f in schema.fields
        )
    )


def records_upto(store: DeltaStore, path: Location, version: int | None) -> DataFrame | None:
    """Every record a stream (append-only, unique on partition and offset) had at ``version``:
    the current snapshot without what later versions added. Old versions' files and commits
    may be gone after maintenance, so the stream is never read *at* an old version."""
    from pyspark.sql import functions as F

    head = store.version(path)
    if version is None or head is None:
        return None
    snapshot = store.read(path, version=head)
    if version >= head:
        return snapshot
    newer = store.changes(path, version + 1, head).filter(F.col("_change_type") == "insert")
    return snapshot.join(newer.select("partition", "offset"), ["partition", "offset"], "left_anti")


def join_meta(
    app: str, span: tuple[int, int] | None, other_app: str, other_span: tuple[int, int] | None
) -> dict[str, Any]:
    """Commit metadata: the versions of each input a commit consumed (None: none new)."""
    return {
        "lakehouse.source": {"table": app, "versions": list(span) if span else None},
        JOIN_META: {"table": other_app, "versions": list(other_span) if other_span else None},
    }


def txns(*positions: tuple[str, int | None]) -> list[Txn]:
    """The positions a commit records, one per app id (a self-join reads one stream twice)."""
    latest: dict[str, int] = {}
    for app, v in positions:
        if v is not None:
            latest[app] = max(v, latest.get(app, v))
    return [Txn(app, v) for app, v in latest.items()]


def join_of(spec: TableSpec) -> Join:
    assert spec.join is not None, f"{spec.name} is a join"
    return spec.join


class JoinKind:
    """What the three joins share: they read this side's stream and the other topic's, keep no
    late table, have the join schema, and say in a dry run what each side has new."""

    name: Any

    def inputs(
        self, settings: Settings, catalog: Catalog, contract: Contract, spec: TableSpec
    ) -> tuple[Input, ...]:
        other = catalog.topic(join_of(spec).other)
        path = settings.silver_path(other.stream)
        return (
            stream_input(contract, spec, settings),
            Input(f"silver.{other.stream}", path, stream_app(other)),
        )

    def side_tables(self, spec: TableSpec, out: Outputs) -> tuple[SideTable, ...]:
        return ()

    def other(self, ctx: Context) -> Contract:
        return ctx.catalog.topic(join_of(ctx.spec).other)

    def create(self, ctx: Context) -> None:
        schema = join_schema(ctx.contract, self.other(ctx), ctx.spec)
        delta_spark.create_table(ctx.spark, ctx.out.gold, schema, gate=ctx.out.gate)

    def unfinished(self, ctx: Context) -> None:
        return None

    def needs_rebuild(self, store: DeltaStore, spec: TableSpec, out: Outputs) -> bool:
        return False

    def plan(self, ctx: Context) -> list[str]:
        other = self.other(ctx)
        todo = pending(
            ctx.store, ctx.out.gold, stream_app(other), ctx.settings.silver_path(other.stream)
        )
        side = "no new versions" if todo is None else f"versions {todo[0]}..{todo[1]}"
        return plan_stream(ctx, also=f"; silver.{other.stream} (the join's other side): {side}")
