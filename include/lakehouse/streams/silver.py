"""Silver: a stream is a topic with a schema.

The silver job reads bronze's change feed from the last bronze version it consumed, decodes key
and value by the contract (schema-on-read), and appends the typed stream; records that do not
decode go to the stream's quarantine table with their reason and origin. The consumed bronze
version is committed atomically with the output (app transaction), so a rerun is a no-op.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from lakehouse.contracts.fields import DECIMAL_TEXT, Field
from lakehouse.contracts.model import Contract
from lakehouse.quality.gate import Gate
from lakehouse.quality.ledger import PUBLISHED, BatchOutcome, count_reasons
from lakehouse.quality.verdict import Verdict
from lakehouse.runtime.config import Settings
from lakehouse.runtime.objectstore import Location
from lakehouse.storage import DeltaStore, Txn, delta_spark, is_table
from lakehouse.streams.schema import (
    EVENT_TIME,
    TOMBSTONE,
    event_time_is_a_field,
    kind_spark_type,
    spark_type,
    stream_schema,
    value_schema,
)

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import Column, DataFrame, SparkSession

    # One projection of the decoding: new columns by name, or the whole select list.
    Step = dict[str, Column] | list[Column]

# Decoded values and the first decoding problem of each record, before the checks that follow.
_V, _VALUE_ERROR, _K, _KEY_ERROR = "_v", "_value_error", "_k", "_key_error"
_VARIANT = "_variant"  # a JSON value parsed, when its decimal fields need it
_BRONZE_INPUT = ("key", "value", "topic", "partition", "offset", "timestamp")
# A string field of a JSON value: Spark's from_json hands back the raw text of a number, object,
# array or boolean; only values that look like one are re-checked (by JSON type) for strictness.
_AMBIGUOUS_STRING = r"^(-?[0-9]|\{|\[|true$|false$)"
# The JSON types (as schema_of_variant names them) each field type accepts.
_JSON_KINDS: dict[str, tuple[str, ...]] = {
    "string": ("STRING",),
    "long": ("BIGINT",),
    "int": ("BIGINT",),
    "double": ("BIGINT", "DECIMAL", "DOUBLE"),
    "boolean": ("BOOLEAN",),
    "timestamp": ("STRING",),
}


def source_app(contract: Contract) -> str:
    """The app id under which silver records how far it has read bronze."""
    return f"bronze.{contract.topic}"


def _first(cases: list[tuple[Column, Column | str]], otherwise: Column | None = None) -> Column:
    """CASE WHEN over ``cases`` in order; Spark evaluates a branch's value only when it is chosen,
    so a costly diagnosis is paid for by the bad records alone."""
    from pyspark.sql import functions as F

    out = F.lit(None).cast("string") if otherwise is None else otherwise
    for cond, value in reversed(cases):
        out = F.when(cond, F.lit(value) if isinstance(value, str) else value).otherwise(out)
    return out


def _json_kind(variant: Column) -> Column:
    """The JSON type of a variant: STRING, BIGINT, DECIMAL, DOUBLE, BOOLEAN, OBJECT, ARRAY, VOID
    (a JSON null), or null when absent."""
    from pyspark.sql import functions as F

    return F.regexp_extract(F.schema_of_variant(variant), r"^[A-Z]+", 0)


def _article(kind: str) -> str:
    return ("an " if kind[0] in "aeiou" else "a ") + kind


def _json_field_problem(parsed: Column, typed: Column, name: str, kind: str) -> Column:
    """Why a present field of a parsed JSON object does not fit its type (null if it fits)."""
    from pyspark.sql import functions as F

    found = _json_kind(F.variant_get(parsed, f"$.{name}", "variant"))
    allowed = _JSON_KINDS[kind]
    present = found.isNotNull() & (found != "VOID")
    return _first(
        [
            (
                present & ~found.isin(*allowed),
                F.concat(
                    F.lit(f"field {name!r} should be {_article(kind)}, found a JSON "),
                    F.lower(found),
                ),
            ),
            (
                present & typed.isNull(),
                F.concat(
                    F.lit(f"field {name!r} is not a valid {kind}: "),
                    F.substring(F.variant_get(parsed, f"$.{name}", "string"), 1, 80),
                ),
            ),
        ]
    )


def _json_decimal(variant: Column, f: Field) -> tuple[Column, Column]:
    """(value, problem) of a decimal field of a parsed JSON object. A JSON number, or a string
    holding one, in plain notation, whose digits fit: more digits after the point than the
    scale is a problem, not a rounding (from_json would round 12.505 to 12.51)."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import DecimalType

    assert f.precision is not None and f.scale is not None
    name, kind = f.name, f.type_name
    found = _json_kind(F.variant_get(variant, f"$.{name}", "variant"))
    # A JSON number's text as the variant keeps it: plain notation, trailing zeros dropped.
    text = F.variant_get(variant, f"$.{name}", "string")
    shown = F.substring(text, 1, 80)
    present = found.isNotNull() & (found != "VOID")
    before = F.length(F.regexp_extract(text, r"^-?0*([0-9]*)", 1))
    after = F.length(F.regexp_extract(text, r"\.([0-9]*[1-9])0*$", 1))
    plain = text.rlike(f"^{DECIMAL_TEXT}$")
    # A number in exponent notation, or of more than 38 digits, is a double to the variant.
    exact = found.isin("BIGINT", "DECIMAL", "STRING")
    problem = _first(
        [
            (~present, F.lit(None).cast("string")),
            (
                found == "DOUBLE",
                f"field {name!r} should be a {kind} in plain notation, found a JSON number in "
                "exponent notation or of more than 38 digits",
            ),
            (
                ~exact,
                F.concat(
                    F.lit(f"field {name!r} should be a {kind}, found a JSON "), F.lower(found)
                ),
            ),
            (~plain, F.concat(F.lit(f"field {name!r} is not a valid {kind}: "), shown)),
            (
                after > f.scale,
                F.concat(
                    F.lit(
                        f"field {name!r} has more than {f.scale} digit(s) after the point "
                        f"for a {kind}: "
                    ),
                    shown,
                ),
            ),
            (
                before > f.precision - f.scale,
                F.concat(
                    F.lit(
                        f"field {name!r} has more than {f.precision - f.scale} digit(s) "
                        f"before the point for a {kind}: "
                    ),
                    shown,
                ),
            ),
        ]
    )
    fits = present & exact & plain & (after <= f.scale) & (before <= f.precision - f.scale)
    return F.when(fits, text.try_cast(DecimalType(f.precision, f.scale))), problem


def _json_value_steps(contract: Contract) -> list[Step]:
    """Spark's from_json for the typed values (fast), and a diagnosis only for failing rows.
    Decimal fields are read from the parsed JSON of every record instead: from_json rounds
    them."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    text = F.col("value").cast("string")
    decimals = [f for f in contract.fields if f.type == "decimal"]
    others = [f for f in contract.fields if f.type != "decimal"]
    schema = T.StructType(
        [
            *(T.StructField(f.name, spark_type(f), True) for f in others),
            T.StructField("_corrupt_record", T.StringType(), True),
        ]
    )
    parsed = F.from_json(
        text, schema, {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": "_corrupt_record"}
    )
    # Parsed once per record when decimals need it, else only for the records that fail.
    variant = F.col(_VARIANT) if decimals else F.try_parse_json(text)
    problems = {
        f.name: _json_field_problem(variant, F.col(f"_json.{f.name}"), f.name, f.type)
        for f in others
    }
    typed = {f.name: F.col(f"_json.{f.name}") for f in others}
    for f in decimals:
        typed[f.name], problems[f.name] = _json_decimal(variant, f)
    top = _json_kind(variant)
    diagnosis = _first(
        [
            (variant.isNull(), "value is not valid JSON"),
            (
                top != "OBJECT",
                F.concat(
                    F.lit("value is a JSON "),
                    # JSON's name for it: the variant calls a JSON null VOID.
                    F.when(top == "VOID", F.lit("null")).otherwise(F.lower(top)),
                    F.lit(", not an object"),
                ),
            ),
            *((p.isNotNull(), p) for p in problems.values()),
        ],
        otherwise=F.lit(f"value does not match the {contract.topic} contract"),
    )
    strings = [f.name for f in contract.fields if f.type == "string"]
    times = [f.name for f in contract.fields if f.type == "timestamp"]
    suspicious = F.lit(False)
    for name in strings:
        suspicious = suspicious | F.col(f"_json.{name}").rlike(_AMBIGUOUS_STRING)
    for name in times:
        # from_json reads a JSON number as epoch seconds; the contract wants an ISO-8601 string.
        suspicious = suspicious | text.rlike(f'"{re.escape(name)}"\\s*:\\s*[-0-9]')
    # A string that looks like a number, object, array or boolean (or a timestamp that may have
    # been a number) is a problem only if the JSON value really was one.
    string_diagnosis = _first([(problems[n].isNotNull(), problems[n]) for n in strings + times])
    error = _first(
        [
            (F.col("value").isNull(), F.lit(None).cast("string")),
            (~F.is_valid_utf8(text), "value is not valid UTF-8"),
            (F.col("_json").isNull() | F.col("_json._corrupt_record").isNotNull(), diagnosis),
            *((problems[f.name].isNotNull(), problems[f.name]) for f in decimals),
            (suspicious, string_diagnosis),
        ]
    )
    values = F.struct(*[typed[f.name].alias(f.name) for f in contract.fields])
    first: dict[str, Column] = {"_json": parsed}
    if decimals:
        first[_VARIANT] = F.try_parse_json(text)
    # The final projection drops "_json" and the variant.
    return [first, {_V: values, _VALUE_ERROR: error}]


def _string_value_steps(contract: Contract) -> list[Step]:
    from pyspark.sql import functions as F

    text = F.col("value").cast("string")
    error = F.when(
        F.col("value").isNotNull() & ~F.is_valid_utf8(text), F.lit("value is not valid UTF-8")
    )
    valid = F.when(F.is_valid_utf8(text), text)
    return [{_V: F.struct(valid.alias(contract.fields[0].name)), _VALUE_ERROR: error}]


def _text_key_steps(contract: Contract) -> list[Step]:
    """``string`` keys are UTF-8 text; ``json`` keys are one JSON scalar of the key's type."""
    from pyspark.sql import functions as F

    text = F.col("key").cast("string")
    not_utf8 = F.col("key").isNotNull() & ~F.is_valid_utf8(text)
    if contract.key_format == "string":
        return [{_K: text, _KEY_ERROR: F.when(not_utf8, F.lit("key is not valid UTF-8"))}]
    variant = F.try_parse_json(text)
    found = _json_kind(variant)
    kind = contract.key_type
    typed = F.try_variant_get(variant, "$", kind_spark_type(kind).simpleString())
    error = _first(
        [
            (F.col("key").isNull(), F.lit(None).cast("string")),
            (not_utf8, "key is not valid UTF-8"),
            (variant.isNull(), "key is not valid JSON"),
            (found == "VOID", F.lit(None).cast("string")),
            (
                ~found.isin(*_JSON_KINDS[kind]),
                F.concat(F.lit(f"key should be {_article(kind)}, found a JSON "), F.lower(found)),
            ),
            (typed.isNull(), F.lit(f"key is not a valid {kind}")),
        ]
    )
    return [{_K: F.when(found.isin(*_JSON_KINDS[kind]), typed), _KEY_ERROR: error}]


def _decode_avro(df: DataFrame, contract: Contract) -> DataFrame:
    """Avro keys and values (Confluent wire format) decode in Python workers with fastavro.

    Records written with an older schema id resolve into the latest schema (Avro's schema
    resolution), so the stream always has the latest shape.
    """
    from pyspark.sql import types as T

    value_avro = contract.value_format == "avro"
    key_avro = contract.key_format == "avro"
    out_fields = list(df.schema.fields)
    if value_avro:
        out_fields += [
            T.StructField(_V, value_schema(contract), True),
            T.StructField(_VALUE_ERROR, T.StringType(), True),
        ]
    if key_avro:
        out_fields += [
            T.StructField(_K, kind_spark_type(contract.key_type), True),
            T.StructField(_KEY_ERROR, T.StringType(), True),
        ]
    value_args = (
        ({v.id: v.schema for v in contract.value_schemas}, contract.value_schemas[-1].schema)
        if value_avro
        else None
    )
    key_args = (
        ({v.id: v.schema for v in contract.key_schemas}, contract.key_schemas[-1].schema)
        if key_avro
        else None
    )
    return df.mapInArrow(
        _avro_batches(value_args, key_args, contract.fields), T.StructType(out_fields)
    )


def _avro_batches(
    value_args: tuple[dict[int, Any], Any] | None,
    key_args: tuple[dict[int, Any], Any] | None,
    fields: tuple[Field, ...],
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa

        from lakehouse.contracts import avro

        values = avro.WireDecoder(value_args[0], value_args[1], fields) if value_args else None
        keys = avro.WireDecoder(key_args[0], key_args[1], ()) if key_args else None
        for batch in batches:
            columns = list(batch.columns)
            names = list(batch.schema.names)
            if values is not None:
                decoded, reasons = values.decode(batch.column("value"))
                columns += [decoded, reasons]
                names += [_V, _VALUE_ERROR]
            if keys is not None:
                key_values, key_reasons = keys.decode_key(batch.column("key"))
                columns += [key_values, key_reasons]
                names += [_K, _KEY_ERROR]
            yield pa.RecordBatch.from_arrays(columns, names=names)

    return run


def decode(bronze: DataFrame, contract: Contract) -> DataFrame:
    """Bronze rows -> typed rows plus a ``_reason`` column (null when the record is good). Pure.

    A null value is a tombstone and is kept (flagged); a null key is kept too: a stream records
    every event, and tables decide what to ignore. ``_reason`` is the first problem found: the
    key's decoding, then the value's, then required fields.
    """
    df = bronze.select(*_BRONZE_INPUT)
    if "avro" in (contract.key_format, contract.value_format):
        df = _decode_avro(df, contract)
    for step in _decode_steps(contract):
        df = df.withColumns(step) if isinstance(step, dict) else df.select(*step)
    return df


def _decode_steps(contract: Contract) -> list[Step]:
    """The projections that turn bronze rows (their Avro already decoded) into typed rows.

    They are the same for every batch of a contract, and building them costs a round trip to
    the JVM per function call (a JSON value's diagnosis makes hundreds, about a quarter of a
    second), so they are built once per contract and JVM. Column expressions depend on neither
    a session nor a DataFrame."""
    try:
        hash(contract)
    except TypeError:  # a contract built in code with a list in it: not worth keeping
        return _build_decode_steps(contract)
    return _cached_decode_steps(_jvm_gateway(), contract)


def _jvm_gateway() -> object:
    """PySpark's connection to the JVM (one per process; None under Spark Connect)."""
    from pyspark import SparkContext

    return SparkContext._gateway


@functools.lru_cache(maxsize=32)
def _cached_decode_steps(gateway: object, contract: Contract) -> list[Step]:
    """``gateway`` keys the cache: columns built for one JVM mean nothing to another."""
    return _build_decode_steps(contract)


def _build_decode_steps(contract: Contract) -> list[Step]:
    from pyspark.sql import functions as F

    steps: list[Step] = []
    if contract.value_format == "json":
        steps += _json_value_steps(contract)
    elif contract.value_format == "string":
        steps += _string_value_steps(contract)
    if contract.key_format != "avro":
        steps += _text_key_steps(contract)

    is_tombstone = F.col("value").isNull()
    checks: list[tuple[Column, Column | str]] = [
        (F.col(_KEY_ERROR).isNotNull(), F.col(_KEY_ERROR)),
        (F.col(_VALUE_ERROR).isNotNull(), F.col(_VALUE_ERROR)),
    ]
    for f in contract.fields:
        if not f.nullable:
            checks.append(
                (
                    ~is_tombstone & F.col(f"{_V}.{f.name}").isNull(),
                    f"required field {f.name!r} is missing or null",
                )
            )
    if _millis_event_time(contract):
        name = contract.event_time
        checks.append(
            (
                ~is_tombstone & ~_millis_in_range(F.col(f"{_V}.{name}")),
                f"event-time field {name!r} is out of range (epoch milliseconds)",
            )
        )
    value_columns = [
        F.when(is_tombstone, None).otherwise(F.col(f"{_V}.{f.name}")).alias(f.name)
        for f in contract.fields
    ]
    columns = [
        F.col(_K).alias(contract.key_name),
        *value_columns,
        is_tombstone.alias(TOMBSTONE),
        F.col("partition"),
        F.col("offset"),
        F.col("timestamp"),
    ]
    if not event_time_is_a_field(contract):
        columns.append(_event_time(contract, is_tombstone).alias(EVENT_TIME))
    reason = _first(checks).alias("_reason")
    return [*steps, [*columns, reason, F.col("key"), F.col("value"), F.col("topic")]]


def _event_time(contract: Contract, is_tombstone: Column) -> Column:
    """The declared event-time field, else (absent, null, or a tombstone) the record timestamp."""
    from pyspark.sql import functions as F

    if contract.event_time is None:
        return F.col("timestamp")
    value = F.col(f"{_V}.{contract.event_time}")
    if _millis_event_time(contract):
        # Out of range it would overflow (and fail the job); such records are quarantined.
        value = F.when(_millis_in_range(value), F.timestamp_millis(value))
    return F.when(is_tombstone, F.col("timestamp")).otherwise(F.coalesce(value, F.col("timestamp")))


def _millis_event_time(contract: Contract) -> bool:
    return contract.event_time is not None and contract.field(contract.event_time).type == "long"


# A long event time is epoch milliseconds; in microseconds (a timestamp) it must fit an int64.
MAX_EVENT_MILLIS = (2**63 - 1) // 1000


def _millis_in_range(value: Column) -> Column:
    """Null or a number of epoch milliseconds whose timestamp exists."""
    return value.isNull() | value.between(-MAX_EVENT_MILLIS, MAX_EVENT_MILLIS)


def stream_rows(decoded: DataFrame, contract: Contract) -> DataFrame:
    from pyspark.sql import functions as F

    cols = [f.name for f in stream_schema(contract).fields]
    return decoded.filter(F.col("_reason").isNull()).select(*cols)


def quarantine_rows(
    decoded: DataFrame, records: DataFrame | None = None, verdict: Verdict | None = None
) -> DataFrame:
    """The rows for the quarantine table: the records that did not decode, and those a
    quarantine expectation of ``verdict`` routed, with their raw key and value. The decoded
    batch keeps raw bytes only for records that did not decode; routed records take theirs from
    ``records`` (the bronze rows decoded), by partition and offset."""
    from pyspark.sql import functions as F

    bad = decoded.filter(F.col("_reason").isNotNull()).select(
        "topic",
        "partition",
        "offset",
        "timestamp",
        "key",
        "value",
        F.col("_reason").alias("reason"),
    )
    if verdict is None or not verdict.to_quarantine:
        return bad
    assert records is not None, "routed records take their raw bytes from the bronze rows"
    raw = records.select(*RECORD_KEY, "key", "value")
    return bad.drop("key", "value").join(raw, RECORD_KEY).select(*bad.columns)


@dataclass
class SilverResult:
    stream: str
    source_versions: tuple[int, int] | None
    records: int = 0
    quarantined: int = 0
    committed: bool = False
    table_version: int | None = None  # the version the batch committed
    reasons: dict[str, int] = field(default_factory=dict)  # quarantined, by reason kind

    def batch(self) -> BatchOutcome | None:
        """The batch's outcome for the ledger (None: no batch, or one committed before)."""
        if not self.committed:
            return None
        return BatchOutcome(
            "silver", self.stream, PUBLISHED, self.records, self.table_version, self.reasons
        )

    def summary(self) -> str:
        if self.source_versions is None:
            return f"silver {self.stream}: bronze has no new versions"
        lo, hi = self.source_versions
        state = "committed" if self.committed else "already applied (skipped)"
        return (
            f"silver {self.stream}: bronze versions {lo}..{hi} {state}: "
            f"{self.records} records, {self.quarantined} quarantined"
        )


def build(
    spark: SparkSession, settings: Settings, contract: Contract, gate: Gate | None = None
) -> SilverResult:
    """Decode bronze versions not yet consumed into the silver stream (one micro-batch), judged
    by the stream's ``gate``.

    The job holds the stream's and its quarantine's commit locks throughout: a second copy of
    it waits, then finds the batch done."""
    silver_path = settings.silver_path(contract.stream)
    quarantine_path = settings.quarantine_path("silver", contract.stream)
    with delta_spark.table_lock(silver_path), delta_spark.table_lock(quarantine_path):
        return _build(spark, settings, contract, silver_path, quarantine_path, gate)


def _build(
    spark: SparkSession,
    settings: Settings,
    contract: Contract,
    silver_path: Location,
    quarantine_path: Location,
    gate: Gate | None,
) -> SilverResult:
    from pyspark.sql import functions as F

    store = DeltaStore(spark)
    bronze_path = settings.bronze_path(contract.topic)
    head = store.version(bronze_path)
    consumed = store.transaction_version(silver_path, source_app(contract))
    start = 0 if consumed is None else consumed + 1
    if head is None or start > head:
        return SilverResult(contract.stream, None)

    changes = store.changes(bronze_path, start, head).filter(F.col("_change_type") == "insert")
    decoded = _decoded(changes, contract)
    txn = Txn(source_app(contract), head)
    source = {"table": f"bronze.{contract.topic}", "versions": [start, head]}
    meta: dict[str, Any] = {"lakehouse.source": source}
    n_good, reasons = _split_counts(decoded)
    decoded, verdict = _judge(decoded, contract, gate, source, at_most=n_good)
    if verdict is not None and verdict.to_quarantine:  # the gate routed some: count again
        n_good, reasons = _split_counts(decoded)
    n_bad = sum(reasons.values())
    good = stream_rows(decoded, contract)
    bad = quarantine_rows(decoded, changes, verdict)
    quarantined = store.transaction_version(quarantine_path, source_app(contract))
    if n_bad and quarantined is not None and quarantined >= start:
        # A run died between the quarantine's commit and the stream's: the quarantine already
        # holds the bad records of bronze versions start..quarantined. Bronze may have moved on
        # since, so this batch is larger and its Txn newer: append only the records not there.
        held = store.read(quarantine_path).select(*RECORD_KEY)
        bad = bad.join(held, RECORD_KEY, "left_anti")
        n_bad = bad.count()
        reasons = {} if n_bad == 0 else _reason_counts(bad)
    if n_bad:
        delta_spark.append(bad, quarantine_path, txn=txn, metadata=meta, create=bad.schema)
    # The registry (checked when the job started) has allowed the contract's schema: new
    # optional fields become new columns; columns the contract dropped are written as nulls.
    # The gate's verdict is the one that routed the rows.
    result = delta_spark.append(
        good,
        silver_path,
        txn=txn,
        metadata=meta,
        schema_mode="add_columns",
        create=stream_schema(contract),
        gate=gate,
        verdict=verdict,
    )
    decoded.unpersist()
    return SilverResult(
        contract.stream,
        (start, head),
        n_good,
        n_bad,
        result.committed,
        result.table_version,
        reasons,
    )


def _split_counts(decoded: DataFrame) -> tuple[int, dict[str, int]]:
    """How many of the batch's records go to the stream, and how many to quarantine by reason
    kind (:func:`~lakehouse.quality.ledger.reason_kind`): one Spark job over the cached batch,
    not one per output."""
    counts = _grouped_reasons(decoded, "_reason")
    good = counts.pop(None, 0)
    return good, count_reasons((r, n) for r, n in counts.items() if r is not None)


def _reason_counts(bad: DataFrame) -> dict[str, int]:
    """Quarantine rows counted by reason kind."""
    return count_reasons(
        (r, n) for r, n in _grouped_reasons(bad, "reason").items() if r is not None
    )


def _grouped_reasons(rows: DataFrame, column: str) -> dict[str | None, int]:
    """Rows counted by their reason's text up to its first ": " (what follows names the value
    found, different in each record), null for a good row."""
    from pyspark.sql import functions as F

    cut = F.substring_index(F.col(column), ": ", 1).alias("r")
    return {
        row["r"]: int(row["n"]) for row in rows.groupBy(cut).agg(F.count("*").alias("n")).collect()
    }


def _decoded(changes: DataFrame, contract: Contract) -> DataFrame:
    """Bronze records decoded by the contract, cached once for both outputs. The raw bytes are
    kept for records that did not decode only: they are most of a record's size, and the rest
    do not need them (the few that a quarantine expectation routes get theirs from bronze, see
    :func:`quarantine_rows`)."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    decoded = decode(changes, contract)
    bad_row = F.col("_reason").isNotNull()
    return decoded.select(
        *(c for c in decoded.columns if c not in {"key", "value"}),
        F.when(bad_row, F.col("key")).alias("key"),
        F.when(bad_row, F.col("value")).alias("value"),
    ).persist(StorageLevel.DISK_ONLY)  # on disk: see lakehouse.storage.tasks


def _judge(
    decoded: DataFrame,
    contract: Contract,
    gate: Gate | None,
    source: dict[str, Any],
    *,
    at_most: int | None = None,
) -> tuple[DataFrame, Verdict | None]:
    """The gate judges the records that decoded and carry a value (``at_most`` of them, if the
    caller knows a bound); tombstones (deletes) pass through. A failed `fail` expectation raises
    here, before anything is written; the records failing a `quarantine` expectation are given
    its reason."""
    from pyspark.sql import functions as F

    if gate is None:
        return decoded, None
    judged = stream_rows(decoded, contract).filter(~F.col(TOMBSTONE))
    verdict = gate.check(judged, source=source, at_most=(at_most, None))
    if verdict.to_quarantine:
        routed = F.when(~F.col(TOMBSTONE), gate.quarantine_reason(verdict.to_quarantine))
        decoded = decoded.withColumn("_reason", F.coalesce(F.col("_reason"), routed))
    return decoded, verdict


RECORD_KEY = ["partition", "offset"]


@dataclass
class ReprocessResult:
    """A reprocess of bronze records the stream has already consumed (see :func:`reprocess`)."""

    stream: str
    scope: str
    candidates: int = 0  # records in scope that are not in the stream
    recovered: int = 0  # of which now decode and joined the stream
    quarantined: int = 0  # of which still fail and were not in quarantine yet
    released: int = 0  # quarantine rows removed because their record is now in the stream
    held: int = 0  # dry run: how many of the candidates are in quarantine now
    dry_run: bool = False

    def summary(self) -> str:
        head = f"silver {self.stream}: reprocess of {self.scope}"
        if self.dry_run:
            return (
                f"{head} (dry run): would decode again {self.candidates} record(s) not in the "
                f"stream, {self.held} of them in quarantine now; nothing changed"
            )
        return (
            f"{head}: {self.candidates} record(s) not in the stream decoded again: "
            f"{self.recovered} joined the stream, {self.quarantined} newly quarantined, "
            f"{self.released} released from quarantine"
        )


def reprocess(
    spark: SparkSession,
    settings: Settings,
    contract: Contract,
    *,
    from_version: int | None = None,
    from_offsets: Mapping[int, int] | None = None,
    dry_run: bool = False,
    gate: Gate | None = None,
) -> ReprocessResult:
    """Decode again the bronze records the stream has consumed from bronze version
    ``from_version``, or from an offset per partition (other partitions untouched).

    A stream is append-only and its records are immutable, so a record already in the stream
    stays as it is; the records in scope that are not (those in quarantine, after a contract or
    decoder fix) are decoded and gated again. The ones that now pass are appended (as late
    arrivals: gold tables take them by their offsets and event times, as Kafka Streams would)
    and leave the quarantine; the ones that still fail stay in it, once. Idempotent: a rerun, or
    a rerun after a crash between the two tables' commits, finds the records in the stream and
    only finishes the release."""
    silver_path = settings.silver_path(contract.stream)
    quarantine_path = settings.quarantine_path("silver", contract.stream)
    with delta_spark.table_lock(silver_path), delta_spark.table_lock(quarantine_path):
        return _reprocess(
            spark, settings, contract, from_version, from_offsets or {}, dry_run=dry_run, gate=gate
        )


def _reprocess(
    spark: SparkSession,
    settings: Settings,
    contract: Contract,
    from_version: int | None,
    from_offsets: Mapping[int, int],
    *,
    dry_run: bool,
    gate: Gate | None,
) -> ReprocessResult:
    from pyspark.sql import functions as F

    store = DeltaStore(spark)
    bronze_path = settings.bronze_path(contract.topic)
    silver_path = settings.silver_path(contract.stream)
    quarantine_path = settings.quarantine_path("silver", contract.stream)
    consumed = store.transaction_version(silver_path, source_app(contract))
    start = from_version or 0
    where = f" from offsets {_offsets_text(from_offsets)}" if from_offsets else ""
    scope = f"bronze.{contract.topic} versions {start}..{consumed}{where}"
    if consumed is None or start > consumed:
        scope = f"bronze.{contract.topic} from version {start}{where} (not consumed yet)"
        return ReprocessResult(contract.stream, scope, dry_run=dry_run)

    rows = store.changes(bronze_path, start, consumed).filter(F.col("_change_type") == "insert")
    done = store.read(silver_path).select(*RECORD_KEY)
    if from_offsets:
        # The stream's side of the anti join is cut to the same offsets as the records.
        in_scope = functools.reduce(
            lambda a, b: a | b,
            [
                (F.col("partition") == p) & (F.col("offset") >= o)
                for p, o in sorted(from_offsets.items())
            ],
        )
        rows, done = rows.filter(in_scope), done.filter(in_scope)
    todo = rows.join(done, RECORD_KEY, "left_anti")
    held = (
        store.read(quarantine_path).select(*RECORD_KEY).distinct()
        if DeltaStore.exists(quarantine_path)
        else None
    )
    if dry_run:
        todo = todo.cache()
        n_held = 0 if held is None else todo.join(held, RECORD_KEY, "left_semi").count()
        planned = ReprocessResult(contract.stream, scope, todo.count(), held=n_held, dry_run=True)
        todo.unpersist()
        return planned

    decoded = _decoded(todo, contract)
    source: dict[str, Any] = {"table": f"bronze.{contract.topic}", "versions": [start, consumed]}
    if from_offsets:
        source["offsets"] = {str(p): o for p, o in sorted(from_offsets.items())}
    decoded, verdict = _judge(decoded, contract, gate, source)
    meta: dict[str, Any] = {"lakehouse.reprocess": source}
    good = stream_rows(decoded, contract)
    bad = quarantine_rows(decoded, todo, verdict)
    if held is not None:
        bad = bad.join(held, RECORD_KEY, "left_anti")
    n_todo, n_good, n_bad = decoded.count(), good.count(), bad.count()
    # The stream first: a crash before the quarantine's release leaves a record in both, which
    # the rerun's release removes (never a record in neither).
    if n_good:
        delta_spark.append(
            good, silver_path, metadata=meta, schema_mode="add_columns", gate=gate, verdict=verdict
        )
    if n_bad:
        delta_spark.append(bad, quarantine_path, metadata=meta, create=bad.schema)
    released = 0
    if is_table(quarantine_path):
        in_stream = (
            store.read(quarantine_path)
            .select(*RECORD_KEY)
            .join(store.read(silver_path).select(*RECORD_KEY), RECORD_KEY, "left_semi")
            .distinct()
        )
        released = delta_spark.delete_matching(
            in_stream, quarantine_path, on=RECORD_KEY, metadata=meta
        )
    decoded.unpersist()
    return ReprocessResult(contract.stream, scope, n_todo, n_good, n_bad, released)


def _offsets_text(offsets: Mapping[int, int]) -> str:
    return ",".join(f"{p}:{o}" for p, o in sorted(offsets.items()))
