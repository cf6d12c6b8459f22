"""Data contracts: one YAML file per topic, the single place a topic is described.

A contract names the topic and its partition count, the key and value formats and schemas (the
stream is the topic read with this schema), the event-time field, the schema-registry
compatibility mode, the gold tables built from the stream and the expectations of each layer.
This module holds the platform's view of one: the frozen :class:`Contract` and its parts. They
are read from a file by :mod:`lakehouse.contracts.catalog` (through the document's models in
:mod:`lakehouse.contracts.document`) and checked across the document by
:mod:`lakehouse.contracts.checks`.

Avro schemas live beside the contract (``.avsc`` files, or inline), listed by their Confluent
schema id, oldest first; the last one is the latest and is the shape of the silver stream. A
value written through a schema registry lists its reader schema alone; the writers' schemas are
the registry's versions of its subject, looked up by each job that decodes it.

This module is imported at DAG parse time: it must stay free of Spark, Delta and GX imports.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from lakehouse.contracts.document import (
    Aggregation,
    JoinType,
    KeyFormat,
    Severity,
    ValueFormat,
    Volume,
    WindowType,
)
from lakehouse.contracts.fields import MAX_DECIMAL_PRECISION, Field, FieldType

# Aggregation and Volume read the same in a file: they are the document's own (imported above).

# Aggregations that can take a value back when a key's value changes, as an aggregate of an
# input read as a table must (KGroupedTable's subtractor).
SUBTRACTABLE = frozenset({"count", "sum", "avg"})


NUMERIC_TYPES = frozenset({"long", "int", "double", "decimal"})


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


def aggregate_field(stream: Contract, a: Aggregation) -> Field:
    """The column of an aggregation, typed as Spark types it (``collect`` is a list of its
    field's type, which no :class:`Field` is; it is refused where a field is needed). A sum of
    a decimal(p,s) is a decimal(p+10,s) and an average a decimal(p+4,s+4), at most 38 digits,
    so neither is rounded to a binary fraction."""
    if a.fn in {"count", "count_distinct"}:
        return Field(a.name, "long")
    f = stream.field(a.field or "")
    if f.type == "decimal" and a.fn in {"sum", "avg"}:
        assert f.precision is not None and f.scale is not None
        if a.fn == "sum":
            return _decimal(a.name, f.precision + 10, f.scale)
        return _decimal(a.name, f.precision + 4, f.scale + 4)
    if a.fn == "avg":
        return Field(a.name, "double")
    if a.fn == "sum":
        return Field(a.name, "double" if f.type == "double" else "long")
    return replace(f, name=a.name, nullable=True)


def _decimal(name: str, precision: int, scale: int) -> Field:
    """A decimal column as Spark widens one: at most 38 digits, the scale cut down to fit."""
    return Field(
        name,
        "decimal",
        precision=min(precision, MAX_DECIMAL_PRECISION),
        scale=min(scale, MAX_DECIMAL_PRECISION),
    )


def canonical_json(schema: Any) -> str:
    """One text per schema, whatever its key order or spacing: what "the same schema" means."""
    return json.dumps(schema, sort_keys=True, separators=(",", ":"))


@dataclass(frozen=True)
class SchemaVersion:
    """One Avro schema of a key or value, by its Confluent schema id; a registry-backed value's
    reader schema has none (:class:`RegistrySource`)."""

    id: int | None
    schema: Any = field(compare=False)
    file: str | None = None

    @property
    def canonical(self) -> str:
        return canonical_json(self.schema)


SubjectStrategy = Literal["topic", "record", "topic-record"]


@dataclass(frozen=True)
class RegistrySource:
    """Values written through a Confluent-compatible schema registry: each record's schema id is
    one of the versions of ``subject`` there (at ``url``; None: the deployment's registry, see
    :mod:`lakehouse.contracts.confluent`)."""

    subject: str
    strategy: SubjectStrategy = "topic"
    url: str | None = None
    looked_up: bool = False  # the contract's value_schemas hold the registry's versions
    compatibility: str | None = None  # the subject's mode in the registry, once looked up
    # The contract lists ids too: with no registry given or running, they alone are read; with
    # one, the registry's versions and the listed ids it lacks (where both know an id, they
    # must agree).
    listed: bool = False


def subject_name(
    topic: str, strategy: SubjectStrategy, reader: Any, part: Literal["key", "value"] = "value"
) -> str:
    """The subject a Confluent serializer registers a topic's key or value schema under, by
    its subject naming strategy (TopicNameStrategy, RecordNameStrategy,
    TopicRecordNameStrategy)."""
    if strategy == "topic":
        return f"{topic}-{part}"
    name = reader.get("name", "") if isinstance(reader, dict) else ""
    namespace = reader.get("namespace") if isinstance(reader, dict) else None
    full = name if "." in name or not namespace else f"{namespace}.{name}"
    return full if strategy == "record" else f"{topic}-{full}"


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


# Severities from the mildest to the gravest (a contract's ``quality.notify`` names the least
# one that notifies).
SEVERITIES: tuple[Severity, ...] = ("warn", "quarantine", "fail")


@dataclass(frozen=True)
class QualityChecks:
    """Checks beside the value expectations, each a warning: freshness and volume; and which
    failed checks notify (``notify``: the least severity that does)."""

    freshness_ms: int | None = None
    volume: Volume | None = None
    notify: Severity = "fail"

    @property
    def notified(self) -> tuple[Severity, ...]:
        """The severities whose failed checks notify."""
        return SEVERITIES[SEVERITIES.index(self.notify) :]


WINDOW_START, WINDOW_END = "window_start", "window_end"
# A history table's version bounds and flag (valid_to exclusive, null while current).
VALID_FROM, VALID_TO, IS_CURRENT = "valid_from", "valid_to", "is_current"
HISTORY_COLUMNS = (VALID_FROM, VALID_TO, IS_CURRENT)
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
    table: str | None = None  # stream-table: the other topic's history table; None: its stream

    def column(self, field_name: str) -> str:
        """The output column of one of the other side's fields."""
        return self.prefix + field_name


# The kinds of gold table, one module each (lakehouse.tables.kind): the file's ``kind``, with an
# aggregate over ``window`` a windowed one and a join its join's type.
Kind = Literal[
    "latest", "aggregate", "windowed", "stream-table", "table-table", "stream-stream", "history"
]


@dataclass(frozen=True)
class TableSpec:
    """A gold table: an aggregated stream (KTable).

    An ``aggregate`` (or ``windowed`` aggregate) groups by the record key, or re-keys by a value
    field (``group_by``). It reads its input (``read_as``; the file's ``source``) as a
    ``stream`` (every event counts, KGroupedStream) or as a ``table`` (only each key's latest
    value counts: an update takes back the old value and adds the new one, KGroupedTable).
    """

    name: str
    kind: Kind
    aggregations: tuple[Aggregation, ...] = ()
    description: str = ""
    group_by: str | None = None
    read_as: Literal["stream", "table"] = "stream"
    window: Window | None = None
    join: Join | None = None
    changelog: str | None = None  # another table of the contract whose changelog is the input
    sequence_by: str | None = None  # history: the field that orders versions (None: event time)
    track: tuple[str, ...] = ()  # history: the fields whose change makes a version (): all
    retention_ms: int | None = None  # history: how far behind stream time a record may be

    @property
    def other_topic(self) -> str | None:
        """The other topic a join reads, beside its own stream."""
        return self.join.other if self.join is not None else None

    @property
    def keeps_late(self) -> bool:
        """Whether records can be too late for the table: it keeps them in a side table."""
        return self.kind in ("windowed", "history")


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
class KafkaOrigin:
    """Where a topic read from a Kafka broker comes from (the contract's ``kafka`` section); a
    topic without one lands as files."""

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
    # Written through a schema registry: ``value_schemas`` is an Avro value's reader schema
    # alone (no id; a JSON value's is empty) until the registry's versions are looked up
    # (lakehouse.contracts.confluent.resolve): then theirs by id, the reader last.
    value_registry: RegistrySource | None = None
    # Keys written through a schema registry: ``key_schemas`` as ``value_schemas`` above (an
    # Avro key's reader; a JSON Schema or Protobuf key's type is ``key_type``).
    key_registry: RegistrySource | None = None
    event_time: str | None = None
    compatibility: str = "BACKWARD"
    expectations: tuple[Expectation, ...] = ()
    quality: QualityChecks = QualityChecks()
    schedule_minutes: int | None = None  # None: no time schedule (run when triggered)
    landing_format: Literal["envelope", "connect_json"] = "envelope"
    max_record_bytes: int = 1_048_576
    kafka: KafkaOrigin | None = None
    description: str = ""
    owner: str = "data-platform"
    file: str = field(default="<memory>", compare=False)

    @property
    def bronze_name(self) -> str:
        return self.topic

    @property
    def columns(self) -> tuple[str, ...]:
        """The stream's own columns: the key, then the value's fields."""
        return (self.key_name, *(f.name for f in self.fields))

    @property
    def key_writers(self) -> dict[int, Any]:
        """The key's writer schemas by Confluent id (Avro, or JSON Schema or Protobuf through a
        registry): listed, or the registry's once looked up."""
        return {v.id: v.schema for v in self.key_schemas if v.id is not None}

    @property
    def value_writers(self) -> dict[int, Any]:
        """The value's writer schemas by Confluent id (Avro, or JSON Schema through a registry):
        those the contract lists, or the registry's once looked up."""
        return {v.id: v.schema for v in self.value_schemas if v.id is not None}

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
        stream = self.input(spec)
        key = self.table_key(spec)
        if spec.kind == "latest":
            key_type, fields = stream.key_type, stream.fields
        else:
            key_type = stream.key_type if key == stream.key_name else stream.field(key).type
            fields = tuple(aggregate_field(stream, a) for a in spec.aggregations)
        return Contract(
            topic=f"{self.topic}:{spec.name}",
            partitions=1,
            key_format="string",
            key_name=key,
            key_type=key_type,
            value_format="json",
            fields=fields,
            stream=spec.name,
            file=f"{self.file} (changelog of {spec.name})",
        )

    def table_key(self, spec: TableSpec) -> str:
        """The key column of a gold table: the record key, or the field it is re-keyed by."""
        return spec.group_by or self.input(spec).key_name

    def table_key_columns(self, spec: TableSpec) -> tuple[str, ...]:
        """The columns that identify a row of a gold table."""
        if spec.kind == "windowed":
            return (self.table_key(spec), WINDOW_START, WINDOW_END)
        if spec.kind == "stream-table":
            return ("partition", "offset")
        if spec.kind == "stream-stream":
            j = spec.join
            assert j is not None
            return ("partition", "offset", j.column("partition"), j.column("offset"))
        if spec.kind == "history":
            return (self.table_key(spec), VALID_FROM)
        return (self.table_key(spec),)

    def table_columns(self, spec: TableSpec) -> tuple[str, ...]:
        """A gold table's visible columns (hidden state columns start with ``__``)."""
        stream = self.input(spec)
        if spec.kind == "latest":
            return stream.columns
        if spec.kind == "history":
            return (*stream.columns, *HISTORY_COLUMNS)
        if spec.join is not None:
            j = spec.join
            taken = tuple(j.column(f) for f in j.fields)
            if spec.kind == "table-table":
                return (*stream.columns, *taken)
            # A stream whose event-time field is itself called event_time has it once.
            if spec.kind == "stream-table":
                event = ("partition", "offset", "timestamp", "event_time")
                return tuple(dict.fromkeys((*stream.columns, *taken, *event)))
            mine = ("partition", "offset", "event_time")
            return tuple(
                dict.fromkeys((*stream.columns, *taken, *mine, *(j.column(c) for c in mine)))
            )
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
