"""Bronze from Kafka: a topic's records read from a Kafka cluster with Spark's Kafka source.

One micro-batch is one bounded read: from bronze's committed offsets to the end offsets fixed at
planning, appended in one Delta commit with the new position. Ranges that retention deleted
before bronze read them fail the run, or (if the contract accepts data loss) are recorded in the
topic's gaps table. The consumer group only mirrors the position kept in bronze's commits.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from lakehouse.contracts.model import BRONZE_COLUMNS, Contract
from lakehouse.errors import BrokerUnavailableError, DataLossError
from lakehouse.quality.gate import Gate
from lakehouse.runtime.config import Settings
from lakehouse.runtime.objectstore import Location
from lakehouse.storage import DeltaStore, Txn, delta_spark
from lakehouse.topics.bronze_table import (
    BATCH_KEY,
    BRONZE_APP,
    BRONZE_SCHEMA,
    POSITION_KEY,
    BronzeResult,
    Position,
    append_side,
    position,
    side_table_behind,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from lakehouse.topics import kafka

log = logging.getLogger(__name__)


def plan(settings: Settings, contract: Contract, pos: Position) -> str:
    """A dry run of :func:`ingest` from bronze's position ``pos``: the offsets it would read per
    partition, and those retention deleted first. Asks the broker only; changes nothing."""
    from lakehouse.topics import kafka

    c = kafka.client(settings, contract)
    kafka.check_topic(c, contract)
    read, lost, _ = kafka_plan(pos, kafka.offsets(c, contract.partitions))
    topic = contract.topic
    if not read and not lost:
        return f"bronze {topic} (dry run): no new records on Kafka topic {c.topic}"
    parts = [f"partition {p}: offsets {a}..{b - 1}" for p, (a, b) in sorted(read.items())]
    parts += [
        f"partition {p}: offsets {a}..{b - 1} LOST to retention"
        for p, (a, b) in sorted(lost.items())
    ]
    assert contract.kafka is not None
    verdict = ""
    if lost:
        verdict = (
            " (the run would fail: the contract does not accept data loss)"
            if contract.kafka.on_data_loss == "fail"
            else " (the loss would be recorded in the gaps table)"
        )
    return (
        f"bronze {topic} (dry run): would read Kafka topic {c.topic} at {c.bootstrap_servers} "
        f"into bronze.{topic} as one batch: " + "; ".join(parts) + verdict
    )


GAPS_SCHEMA = pa.schema(
    [
        pa.field("topic", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("first_offset", pa.int64()),
        pa.field("last_offset", pa.int64()),
        pa.field("records", pa.int64()),
        pa.field("_batch_id", pa.int64()),
        pa.field("_ingested_at", pa.timestamp("us", tz="UTC")),
    ]
)


def kafka_plan(
    pos: Position, marks: dict[int, tuple[int, int]]
) -> tuple[dict[int, tuple[int, int]], dict[int, tuple[int, int]], dict[int, int]]:
    """From bronze's position and the broker's (earliest, end) offsets per partition: the
    ranges to read, ``[start, end)`` per partition with records; the ranges retention deleted
    before bronze read them; and the position after the batch, for every partition."""
    read: dict[int, tuple[int, int]] = {}
    lost: dict[int, tuple[int, int]] = {}
    after: dict[int, int] = {}
    for p, (low, end) in sorted(marks.items()):
        at = pos.next.get(p, 0)
        if at < low:
            lost[p] = (at, low)
            at = low
        if at < end:
            read[p] = (at, end)
        after[p] = max(at, end)
    return read, lost, after


def _kafka_frame(
    spark: SparkSession, c: Any, read: dict[int, tuple[int, int]], batch_id: int
) -> Any:
    """The records of ``read`` from Spark's Kafka source (one bounded batch read), in bronze's
    schema. ``failOnDataLoss``: records deleted between planning and reading fail the read."""
    import json

    from pyspark.sql import functions as F

    def per_partition(i: int) -> str:
        return json.dumps({c.topic: {str(p): r[i] for p, r in sorted(read.items())}})

    frame = (
        spark.read.format("kafka")
        .options(**c.spark_options())
        .option("assign", json.dumps({c.topic: sorted(read)}))
        .option("startingOffsets", per_partition(0))
        .option("endingOffsets", per_partition(1))
        .option("includeHeaders", "true")
        .option("failOnDataLoss", "true")
        .option("kafka.isolation.level", c.isolation)
        # Every offset asked for is on the broker: a fetch need not wait for more. Kafka's
        # default (500 ms) made a 1M-record read 2.5x slower here (5.6 s against 2.3 s).
        .option("kafka.fetch.max.wait.ms", c.config.get("fetch.max.wait.ms", "10"))
        # A broker that dies under the read fails it within about a minute (planning tries
        # three times), not the Java client's 3 x 60 s: measured 51 s after a kill -9 here.
        .option("kafka.request.timeout.ms", c.config.get("request.timeout.ms", "10000"))
        .option("kafka.default.api.timeout.ms", c.config.get("default.api.timeout.ms", "15000"))
        .load()
    )
    return frame.select(
        *(c for c in BRONZE_COLUMNS if c != "headers"),
        # Spark's Kafka source gives no headers as null; bronze has always kept them as an empty list.
        F.coalesce("headers", F.array().cast(frame.schema["headers"].dataType)).alias("headers"),
        F.lit(None).cast("string").alias("_source_file"),
        F.lit(batch_id).cast("long").alias("_batch_id"),
        F.current_timestamp().alias("_ingested_at"),
    )


def ingest(
    spark: SparkSession,
    settings: Settings,
    contract: Contract,
    path: Location,
    c: kafka.Client,
    gate: Gate | None,
) -> BronzeResult:
    """One bounded read of the topic's partitions, from bronze's position to the end offsets
    read at planning, appended in one Delta commit with the new position."""
    from pyspark import StorageLevel

    from lakehouse.topics import kafka

    store = DeltaStore(spark)
    topic = contract.topic
    pos = position(store, settings, topic)
    last_batch = store.transaction_version(path, BRONZE_APP)
    batch_id = 0 if last_batch is None else last_batch + 1
    marks = kafka.offsets(c, contract.partitions)
    read, lost, after = kafka_plan(pos, marks)
    assert contract.kafka is not None
    if lost and contract.kafka.on_data_loss == "fail":
        raise DataLossError(c.topic, lost)
    if not read and not lost:
        return BronzeResult(topic, None, next_offsets=pos.next, kafka_topic=c.topic)
    new_pos = Position({**pos.next, **after}, listed_at_ms=int(time.time() * 1000))
    if read:
        records = _kafka_frame(spark, c, read, batch_id)
    else:
        records = delta_spark.arrow_frame(spark, BRONZE_SCHEMA.empty_table())
    summary: dict[str, Any] = {
        "batch_id": batch_id,
        "quarantined": 0,
        "duplicates": 0,
        "lost": {str(p): list(r) for p, r in lost.items()},
    }
    kept: int | None = None
    if gate is not None:
        # The gate judges the rows before they are written: read them from the broker once.
        records = records.persist(StorageLevel.DISK_ONLY)
        kept = records.count()
        summary["records"] = kept
    try:
        result = delta_spark.append(
            records,
            path,
            txn=Txn(BRONZE_APP, batch_id),
            metadata={POSITION_KEY: new_pos.to_json(), BATCH_KEY: summary},
            gate=gate,
            rows=kept,
            lineage={
                "table": f"kafka.{c.topic}",
                "offsets": {str(p): n for p, n in pos.next.items()},
            },
        )
    finally:
        records.unpersist()
    if kept is None:
        kept = result.rows_written or 0
    gaps: dict[int, int] = {}
    if result.committed and kept < sum(end - start for start, end in read.values()):
        gaps = _kafka_gaps(spark, path, batch_id, read)
    if result.committed:
        _write_gaps(spark, settings, topic, batch_id, lost)
    try:
        kafka.commit_group(c, new_pos.next)
    except BrokerUnavailableError as exc:  # the Delta commit stands; the group only mirrors it
        log.warning("bronze %s: consumer group not updated: %s", topic, exc)
    return BronzeResult(
        topic,
        batch_id,
        records=kept,
        gaps=gaps,
        next_offsets=new_pos.next,
        committed=result.committed,
        kafka_topic=c.topic,
        lost=lost,
        table_version=result.table_version,
        end_offsets={p: end for p, (_, end) in marks.items()},
    )


def _kafka_gaps(
    spark: SparkSession, path: Location, batch_id: int, read: dict[int, tuple[int, int]]
) -> dict[int, int]:
    """Offsets a batch read past that carried no record (a compacted topic, transaction
    markers), per partition: counted in the batch's rows as written, not read again from Kafka."""
    from pyspark.sql import functions as F

    rows = spark.read.format("delta").load(str(path)).where(F.col("_batch_id") == batch_id)
    counted = {
        r["partition"]: r["n"]
        for r in rows.groupBy("partition").agg(F.count("*").alias("n")).collect()
    }
    gaps = {p: end - start - counted.get(p, 0) for p, (start, end) in read.items()}
    return {p: g for p, g in gaps.items() if g > 0}


def _write_gaps(
    spark: SparkSession,
    settings: Settings,
    topic: str,
    batch_id: int,
    lost: dict[int, tuple[int, int]],
) -> None:
    """Keep the ranges retention deleted (accepted by the contract), once per batch."""
    if not lost:
        return
    now = int(time.time() * 1_000_000)
    parts = sorted(lost)
    columns = {
        "topic": [topic] * len(parts),
        "partition": parts,
        "first_offset": [lost[p][0] for p in parts],
        "last_offset": [lost[p][1] - 1 for p in parts],
        "records": [lost[p][1] - lost[p][0] for p in parts],
        "_batch_id": [batch_id] * len(parts),
        "_ingested_at": [now] * len(parts),
    }
    append_side(spark, settings, settings.gaps_path(topic), batch_id, columns, GAPS_SCHEMA)


def repair_gaps(spark: SparkSession, settings: Settings, contract: Contract) -> None:
    """If the last run committed bronze but died before keeping its lost ranges, keep them now
    (they are in that commit's summary)."""
    behind = side_table_behind(spark, settings, contract.topic, settings.gaps_path(contract.topic))
    if behind is None or not behind[1].get("lost"):
        return
    done, summary = behind
    lost = {int(p): (int(a), int(b)) for p, (a, b) in summary["lost"].items()}
    _write_gaps(spark, settings, contract.topic, done, lost)
