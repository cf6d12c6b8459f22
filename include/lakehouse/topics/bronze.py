"""Bronze: topics as Delta tables, ingested exactly once from the origin the contract names.

A topic's records come from its landing segment files (:mod:`~lakehouse.topics.from_landing`) or
from a Kafka cluster (:mod:`~lakehouse.topics.from_kafka`); both append to the same bronze table
(:mod:`~lakehouse.topics.bronze_table`), in Spark's Kafka source schema plus ingest metadata, one
Delta commit per batch that also records the new position. This module is the job's entry: it
takes the table's lock, creates the table, repairs a side table a crashed run left behind, and
runs the batch from the contract's origin.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lakehouse.contracts.model import Contract
from lakehouse.quality.gate import Gate
from lakehouse.runtime.config import Settings
from lakehouse.storage import delta_spark
from lakehouse.storage.store import latest_metadata
from lakehouse.topics import from_kafka, from_landing, kafka
from lakehouse.topics.bronze_table import BRONZE_SCHEMA, POSITION_KEY, BronzeResult, Position

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def ingest(
    spark: SparkSession, settings: Settings, contract: Contract, gate: Gate | None = None
) -> BronzeResult:
    """Ingest every new record of a topic (from landing or Kafka) as one bronze batch (one Delta
    commit), judged by the table's ``gate`` before it is published.

    The job holds the table's commit lock throughout: a second copy of it (a retried task
    beside the first) waits, then finds the batch done."""
    path = settings.bronze_path(contract.topic)
    client = None
    if contract.kafka is not None:
        # The broker is checked before the lock is taken: an unreachable one fails fast.
        client = kafka.client(settings, contract)
        kafka.check_topic(client, contract)
    with delta_spark.table_lock(settings, path):
        delta_spark.create_table(spark, path, BRONZE_SCHEMA, gate=gate)
        if client is not None:
            from_kafka.repair_gaps(spark, settings, contract)
            return from_kafka.ingest(spark, settings, contract, path, client, gate)
        from_landing.repair_quarantine(spark, settings, contract)
        return from_landing.ingest(spark, settings, contract, path, gate)


def plan(settings: Settings, contract: Contract) -> str:
    """A dry run of :func:`ingest`: what it would read per partition, from the offsets bronze has
    reached to the origin's end offsets. Reads the logs only; changes nothing."""
    pos = Position.from_json(latest_metadata(settings.bronze_path(contract.topic), POSITION_KEY))
    if contract.kafka is not None:
        return from_kafka.plan(settings, contract, pos)
    return from_landing.plan(settings, contract, pos)
