"""A stream's shape, as every reader of it sees it: the Spark types of the contract's fields and
the silver stream's schema (key, value fields, then the stream metadata).

Gold reads streams through this module, never through the silver job: the job writes rows of
this shape, the tables read them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lakehouse.contracts.fields import Field
from lakehouse.contracts.model import Contract

if TYPE_CHECKING:
    from pyspark.sql.types import DataType, StructType

TOMBSTONE = "tombstone"
EVENT_TIME = "event_time"


def spark_type(f: Field) -> DataType:
    """The Spark type of a value field (a decimal with its precision and scale)."""
    if f.type == "decimal":
        from pyspark.sql.types import DecimalType

        assert f.precision is not None and f.scale is not None
        return DecimalType(f.precision, f.scale)
    return kind_spark_type(f.type)


def key_spark_type(contract: Contract) -> DataType:
    """The Spark type of the contract's key."""
    return kind_spark_type(contract.key_type)


def kind_spark_type(kind: str) -> DataType:
    """The Spark type of a field type that needs no parameters (every type but decimal)."""
    from pyspark.sql import types as T

    types: dict[str, DataType] = {
        "string": T.StringType(),
        "long": T.LongType(),
        "int": T.IntegerType(),
        "double": T.DoubleType(),
        "boolean": T.BooleanType(),
        "timestamp": T.TimestampType(),
    }
    return types[kind]


def value_schema(contract: Contract) -> StructType:
    """The value's fields as one struct, every field nullable."""
    from pyspark.sql.types import StructField, StructType

    return StructType([StructField(f.name, spark_type(f), True) for f in contract.fields])


def stream_schema(contract: Contract) -> StructType:
    """The silver stream's schema: key, value fields, then the stream metadata."""
    from pyspark.sql import types as T

    fields = [
        T.StructField(contract.key_name, kind_spark_type(contract.key_type), True),
        *(T.StructField(f.name, spark_type(f), True) for f in contract.fields),
        T.StructField(TOMBSTONE, T.BooleanType(), True),
        T.StructField("partition", T.IntegerType(), True),
        T.StructField("offset", T.LongType(), True),
        T.StructField("timestamp", T.TimestampType(), True),
    ]
    if not event_time_is_a_field(contract):
        fields.append(T.StructField(EVENT_TIME, T.TimestampType(), True))
    return T.StructType(fields)


def event_time_is_a_field(contract: Contract) -> bool:
    """Whether the event time is a value field named ``event_time`` (then the stream has no
    separate event-time column)."""
    return contract.event_time == EVENT_TIME
