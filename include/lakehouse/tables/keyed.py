"""What the tables kept by key share: the latest value per key of a batch of a stream (Kafka
Streams' KTable read from a stream), its schema, and the MERGE that folds it into a table (a
``latest`` table, the state of an input read as a table, each side of a table-table join).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from lakehouse.contracts.model import Contract, TableSpec
from lakehouse.runtime.config import Settings
from lakehouse.runtime.objectstore import Location
from lakehouse.storage import DeltaStore, Txn, WriteResult, delta_spark
from lakehouse.storage.gates import PublishGate
from lakehouse.streams.schema import TOMBSTONE, key_spark_type, spark_type
from lakehouse.tables.common import Outputs, input_app, input_meta, read_input

if TYPE_CHECKING:
    from pyspark.sql import DataFrame
    from pyspark.sql.types import StructType


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
    # The last offset of each key in each partition, from the narrow columns alone (an
    # aggregation over whole rows sorts every row of the batch), then those records' rows: a
    # key's events in a batch are many, its partitions few.
    last = keyed.groupBy(key, "partition").agg(F.max("offset").alias("offset"))
    rows = keyed.select(key, "partition", "offset", "timestamp", *value_cols, TOMBSTONE)
    per_partition = rows.join(F.broadcast(last), [key, "partition", "offset"], "left_semi")
    row = F.struct(*[F.col(c) for c in [*value_cols, TOMBSTONE]])
    ordered = F.struct(F.col("timestamp"), F.col("partition"), F.col("offset"), row.alias("r"))
    best = per_partition.groupBy(key).agg(F.max(ordered).alias("w"))
    return best.select(key, *[F.col(f"w.r.{c}").alias(c) for c in [*value_cols, TOMBSTONE]])


def latest_schema(contract: Contract) -> StructType:
    """The schema of a table of each key's latest value: the key (not null), the value's
    fields."""
    from pyspark.sql.types import StructField, StructType

    key = StructField(contract.key_name, key_spark_type(contract), False)
    return StructType([key, *(StructField(f.name, spark_type(f), True) for f in contract.fields)])


LATEST = TableSpec(name="state", kind="latest")


def merge_latest(
    batch: DataFrame,
    path: Location,
    contract: Contract,
    txn: Txn,
    meta: dict[str, Any],
    gate: PublishGate | None = None,
) -> WriteResult:
    """Upsert one row per key; a tombstone deletes the key."""
    key = contract.key_name
    values = [f.name for f in contract.fields]
    return delta_spark.merge(
        batch,
        path,
        on=[key],
        delete_when=f"s.{TOMBSTONE}",
        update={c: f"s.{c}" for c in values},
        insert={c: f"s.{c}" for c in [key, *values]},
        insert_when=f"NOT s.{TOMBSTONE}",
        txn=txn,
        metadata=meta,
        gate=gate,
    )


def catch_up_state(
    store: DeltaStore,
    settings: Settings,
    contract: Contract,
    spec: TableSpec,
    out: Outputs,
    upto: int | None,
) -> Location:
    """The state of an input read as a table (each key's latest value) must stand where the gold table does.
    The gold commit comes first; if a run died before the state's, fold the missing versions in
    now (the state depends on the stream alone, so this is exact). The caller holds the state's
    :func:`~lakehouse.storage.delta_spark.table_lock`."""
    stream, app = contract.input(spec), input_app(contract, spec)
    delta_spark.create_table(store.spark, out.state, latest_schema(stream))
    have = store.transaction_version(out.state, app)
    start = 0 if have is None else have + 1
    if upto is not None and start <= upto:
        batch = latest_per_key(read_input(store, settings, contract, spec, start, upto), stream)
        merge_latest(batch, out.state, stream, Txn(app, upto), input_meta(app, start, upto))
    return out.state
