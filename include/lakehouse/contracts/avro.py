"""Avro values in the Confluent wire format: schemas to silver columns, compatibility, decoding.

A Confluent-framed value is one magic byte 0, the writer's schema id as a 4-byte big-endian int,
then the Avro binary record. Contracts list a topic's schemas by id, oldest first; the last one
is the *reader* schema, so every record decodes into the latest shape by Avro's resolution rules.
A contract whose value is written through a schema registry names its reader schema alone; the
writers' schemas by id come from the registry (:mod:`lakehouse.contracts.confluent`).

This module runs at contract load time and inside Spark Python workers (``mapInArrow``), so it
must stay free of Spark, Delta and GX imports. Apache's ``avro`` package is only needed to check
compatibility and is imported there, lazily: fastavro alone decodes.
"""

from __future__ import annotations

import io
import json
import re
import struct
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeAlias

import fastavro
from fastavro.read import SchemaResolutionError
from fastavro.types import Schema

# The module, not its names: contracts imports this module, possibly while itself loading.
from lakehouse.contracts.fields import (
    MAX_DECIMAL_PRECISION,
    Field,
    FieldType,
    at_scale,
    decimal_problem,
    unscaled,
)
from lakehouse.errors import ContractError

if TYPE_CHECKING:
    import pyarrow as pa


ParsedSchema: TypeAlias = Schema
"""What ``fastavro.parse_schema`` returns; parse once and reuse, parsing is not free."""

MAGIC = 0
_HEADER = struct.Struct(">bI")  # magic byte, schema id
_HEADER_SIZE = _HEADER.size


def wire_header(
    raw: bytes, part: str, fmt: str, least: int = _HEADER.size
) -> tuple[int, None] | tuple[None, str]:
    """The writer schema's id in a key's or value's Confluent wire-format header (magic byte 0,
    a 4-byte big-endian id), or why there is none: shorter than ``least`` bytes (the format's
    smallest record), or another first byte. ``fmt`` names the format in the reason (Avro,
    JSON Schema, Protobuf)."""
    if len(raw) < least:
        return None, f"{part} is too short for the Confluent {fmt} wire format ({len(raw)} bytes)"
    if raw[0] != MAGIC:
        return None, (
            f"{part} does not start with the {fmt} wire-format magic byte 0 (found 0x{raw[0]:02x})"
        )
    return int(_HEADER.unpack_from(raw)[1]), None


# Avro types a silver column can hold, and the column type each becomes.
_PRIMITIVES: dict[str, FieldType] = {
    "string": "string",
    "int": "int",
    "long": "long",
    "float": "double",
    "double": "double",
    "boolean": "boolean",
}
_TIMESTAMP_UNITS = ("timestamp-millis", "timestamp-micros")
_SUPPORTED = (
    "string, int, long, float, double, boolean, enum, a long with logical type "
    "timestamp-millis/-micros or bytes with logical type decimal, optionally in a union with null"
)


def _arrow_type(column: Field) -> pa.DataType:
    """The Arrow type of a column (pyarrow is imported here, not at contract load)."""
    import pyarrow as pa

    if column.type == "decimal":
        assert column.precision is not None and column.scale is not None
        return pa.decimal128(column.precision, column.scale)
    return {
        "string": pa.string(),
        "int": pa.int32(),
        "long": pa.int64(),
        "double": pa.float64(),
        "boolean": pa.bool_(),
        "timestamp": pa.timestamp("us", tz="UTC"),
    }[column.type]


_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_REASON_LIMIT = 300  # exception texts can embed whole schemas; a reason should stay readable

_AVRO_NAME_BAD = re.compile(r"[^A-Za-z0-9_]")


def encode(schema_id: int, schema: ParsedSchema, record: Any) -> bytes:
    """Frame ``record`` as a Confluent Avro value: what a registry-aware producer sends."""
    out = io.BytesIO()
    out.write(_HEADER.pack(MAGIC, schema_id))
    fastavro.schemaless_writer(out, schema, record)
    return out.getvalue()


def parse(schema_json: Any, file: str, path: str) -> ParsedSchema:
    """Validate an Avro schema (the JSON as loaded: dict, list or type name) and parse it."""
    return _parse(schema_json, file, path, expand=False)


def _parse(schema_json: Any, file: str, path: str, *, expand: bool) -> ParsedSchema:
    try:
        return fastavro.parse_schema(schema_json, expand=expand)
    except Exception as exc:  # fastavro raises several unrelated types for bad schemas
        raise ContractError(file, path, f"not a valid Avro schema: {exc}") from exc


class _Unsupported(Exception):
    """A type no silver column can hold; carries its description."""


def _scalar_type(name: str, avro_type: Any) -> Field:
    """The column ``name`` of one non-union Avro type (named references already expanded)."""
    kind: Any
    logical: Any
    if isinstance(avro_type, str):
        kind, logical = avro_type, None
    elif isinstance(avro_type, dict):
        kind, logical = avro_type.get("type"), avro_type.get("logicalType")
        if kind == "enum":
            return Field(name, "string", False)
    else:
        raise _Unsupported(_describe_json(avro_type))
    if kind == "bytes" and logical == "decimal":
        return _decimal_column(name, avro_type)
    if not isinstance(kind, str) or kind not in _PRIMITIVES:
        raise _Unsupported(_describe_json(avro_type))
    # Decoding ignores logical types (see _strip_logical), so any other than these would reach
    # silver as its raw encoding, e.g. a date as a count of days: refuse it instead.
    if logical is None or (kind == "string" and logical == "uuid"):
        return Field(name, _PRIMITIVES[kind], False)
    if kind == "long" and logical in _TIMESTAMP_UNITS:
        return Field(name, "timestamp", False)
    raise _Unsupported(_describe_json(avro_type))


def _decimal_column(name: str, avro_type: dict[str, Any]) -> Field:
    """A decimal column of a bytes decimal. fastavro checks the scale (0 to the precision, by
    default 0) but not the precision, which must be 1 to 38, as a decimal column's is."""
    precision = avro_type.get("precision")
    if (
        not isinstance(precision, int)
        or isinstance(precision, bool)
        or not 1 <= precision <= MAX_DECIMAL_PRECISION
    ):
        raise _Unsupported(
            f"{_describe_json(avro_type)} with precision {precision!r} (a decimal column has a "
            f"precision of 1 to {MAX_DECIMAL_PRECISION})"
        )
    return Field(name, "decimal", False, precision, avro_type.get("scale", 0))


def _column_type(name: str, avro_type: Any) -> Field:
    """The column ``name`` of an Avro type: a union is accepted only as one type, optionally
    with null (then the column is nullable)."""
    if not isinstance(avro_type, list):
        return _scalar_type(name, avro_type)
    others = [branch for branch in avro_type if branch != "null"]
    if len(others) != 1:
        raise _Unsupported(_describe_json(avro_type))
    column = _scalar_type(name, others[0])
    return Field(name, column.type, len(others) < len(avro_type), column.precision, column.scale)


def _describe_json(avro_type: Any) -> str:
    """A short human name for an Avro type, for error messages."""
    if isinstance(avro_type, list):
        return "union [" + ", ".join(_describe_json(branch) for branch in avro_type) + "]"
    if isinstance(avro_type, dict):
        kind, name, logical = (avro_type.get(k) for k in ("type", "name", "logicalType"))
        if kind in ("record", "enum", "fixed") and name:
            return f"{kind} {name!r}"
        return f"{kind} ({logical})" if logical else str(kind)
    return str(avro_type)


def fields_of(schema_json: Any, file: str, path: str) -> tuple[Field, ...]:
    """The silver columns of a record value schema, in its field order.

    Silver is flat: nested records, arrays, maps, bytes, fixed and unions of several types are
    refused at load time, naming the field, rather than failing in a decode job later.
    """
    schema = _parse(schema_json, file, path, expand=True)
    if not isinstance(schema, dict) or schema.get("type") != "record":
        raise ContractError(
            file, path, f"an Avro value schema must be a record, not {_describe_json(schema)}"
        )
    columns: list[Field] = []
    seen: set[str] = set()
    for i, avro_field in enumerate(schema["fields"]):
        name = avro_field["name"]
        where = f"{path}.fields[{i}]"
        if name in seen:
            raise ContractError(file, where, f"duplicate field name {name!r}")
        seen.add(name)
        try:
            columns.append(_column_type(name, avro_field["type"]))
        except _Unsupported as exc:
            raise ContractError(
                file, where, f"field {name!r} has unsupported Avro type {exc}; use {_SUPPORTED}"
            ) from None
    return tuple(columns)


def primitive_of(schema_json: Any, file: str, path: str) -> FieldType:
    """The column type of a key schema: a single scalar type, optionally in a union with null
    (not a decimal: a key's type has no precision and scale)."""
    schema = _parse(schema_json, file, path, expand=True)
    try:
        column = _column_type("", schema)
    except _Unsupported as exc:
        raise ContractError(
            file, path, f"an Avro key schema must be a {_SUPPORTED}, not {exc}"
        ) from None
    if column.type == "decimal":
        raise ContractError(
            file,
            path,
            "an Avro key schema cannot be a decimal: a key is a string, int, long, float, "
            "double, boolean, enum or timestamp",
        )
    return column.type


def _avro_name(name: str) -> str:
    """``name`` made a valid Avro name: letters, digits and _, not starting with a digit."""
    cleaned = _AVRO_NAME_BAD.sub("_", name)
    return cleaned if cleaned[:1].isalpha() or cleaned[:1] == "_" else f"_{cleaned}"


def record_schema(name: str, fields: Sequence[Field]) -> dict[str, Any]:
    """The Avro record equivalent to columns: lets JSON contracts evolve by Avro's rules.

    Nullable columns default to null, as a registry-minded producer would declare them, so adding
    one is compatible both ways; a new required column is not.
    """
    avro_fields: list[dict[str, Any]] = []
    for field in fields:
        avro_type: Any = field.type
        if field.type == "timestamp":
            avro_type = {"type": "long", "logicalType": "timestamp-micros"}
        elif field.type == "decimal":
            avro_type = {
                "type": "bytes",
                "logicalType": "decimal",
                "precision": field.precision,
                "scale": field.scale,
            }
        if field.nullable:
            avro_fields.append({"name": field.name, "type": ["null", avro_type], "default": None})
        else:
            avro_fields.append({"name": field.name, "type": avro_type})
    return {"type": "record", "name": _avro_name(name), "fields": avro_fields}


# -- compatibility -------------------------------------------------------------------------------

_MODES = frozenset(
    {
        "NONE",
        "BACKWARD",
        "FORWARD",
        "FULL",
        "BACKWARD_TRANSITIVE",
        "FORWARD_TRANSITIVE",
        "FULL_TRANSITIVE",
    }
)


def _apache_schema(schema_json: Any) -> Any:
    import avro.schema

    try:
        return avro.schema.parse(json.dumps(schema_json))
    except Exception as exc:  # SchemaParseException, or JSON that does not serialize
        raise ValueError(f"not a valid Avro schema: {exc}") from exc


def _describe_apache(schema: Any) -> str:
    kind = str(schema.type)
    if kind == "union":
        return "union [" + ", ".join(_describe_apache(branch) for branch in schema.schemas) + "]"
    if kind in ("record", "enum", "fixed"):
        return f"{kind} {schema.fullname!r}"
    if kind == "array":
        return f"array of {_describe_apache(schema.items)}"
    if kind == "map":
        return f"map of {_describe_apache(schema.values)}"
    logical = schema.get_prop("logicalType")
    if logical == "decimal":
        return f"{kind} (decimal({schema.get_prop('precision')},{schema.get_prop('scale') or 0}))"
    return f"{kind} ({logical})" if logical else kind


_DECIMAL_RULE = (
    "a decimal reads only a decimal of the same precision and scale, as Avro's spec says"
)


def _decimal_of(schema: Any) -> tuple[Any, Any] | None:
    """(precision, scale) of an Apache schema that is a decimal, or a union of one with null."""
    if str(schema.type) == "union":
        branches = [b for b in schema.schemas if str(b.type) != "null"]
        return _decimal_of(branches[0]) if len(branches) == 1 else None
    if schema.get_prop("logicalType") != "decimal":
        return None
    return schema.get_prop("precision"), schema.get_prop("scale") or 0


def _decimals_differ(reader: Any, writer: Any) -> bool:
    """Whether a decimal meets anything but a decimal of its precision and scale. Avro's spec
    says two decimals match only then; Apache's checker does not look (AVRO-2078), and the
    bytes alone do not say where the point is."""
    mine, theirs = _decimal_of(reader), _decimal_of(writer)
    return (mine is not None or theirs is not None) and mine != theirs


def _decimal_problems(read: Any, write: Any) -> list[str]:
    """Each field (or the schema itself) whose decimals differ between reader and writer."""
    from avro.compatibility import lookup_writer_field

    if str(read.type) != "record" or str(write.type) != "record":
        if _decimals_differ(read, write):
            return [
                f"{_describe_apache(read)} cannot read {_describe_apache(write)} ({_DECIMAL_RULE})"
            ]
        return []
    problems = []
    for i, reader_field in enumerate(read.fields):
        writer_field = lookup_writer_field(write, reader_field)
        if writer_field is not None and _decimals_differ(reader_field.type, writer_field.type):
            problems.append(_field_problem(i, reader_field, writer_field, _DECIMAL_RULE))
    return problems


def _field_problem(i: int, reader_field: Any, writer_field: Any, why: str) -> str:
    return (
        f"field {reader_field.name!r} (at /fields/{i}) is {_describe_apache(reader_field.type)} "
        f"and cannot read {_describe_apache(writer_field.type)} ({why})"
    )


def _detail(result: Any) -> str:
    """The checker's own words for one failed comparison, made a little more self-explanatory."""
    from avro.compatibility import SchemaIncompatibilityType as Kind

    messages = sorted(result.messages)
    if len(result.incompatibilities) == 1 and len(messages) == 1:
        kind, message = result.incompatibilities[0], messages[0]
        if kind is Kind.missing_enum_symbols:
            return f"the reader's enum lacks symbols {message}"
        if kind is Kind.reader_field_missing_default_value:
            return f"nested field {message!r} has no default"
        if kind is Kind.name_mismatch:
            return f"type names differ ({message})"
        if kind is Kind.fixed_size_mismatch:
            return f"fixed sizes differ ({message})"
    return "; ".join(messages)


def compatibility_problems(reader: Any, writer: Any) -> list[str]:
    """Why data written with schema ``writer`` cannot be read with ``reader`` ([] if it can).

    The verdict is Apache Avro's own checker, the rules a schema registry applies, and the
    rule of Avro's spec it leaves out: decimals match only with the same precision and scale
    (:func:`_decimals_differ`). The checker's result pools messages and locations into
    unordered sets (and loses the location under unions), so for records the problems are
    re-derived field by field to say which field fails and why.
    """
    from avro.compatibility import (
        ReaderWriterCompatibilityChecker,
        SchemaCompatibilityType,
        lookup_writer_field,
        schema_name_equals,
    )

    read, write = _apache_schema(reader), _apache_schema(writer)
    result = ReaderWriterCompatibilityChecker().get_compatibility(read, write)
    if result.compatibility is not SchemaCompatibilityType.incompatible:
        return _decimal_problems(read, write)
    problems: list[str] = []
    if str(read.type) == "record" and str(write.type) == "record":
        if not schema_name_equals(read, write):
            problems.append(
                f"the record is named {read.fullname!r} but the data was written as "
                f"{write.fullname!r} (list the old name in the record's aliases)"
            )
        for i, reader_field in enumerate(read.fields):
            at = f"field {reader_field.name!r} (at /fields/{i})"
            writer_field = lookup_writer_field(write, reader_field)
            if writer_field is None:
                if not reader_field.has_default:
                    problems.append(
                        f"{at} has no default, so data written without it cannot be read"
                    )
                continue
            field_result = ReaderWriterCompatibilityChecker().get_compatibility(
                reader_field.type, writer_field.type
            )
            if field_result.compatibility is SchemaCompatibilityType.incompatible:
                problems.append(
                    _field_problem(i, reader_field, writer_field, _detail(field_result))
                )
            elif _decimals_differ(reader_field.type, writer_field.type):
                problems.append(_field_problem(i, reader_field, writer_field, _DECIMAL_RULE))
    if not problems:  # not records, or a rule the field walk does not mirror
        problems.append(
            f"{_describe_apache(read)} cannot read {_describe_apache(write)} ({_detail(result)})"
        )
    return problems


def check_compatibility(mode: str, new: Any, previous: Sequence[Any]) -> list[str]:
    """Problems with adding schema ``new`` after ``previous`` (oldest first) under ``mode``.

    Modes are the schema registry's: BACKWARD means consumers on ``new`` read data written with
    the latest previous schema, FORWARD that consumers still on it read data written with
    ``new``, FULL both; the _TRANSITIVE variants check every previous version, not only the
    latest. Versions are numbered from 1 in list order, ``new`` being ``len(previous) + 1``.
    """
    normalized = mode.upper()
    if normalized not in _MODES:
        raise ValueError(f"unknown compatibility mode {mode!r}; use one of {sorted(_MODES)}")
    if normalized == "NONE" or not previous:
        return []
    new_version = len(previous) + 1
    base = normalized.removesuffix("_TRANSITIVE")
    versions = (
        list(enumerate(previous, start=1))
        if normalized.endswith("_TRANSITIVE")
        else [(len(previous), previous[-1])]
    )
    problems: list[str] = []
    for version, old in versions:
        if base in ("BACKWARD", "FULL"):
            problems.extend(
                f"{normalized}: version {new_version} cannot read data written with "
                f"version {version}: {problem}"
                for problem in compatibility_problems(new, old)
            )
        if base in ("FORWARD", "FULL"):
            problems.extend(
                f"{normalized}: version {version} cannot read data written with "
                f"version {new_version}: {problem}"
                for problem in compatibility_problems(old, new)
            )
    return problems


# -- decoding ------------------------------------------------------------------------------------


def _strip_logical(avro_type: Any) -> tuple[Any, str | None]:
    """``avro_type`` without logical type annotations, and its timestamp unit if it had one.

    Logical types do not change the binary encoding. Decoding without them returns plain ints
    instead of datetimes, which is exact and several times cheaper to turn into Arrow.
    """
    if isinstance(avro_type, list):
        stripped = [_strip_logical(branch) for branch in avro_type]
        unit = next((u for _, u in stripped if u is not None), None)
        return [branch for branch, _ in stripped], unit
    if isinstance(avro_type, dict) and "logicalType" in avro_type:
        logical = avro_type["logicalType"]
        plain = {k: v for k, v in avro_type.items() if k != "logicalType"}
        return plain, logical if logical in _TIMESTAMP_UNITS else None
    return avro_type, None


def _plain_schema(schema_json: Any) -> tuple[Any, dict[str, str]]:
    """The schema with top-level logical types stripped, and its timestamp units.

    Units are keyed by field name for a record, by "" for a scalar (key) schema.
    """
    if isinstance(schema_json, dict) and schema_json.get("type") == "record":
        units: dict[str, str] = {}
        plain_fields = []
        for avro_field in schema_json.get("fields", []):
            plain_type, unit = _strip_logical(avro_field.get("type"))
            plain_fields.append({**avro_field, "type": plain_type})
            if unit is not None:
                units[avro_field["name"]] = unit
        return {**schema_json, "fields": plain_fields}, units
    plain, unit = _strip_logical(schema_json)
    return plain, ({"": unit} if unit is not None else {})


def _decimal_scales(schema_json: Any) -> dict[str, int]:
    """The scale of each decimal field of a record schema, by name."""
    if not isinstance(schema_json, dict) or schema_json.get("type") != "record":
        return {}
    scales = {}
    for avro_field in schema_json.get("fields", []):
        kind = avro_field.get("type")
        branches = kind if isinstance(kind, list) else [kind]
        for branch in branches:
            if isinstance(branch, dict) and branch.get("logicalType") == "decimal":
                scales[avro_field["name"]] = branch.get("scale", 0)
    return scales


def _aliases(schema_json: Any, name: str) -> list[str]:
    """The names a writer may have used for reader field ``name``."""
    if not isinstance(schema_json, dict):
        return [name]
    for avro_field in schema_json.get("fields", []):
        if avro_field.get("name") == name:
            return [name, *avro_field.get("aliases", [])]
    return [name]


def _reason_text(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text if len(text) <= _REASON_LIMIT else text[: _REASON_LIMIT - 1] + "…"


_PADDING = bytes(16)


def _decode_problem(
    exc: Exception, raw: bytes, failed_at: int, entry: tuple[int, ParsedSchema, ParsedSchema | None]
) -> str:
    """Why a framed record did not decode, from what fastavro raised and where it stopped."""
    schema_id, writer, reader = entry
    if isinstance(exc, SchemaResolutionError):
        return (
            f"Avro record written with schema id {schema_id} cannot be read with the latest "
            f"schema: {_reason_text(exc)}"
        )
    if _ran_out(raw, failed_at, writer, reader):
        return (
            f"Avro record is truncated: does not decode with schema id {schema_id} "
            f"(ran out after {len(raw) - _HEADER_SIZE} bytes)"
        )
    # A bad union or enum index, invalid UTF-8, a negative length, ...
    return (
        f"Avro record does not decode with schema id {schema_id}: "
        f"{_reason_text(exc)} ({type(exc).__name__})"
    )


def _ran_out(raw: bytes, failed_at: int, writer: ParsedSchema, reader: ParsedSchema | None) -> bool:
    """Whether decoding failed only for want of bytes.

    fastavro signals a short read as EOFError, IndexError or struct.error depending on the
    type being read, and a bad union index is an IndexError too; so rather than trust the
    exception, retry with padding: a truncated record gets further, a corrupt one does not.
    """
    if failed_at < len(raw):
        return False
    padded = io.BytesIO(raw + _PADDING)
    padded.seek(_HEADER_SIZE)
    try:
        fastavro.schemaless_reader(padded, writer, reader)
    except Exception:
        return padded.tell() > failed_at
    return True


class WireDecoder:
    """Decodes Confluent-framed Avro values of one topic into Arrow, a batch at a time.

    ``writers`` maps each schema id the contract knows (or its registry's subject has: ``known``
    says which in an unknown id's reason) to its schema JSON; ``reader`` is the latest schema,
    whose shape every record takes. With ``fields`` (the reader's silver
    columns) it decodes record values with ``decode``; with ``fields=()`` the reader must be a
    scalar and it decodes keys with ``decode_key``.

    A record that cannot be decoded never fails the batch: its row is null and its reason says
    why, so the caller can route it to quarantine. A null value (a tombstone) is a null row
    with no reason.
    """

    _SOURCE = "<Avro wire decoder>"

    def __init__(
        self,
        writers: Mapping[int, Any],
        reader: Any,
        fields: Sequence[Field],
        *,
        known: str = "the contract knows",
    ) -> None:
        import pyarrow as pa

        self.fields = tuple(fields)
        self.scalar: FieldType | None = None
        if self.fields:
            self._check_fields(reader)
        else:
            self.scalar = primitive_of(reader, self._SOURCE, "reader")

        plain_reader, reader_units = _plain_schema(reader)
        parsed_reader = parse(plain_reader, self._SOURCE, "reader")
        # By wire header: (id, writer, reader or None); None skips resolution for the reader.
        self._by_header: dict[bytes, tuple[int, ParsedSchema, ParsedSchema | None]] = {}
        # Timestamp columns whose raw value needs scaling to micros, with the factor per id.
        self._scales: dict[str, dict[int, int]] = {}
        columns = [f.name for f in self.fields if f.type == "timestamp"]
        if self.scalar == "timestamp":
            columns = [""]
        for schema_id, writer in writers.items():
            plain_writer, writer_units = _plain_schema(writer)
            self._by_header[_HEADER.pack(MAGIC, schema_id)] = (
                schema_id,
                parse(plain_writer, self._SOURCE, f"writers[{schema_id}]"),
                None if writer == reader else parsed_reader,
            )
            for column in columns:
                # The bytes carry the writer's unit; a value the writer lacks is the reader's
                # default, in the reader's unit.
                names = _aliases(reader, column) if column else [""]
                unit = next((writer_units[n] for n in names if n in writer_units), None)
                if (unit or reader_units[column]) == "timestamp-millis":
                    self._scales.setdefault(column, {})[schema_id] = 1000
        # Decimal columns arrive as their bytes: the scale each writer wrote them with, by id.
        self._decimals = {
            f.name: {
                schema_id: _decimal_scales(writer).get(f.name, f.scale or 0)
                for schema_id, writer in writers.items()
            }
            for f in self.fields
            if f.type == "decimal"
        }
        self._known_ids = f"{known} " + (", ".join(str(i) for i in sorted(writers)) or "none")
        self._arrow_fields = [
            pa.field(f.name, _arrow_type(f), nullable=f.nullable) for f in self.fields
        ]

    def _check_fields(self, reader: Any) -> None:
        available = {f.name: f.type_name for f in fields_of(reader, self._SOURCE, "reader")}
        for field in self.fields:
            if available.get(field.name) != field.type_name:
                raise ValueError(
                    f"column {field.name!r} ({field.type_name}) is not a field of that type in "
                    f"the reader schema (it has {available})"
                )

    @property
    def arrow_type(self) -> pa.DataType:
        """The type ``decode`` (a struct) or ``decode_key`` (a scalar) returns."""
        import pyarrow as pa

        if self.scalar is not None:
            return _arrow_type(Field("", self.scalar))
        return pa.struct(self._arrow_fields)

    def decode(self, values: pa.Array) -> tuple[pa.StructArray, pa.StringArray]:
        """Decode a binary array of values: (one struct row per value, reason or null)."""
        import pyarrow as pa

        if self.scalar is not None:
            raise TypeError("this decoder reads scalar (key) schemas: use decode_key")
        decoded, reasons = self._decode(values)
        children = [
            pa.array([None if row is None else row[f.name] for row in decoded], type=_arrow_type(f))
            for f in self.fields
        ]
        mask = pa.array([row is None for row in decoded], type=pa.bool_())
        struct_array = pa.StructArray.from_arrays(children, fields=self._arrow_fields, mask=mask)
        return struct_array, pa.array(reasons, type=pa.string())

    def decode_key(self, values: pa.Array) -> tuple[pa.Array, pa.StringArray]:
        """Decode a binary array of keys: (one typed value per key, reason or null)."""
        import pyarrow as pa

        if self.scalar is None:
            raise TypeError("this decoder reads record schemas: use decode")
        decoded, reasons = self._decode(values, "key")
        kind = _arrow_type(Field("", self.scalar))
        return pa.array(decoded, type=kind), pa.array(reasons, type=pa.string())

    def _decode(self, values: pa.Array, part: str = "value") -> tuple[list[Any], list[str | None]]:
        """One pass over the batch of values (or keys): (record dict / scalar / None per row,
        reason per row)."""
        import pyarrow as pa

        kind = values.type
        if not (
            pa.types.is_binary(kind)
            or pa.types.is_large_binary(kind)
            or pa.types.is_binary_view(kind)
            or pa.types.is_null(kind)
        ):
            raise TypeError(f"Avro values must be a binary Arrow array, not {kind}")
        decoded: list[Any] = []
        reasons: list[str | None] = []
        ids: list[int] = []
        by_header = self._by_header
        read = fastavro.schemaless_reader
        for raw in values.to_pylist():
            value: Any = None
            reason: str | None = None
            schema_id = -1
            if raw is not None:  # a null value is a tombstone: a null row, not an error
                # The whole 5-byte header is the key: one slice and one dict probe per value.
                entry = by_header.get(raw[:_HEADER_SIZE])
                if entry is None:
                    reason = self._framing_problem(raw, part)
                else:
                    schema_id, writer, reader = entry
                    buffer = io.BytesIO(raw)
                    buffer.seek(_HEADER_SIZE)
                    try:
                        value = read(buffer, writer, reader)
                    except Exception as exc:
                        reason = _decode_problem(exc, raw, buffer.tell(), entry)
                    else:
                        if extra := len(raw) - buffer.tell():
                            value = None
                            reason = (
                                f"{extra} unexpected bytes after the Avro record "
                                f"(schema id {schema_id})"
                            )
            decoded.append(value)
            reasons.append(reason)
            ids.append(schema_id)
        if self._scales:
            self._scale_timestamps(decoded, reasons, ids)
        if self._decimals:
            self._read_decimals(decoded, reasons, ids)
        return decoded, reasons

    def _framing_problem(self, raw: bytes, part: str) -> str:
        """Why a value's (or key's) header is not one this decoder knows."""
        schema_id, problem = wire_header(raw, part, "Avro")
        return problem or f"unknown Avro schema id {schema_id} ({self._known_ids})"

    def _read_decimals(self, decoded: list[Any], reasons: list[str | None], ids: list[int]) -> None:
        """Turn decimal columns' bytes (a big-endian two's-complement unscaled number, Avro's
        decimal) into decimals in place; one that does not fit its column nulls the row."""
        for f in self.fields:
            if f.type != "decimal":
                continue
            assert f.precision is not None and f.scale is not None
            scales = self._decimals[f.name]
            for i, row in enumerate(decoded):
                if row is None or (raw := row[f.name]) is None:
                    continue
                value = unscaled(int.from_bytes(raw, "big", signed=True), scales[ids[i]])
                if problem := decimal_problem(value, f.precision, f.scale):
                    decoded[i] = None
                    reasons[i] = (
                        f"decimal field {f.name!r} does not fit {f.type_name} ({problem}): "
                        f"{value:f}"
                    )
                else:
                    row[f.name] = at_scale(value, f.scale)

    def _scale_timestamps(
        self, decoded: list[Any], reasons: list[str | None], ids: list[int]
    ) -> None:
        """Turn timestamp-millis values into micros in place; out of range nulls the row."""
        for column, factors in self._scales.items():
            for i, row in enumerate(decoded):
                if row is None or (factor := factors.get(ids[i])) is None:
                    continue
                raw = row if column == "" else row[column]
                if raw is None:
                    continue
                micros = raw * factor
                if not _INT64_MIN <= micros <= _INT64_MAX:
                    decoded[i] = None
                    what = f"timestamp field {column!r}" if column else "timestamp key"
                    reasons[i] = f"{what} is out of range ({raw} ms)"
                elif column == "":
                    decoded[i] = micros
                else:
                    row[column] = micros
