"""Silver: a stream is a topic with a schema.

The silver job reads bronze's change feed from the last bronze version it consumed, decodes key
and value by the contract (schema-on-read), and appends the typed stream; records that do not
decode go to the stream's quarantine table with their reason and origin. The consumed bronze
version is committed atomically with the output (app transaction), so a rerun is a no-op.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from lakehouse.config import Settings
from lakehouse.contracts import Contract, Field
from lakehouse.storage import DeltaStore, Txn

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.types import DataType, StructType

TOMBSTONE = "tombstone"
SOURCE_METADATA = ("partition", "offset", "timestamp")


def source_app(contract: Contract) -> str:
    """The app id under which silver records how far it has read bronze."""
    return f"bronze.{contract.topic}"


def spark_type(f: Field) -> DataType:
    from pyspark.sql import types as T

    types: dict[str, DataType] = {
        "string": T.StringType(),
        "long": T.LongType(),
        "int": T.IntegerType(),
        "double": T.DoubleType(),
        "boolean": T.BooleanType(),
        "timestamp": T.TimestampType(),
    }
    return types[f.type]


def value_schema(contract: Contract) -> StructType:
    from pyspark.sql.types import StringType, StructField, StructType

    fields = [StructField(f.name, spark_type(f), True) for f in contract.fields]
    return StructType([*fields, StructField("_corrupt_record", StringType(), True)])


def _first_failure(checks: list[tuple[Column, str]]) -> Column:
    from pyspark.sql import functions as F

    reason = F.lit(None).cast("string")
    for cond, text in reversed(checks):
        reason = F.when(cond, F.lit(text)).otherwise(reason)
    return reason


def decode(bronze: DataFrame, contract: Contract) -> DataFrame:
    """Bronze rows -> typed rows plus a ``_reason`` column (null when the record is good). Pure.

    A null value is a tombstone and is kept (flagged), a null key is kept too: a stream records
    every event; tables decide what to ignore.
    """
    from pyspark.sql import functions as F

    parsed = F.from_json(
        F.col("value").cast("string"),
        value_schema(contract),
        {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": "_corrupt_record"},
    )
    df = bronze.withColumn("_v", parsed)
    is_tombstone = F.col("value").isNull()
    checks: list[tuple[Column, str]] = [
        (
            ~is_tombstone & (F.col("_v").isNull() | F.col("_v._corrupt_record").isNotNull()),
            f"value is not a JSON object matching the {contract.topic} contract",
        ),
    ]
    if contract.key_format == "string":
        checks.append(
            (
                F.col("key").isNotNull() & F.col("key").cast("string").isNull(),
                "key is not UTF-8 text",
            )
        )
    for f in contract.fields:
        if not f.nullable:
            checks.append(
                (
                    ~is_tombstone & F.col(f"_v.{f.name}").isNull(),
                    f"required field {f.name!r} is missing or null",
                )
            )
    columns = [
        F.col("key").cast("string").alias(contract.key_name),
        *(
            F.when(is_tombstone, None).otherwise(F.col(f"_v.{f.name}")).alias(f.name)
            for f in contract.fields
        ),
        is_tombstone.alias(TOMBSTONE),
        F.col("partition"),
        F.col("offset"),
        F.col("timestamp"),
    ]
    return df.select(*columns, _first_failure(checks).alias("_reason"), "key", "value", "topic")


def stream_rows(decoded: DataFrame, contract: Contract) -> DataFrame:
    from pyspark.sql import functions as F

    cols = [contract.key_name, *(f.name for f in contract.fields), TOMBSTONE, *SOURCE_METADATA]
    return decoded.filter(F.col("_reason").isNull()).select(*cols)


def quarantine_rows(decoded: DataFrame) -> DataFrame:
    from pyspark.sql import functions as F

    return decoded.filter(F.col("_reason").isNotNull()).select(
        "topic",
        "partition",
        "offset",
        "timestamp",
        "key",
        "value",
        F.col("_reason").alias("reason"),
    )


@dataclass
class SilverResult:
    stream: str
    source_versions: tuple[int, int] | None
    records: int = 0
    quarantined: int = 0
    committed: bool = False

    def summary(self) -> str:
        if self.source_versions is None:
            return f"silver {self.stream}: bronze has no new versions"
        lo, hi = self.source_versions
        state = "committed" if self.committed else "already applied (skipped)"
        return (
            f"silver {self.stream}: bronze versions {lo}..{hi} {state}: "
            f"{self.records} records, {self.quarantined} quarantined"
        )


def build(spark: SparkSession, settings: Settings, contract: Contract) -> SilverResult:
    """Decode bronze versions not yet consumed into the silver stream (one micro-batch)."""
    from pyspark.sql import functions as F

    store = DeltaStore(spark)
    bronze_path = settings.bronze_path(contract.topic)
    silver_path = settings.silver_path(contract.stream)
    head = store.version(bronze_path)
    consumed = store.transaction_version(silver_path, source_app(contract))
    start = 0 if consumed is None else consumed + 1
    if head is None or start > head:
        return SilverResult(contract.stream, None)

    changes = store.changes(bronze_path, start, head).filter(F.col("_change_type") == "insert")
    decoded = decode(changes, contract).cache()
    good = stream_rows(decoded, contract)
    bad = quarantine_rows(decoded)
    txn = Txn(source_app(contract), head)
    meta = {"lakehouse.source": {"table": f"bronze.{contract.topic}", "versions": [start, head]}}
    n_bad = bad.count()
    if n_bad:
        store.append(
            bad, settings.quarantine_path("silver", contract.stream), txn=txn, metadata=meta
        )
    n_good = good.count()
    result = store.append(good, silver_path, txn=txn, metadata=meta)
    decoded.unpersist()
    return SilverResult(contract.stream, (start, head), n_good, n_bad, result.committed)
