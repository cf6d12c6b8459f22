"""The end-to-end benchmark's peer: the same pipeline written the way Spark's and Delta Lake's
documentation teach it, with the same stack (pyspark 4.2.0, delta-spark).

Structured Streaming, one query per layer, each with its own checkpoint and
``Trigger.AvailableNow`` (everything that has arrived, then stop), run bronze, silver, gold:

* bronze: Spark's file source over the landing folders (the JSON envelopes; ``partition`` comes
  from the ``partition=<p>`` folder names). ``foreachBatch`` MERGEs each batch into bronze,
  inserting only the (partition, offset) pairs bronze does not hold yet: Delta's documented
  de-duplication, so a record delivered twice lands once.
* silver: Delta's streaming source on bronze; values parsed with ``from_json``. ``foreachBatch``
  appends the records without a key to the quarantine table and the rest to silver, each write
  made idempotent by the DataFrame writer's ``txnAppId`` / ``txnVersion`` (the batch id), as
  Delta's documentation for ``foreachBatch`` shows; the contract's silver checks first (a
  ``fail`` on the batch size, a ``warn`` counted).
* gold: Delta's streaming source on silver. ``foreachBatch`` MERGEs each user's count and sum of
  ``visits`` into the totals table, and each user's newest record (by partition and offset) into
  the latest table (a tombstone deletes the user); each MERGE made idempotent by the session
  settings ``spark.databricks.delta.write.txnAppId`` / ``txnVersion``. Then the gold checks: no
  count below 1, one row per user.

Tables are created with the change data feed on, as ours are. The session is a plain one,
configured as Delta's quick start says (the extension and the catalog), with the same jars, master
and shuffle partitions as ours.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

CDF = {"delta.enableChangeDataFeed": "true"}
APP = "bench-peer"


def session(cores: int) -> Any:
    from pyspark.sql import SparkSession

    from lakehouse.runtime.jvm import spark_jars_conf

    return (
        SparkSession.builder.master(f"local[{cores}]")
        .appName("bench-e2e-streaming-peer")
        .config("spark.jars", spark_jars_conf())
        .config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
        .config(
            "spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog"
        )
        .config("spark.sql.shuffle.partitions", "8")
        .config("spark.driver.memory", "2g")
        .getOrCreate()
    )


class StreamingPeer:
    """bronze -> silver -> gold for one topic, three AvailableNow queries per pass."""

    def __init__(self, spark: Any, landing: Path, root: Path, topic: str, partitions: int) -> None:
        self.spark = spark
        self.landing = landing
        self.topic = topic
        self.partitions = partitions
        stream = topic.replace("-", "_")
        self.bronze = root / "bronze" / topic
        self.silver = root / "silver" / stream
        self.quarantine = root / "quarantine" / stream
        self.totals = root / "gold" / f"{stream}_totals"
        self.latest = root / "gold" / f"{stream}_latest"
        self.checkpoints = root / "_checkpoints" / topic

    def run(self) -> None:
        self.run_bronze()
        self.run_silver()
        self.run_gold()

    # -- helpers -------------------------------------------------------------------------

    def _create(self, path: Path, ddl: str) -> None:
        props = ", ".join(f"'{k}' = '{v}'" for k, v in CDF.items())
        self.spark.sql(
            f"CREATE TABLE IF NOT EXISTS delta.`{path}` ({ddl}) USING delta TBLPROPERTIES ({props})"
        )

    def _drain(self, stream: Any, write: Any, name: str) -> None:
        """Run ``write`` on every batch of ``stream`` that has arrived, then stop."""
        query = (
            stream.writeStream.foreachBatch(write)
            .option("checkpointLocation", str(self.checkpoints / name))
            .trigger(availableNow=True)
            .queryName(name)
            .start()
        )
        query.awaitTermination()
        if query.exception() is not None:
            raise RuntimeError(f"{name}: {query.exception()}")

    def _merge(self, builder: Any, batch_id: int, app: str) -> None:
        conf = self.spark.conf
        conf.set("spark.databricks.delta.write.txnAppId", f"{APP}-{app}")
        conf.set("spark.databricks.delta.write.txnVersion", str(batch_id))
        try:
            builder.execute()
        finally:
            conf.unset("spark.databricks.delta.write.txnAppId")
            conf.unset("spark.databricks.delta.write.txnVersion")

    # -- layers --------------------------------------------------------------------------

    def run_bronze(self) -> None:
        from delta.tables import DeltaTable
        from pyspark.sql import functions as F

        self._create(
            self.bronze,
            "key binary, value binary, topic string, partition int, offset bigint, "
            "timestamp timestamp, timestampType int",
        )
        envelopes = (
            self.spark.readStream.schema(
                "offset bigint, timestamp bigint, timestampType string, key string, "
                "value string, partition int"
            )
            .json(str(self.landing))
            .select(
                F.col("key").cast("binary").alias("key"),
                F.col("value").cast("binary").alias("value"),
                F.lit(self.topic).alias("topic"),
                "partition",
                "offset",
                F.timestamp_millis("timestamp").alias("timestamp"),
                F.when(F.col("timestampType") == "LogAppendTime", 1)
                .otherwise(0)
                .cast("int")
                .alias("timestampType"),
            )
        )

        def write(batch: Any, batch_id: int) -> None:
            bad = batch.where(~F.col("partition").between(0, self.partitions - 1)).count()
            if bad:  # the contract's bronze `fail` check
                raise RuntimeError(f"bronze gate failed: {bad} records out of the partition range")
            target = DeltaTable.forPath(self.spark, str(self.bronze))
            merge = (
                target.alias("t")
                .merge(
                    batch.dropDuplicates(["partition", "offset"]).alias("s"),
                    "t.partition = s.partition AND t.offset = s.offset",
                )
                .whenNotMatchedInsertAll()
            )
            self._merge(merge, batch_id, "bronze")

        self._drain(envelopes, write, "bronze")

    def run_silver(self) -> None:
        from pyspark.sql import functions as F

        self._create(
            self.silver,
            "username string, location string, note string, visits bigint, score double, "
            "tombstone boolean, partition int, offset bigint, timestamp timestamp, "
            "event_time timestamp",
        )
        self._create(
            self.quarantine,
            "username string, location string, note string, visits bigint, score double, "
            "tombstone boolean, partition int, offset bigint, timestamp timestamp, "
            "event_time timestamp, reason string",
        )
        fields = "location string, note string, visits bigint, score double"
        decoded = (
            self.spark.readStream.format("delta")
            .load(str(self.bronze))
            .select(
                F.col("key").cast("string").alias("username"),
                F.from_json(F.col("value").cast("string"), fields).alias("v"),
                F.col("value").isNull().alias("tombstone"),
                "partition",
                "offset",
                "timestamp",
                F.col("timestamp").alias("event_time"),
            )
            .select(
                "username",
                "v.*",
                "tombstone",
                "partition",
                "offset",
                "timestamp",
                "event_time",
            )
        )

        def write(batch: Any, batch_id: int) -> None:
            batch.persist()
            keyless = F.col("username").isNull()
            good = batch.where(~keyless)
            rows = good.count()
            if not 1 <= rows <= 100_000_000:  # the contract's silver `fail` check
                raise RuntimeError(f"silver gate failed: batch of {rows} rows")
            good.where(~F.col("visits").between(0, 1_000_000)).count()  # a `warn`: counted
            bad = batch.where(keyless).withColumn("reason", F.lit("username is null"))
            writes = [(good, self.silver, "silver")]
            if not bad.isEmpty():
                writes.append((bad, self.quarantine, "quarantine"))
            for frame, path, app in writes:
                (
                    frame.write.format("delta")
                    .mode("append")
                    .option("txnAppId", f"{APP}-{app}")
                    .option("txnVersion", batch_id)
                    .save(str(path))
                )
            batch.unpersist()

        self._drain(decoded, write, "silver")

    def run_gold(self) -> None:
        from delta.tables import DeltaTable
        from pyspark.sql import Window
        from pyspark.sql import functions as F

        self._create(self.totals, "username string, n bigint, visits_total bigint")
        self._create(
            self.latest,
            "username string, location string, note string, visits bigint, score double",
        )
        columns = ["username", "location", "note", "visits", "score"]

        def write(batch: Any, batch_id: int) -> None:
            batch.persist()
            totals = (
                batch.where(~F.col("tombstone"))
                .groupBy("username")
                .agg(F.count("*").alias("n"), F.sum("visits").alias("visits_total"))
            )
            merge = (
                DeltaTable.forPath(self.spark, str(self.totals))
                .alias("t")
                .merge(totals.alias("s"), "t.username = s.username")
                .whenMatchedUpdate(
                    set={"n": "t.n + s.n", "visits_total": "t.visits_total + s.visits_total"}
                )
                .whenNotMatchedInsertAll()
            )
            self._merge(merge, batch_id, "totals")
            newest = Window.partitionBy("username").orderBy(
                F.col("partition").desc(), F.col("offset").desc()
            )
            latest = (
                batch.withColumn("_n", F.row_number().over(newest))
                .where("_n = 1")
                .select(*columns, "tombstone")
            )
            values = {c: f"s.{c}" for c in columns}
            merge = (
                DeltaTable.forPath(self.spark, str(self.latest))
                .alias("t")
                .merge(latest.alias("s"), "t.username = s.username")
                .whenMatchedDelete(condition="s.tombstone")
                .whenMatchedUpdate(condition="NOT s.tombstone", set=values)
                .whenNotMatchedInsert(condition="NOT s.tombstone", values=values)
            )
            self._merge(merge, batch_id, "latest")
            batch.unpersist()
            low = self.spark.read.format("delta").load(str(self.totals)).where("n < 1").count()
            if low:
                raise RuntimeError(f"gold gate failed: {low} rows with n < 1")
            users = self.spark.read.format("delta").load(str(self.latest))
            if users.groupBy("username").count().where("count > 1").limit(1).count():
                raise RuntimeError("gold gate failed: username is not unique in the latest table")

        self._drain(self.spark.readStream.format("delta").load(str(self.silver)), write, "gold")
