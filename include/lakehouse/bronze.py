"""Bronze: topics as Delta tables, ingested exactly once from landing segments.

The bronze table has the schema of Spark's Kafka source (``key``, ``value``, ``topic``,
``partition``, ``offset``, ``timestamp``, ``timestampType``, ``headers``) plus ingest metadata.
Its position is the next offset per partition, stored in the commit that wrote the records
(commit metadata + an app transaction whose version is the batch id), so a rerun after a crash
neither loses nor doubles a record.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from lakehouse.config import Settings
from lakehouse.contracts import Contract
from lakehouse.landing import list_segments
from lakehouse.storage import DeltaStore, Txn

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.types import StructType

BRONZE_APP = "landing"
OFFSETS_KEY = "lakehouse.next_offsets"
QUARANTINE_REASON_MALFORMED = "malformed segment line: not a JSON record envelope"


def envelope_schema() -> StructType:
    from pyspark.sql.types import (
        ArrayType,
        LongType,
        StringType,
        StructField,
        StructType,
    )

    header = StructType(
        [
            StructField("key", StringType()),
            StructField("value", StringType()),
            StructField("encoding", StringType()),
        ]
    )
    return StructType(
        [
            StructField("offset", LongType()),
            StructField("timestamp", LongType()),
            StructField("timestampType", StringType()),
            StructField("key", StringType()),
            StructField("keyEncoding", StringType()),
            StructField("value", StringType()),
            StructField("valueEncoding", StringType()),
            StructField("headers", ArrayType(header)),
            StructField("_corrupt_record", StringType()),
        ]
    )


def _bytes(text: str, encoding: str) -> Column:
    from pyspark.sql import functions as F

    return F.when(F.col(encoding) == "base64", F.unbase64(F.col(text))).otherwise(
        F.encode(F.col(text), "UTF-8")
    )


def to_bronze(envelopes: DataFrame, topic: str, batch_id: int) -> DataFrame:
    """Envelope rows (+ ``_file``, ``_partition``) -> rows of the bronze schema. Pure."""
    from pyspark.sql import functions as F

    headers = F.transform(
        F.coalesce(F.col("headers"), F.array()),
        lambda h: F.struct(
            h["key"].alias("key"),
            F.when(h["encoding"] == "base64", F.unbase64(h["value"]))
            .otherwise(F.encode(h["value"], "UTF-8"))
            .alias("value"),
        ),
    )
    return envelopes.select(
        _bytes("key", "keyEncoding").alias("key"),
        _bytes("value", "valueEncoding").alias("value"),
        F.lit(topic).alias("topic"),
        F.col("_partition").cast("int").alias("partition"),
        F.col("offset").alias("offset"),
        F.timestamp_millis(F.col("timestamp")).alias("timestamp"),
        F.when(F.col("timestampType") == "LogAppendTime", F.lit(1))
        .otherwise(F.lit(0))
        .cast("int")
        .alias("timestampType"),
        headers.alias("headers"),
        F.col("_file").alias("_source_file"),
        F.lit(batch_id).cast("long").alias("_batch_id"),
        F.current_timestamp().alias("_ingested_at"),
    )


@dataclass
class BronzeResult:
    topic: str
    batch_id: int | None
    records: int = 0
    quarantined: int = 0
    next_offsets: dict[int, int] = field(default_factory=dict)
    committed: bool = False

    def summary(self) -> str:
        if self.batch_id is None:
            return f"bronze {self.topic}: no new segments"
        state = "committed" if self.committed else "already applied (skipped)"
        return (
            f"bronze {self.topic}: batch {self.batch_id} {state}: {self.records} records, "
            f"{self.quarantined} quarantined, next offsets {self.next_offsets}"
        )


def committed_offsets(store: DeltaStore, settings: Settings, topic: str) -> dict[int, int]:
    raw = store.latest_metadata(settings.bronze_path(topic), OFFSETS_KEY) or {}
    return {int(p): int(o) for p, o in raw.items()}


def ingest(spark: SparkSession, settings: Settings, contract: Contract) -> BronzeResult:
    """Ingest every landing record past the committed offsets as one bronze batch."""
    from pyspark.sql import functions as F

    store = DeltaStore(spark)
    topic = contract.topic
    path = settings.bronze_path(topic)
    done = committed_offsets(store, settings, topic)
    last_batch = store.transaction_version(path, BRONZE_APP)
    batch_id = 0 if last_batch is None else last_batch + 1

    segments = [
        s for s in list_segments(settings, topic) if s.start_offset >= done.get(s.partition, 0)
    ]
    if not segments:
        return BronzeResult(topic, None, next_offsets=done)

    part_of = spark.createDataFrame(
        [(str(s.path), s.partition) for s in segments], "_file string, _partition int"
    )
    raw = (
        spark.read.schema(envelope_schema())
        .option("mode", "PERMISSIVE")
        .option("columnNameOfCorruptRecord", "_corrupt_record")
        .json([str(s.path) for s in segments])
        .withColumn("_file", F.col("_metadata.file_path"))
    )
    # Spark reports file paths as URIs; join on the path part.
    raw = raw.withColumn("_file", F.regexp_replace("_file", "^file:", ""))
    raw = raw.join(F.broadcast(part_of), "_file").cache()

    bad = raw.filter(F.col("_corrupt_record").isNotNull() | F.col("offset").isNull())
    good = raw.filter(F.col("_corrupt_record").isNull() & F.col("offset").isNotNull())
    for p, start in done.items():
        good = good.filter((F.col("_partition") != p) | (F.col("offset") >= start))
    # A segment delivered twice carries the same (partition, offset) twice: keep one.
    good = good.dropDuplicates(["_partition", "offset"])
    rows = to_bronze(good, topic, batch_id).cache()

    maxima = rows.groupBy("partition").agg(F.max("offset").alias("m")).collect()
    next_offsets = dict(done)
    for r in maxima:
        next_offsets[r["partition"]] = max(next_offsets.get(r["partition"], 0), r["m"] + 1)

    n_bad = bad.count()
    if n_bad:
        quarantine = bad.select(
            F.lit(topic).alias("topic"),
            F.col("_partition").alias("partition"),
            F.col("_file").alias("source_file"),
            F.col("_corrupt_record").alias("raw"),
            F.lit(QUARANTINE_REASON_MALFORMED).alias("reason"),
            F.lit(batch_id).cast("long").alias("_batch_id"),
            F.current_timestamp().alias("_ingested_at"),
        )
        store.append(
            quarantine, settings.quarantine_path("bronze", topic), txn=Txn(BRONZE_APP, batch_id)
        )
    n_rows = rows.count()
    result = store.append(
        rows,
        path,
        txn=Txn(BRONZE_APP, batch_id),
        metadata={OFFSETS_KEY: {str(p): o for p, o in sorted(next_offsets.items())}},
    )
    rows.unpersist()
    raw.unpersist()
    return BronzeResult(topic, batch_id, n_rows, n_bad, next_offsets, result.committed)
