"""Decoding: bronze records into the typed rows of a stream, by the topic's contract.

:func:`decode` turns bronze rows (raw key and value bytes) into the stream's columns plus a
``_reason`` column: null for a good record, else the first problem found (the key's decoding, then
the value's, then required fields and the event time). JSON and string keys and values decode
with Spark's own functions; Avro (Confluent wire format) decodes in Python workers with fastavro,
the one format Spark has no native reader for. :func:`stream_rows` keeps the good rows in the
stream's schema. Everything here is pure: no paths, no session, no writes.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from lakehouse.contracts.fields import DECIMAL_TEXT, Field
from lakehouse.contracts.model import Contract, RegistrySource
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
    from pyspark.sql import Column, DataFrame

    # One projection of the decoding: new columns by name, or the whole select list.
    Step = dict[str, Column] | list[Column]

# Decoded values and the first decoding problem of each record, before the checks that follow.
_V, _VALUE_ERROR, _K, _KEY_ERROR = "_v", "_value_error", "_k", "_key_error"
_VARIANT = "_variant"  # a JSON value parsed, when its decimal fields need it
# A JSON Schema or Protobuf value written through a schema registry: its bytes as they came,
# and what is wrong with its framing or with it against its writer's schema (the JSON after the
# header, or the message as JSON, is read by the JSON steps as any JSON value is).
_RAW, _FRAME_ERROR = "_raw_value", "_frame_error"
_KEY_RAW, _KEY_FRAME_ERROR = "_raw_key", "_key_frame_error"  # the same of a key
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
    resolution), so the stream always has the latest shape. A key or value written through a
    schema registry needs its contract's writers looked up first
    (:func:`lakehouse.contracts.confluent.resolve`): the ids its subject had then.
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
    value_args = None
    if value_avro:
        known = _known(contract, contract.value_registry, "value")
        value_args = (contract.value_writers, contract.value_schemas[-1].schema, known)
    key_args = None
    if key_avro:
        known = _known(contract, contract.key_registry, "key")
        key_args = (contract.key_writers, contract.key_schemas[-1].schema, known)
    return df.mapInArrow(
        _avro_batches(value_args, key_args, contract.fields), T.StructType(out_fields)
    )


def _known(contract: Contract, source: RegistrySource | None, part: str) -> str:
    """Whose ids an Avro key's or value's are (for the reason of an unknown one)."""
    if source is None:
        return "the contract knows"
    if not source.looked_up:
        raise ValueError(
            f"topic {contract.topic!r}: look its {part}'s writer schemas up first "
            "(lakehouse.contracts.confluent.resolve)"
        )
    return f"subject {source.subject!r} has"


def _avro_batches(
    value_args: tuple[dict[int, Any], Any, str] | None,
    key_args: tuple[dict[int, Any], Any, str] | None,
    fields: tuple[Field, ...],
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa

        from lakehouse.contracts import avro

        values = (
            avro.WireDecoder(*value_args[:2], fields, known=value_args[2]) if value_args else None
        )
        keys = avro.WireDecoder(*key_args[:2], (), known=key_args[2]) if key_args else None
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


def _framed(contract: Contract, part: str = "value") -> bool:
    """Whether the value (or the key) is unframed into JSON text before the JSON steps: JSON
    Schema or Protobuf written through a registry."""
    if part == "key":
        return contract.key_format in ("json", "protobuf") and contract.key_registry is not None
    return contract.value_format in ("json", "protobuf") and contract.value_registry is not None


# Each framed part's column, and the columns of its bytes as they came and of its framing's
# problem.
_FRAMING = {"value": ("value", _RAW, _FRAME_ERROR), "key": ("key", _KEY_RAW, _KEY_FRAME_ERROR)}


def _unframe(df: DataFrame, contract: Contract) -> DataFrame:
    """Keys and values in Confluent's wire format (magic byte 0, the writer schema's id, the
    payload) become JSON text in ``key`` and ``value``, in Python workers, in one pass: a JSON
    Schema payload's text, validated against its writer's schema as Confluent's
    JSONDeserializer does; a Protobuf message, parsed with its writer's descriptors, as the
    JSON of its fields (a key's: of its key field)."""
    from pyspark.sql import types as T

    parts: list[tuple[str, str, dict[int, Any], str, str | None]] = []
    fields = list(df.schema.fields)
    for part in ("value", "key"):
        if not _framed(contract, part):
            continue
        source = contract.value_registry if part == "value" else contract.key_registry
        assert source is not None
        if not source.looked_up:
            raise ValueError(
                f"topic {contract.topic!r}: look its {part}'s writer schemas up first "
                "(lakehouse.contracts.confluent.resolve)"
            )
        writers = contract.value_writers if part == "value" else contract.key_writers
        known = f"subject {source.subject!r} has " + (
            ", ".join(str(i) for i in sorted(writers)) or "none"
        )
        fmt: str = contract.value_format if part == "value" else contract.key_format
        key_field = contract.key_name if part == "key" else None
        parts.append((part, fmt, writers, known, key_field))
        _, raw, error = _FRAMING[part]
        fields += [T.StructField(raw, T.BinaryType(), True), T.StructField(error, T.StringType())]
    return df.mapInArrow(_frames(parts), T.StructType(fields))


def _frames(
    parts: list[tuple[str, str, dict[int, Any], str, str | None]],
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """Each framed part's payload in its column (empty where it cannot be read), its bytes as
    they came and the reason beside."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa

        from lakehouse.contracts.protobuf import WireDecoder

        decoders = {
            part: WireDecoder(writers, known, part, key_field)
            if fmt == "protobuf"
            else _JsonFrames(writers, known, part)
            for part, fmt, writers, known, key_field in parts
        }
        for batch in batches:
            replaced: dict[str, pa.Array] = {}
            added: list[pa.Array] = []
            names: list[str] = []
            for part, decoder in decoders.items():
                column, raw, error = _FRAMING[part]
                payloads: list[bytes | None] = []
                problems: list[str | None] = []
                for given in batch.column(column).to_pylist():
                    payload, problem = (None, None) if given is None else decoder.decode(given)
                    payloads.append(b"" if problem is not None else payload)
                    problems.append(problem)
                replaced[column] = pa.array(payloads, pa.binary())
                added += [batch.column(column), pa.array(problems, pa.string())]
                names += [raw, error]
            columns = [replaced.get(n, batch.column(n)) for n in batch.schema.names]
            yield pa.RecordBatch.from_arrays(
                [*columns, *added], names=[*batch.schema.names, *names]
            )

    return run


class _JsonFrames:
    """Decodes framed JSON Schema payloads: the JSON text after the header, checked against its
    writer's schema (JSON that does not parse is left to the JSON steps to name)."""

    def __init__(self, writers: dict[int, Any], known: str, part: str) -> None:
        from jsonschema import validators

        self._checks = {i: validators.validator_for(s)(s) for i, s in writers.items()}
        self._known = known
        self._part = part

    def decode(self, raw: bytes) -> tuple[bytes | None, str | None]:
        import json

        from jsonschema.exceptions import best_match

        from lakehouse.contracts.avro import wire_header

        part = self._part
        schema_id, problem = wire_header(raw, part, "JSON Schema")
        if schema_id is None:
            return None, problem
        if schema_id not in self._checks:
            return None, f"unknown JSON Schema id {schema_id} ({self._known})"
        payload = raw[5:]
        try:
            instance = json.loads(payload)
        except ValueError:
            return payload, None  # the JSON steps say what is wrong with it
        found = best_match(self._checks[schema_id].iter_errors(instance))
        if found is not None:
            return None, (
                f"{part} does not match JSON Schema id {schema_id} at {found.json_path}: "
                f"{found.message}"
            )
        return payload, None


def decode(bronze: DataFrame, contract: Contract) -> DataFrame:
    """Bronze rows -> typed rows plus a ``_reason`` column (null when the record is good). Pure.

    A null value is a tombstone and is kept (flagged); a null key is kept too: a stream records
    every event, and tables decide what to ignore. ``_reason`` is the first problem found: the
    key's decoding, then the value's, then required fields.
    """
    df = bronze.select(*_BRONZE_INPUT)
    if "avro" in (contract.key_format, contract.value_format):
        df = _decode_avro(df, contract)
    if _framed(contract) or _framed(contract, "key"):
        df = _unframe(df, contract)
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
    raw_value = F.col(_RAW) if _framed(contract) else F.col("value")
    if contract.value_format in ("json", "protobuf"):  # Protobuf: unframed into JSON text
        steps += _json_value_steps(contract)
        if _framed(contract):  # the framing's problem first, then the JSON's
            steps.append({_VALUE_ERROR: F.coalesce(F.col(_FRAME_ERROR), F.col(_VALUE_ERROR))})
    elif contract.value_format == "string":
        steps += _string_value_steps(contract)
    if contract.key_format != "avro":
        steps += _text_key_steps(contract)
        if _framed(contract, "key"):  # as a value's: the framing's problem first
            steps.append({_KEY_ERROR: F.coalesce(F.col(_KEY_FRAME_ERROR), F.col(_KEY_ERROR))})
    raw_key = F.col(_KEY_RAW) if _framed(contract, "key") else F.col("key")

    is_tombstone = raw_value.isNull()
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
    return [
        *steps,
        [*columns, reason, raw_key.alias("key"), raw_value.alias("value"), F.col("topic")],
    ]


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
    """The records of a :func:`decode` output that decoded, in the stream's schema."""
    from pyspark.sql import functions as F

    cols = [f.name for f in stream_schema(contract).fields]
    return decoded.filter(F.col("_reason").isNull()).select(*cols)
