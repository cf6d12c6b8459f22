"""Data contracts: one YAML file per topic, the single place a topic is described.

A contract names the topic and its partition count, the key and value formats and schemas (the
stream is the topic read with this schema), the event-time field, the schema-registry
compatibility mode, the gold tables built from the stream and the expectations of each layer.

A file is read in three steps. The pydantic models of the document (``ContractDoc`` and its
sections, in :mod:`lakehouse.contracts.document`) check its shape: keys, types, names, and the
keys one key's value requires or refuses. The platform's view is then built from it: the frozen
:class:`Contract` and its parts, with Avro schemas read from their files and durations in
milliseconds. Last come the checks across the document (fields named, columns that collide, tables
read before they exist) and, in a :class:`Catalog`, across contracts. Each problem is a
ContractError naming the file, the path inside it and what is wrong.

This module's parts, in order: the platform's types; reading a document into them
(:func:`parse_contract`); the checks across a document; :func:`load_contract` and the
:class:`Catalog`.

Avro schemas live beside the contract (``.avsc`` files, or inline), listed by their Confluent
schema id, oldest first; the last one is the latest and is the shape of the silver stream.

This module is imported at DAG parse time: it must stay free of Spark, Delta and GX imports
(the Avro helpers are imported only when a contract uses Avro).
"""

from __future__ import annotations

import contextlib
import json
import math
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import yaml

from lakehouse.contracts.document import (
    Aggregation,
    ContractDoc,
    ExpectationDoc,
    ExpectationsDoc,
    JoinDoc,
    JoinType,
    KeyFormat,
    LandingDoc,
    SchemaVersionDoc,
    Severity,
    TableDoc,
    TableKind,
    ValueDoc,
    ValueFormat,
    Volume,
    WindowDoc,
    WindowType,
    validate_document,
)
from lakehouse.contracts.fields import MAX_DECIMAL_PRECISION, Field, FieldType
from lakehouse.errors import ContractError, UnknownTableError, UnknownTopicError
from lakehouse.runtime.config import IDENTIFIER, IDENTIFIER_RULE, LAYERS

# -- The platform's view of a contract ---------------------------------------------------------
# Aggregation and Volume read the same in a file: they are the document's own (imported above).

# Aggregations a table source can take back when a key's value changes (KGroupedTable's subtractor).
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


def aggregate_field(source: Contract, a: Aggregation) -> Field:
    """The column of an aggregation, typed as Spark types it (``collect`` is a list of its
    field's type, which no :class:`Field` is; it is refused where a field is needed). A sum of
    a decimal(p,s) is a decimal(p+10,s) and an average a decimal(p+4,s+4), at most 38 digits,
    so neither is rounded to a binary fraction."""
    if a.fn in {"count", "count_distinct"}:
        return Field(a.name, "long")
    f = source.field(a.field or "")
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
            fields = tuple(aggregate_field(source, a) for a in spec.aggregations)
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
            # A stream whose event-time field is itself called event_time has it once.
            if j.type == "stream-table":
                event = ("partition", "offset", "timestamp", "event_time")
                return tuple(dict.fromkeys((*source.columns, *taken, *event)))
            mine = ("partition", "offset", "event_time")
            return tuple(
                dict.fromkeys((*source.columns, *taken, *mine, *(j.column(c) for c in mine)))
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


# -- Reading a file: the document, then the platform's view of it ------------------------------
def parse_contract(document: Any, source: str = "<memory>", base: Path | None = None) -> Contract:
    """Validate a parsed YAML document and build a :class:`Contract`, or raise ContractError.

    ``base`` is the folder Avro schema files are read from (the contract's own folder).
    """
    doc = validate_document(document, source)
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
            doc.quality.notify,
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
    # A decimal's scale is 0 when left out, as in Avro.
    return tuple(
        Field(f.name, f.type, f.nullable, f.precision, f.scale or 0)
        if f.type == "decimal"
        else Field(f.name, f.type, f.nullable)
        for f in value.fields or ()
    )


def _expectations(doc: ExpectationsDoc) -> tuple[Expectation, ...]:
    return tuple(
        Expectation(layer, e.name, e.expect, e.severity, e.column, e.table, _params(e))
        for layer in LAYERS
        for e in getattr(doc, layer)
    )


def _params(e: ExpectationDoc) -> tuple[tuple[str, Any], ...]:
    given = ((k, getattr(e, k)) for k in ("max", "min", "pattern", "values"))
    return tuple((k, tuple(v) if isinstance(v, list) else v) for k, v in given if v is not None)


# -- Checks across the document (a join's other side: in the Catalog) --------------------------
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
                f"field {et.name!r} is {et.type_name}; event time must be "
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
        if t.group_by is not None and source.field(t.group_by).type == "decimal":
            raise ContractError(
                c.source,
                f"{at}.group_by",
                f"cannot re-key by {t.group_by!r} of type {source.field(t.group_by).type_name}: "
                "a key is a string, long, int, double, boolean or timestamp",
            )
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
                    c.source, f"{where}.field", f"cannot {a.fn} {a.field!r} of type {f.type_name}"
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


def _claim(c: Contract, owners: dict[str, str]) -> None:
    """Record the names ``c`` takes (its stream, its tables) in ``owners``; a name another
    contract took first is an error of ``c``."""
    for kind, name in [("stream", c.stream), *(("table", t.name) for t in c.tables)]:
        if name in owners:
            raise ContractError(c.source, kind, f"name {name!r} is already used by {owners[name]}")
    owners.update({name: c.source for name in [c.stream, *(t.name for t in c.tables)]})


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


# -- A contract file, and a folder of them -----------------------------------------------------
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
    def load_each(cls, directory: Path) -> LoadedCatalog:
        """Every contract of a folder that loads, and the error of each that does not: one
        broken contract is its own problem, not its neighbours'. A contract whose name is
        already taken by an earlier file (in name order) is broken; a join with a topic whose
        contract is broken is kept out of the catalog's checks and named in ``unjoinable``."""
        if not directory.is_dir():
            raise ContractError(str(directory), "", "contracts folder does not exist")
        errors: dict[str, ContractError] = {}
        loaded: list[Contract] = []
        owners: dict[str, str] = {}
        for path in sorted(directory.glob("*.yaml")):
            try:
                contract = load_contract(path)
                _claim(contract, owners)
            except ContractError as exc:
                errors[str(path)] = exc
                continue
            loaded.append(contract)
        broken = {Path(source).stem: source for source in errors}
        while True:
            try:
                catalog = cls.of(loaded, broken=broken)
            except ContractError as exc:  # a join names a topic no contract has
                errors[exc.source] = exc
                broken[Path(exc.source).stem] = exc.source
                loaded = [c for c in loaded if c.source != exc.source]
                continue
            unjoinable = {
                c.topic: {
                    t.join.other: broken[t.join.other]
                    for t in c.tables
                    if t.join and t.join.other in broken
                }
                for c in catalog
            }
            return LoadedCatalog(catalog, errors, {t: o for t, o in unjoinable.items() if o})

    @classmethod
    def of(cls, contracts: Iterable[Contract], *, broken: Mapping[str, str] = {}) -> Catalog:
        """The contracts, checked together: names are unique across them, and each join's other
        side exists and fits (a join with a topic in ``broken``, whose contract did not load,
        is not checked: its DAG reports it instead)."""
        contracts = tuple(contracts)
        owners: dict[str, str] = {}
        for c in contracts:
            _claim(c, owners)
        catalog = cls(contracts)
        for c in contracts:
            for ti, t in enumerate(c.tables):
                if t.join is not None and t.join.other not in broken:
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


@dataclass(frozen=True)
class LoadedCatalog:
    """A contracts folder read contract by contract (:meth:`Catalog.load_each`)."""

    catalog: Catalog  # the contracts that load, checked together
    errors: dict[str, ContractError]  # by file: the contracts that do not
    # By topic: the topics its joins read whose contracts do not load, with their files.
    unjoinable: dict[str, dict[str, str]]

    def topic(self, name: str) -> Contract:
        """The contract of topic ``name``; the error of its file when that does not load (a
        task or a command about one topic fails on its own contract only)."""
        for source, error in self.errors.items():
            if Path(source).stem == name:
                raise error
        return self.catalog.topic(name)
