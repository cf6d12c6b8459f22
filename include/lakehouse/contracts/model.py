"""Data contracts: one YAML file per topic, the single place a topic is described.

A contract names the topic and its partition count, the key and value formats and schemas (the
stream is the topic read with this schema), the event-time field, the schema-registry
compatibility mode, the gold tables built from the stream and the expectations of each layer.

A file is read in three steps. The pydantic models of the document (``ContractDoc`` and its
sections) check its shape: keys, types, names, and the keys one key's value requires or refuses.
The platform's view is then built from it: the frozen :class:`Contract` and its parts, with Avro
schemas read from their files and durations in milliseconds. Last come the checks across the
document (fields named, columns that collide, tables read before they exist) and, in a
:class:`Catalog`, across contracts. Each problem is a ContractError naming the file, the path
inside it and what is wrong. The JSON Schema editors use, ``schemas/contract.schema.json``, is
generated from the models: ``python -m lakehouse.contracts.model --write-schema``.

Avro schemas live beside the contract (``.avsc`` files, or inline), listed by their Confluent
schema id, oldest first; the last one is the latest and is the shape of the silver stream.

This module is imported at DAG parse time: it must stay free of Spark, Delta and GX imports
(the Avro helpers are imported only when a contract uses Avro).
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import operator
import re
import sys
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, Self, get_args

import pydantic
import yaml
from pydantic import BaseModel, ConfigDict, PlainValidator, StringConstraints
from pydantic.json_schema import GenerateJsonSchema
from pydantic_core import PydanticCustomError

from lakehouse.contracts.fields import Field, FieldType
from lakehouse.errors import ContractError, UnknownTableError, UnknownTopicError
from lakehouse.runtime.config import IDENTIFIER, IDENTIFIER_RULE, LAYERS

AggFn = Literal[
    "count", "sum", "min", "max", "avg", "count_distinct", "earliest", "latest", "collect"
]
# Aggregations a table source can take back when a key's value changes (KGroupedTable's subtractor).
SUBTRACTABLE = frozenset({"count", "sum", "avg"})
KeyFormat = Literal["string", "json", "avro"]
ValueFormat = Literal["json", "avro", "string"]
Severity = Literal["warn", "quarantine", "fail"]
TableKind = Literal["latest", "aggregate", "join"]
WindowType = Literal["tumbling", "hopping", "session"]
JoinType = Literal["stream-table", "table-table", "stream-stream"]
Expect = Literal[
    "not_null", "unique", "between", "in_set", "match_regex", "length_between", "row_count_between"
]
NUMERIC_TYPES = frozenset({"long", "int", "double"})

# Words delta-rs's SQL reads as values even after a table alias (``t.null``): column names are
# written unquoted into merge predicates, so none may be one of these.
SQL_LITERAL_WORDS = frozenset({"null", "true", "false"})
# Columns every stream carries beside the contract's own; contract fields may not shadow them.
STREAM_METADATA_COLUMNS = ("partition", "offset", "timestamp", "tombstone", "event_time")
# Bronze has the schema of Spark's Kafka source plus ingest metadata.
BRONZE_COLUMNS = (
    "key",
    "value",
    "topic",
    "partition",
    "offset",
    "timestamp",
    "timestampType",
    "headers",
)


# Aggregation and Volume read the same in a file and on the platform: the document's models are
# the types (pydantic dataclasses, so code builds them as it does the other dataclasses).
_LEAF = ConfigDict(extra="forbid", use_attribute_docstrings=True)
Identifier = Annotated[str, StringConstraints(pattern=f"^{IDENTIFIER.pattern}$")]


@pydantic.dataclasses.dataclass(frozen=True, config=_LEAF)
class Aggregation:
    """A column of an aggregate table."""

    name: Identifier
    fn: AggFn
    """count (of records, or of non-null values of 'field'), sum, min, max, avg, count_distinct,
    earliest/latest (the value of the first/last record by offset, ksqlDB's
    EARLIEST_BY_OFFSET/LATEST_BY_OFFSET), collect (every non-null value, in offset order)"""
    field: Identifier | None = None


def aggregate_type(source: Contract, a: Aggregation) -> FieldType:
    """The type of an aggregation's column (``collect`` is a list of its field's type, which has
    no :data:`FieldType`; it is refused where a field type is needed)."""
    if a.fn in {"count", "count_distinct"}:
        return "long"
    if a.fn == "avg":
        return "double"
    f = source.field(a.field or "")
    if a.fn == "sum":
        return "double" if f.type == "double" else "long"
    if f.type == "int" and a.fn in {"min", "max", "earliest", "latest"}:
        return "int"
    return f.type


def canonical_json(schema: Any) -> str:
    """One text per schema, whatever its key order or spacing: what "the same schema" means."""
    return json.dumps(schema, sort_keys=True, separators=(",", ":"))


@dataclass(frozen=True)
class SchemaVersion:
    """One Avro schema of a key or value, by its Confluent schema id."""

    id: int
    schema: Any = field(compare=False)
    file: str | None = None

    @property
    def canonical(self) -> str:
        return canonical_json(self.schema)


@dataclass(frozen=True)
class Expectation:
    """A data-quality expectation on one layer; compiled into a GX suite by the quality gates."""

    layer: Literal["bronze", "silver", "gold"]
    name: str
    expect: str
    severity: Severity
    column: str | None = None
    table: str | None = None
    params: tuple[tuple[str, Any], ...] = ()

    def param(self, name: str, default: Any = None) -> Any:
        return dict(self.params).get(name, default)


@pydantic.dataclasses.dataclass(frozen=True, config=_LEAF)
class Volume:
    """Warn when a batch is more than ``factor`` times, or less than ``1/factor`` of, the median
    size of the last ``history`` batches (once ``min_history`` of them exist)."""

    factor: Annotated[float, pydantic.Strict(), pydantic.Field(gt=1)] = 10.0
    history: Annotated[int, pydantic.Strict(), pydantic.Field(ge=1, le=1000)] = 20
    min_history: Annotated[int, pydantic.Strict(), pydantic.Field(ge=1)] = 5


@dataclass(frozen=True)
class QualityChecks:
    """Checks beside the value expectations, each a warning: freshness and volume."""

    freshness_ms: int | None = None
    volume: Volume | None = None


WINDOW_START, WINDOW_END = "window_start", "window_end"
# What a windowed table's late-records side table adds to the stream's columns.
WINDOW_LATE_COLUMNS = (WINDOW_START, WINDOW_END, "stream_time", "reason")
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def duration_ms(text: str) -> int:
    """``5m`` -> 300000; the schema has already checked the form."""
    number = text.rstrip("smhd")
    return int(number) * _UNIT_MS[text[len(number) :]]


@dataclass(frozen=True)
class Window:
    """An event-time window (Kafka Streams' TimeWindows and SessionWindows), in milliseconds.

    Tumbling windows are hopping windows whose advance is their size. A record is late, and goes
    to the table's late-records side table, once its window has closed: the window's end plus
    the grace period is at or before the stream time (the largest event time seen so far).
    """

    type: WindowType
    size_ms: int = 0
    advance_ms: int = 0
    gap_ms: int = 0
    grace_ms: int = 0


@dataclass(frozen=True)
class Join:
    """A join with another topic's stream or table (:class:`JoinDoc` describes the kinds)."""

    type: JoinType
    other: str  # the other topic
    fields: tuple[str, ...]
    how: Literal["inner", "left"] = "inner"
    on: str | None = None  # this side's field matched against the other key; None: the key
    prefix: str = ""
    within_ms: int = 0

    def column(self, field_name: str) -> str:
        """The output column of one of the other side's fields."""
        return self.prefix + field_name


@dataclass(frozen=True)
class TableSpec:
    """A gold table: an aggregated stream (KTable).

    An ``aggregate`` groups by the record key, or re-keys by a value field (``group_by``). Its
    ``source`` is the ``stream`` (every event counts, KGroupedStream) or the stream read as a
    ``table`` (only each key's latest value counts: an update takes back the old value and adds
    the new one, KGroupedTable).
    """

    name: str
    kind: TableKind
    aggregations: tuple[Aggregation, ...] = ()
    description: str = ""
    group_by: str | None = None
    source: Literal["stream", "table"] = "stream"
    window: Window | None = None
    join: Join | None = None
    changelog: str | None = None  # another table of the contract whose changelog is the input


# Client settings that carry credentials: named in a contract's kafka.secrets (an environment
# variable each), never written in it.
SECRET_SETTING = re.compile(r"password|secret|jaas|credential|token|private|\.key\.pem|\.key$")
# Settings the platform owns: where the broker is, how offsets are tracked and records decoded.
OWNED_SETTINGS = frozenset(
    {
        "bootstrap.servers",
        "group.id",
        "enable.auto.commit",
        "auto.offset.reset",
        "key.deserializer",
        "value.deserializer",
        "key.serializer",
        "value.serializer",
    }
)


@dataclass(frozen=True)
class KafkaSource:
    """A topic read from a Kafka broker (the contract's ``kafka`` section)."""

    topic: str
    bootstrap_servers: str | None = None
    properties: tuple[tuple[str, str], ...] = ()
    secrets: tuple[tuple[str, str], ...] = ()  # client setting -> environment variable
    on_data_loss: Literal["fail", "record"] = "fail"


@dataclass(frozen=True)
class Contract:
    topic: str
    partitions: int
    key_format: KeyFormat
    key_name: str
    value_format: ValueFormat
    fields: tuple[Field, ...]
    stream: str
    tables: tuple[TableSpec, ...] = ()
    key_type: FieldType = "string"
    key_schemas: tuple[SchemaVersion, ...] = ()
    value_schemas: tuple[SchemaVersion, ...] = ()
    event_time: str | None = None
    compatibility: str = "BACKWARD"
    expectations: tuple[Expectation, ...] = ()
    quality: QualityChecks = QualityChecks()
    schedule_minutes: int = 5
    landing_format: Literal["envelope", "connect_json"] = "envelope"
    max_record_bytes: int = 1_048_576
    kafka: KafkaSource | None = None
    description: str = ""
    owner: str = "data-platform"
    source: str = field(default="<memory>", compare=False)

    @property
    def bronze_name(self) -> str:
        return self.topic

    @property
    def columns(self) -> tuple[str, ...]:
        """The stream's own columns: the key, then the value's fields."""
        return (self.key_name, *(f.name for f in self.fields))

    def value_avro_schema(self) -> Any:
        """The value's latest schema in Avro's terms, as the schema registry compares it."""
        from lakehouse.contracts import avro

        if self.value_format == "avro":
            return self.value_schemas[-1].schema
        if self.value_format == "string":
            return ["null", "string"]
        return avro.record_schema(self.stream, self.fields)

    def key_avro_schema(self) -> Any:
        if self.key_format == "avro":
            return self.key_schemas[-1].schema
        return self.key_type

    def expectations_of(self, layer: str) -> tuple[Expectation, ...]:
        return tuple(e for e in self.expectations if e.layer == layer)

    def expectations_for(self, layer: str, table: str) -> tuple[Expectation, ...]:
        """The expectations gating one published table (gold ones name their table)."""
        mine = self.expectations_of(layer)
        return tuple(e for e in mine if e.table == table) if layer == "gold" else mine

    def published_tables(self, layer: str) -> list[str]:
        """The tables a layer of this topic publishes: the topic, the stream, the gold tables."""
        if layer == "bronze":
            return [self.topic]
        if layer == "silver":
            return [self.stream]
        return [t.name for t in self.tables]

    def input(self, spec: TableSpec) -> Contract:
        """The stream a table reads: the topic's stream, or another table's changelog read as a
        stream (:meth:`changelog_stream`)."""
        if spec.changelog is None:
            return self
        return self.changelog_stream(self.table(spec.changelog))

    def changelog_stream(self, spec: TableSpec) -> Contract:
        """A table turned back into a stream: its changelog, keyed by the table's key, with the
        table's other columns as the value; a deleted row is a tombstone."""
        source = self.input(spec)
        key = self.table_key(spec)
        if spec.kind == "latest":
            key_type, fields = source.key_type, source.fields
        else:
            key_type = source.key_type if key == source.key_name else source.field(key).type
            fields = tuple(
                Field(a.name, aggregate_type(source, a), nullable=True) for a in spec.aggregations
            )
        return Contract(
            topic=f"{self.topic}:{spec.name}",
            partitions=1,
            key_format="string",
            key_name=key,
            key_type=key_type,
            value_format="json",
            fields=fields,
            stream=spec.name,
            source=f"{self.source} (changelog of {spec.name})",
        )

    def table_key(self, spec: TableSpec) -> str:
        """The key column of a gold table: the record key, or the field it is re-keyed by."""
        return spec.group_by or self.input(spec).key_name

    def table_key_columns(self, spec: TableSpec) -> tuple[str, ...]:
        """The columns that identify a row of a gold table."""
        if spec.window is not None:
            return (self.table_key(spec), WINDOW_START, WINDOW_END)
        if spec.join is not None and spec.join.type == "stream-table":
            return ("partition", "offset")
        if spec.join is not None and spec.join.type == "stream-stream":
            j = spec.join
            return ("partition", "offset", j.column("partition"), j.column("offset"))
        return (self.table_key(spec),)

    def table_columns(self, spec: TableSpec) -> tuple[str, ...]:
        """A gold table's visible columns (hidden state columns start with ``__``)."""
        source = self.input(spec)
        if spec.kind == "latest":
            return source.columns
        if spec.join is not None:
            j = spec.join
            taken = tuple(j.column(f) for f in j.fields)
            if j.type == "table-table":
                return (*source.columns, *taken)
            if j.type == "stream-table":
                return (*source.columns, *taken, "partition", "offset", "timestamp", "event_time")
            mine = ("partition", "offset", "event_time")
            return (*source.columns, *taken, *mine, *(j.column(c) for c in mine))
        return (*self.table_key_columns(spec), *(a.name for a in spec.aggregations))

    def field(self, name: str) -> Field:
        for f in self.fields:
            if f.name == name:
                return f
        raise KeyError(name)

    def table(self, name: str) -> TableSpec:
        for t in self.tables:
            if t.name == name:
                return t
        raise KeyError(name)


# -- The document: what a contract file may say ------------------------------------------------
# Patterns run in pydantic-core's regex engine, where '$' is the end of the text; Python's also
# matches before a final newline, which would let a name ending in a line break reach paths and SQL.
_SEGMENT = "[A-Za-z0-9_][A-Za-z0-9_.-]*"
TopicName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9._-]{1,249}$")]
# A duration: a positive whole number and a unit, ms, s, m, h or d (e.g. 5m).
Duration = Annotated[str, StringConstraints(pattern=r"^[1-9][0-9]*(ms|s|m|h|d)$")]
# Each segment of the path starts with a letter, digit or '_': none is '.' or '..'.
AvroFile = Annotated[str, StringConstraints(pattern=rf"^{_SEGMENT}(/{_SEGMENT})*\.avsc$")]


def _problem(text: str) -> PydanticCustomError:
    """A problem in the contract's words (pydantic's own messages are translated instead)."""
    return PydanticCustomError("contract", "{text}", {"text": text})


def _of_type(*kinds: type) -> PlainValidator:
    """Exactly these YAML types: ``true`` is no number and ``1`` no text here."""

    def check(value: Any) -> Any:
        if type(value) not in kinds:
            names = [_JSON_TYPES[k.__name__] for k in kinds if k is not int or float not in kinds]
            raise _problem(f"{value!r} is not of type {_or(names)}")
        return value

    return PlainValidator(check, json_schema_input_type=functools.reduce(operator.or_, kinds))


Number = Annotated[int | float, _of_type(int, float)]
Scalar = Annotated[str | int | float | bool, _of_type(str, int, float, bool)]


def _or(values: Iterable[str]) -> str:
    quoted = [repr(v) for v in values]
    return " or ".join([", ".join(quoted[:-1]), quoted[-1]] if len(quoted) > 1 else quoted)


@dataclass(frozen=True)
class KeyRules:
    """The keys a section requires, refuses or needs one of, by the value of its ``key`` (its
    kind, format or type). Checked when a file is read, and written into the editors' schema."""

    key: str
    requires: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    refuses: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    needs_one_of: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def check(self, section: _Doc) -> None:
        given = {
            f.alias or name
            for name, f in type(section).model_fields.items()
            if name in section.model_fields_set and getattr(section, name) is not None
        }
        value = getattr(section, self.key)
        with_it = f"{self.key} {value!r}"
        for key in self.refuses.get(value, ()):
            if key in given:
                allowed = [
                    v for v in self.values(type(section)) if key not in self.refuses.get(v, ())
                ]
                raise _problem(
                    f"{key!r} is not allowed with {with_it} (only allowed with {self.key} "
                    f"{_or(allowed)})"
                )
        for key in self.requires.get(value, ()):
            if key not in given:
                raise _problem(f"{key!r} is a required property with {with_it}")
        choices = self.needs_one_of.get(value, ())
        if choices and not given & set(choices):
            raise _problem(f"{with_it} needs {_or(choices)}")

    def values(self, section: type[_Doc]) -> tuple[str, ...]:
        return get_args(section.model_fields[self.key].annotation)

    def json_schema(self, schema: dict[str, Any], section: type[_Doc]) -> None:
        """The same rules in JSON Schema's words: if the key has this value, then ..."""
        cases = []
        for value in self.values(section):
            then: dict[str, Any] = {}
            if value in self.requires:
                then["required"] = list(self.requires[value])
            if value in self.refuses:
                then["not"] = {"anyOf": [{"required": [k]} for k in self.refuses[value]]}
            if value in self.needs_one_of:
                then["anyOf"] = [{"required": [k]} for k in self.needs_one_of[value]]
            if then:
                when = {"properties": {self.key: {"const": value}}, "required": [self.key]}
                cases.append({"if": when, "then": then})
        schema["allOf"] = cases


def _rules_schema(schema: dict[str, Any], section: type[Any]) -> None:
    if section.rules is not None:
        section.rules.json_schema(schema, section)


class _Doc(BaseModel):
    """A section of a contract file. Unknown keys are refused, values keep YAML's types (no '5'
    for 5), an optional key set to null counts as left out."""

    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        strict=True,
        use_attribute_docstrings=True,
        json_schema_extra=_rules_schema,
    )
    rules: ClassVar[KeyRules | None] = None

    @pydantic.model_validator(mode="after")
    def _follow_rules(self) -> Self:
        if self.rules is not None:
            self.rules.check(self)
        return self


class SchemaVersionDoc(_Doc):
    """An Avro schema by its Confluent schema id: a file beside the contract, or inline. Listed
    oldest first; the last one is the latest (the reader schema)."""

    model_config = ConfigDict(
        json_schema_extra={"oneOf": [{"required": ["file"]}, {"required": ["schema"]}]}
    )
    id: Annotated[int, pydantic.Field(ge=0, le=2**31 - 1)]
    file: AvroFile | None = None
    schema_: Annotated[Any, _of_type(dict, list, str)] = pydantic.Field(None, alias="schema")

    @pydantic.model_validator(mode="after")
    def _file_or_schema(self) -> Self:
        if (self.file is None) == (self.schema_ is None):
            raise _problem("give either 'file' or 'schema' (one of the two)")
        return self


SchemaVersions = Annotated[list[SchemaVersionDoc], pydantic.Field(min_length=1)]


class KeyDoc(_Doc):
    """The record key: text, a JSON scalar, or Avro."""

    rules = KeyRules(
        "format",
        requires={"avro": ("schemas",), "json": ("type",)},
        refuses={"avro": ("type",), "json": ("schemas",), "string": ("type", "schemas")},
    )
    format: KeyFormat
    name: Identifier
    """The key's column in the stream and the tables."""
    type: Literal["string", "long", "int", "double", "boolean"] | None = None
    """The key's type when format is json (a JSON scalar)."""
    schemas: SchemaVersions | None = None
    description: str = ""


class FieldDoc(_Doc):
    """A field of a JSON value: a column of the stream."""

    name: Identifier
    type: FieldType
    nullable: bool = True
    description: str = ""


class ValueDoc(_Doc):
    """The record value: JSON with the fields listed here, Avro with its schemas, or text."""

    rules = KeyRules(
        "format",
        requires={"json": ("fields",), "avro": ("schemas",), "string": ("name",)},
        refuses={
            "json": ("schemas", "name"),
            "avro": ("fields", "name"),
            "string": ("fields", "schemas"),
        },
    )
    format: ValueFormat
    fields: Annotated[list[FieldDoc], pydantic.Field(min_length=1)] | None = None
    schemas: SchemaVersions | None = None
    name: Identifier | None = None
    """The column holding the whole value when format is string."""
    description: str = ""


class StreamDoc(_Doc):
    """The silver stream: the topic read with the value's schema."""

    name: Identifier
    description: str = ""


class WindowDoc(_Doc):
    """Aggregate per event-time window (Kafka Streams' TimeWindows / SessionWindows). A record
    whose window closed (window end + grace <= stream time) goes to the table's late-records
    side table."""

    rules = KeyRules(
        "type",
        requires={"tumbling": ("size",), "hopping": ("size", "advance"), "session": ("gap",)},
        refuses={
            "tumbling": ("advance", "gap"),
            "hopping": ("gap",),
            "session": ("size", "advance"),
        },
    )
    type: WindowType
    size: Duration | None = None
    """tumbling and hopping: the window length (e.g. 5m; units ms, s, m, h, d)"""
    advance: Duration | None = None
    """hopping: how far each window starts after the previous one"""
    gap: Duration | None = None
    """session: the inactivity gap that ends a session"""
    grace: Duration | None = None
    """how long after a window ends late records are still accepted (default 0)"""


class JoinDoc(_Doc):
    """Join this stream (or table) with another topic's stream or table."""

    rules = KeyRules(
        "type",
        requires={"stream-stream": ("within",)},
        refuses={"stream-table": ("within",), "table-table": ("within",)},
    )
    type: JoinType
    """stream-table: each event enriched with the other topic's value for its key as of the
    event's time (a versioned table); table-table: both topics read as tables, joined by key and
    kept up to date on both sides' changes; stream-stream: pairs of events with the same key whose
    event times are at most 'within' apart"""
    with_: TopicName = pydantic.Field(alias="with")
    """the other topic (its contract must exist)"""
    how: Literal["inner", "left"] = "inner"
    fields: list[Identifier] = pydantic.Field(min_length=1, json_schema_extra={"uniqueItems": True})
    """the other topic's value fields to take"""
    prefix: Annotated[str, StringConstraints(pattern=r"^[a-z_][a-z0-9_]*$")] = ""
    """prepended to the names of the columns taken from the other side"""
    within: Duration | None = None
    """stream-stream: the largest event-time difference of a pair"""
    on_field: Identifier | None = None
    """the value field of this stream matched against the other topic's key (default: this
    stream's key). Not 'on': YAML reads a bare on as true."""

    @pydantic.field_validator("fields")
    @classmethod
    def _once_each(cls, names: list[str]) -> list[str]:
        for name in names:
            if names.count(name) > 1:
                raise _problem(f"{name!r} is listed twice")
        return names


class TableDoc(_Doc):
    """A gold table: each key's latest value, an aggregate of the stream, or a join."""

    rules = KeyRules(
        "kind",
        requires={"aggregate": ("aggregations",), "join": ("join",)},
        refuses={
            "aggregate": ("join",),
            "latest": ("aggregations", "group_by", "source", "window", "join"),
            "join": ("aggregations", "group_by", "source", "window", "changelog"),
        },
    )
    name: Identifier
    description: str = ""
    kind: TableKind
    aggregations: Annotated[list[Aggregation], pydantic.Field(min_length=1)] | None = None
    group_by: Identifier | None = None
    """Re-key the aggregation by this value field (records whose field is null are ignored)."""
    source: Literal["stream", "table"] = "stream"
    """stream: every event counts (KGroupedStream); table: only each key's latest value counts,
    and an update takes back the old value (KGroupedTable)."""
    window: WindowDoc | None = None
    join: JoinDoc | None = None
    changelog: Identifier | None = None
    """Read the changelog of another (earlier) table of this contract as the input stream instead
    of the topic's stream: a table turned back into a stream. Its key is the table's key and a
    deleted row is a tombstone."""


class ExpectationDoc(_Doc):
    """A data-quality expectation, judged on each batch before it is published."""

    rules = KeyRules(
        "expect",
        requires={
            **dict.fromkeys(("not_null", "unique", "between", "length_between"), ("column",)),
            "in_set": ("column", "values"),
            "match_regex": ("column", "pattern"),
        },
        refuses={"row_count_between": ("column",)},
        needs_one_of=dict.fromkeys(
            ("between", "length_between", "row_count_between"), ("min", "max")
        ),
    )
    name: Identifier
    expect: Expect
    column: Annotated[str, StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")] | None = (
        None
    )
    table: Identifier | None = None
    """gold: the table judged"""
    severity: Severity
    """warn records; quarantine routes failing rows aside (silver); fail stops the run, nothing
    published"""
    min: Number | None = None
    max: Number | None = None
    values: Annotated[list[Scalar], pydantic.Field(min_length=1)] | None = None
    pattern: str | None = None
    description: str = ""


class ExpectationsDoc(_Doc):
    """Data-quality expectations per layer, each with a severity."""

    bronze: list[ExpectationDoc] = []
    silver: list[ExpectationDoc] = []
    gold: list[ExpectationDoc] = []


class QualityDoc(_Doc):
    """Checks beside the value expectations, all with severity warn: freshness (no new data for
    longer than an interval) and volume (a batch far outside the usual size)."""

    freshness: Duration | None = None
    """Warn when a layer's table has had no new commit for longer than this."""
    volume: Volume | None = None


class LandingDoc(_Doc):
    """How the topic's segment files are written: 'envelope' JSON lines (the producer's format,
    optionally .json.gz) or 'connect_json', value-only JSON lines as Kafka Connect's JsonFormat
    writes them (keys in <name>.keys.json)."""

    format: Literal["envelope", "connect_json"] = "envelope"
    max_record_bytes: Annotated[int, pydantic.Field(ge=1, le=104_857_600)] = 1_048_576


class KafkaDoc(_Doc):
    """Read the topic from a Kafka broker instead of landing files: bronze ingests its partitions
    with Spark's Kafka source. Secrets never go here: name the environment variables that hold
    them under 'secrets'."""

    topic: TopicName | None = None
    """The broker's topic name (default: this contract's topic)."""
    bootstrap_servers: (
        Annotated[str, StringConstraints(pattern=r"^[^,\s]+:[0-9]+(,[^,\s]+:[0-9]+)*$")] | None
    ) = None
    """host:port[,host:port...] (default: $LAKEHOUSE_KAFKA_BOOTSTRAP_SERVERS, else the broker of
    `lakehouse kafka start`)."""
    properties: dict[str, Annotated[str | int | bool, _of_type(str, int, bool)]] = {}
    """Kafka client settings (librdkafka / Java client names, e.g. security.protocol,
    sasl.mechanism), without secrets."""
    secrets: dict[str, Annotated[str, StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]] = {}
    """Client settings whose values are secret, each mapped to the environment variable that holds
    it (e.g. sasl.password: KAFKA_PASSWORD)."""
    on_data_loss: Literal["fail", "record"] = "fail"
    """Records deleted by the broker's retention before bronze read them: 'fail' the run naming
    the topic, partition and offsets (default), or 'record' the gap in the bronze gaps table and
    go on."""


class ContractDoc(_Doc):
    """One file per topic: its partitions, key/value schema, the stream derived from it and the
    tables built from that stream."""

    model_config = ConfigDict(title="Topic contract")
    topic: TopicName
    description: str = ""
    owner: str = "data-platform"
    partitions: Annotated[int, pydantic.Field(ge=1, le=10_000)] = 1
    schedule_minutes: Annotated[int, pydantic.Field(ge=1, le=1440)] = 5
    compatibility: Literal[
        "BACKWARD",
        "BACKWARD_TRANSITIVE",
        "FORWARD",
        "FORWARD_TRANSITIVE",
        "FULL",
        "FULL_TRANSITIVE",
        "NONE",
    ] = "BACKWARD"
    """Schema-registry compatibility mode for this topic's key and value schemas: a new contract
    version that breaks it is refused before any data moves."""
    event_time: Identifier | None = None
    """The value field holding the event time (a timestamp, or a long of epoch milliseconds).
    Without it, event time is the record's timestamp."""
    landing: LandingDoc | None = None
    kafka: KafkaDoc | None = None
    key: KeyDoc
    value: ValueDoc
    stream: StreamDoc
    tables: list[TableDoc] = []
    expectations: ExpectationsDoc = ExpectationsDoc()
    quality: QualityDoc = QualityDoc()


_JSON_TYPES = {
    "str": "string",
    "string": "string",
    "int": "integer",
    "float": "number",
    "bool": "boolean",
    "list": "array",
    "dict": "object",
    "model": "object",
    "dataclass": "object",
}
_BOUNDS = {
    "greater_than_equal": "is less than the minimum of {ge}",
    "less_than_equal": "is greater than the maximum of {le}",
    "greater_than": "must be greater than {gt}",
    "too_short": "must have at least {min_length} item(s)",
}


def _contract_error(exc: pydantic.ValidationError, source: str) -> ContractError:
    """The first problem in a document, as its author reads it: the path in the file
    (``tables[1].window.size``) and what is wrong there, in the file's words."""
    errors = exc.errors()
    error = errors[0]
    loc, kind, value, ctx = list(error["loc"]), error["type"], error["input"], error.get("ctx", {})
    if loc[-1:] == ["[key]"]:  # a mapping's key is wrong, not its value
        loc.pop()
    if kind in {"missing", "missing_keyword_argument"}:
        problem = f"{loc.pop()!r} is a required property"  # of the section that lacks it
    elif kind in {"extra_forbidden", "unexpected_keyword_argument"}:
        problem = f"unknown key {loc.pop()!r}"
    elif kind == "literal_error":
        problem = f"{value!r} is not one of {ctx['expected']}"
    elif kind == "string_pattern_mismatch":
        problem = f"{value!r} does not match the required pattern {ctx['pattern']}"
    elif kind.endswith("_type") and kind.split("_")[0] in _JSON_TYPES:
        problem = f"{value!r} is not of type {_JSON_TYPES[kind.split('_')[0]]!r}"
    elif kind in _BOUNDS:
        problem = f"{value!r} " + _BOUNDS[kind].format(**ctx)
    else:  # the models' own checks, already in words
        problem = error["msg"]
    path = ""
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    more = f" (and {len(errors) - 1} more problem(s))" if len(errors) > 1 else ""
    return ContractError(source, path, problem + more)


def parse_contract(document: Any, source: str = "<memory>", base: Path | None = None) -> Contract:
    """Validate a parsed YAML document and build a :class:`Contract`, or raise ContractError.

    ``base`` is the folder Avro schema files are read from (the contract's own folder).
    """
    try:
        doc = ContractDoc.model_validate(document)
    except pydantic.ValidationError as exc:
        raise _contract_error(exc, source) from None
    key_schemas = _schema_versions(doc.key.schemas or [], source, "key.schemas", base)
    value_schemas = _schema_versions(doc.value.schemas or [], source, "value.schemas", base)
    key_type: FieldType = doc.key.type or "string"
    if doc.key.format == "avro":
        from lakehouse.contracts import avro

        latest = len(key_schemas) - 1
        key_type = avro.primitive_of(key_schemas[-1].schema, source, f"key.schemas[{latest}]")
    landing = doc.landing or LandingDoc()
    contract = Contract(
        topic=doc.topic,
        partitions=doc.partitions,
        key_format=doc.key.format,
        key_name=doc.key.name,
        key_type=key_type,
        key_schemas=key_schemas,
        value_format=doc.value.format,
        value_schemas=value_schemas,
        fields=_value_fields(doc.value, value_schemas, source),
        stream=doc.stream.name,
        tables=tuple(_table(t) for t in doc.tables),
        event_time=doc.event_time,
        compatibility=doc.compatibility,
        expectations=_expectations(doc.expectations),
        quality=QualityChecks(
            None if doc.quality.freshness is None else duration_ms(doc.quality.freshness),
            doc.quality.volume,
        ),
        schedule_minutes=doc.schedule_minutes,
        landing_format=landing.format,
        max_record_bytes=landing.max_record_bytes,
        kafka=_kafka(doc, source),
        description=doc.description,
        owner=doc.owner,
        source=source,
    )
    _check_semantics(contract)
    return contract


def _ms(duration: str | None) -> int:
    return 0 if duration is None else duration_ms(duration)


def _table(t: TableDoc) -> TableSpec:
    return TableSpec(
        name=t.name,
        kind=t.kind,
        aggregations=tuple(t.aggregations or ()),
        description=t.description,
        group_by=t.group_by,
        source=t.source,
        window=None if t.window is None else _window(t.window),
        join=None if t.join is None else _join(t.join),
        changelog=t.changelog,
    )


def _window(w: WindowDoc) -> Window:
    size = _ms(w.size)
    return Window(w.type, size, _ms(w.advance) or size, _ms(w.gap), _ms(w.grace))


def _join(j: JoinDoc) -> Join:
    return Join(j.type, j.with_, tuple(j.fields), j.how, j.on_field, j.prefix, _ms(j.within))


def _kafka(doc: ContractDoc, source: str) -> KafkaSource | None:
    if doc.kafka is None:
        return None
    if doc.landing is not None:
        raise ContractError(
            source,
            "kafka",
            "a topic has one source: 'landing' (segment files) or 'kafka' (a broker), not both",
        )
    props = {
        k: str(v).lower() if isinstance(v, bool) else str(v)
        for k, v in doc.kafka.properties.items()
    }
    for name in props:
        where = f"kafka.properties.{name}"
        if SECRET_SETTING.search(name):
            raise ContractError(
                source,
                where,
                "looks like a credential: a contract never holds one; name the environment "
                f"variable that does under kafka.secrets ({name}: SOME_VARIABLE)",
            )
        if name in OWNED_SETTINGS:
            raise ContractError(
                source,
                where,
                "is set by the platform"
                + (" (use kafka.bootstrap_servers)" if name == "bootstrap.servers" else ""),
            )
    for name in doc.kafka.secrets:
        if name in props or name in OWNED_SETTINGS:
            raise ContractError(
                source,
                f"kafka.secrets.{name}",
                "is also set in kafka.properties or by the platform",
            )
    return KafkaSource(
        topic=doc.kafka.topic or doc.topic,
        bootstrap_servers=doc.kafka.bootstrap_servers,
        properties=tuple(sorted(props.items())),
        secrets=tuple(sorted(doc.kafka.secrets.items())),
        on_data_loss=doc.kafka.on_data_loss,
    )


def _schema_versions(
    items: list[SchemaVersionDoc], source: str, where: str, base: Path | None
) -> tuple[SchemaVersion, ...]:
    """Load each listed Avro schema (file beside the contract, or inline) and validate it."""
    if not items:
        return ()
    from lakehouse.contracts import avro

    out: list[SchemaVersion] = []
    seen: set[int] = set()
    for i, item in enumerate(items):
        path = f"{where}[{i}]"
        if item.id in seen:
            raise ContractError(source, f"{path}.id", f"schema id {item.id} is listed twice")
        seen.add(item.id)
        schema = item.schema_
        if item.file is not None:
            if base is None:
                raise ContractError(source, f"{path}.file", "schema files need a contract file")
            file = base / item.file
            if not file.resolve().is_relative_to(base.resolve()):  # e.g. through a symlink
                raise ContractError(
                    source, f"{path}.file", f"{item.file!r} is outside the contract's folder"
                )
            try:
                schema = json.loads(file.read_text(encoding="utf-8"))
            except OSError as exc:
                raise ContractError(
                    source, f"{path}.file", f"cannot read {file}: {exc.strerror}"
                ) from None
            except json.JSONDecodeError as exc:
                raise ContractError(
                    source, f"{path}.file", f"{file} is not JSON: {exc.msg} (line {exc.lineno})"
                ) from None
        elif isinstance(schema, str):
            with contextlib.suppress(json.JSONDecodeError):  # else a bare name such as "string"
                schema = json.loads(schema)
        avro.parse(schema, source, path)
        out.append(SchemaVersion(id=item.id, schema=schema, file=item.file))
    return tuple(out)


def _value_fields(
    value: ValueDoc, schemas: tuple[SchemaVersion, ...], source: str
) -> tuple[Field, ...]:
    if value.format == "string":
        assert value.name is not None  # ValueDoc's rules require it
        return (Field(name=value.name, type="string", nullable=True),)
    if value.format == "avro":
        from lakehouse.contracts import avro

        latest = f"value.schemas[{len(schemas) - 1}]"
        return avro.fields_of(schemas[-1].schema, source, latest)
    return tuple(Field(f.name, f.type, f.nullable) for f in value.fields or ())


def _expectations(doc: ExpectationsDoc) -> tuple[Expectation, ...]:
    return tuple(
        Expectation(layer, e.name, e.expect, e.severity, e.column, e.table, _params(e))
        for layer in LAYERS
        for e in getattr(doc, layer)
    )


def _params(e: ExpectationDoc) -> tuple[tuple[str, Any], ...]:
    given = ((k, getattr(e, k)) for k in ("max", "min", "pattern", "values"))
    return tuple((k, tuple(v) if isinstance(v, list) else v) for k, v in given if v is not None)


def _check_semantics(c: Contract) -> None:
    """Rules across the document: names must not collide, fields must exist and fit."""
    if c.topic in {".", ".."}:
        raise ContractError(c.source, "topic", "'.' and '..' are not legal topic names")
    columns = list(c.columns)
    for i, name in enumerate(columns):
        where = "key.name" if i == 0 else f"value.fields[{i - 1}].name"
        if c.value_format == "string" and i == 1:
            where = "value.name"
        elif c.value_format == "avro" and i > 0:
            where = f"value.schemas[{len(c.value_schemas) - 1}].fields[{i - 1}].name"
        if not IDENTIFIER.fullmatch(name):  # Avro field names reach here unchecked
            raise ContractError(c.source, where, f"invalid column name {name!r}: {IDENTIFIER_RULE}")
        if name in SQL_LITERAL_WORDS:
            raise ContractError(c.source, where, _literal_word(name))
        reserved = name in STREAM_METADATA_COLUMNS
        if name == "event_time" and c.event_time == "event_time":
            reserved = False  # the event-time field may itself be called event_time
        if reserved:
            raise ContractError(
                c.source,
                where,
                f"{name!r} is reserved for stream metadata {STREAM_METADATA_COLUMNS}",
            )
        if name in columns[:i]:
            raise ContractError(c.source, where, f"column {name!r} is declared twice")
    if c.event_time is not None:
        try:
            et = c.field(c.event_time)
        except KeyError:
            raise ContractError(
                c.source, "event_time", f"no value field named {c.event_time!r}"
            ) from None
        allowed = ("timestamp",) if et.name == "event_time" else ("timestamp", "long")
        if et.type not in allowed:
            raise ContractError(
                c.source,
                "event_time",
                f"field {et.name!r} is {et.type}; event time must be "
                + " or ".join(f"a {t}" for t in allowed)
                + (" (epoch milliseconds)" if "long" in allowed else ""),
            )
    if c.value_format == "avro" or c.key_format == "avro":
        _check_schema_chain(c)
    _check_tables(c)
    _check_expectations(c)


def _literal_word(name: str) -> str:
    return (
        f"{name!r} cannot name a column: delta-rs's SQL reads s.{name} as a value, so the "
        "table's merge predicates would fail"
    )


def _check_schema_chain(c: Contract) -> None:
    """The listed Avro versions must follow each other under the topic's compatibility mode."""
    from lakehouse.contracts import avro

    for part, versions in (("key", c.key_schemas), ("value", c.value_schemas)):
        for i in range(1, len(versions)):
            try:
                problems = avro.check_compatibility(
                    c.compatibility, versions[i].schema, [v.schema for v in versions[:i]]
                )
            except ValueError as exc:  # Apache's parser is stricter than fastavro's
                raise ContractError(c.source, f"{part}.schemas[{i}]", str(exc)) from None
            if problems:
                raise ContractError(
                    c.source,
                    f"{part}.schemas[{i}]",
                    f"schema id {versions[i].id} breaks {c.compatibility} compatibility: "
                    + "; ".join(problems),
                )


def _check_tables(c: Contract) -> None:
    seen: set[str] = set()
    for ti, t in enumerate(c.tables):
        at = f"tables[{ti}]"
        if t.name in seen:
            raise ContractError(c.source, f"{at}.name", f"table {t.name!r} declared twice")
        if t.changelog is not None:
            _check_changelog_source(c, t, seen, at)
        seen.add(t.name)
        source = c.input(t)
        values = [f.name for f in source.fields]
        if t.group_by is not None and t.group_by not in values:
            raise ContractError(c.source, f"{at}.group_by", f"no value field named {t.group_by!r}")
        if t.window is not None:
            _check_window(c, t, at)
        if t.join is not None:
            if t.join.on is not None and t.join.on not in values:
                raise ContractError(
                    c.source, f"{at}.join.on_field", f"no value field named {t.join.on!r}"
                )
            for name in c.table_columns(t):
                if len(name) > 128:  # the prefix's pattern has no length limit
                    raise ContractError(
                        c.source,
                        f"{at}.join.prefix",
                        f"column {name!r} would be longer than 128 characters",
                    )
            continue
        if t.source == "table":
            for ai, a in enumerate(t.aggregations):
                if a.fn not in SUBTRACTABLE:
                    raise ContractError(
                        c.source,
                        f"{at}.aggregations[{ai}].fn",
                        f"'{a.fn}' cannot aggregate a table: when a key's value changes the "
                        "old value must be taken back, and only "
                        + ", ".join(sorted(SUBTRACTABLE))
                        + " can do that (as with Kafka Streams' KGroupedTable)",
                    )
        out_names: set[str] = set(c.table_key_columns(t))
        for ai, a in enumerate(t.aggregations):
            where = f"{at}.aggregations[{ai}]"
            if a.name in out_names or a.name.startswith("__"):
                raise ContractError(c.source, f"{where}.name", f"column {a.name!r} already exists")
            if a.name in SQL_LITERAL_WORDS:
                raise ContractError(c.source, f"{where}.name", _literal_word(a.name))
            out_names.add(a.name)
            if a.fn == "count" and a.field is None:
                continue
            if a.field is None:
                raise ContractError(c.source, where, f"'{a.fn}' needs a 'field' to aggregate")
            if a.field not in values:
                raise ContractError(c.source, f"{where}.field", f"no value field named {a.field!r}")
            f = source.field(a.field)
            if a.fn in {"sum", "avg"} and f.type not in NUMERIC_TYPES:
                raise ContractError(
                    c.source, f"{where}.field", f"cannot {a.fn} {a.field!r} of type {f.type}"
                )


def _check_changelog_source(c: Contract, t: TableSpec, earlier: set[str], at: str) -> None:
    """A table read as a stream must be an earlier, plainly keyed table of the same contract."""
    name = t.changelog
    if name not in earlier:
        raise ContractError(
            c.source,
            f"{at}.changelog",
            f"no earlier table named {name!r} in this contract (a changelog source must be "
            "declared before the tables that read it)",
        )
    src = c.table(name or "")
    if src.window is not None or src.join is not None:
        raise ContractError(
            c.source,
            f"{at}.changelog",
            f"{name!r} is a {'windowed' if src.window else 'join'} table; only latest and plain "
            "aggregate tables can be read as a stream",
        )
    if any(a.fn == "collect" for a in src.aggregations):
        raise ContractError(
            c.source,
            f"{at}.changelog",
            f"{name!r} has a 'collect' column (a list), which a stream cannot carry",
        )


def _check_join(catalog: Catalog, c: Contract, t: TableSpec, at: str) -> None:
    """A join's other side must exist, have the fields taken, and a key of the matching type."""
    j = t.join
    assert j is not None
    try:
        other = catalog.topic(j.other)
    except UnknownTopicError:
        raise ContractError(
            c.source, f"{at}.with", f"no contract for topic {j.other!r} (known: {catalog.topics})"
        ) from None
    known = [f.name for f in other.fields]
    for fi, name in enumerate(j.fields):
        if name not in known:
            raise ContractError(
                c.source, f"{at}.fields[{fi}]", f"topic {j.other!r} has no value field {name!r}"
            )
    mine = c.key_type if j.on is None else c.field(j.on).type
    if mine != other.key_type:
        raise ContractError(
            c.source,
            f"{at}.on_field" if j.on else at,
            f"{j.on or c.key_name!r} is {mine} but topic {j.other!r} is keyed by {other.key_type}",
        )
    if j.type == "stream-stream" and j.how == "left":
        raise ContractError(
            c.source,
            f"{at}.how",
            "a stream-stream join is inner only: Kafka emits a left join's unmatched events once "
            "their window has closed, which needs a grace period not declared here",
        )
    if j.type == "stream-stream" and not j.prefix:
        raise ContractError(
            c.source,
            f"{at}.prefix",
            "a stream-stream join needs a prefix: both sides have partition, offset and event_time",
        )
    columns = c.table_columns(t)
    for name in columns:
        if columns.count(name) > 1:
            raise ContractError(
                c.source,
                f"{at}.fields",
                f"column {name!r} would appear twice in {t.name!r}; set a 'prefix' for the "
                "columns taken from the other side",
            )


def _check_window(c: Contract, t: TableSpec, at: str) -> None:
    w = t.window
    assert w is not None
    if t.source != "stream":
        raise ContractError(
            c.source,
            f"{at}.window",
            "windows aggregate a stream; a table source cannot be windowed (as in Kafka Streams, "
            "where only KGroupedStream has windowedBy)",
        )
    if w.type == "hopping" and w.advance_ms > w.size_ms:
        raise ContractError(
            c.source,
            f"{at}.window.advance",
            "a hopping window cannot advance by more than its size",
        )
    taken = {*WINDOW_LATE_COLUMNS} & {f.name for f in c.input(t).fields}
    if taken:
        raise ContractError(
            c.source,
            f"{at}.window",
            f"value field(s) {sorted(taken)} would collide with the window and late-record "
            f"columns {list(WINDOW_LATE_COLUMNS)}",
        )


def _no_quarantine(e: Expectation) -> str | None:
    """Why an expectation cannot quarantine rows, if it cannot."""
    if e.layer == "bronze":
        return (
            "bronze is the topic itself and keeps every record: quarantine on silver, where "
            "values have types"
        )
    if e.layer == "gold":
        return "gold tables have no quarantine (a table row is an aggregate, not a record)"
    if e.expect in ("unique", "row_count_between"):
        return f"{e.expect} judges the batch, not a row, so it has no rows to quarantine"
    return None


def _check_expectations(c: Contract) -> None:
    """Each expectation must name a column of its layer (and, on gold, one of the tables)."""
    volume = c.quality.volume
    if volume is not None and volume.min_history > volume.history:
        raise ContractError(
            c.source,
            "quality.volume.min_history",
            f"{volume.min_history} is more than the {volume.history} batches of history kept: "
            "the check could never run",
        )
    index: dict[str, int] = {}
    seen: set[tuple[str, str]] = set()
    for e in c.expectations:
        i = index.get(e.layer, 0)
        index[e.layer] = i + 1
        where = f"expectations.{e.layer}[{i}]"
        if (e.layer, e.name) in seen:
            raise ContractError(
                c.source, f"{where}.name", f"expectation {e.name!r} is declared twice"
            )
        seen.add((e.layer, e.name))
        if e.layer == "gold":
            if e.table is None:
                raise ContractError(c.source, where, "a gold expectation must name its 'table'")
            try:
                available = c.table_columns(c.table(e.table))
            except KeyError:
                raise ContractError(
                    c.source, f"{where}.table", f"no table named {e.table!r} in this contract"
                ) from None
        else:
            if e.table is not None:
                raise ContractError(
                    c.source, f"{where}.table", "only gold expectations name a table"
                )
            available = (
                BRONZE_COLUMNS
                if e.layer == "bronze"
                else (*c.columns, "partition", "offset", "timestamp", "event_time")
            )
        if e.column is not None and e.column not in available:
            raise ContractError(
                c.source,
                f"{where}.column",
                f"no column {e.column!r} in {e.layer} (columns: {', '.join(available)})",
            )
        if e.severity == "quarantine" and (why := _no_quarantine(e)):
            raise ContractError(c.source, f"{where}.severity", f"{why}: use warn or fail")
        lo, hi = e.param("min"), e.param("max")
        numbers = (lo, hi, *(e.param("values") or ()))
        if any(isinstance(v, float) and not math.isfinite(v) for v in numbers):
            raise ContractError(
                c.source, where, "min, max and values must be finite numbers (not .nan or .inf)"
            )
        if lo is not None and hi is not None and lo > hi:
            raise ContractError(c.source, f"{where}.min", f"min {lo} is greater than max {hi}")
        if e.expect == "match_regex":
            try:
                re.compile(e.param("pattern"))
            except re.error as exc:
                raise ContractError(
                    c.source, f"{where}.pattern", f"not a valid regular expression: {exc}"
                ) from None


def load_contract(path: Path) -> Contract:
    """Read and validate one contract file."""
    source = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ContractError(source, "", f"cannot read the file: {exc.strerror}") from exc
    try:
        # libyaml's parser where it is built in (a fifth of a DAG file's parse time otherwise).
        document = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ContractError(source, where, f"not valid YAML: {exc}") from exc
    contract = parse_contract(document, source, base=path.parent)
    if path.stem != contract.topic:
        raise ContractError(
            source,
            "topic",
            f"topic {contract.topic!r} must live in a file named {contract.topic}.yaml",
        )
    return contract


@dataclass(frozen=True)
class Catalog:
    """Every contract of a folder, checked together (table names are global)."""

    contracts: tuple[Contract, ...]

    @classmethod
    def load(cls, directory: Path) -> Catalog:
        if not directory.is_dir():
            raise ContractError(str(directory), "", "contracts folder does not exist")
        contracts = tuple(load_contract(p) for p in sorted(directory.glob("*.yaml")))
        return cls.of(contracts)

    @classmethod
    def of(cls, contracts: Iterable[Contract]) -> Catalog:
        contracts = tuple(contracts)
        owners: dict[str, str] = {}
        for c in contracts:
            for kind, name in [("stream", c.stream), *(("table", t.name) for t in c.tables)]:
                if name in owners:
                    raise ContractError(
                        c.source, kind, f"name {name!r} is already used by {owners[name]}"
                    )
                owners[name] = c.source
        catalog = cls(contracts)
        for c in contracts:
            for ti, t in enumerate(c.tables):
                if t.join is not None:
                    _check_join(catalog, c, t, f"tables[{ti}].join")
        return catalog

    def __iter__(self) -> Iterator[Contract]:
        return iter(self.contracts)

    @property
    def topics(self) -> list[str]:
        return [c.topic for c in self.contracts]

    def topic(self, name: str) -> Contract:
        for c in self.contracts:
            if c.topic == name:
                return c
        raise UnknownTopicError(name, self.topics)

    def table_names(self) -> list[str]:
        return [t.name for c in self.contracts for t in c.tables]

    def resolve_table(self, name: str) -> tuple[str, str, Contract]:
        """Map a user-facing table name to ``(layer, name, contract)``.

        Gold tables are addressed by their bare name; streams as ``silver.<stream>`` (or the bare
        stream name); topics as ``bronze.<topic>``.
        """
        layer, _, bare = name.partition(".") if "." in name else ("", "", name)
        for c in self.contracts:
            if layer in {"", "gold"} and bare in {t.name for t in c.tables}:
                return "gold", bare, c
            if layer in {"", "silver"} and bare == c.stream:
                return "silver", bare, c
            if layer == "bronze" and bare == c.topic:
                return "bronze", bare, c
        known = [*self.table_names(), *(f"silver.{c.stream}" for c in self.contracts)]
        known += [f"bronze.{c.topic}" for c in self.contracts]
        raise UnknownTableError(name, known)


# -- The JSON Schema for editors ----------------------------------------------------------------
SCHEMA_FILE = Path(__file__).with_name("schemas") / "contract.schema.json"


class _EditorSchema(GenerateJsonSchema):
    """Pydantic's schema, written for authors: an optional key is left out (loading also takes
    null for left out, but an editor should not suggest it) and fields have no titles ("Group By"
    above group_by tells an author nothing)."""

    def nullable_schema(self, schema: Any) -> Any:
        return self.generate_inner(schema["schema"])

    def default_schema(self, schema: Any) -> Any:
        out = super().default_schema(schema)
        if "default" in out and out["default"] is None:
            del out["default"]
        return out

    def field_title_should_be_set(self, schema: Any) -> bool:
        return False


def _one_line(node: dict[str, Any]) -> dict[str, Any]:
    """Docstrings wrap at 100 columns; an editor wraps descriptions by itself."""
    return {
        k: " ".join(v.split()) if k == "description" and isinstance(v, str) else v
        for k, v in node.items()
    }


def json_schema() -> str:
    """The contract document's JSON Schema, as committed in ``schemas/contract.schema.json``."""
    schema = ContractDoc.model_json_schema(schema_generator=_EditorSchema)
    schema = json.loads(json.dumps(schema), object_hook=_one_line)
    head = {
        "$schema": _EditorSchema.schema_dialect,
        "$id": "https://lakehouse.local/contract.schema.json",
    }
    return json.dumps({**head, **schema}, indent=2) + "\n"


if __name__ == "__main__":
    if sys.argv[1:] != ["--write-schema"]:
        sys.exit("usage: python -m lakehouse.contracts.model --write-schema")
    SCHEMA_FILE.write_text(json_schema(), encoding="utf-8")
    print(f"wrote {SCHEMA_FILE}")
