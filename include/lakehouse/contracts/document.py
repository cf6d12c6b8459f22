"""The contract document: what a contract file may say, as pydantic models.

``ContractDoc`` and its sections check a file's shape: its keys, their YAML types (no '5' for 5),
names and patterns, and the keys one key's value requires or refuses (:class:`KeyRules`, declared
once per section, checked when a file is read and written into the editors' schema).
:func:`validate_document` reads a parsed YAML document into a ``ContractDoc``, or raises its first
problem as a ContractError naming the file, the path inside it (``tables[1].window.size``) and
what is wrong there, in the file's words. :mod:`lakehouse.contracts.catalog` builds the platform's
view of a contract (:mod:`lakehouse.contracts.model`) from the document and checks it across its
sections (:mod:`lakehouse.contracts.checks`).

The vocabulary the file and the platform share lives here too: the kinds, formats and severities,
and :class:`Aggregation` and :class:`Volume`, which read the same in a file and on the platform.

The JSON Schema editors use, ``schemas/contract.schema.json``, is generated from these models:
``python -m lakehouse.contracts.document --write-schema`` (or ``make schema``).

This module is imported at DAG parse time: it must stay free of Spark, Delta and GX imports.
"""

from __future__ import annotations

import difflib
import functools
import json
import operator
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, Self, get_args

import pydantic
from pydantic import BaseModel, ConfigDict, PlainValidator, StringConstraints
from pydantic.json_schema import GenerateJsonSchema
from pydantic_core import PydanticCustomError

from lakehouse.contracts.fields import MAX_DECIMAL_PRECISION, FieldType
from lakehouse.errors import ContractError
from lakehouse.runtime.config import IDENTIFIER

# -- The vocabulary the file and the platform share --------------------------------------------
# The kinds, formats and severities a contract names, in the file and on the platform alike.
AggFn = Literal[
    "count", "sum", "min", "max", "avg", "count_distinct", "earliest", "latest", "collect"
]
KeyFormat = Literal["string", "json", "avro", "protobuf"]
ValueFormat = Literal["json", "avro", "string", "protobuf"]
Severity = Literal["warn", "quarantine", "fail"]
TableKind = Literal["latest", "aggregate", "join", "history"]
WindowType = Literal["tumbling", "hopping", "session"]
JoinType = Literal["stream-table", "table-table", "stream-stream"]
Expect = Literal[
    "not_null", "unique", "between", "in_set", "match_regex", "length_between", "row_count_between"
]


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


@pydantic.dataclasses.dataclass(frozen=True, config=_LEAF)
class Volume:
    """Warn when a batch is more than ``factor`` times, or less than ``1/factor`` of, the median
    size of the last ``history`` batches (once ``min_history`` of them exist)."""

    factor: Annotated[float, pydantic.Strict(), pydantic.Field(gt=1)] = 10.0
    history: Annotated[int, pydantic.Strict(), pydantic.Field(ge=1, le=1000)] = 20
    min_history: Annotated[int, pydantic.Strict(), pydantic.Field(ge=1)] = 5


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


class SchemaDoc(_Doc):
    """An Avro schema: a file beside the contract, or inline."""

    model_config = ConfigDict(
        json_schema_extra={"oneOf": [{"required": ["file"]}, {"required": ["schema"]}]}
    )
    file: AvroFile | None = None
    schema_: Annotated[Any, _of_type(dict, list, str)] = pydantic.Field(None, alias="schema")

    @pydantic.model_validator(mode="after")
    def _file_or_schema(self) -> Self:
        if (self.file is None) == (self.schema_ is None):
            raise _problem("give either 'file' or 'schema' (one of the two)")
        return self


class SchemaVersionDoc(SchemaDoc):
    """An Avro schema by its Confluent schema id: a file beside the contract, or inline. Listed
    oldest first; the last one is the latest (the reader schema)."""

    id: Annotated[int, pydantic.Field(ge=0, le=2**31 - 1)]


SchemaVersions = Annotated[list[SchemaVersionDoc], pydantic.Field(min_length=1)]


class RegistryDoc(_Doc):
    """Keys or values written through a Confluent-compatible schema registry: each record
    carries its writer schema's id, looked up in the registry (no id is listed in the
    contract)."""

    subject: Literal["topic", "record", "topic-record"] = "topic"
    """The subject naming strategy of the producers' serializers: ``topic`` (``<topic>-value``,
    Confluent's default), ``record`` (the reader schema's full name) or ``topic-record``
    (``<topic>-<full name>``)."""
    url: Annotated[str, StringConstraints(pattern=r"^https?://[^/?#@\s]+(/[^?#@\s]*)?$")] | None = (
        None
    )
    """The registry's URL (Confluent's API). Left out: ``LAKEHOUSE_SCHEMA_REGISTRY_URL``, else
    the registry ``lakehouse registry start`` runs. Credentials never go here: the deployment
    sets ``LAKEHOUSE_SCHEMA_REGISTRY_USER_INFO`` (``user:password``)."""


class KeyDoc(_Doc):
    """The record key: text, a JSON scalar (written through a schema registry or not), Avro
    (its schemas listed by id, or a reader schema and the registry the ids are looked up in),
    or a Protobuf message written through a schema registry."""

    rules = KeyRules(
        "format",
        requires={"json": ("type",), "protobuf": ("type", "registry")},
        refuses={
            "avro": ("type",),
            "json": ("schemas", "reader"),
            "protobuf": ("schemas", "reader"),
            "string": ("type", "schemas", "registry", "reader"),
        },
        needs_one_of={"avro": ("schemas", "registry")},
    )
    format: KeyFormat
    name: Identifier
    """The key's column in the stream and the tables."""
    type: Literal["string", "long", "int", "double", "boolean"] | None = None
    """The key's type when format is json (a JSON scalar) or protobuf (the message's field)."""
    schemas: SchemaVersions | None = None
    registry: RegistryDoc | None = None
    """Keys written through a schema registry, under the subject ``<topic>-key``: Avro
    (instead of ``schemas``), JSON Schema, or Protobuf."""
    reader: SchemaDoc | None = None
    """Avro with ``registry``: the key's schema the stream is read with (a primitive)."""
    description: str = ""

    @pydantic.model_validator(mode="after")
    def _registry_or_ids(self) -> Self:
        if self.registry is not None and self.schemas is not None:
            raise _problem(
                "give either 'schemas' (the ids listed) or 'registry' (the ids looked up), not both"
            )
        if self.registry is not None and self.registry.subject != "topic":
            raise _problem(
                f"subject naming {self.registry.subject!r} takes a record's name, and a key's "
                "schema is a primitive: a key's subject is the topic's ('topic')"
            )
        if self.registry is not None and self.reader is None and self.format == "avro":
            raise _problem("'reader' is a required property with 'registry'")
        if self.reader is not None and self.registry is None:
            raise _problem("'reader' is only allowed with 'registry'")
        return self


class FieldDoc(_Doc):
    """A field of a JSON value: a column of the stream."""

    rules = KeyRules(
        "type",
        requires={"decimal": ("precision",)},
        refuses={kind: ("precision", "scale") for kind in get_args(FieldType) if kind != "decimal"},
    )
    name: Identifier
    type: FieldType
    """string, long, int, double, boolean, timestamp (ISO-8601 text), or decimal (exact, with a
    precision and a scale)"""
    nullable: bool = True
    """whether the field may be null or missing (default true)"""
    precision: Annotated[int, pydantic.Field(ge=1, le=MAX_DECIMAL_PRECISION)] | None = None
    """decimal: how many digits in all (1 to 38)"""
    scale: Annotated[int, pydantic.Field(ge=0, le=MAX_DECIMAL_PRECISION)] | None = None
    """decimal: how many of the digits come after the point (default 0, at most the precision)"""
    description: str = ""

    @pydantic.model_validator(mode="after")
    def _scale_within_precision(self) -> Self:
        if self.precision is not None and (self.scale or 0) > self.precision:
            raise _problem(f"scale {self.scale} is greater than the precision {self.precision}")
        return self


class ValueDoc(_Doc):
    """The record value: JSON with the fields listed here, Avro with its schemas (listed by id,
    or a reader schema and the registry the ids are looked up in), Protobuf written through a
    schema registry and read into the fields listed here, or text. JSON or Avro may be written
    through a schema registry too."""

    rules = KeyRules(
        "format",
        requires={"json": ("fields",), "string": ("name",), "protobuf": ("fields", "registry")},
        refuses={
            "json": ("schemas", "name", "reader"),
            "avro": ("fields", "name"),
            "string": ("fields", "schemas", "registry", "reader"),
            "protobuf": ("schemas", "name", "reader"),
        },
        needs_one_of={"avro": ("schemas", "registry")},
    )
    format: ValueFormat
    fields: Annotated[list[FieldDoc], pydantic.Field(min_length=1)] | None = None
    schemas: SchemaVersions | None = None
    registry: RegistryDoc | None = None
    """Values written through a schema registry: Avro (instead of ``schemas``, or with them: the
    ids listed are read without a registry, the registry's too where one is given or running),
    JSON Schema (JSON whose ``fields`` are the stream's columns) or Protobuf (required; its
    messages' fields read by name into ``fields``)."""
    reader: SchemaDoc | None = None
    """With ``registry``: the schema the stream is read with, whose fields are its columns;
    each record's writer schema resolves into it (Avro's schema resolution)."""
    name: Identifier | None = None
    """The column holding the whole value when format is string."""
    description: str = ""

    @pydantic.model_validator(mode="after")
    def _registry_or_ids(self) -> Self:
        both = self.registry is not None and self.schemas is not None
        if both and self.reader is not None:
            raise _problem(
                "with both 'schemas' and 'registry' the stream is read with the last schema "
                "listed: leave 'reader' out"
            )
        if both:
            return self  # Avro (the rules refuse 'schemas' otherwise)
        if (
            self.registry is not None
            and self.format in ("json", "protobuf")
            and self.registry.subject != "topic"
        ):
            raise _problem(
                f"subject naming {self.registry.subject!r} takes the reader schema's record "
                f"name: with format {self.format!r} the subject is the topic's ('topic')"
            )
        if self.registry is not None and self.format == "avro" and self.reader is None:
            raise _problem("'reader' is a required property with 'registry'")
        if self.reader is not None and self.registry is None:
            raise _problem("'reader' is only allowed with 'registry'")
        return self


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
        refuses={
            "stream-table": ("within",),
            "table-table": ("within", "table"),
            "stream-stream": ("table",),
        },
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
    table: Identifier | None = None
    """stream-table: a history table of the other topic to join each event with, by the version
    valid at the event's time (default: the other topic's stream read as a versioned table)"""

    @pydantic.field_validator("fields")
    @classmethod
    def _once_each(cls, names: list[str]) -> list[str]:
        for name in names:
            if names.count(name) > 1:
                raise _problem(f"{name!r} is listed twice")
        return names


_HISTORY_KEYS = ("sequence_by", "track", "history_retention")


class TableDoc(_Doc):
    """A gold table: each key's latest value, an aggregate of the stream, a join, or each key's
    history of versions."""

    rules = KeyRules(
        "kind",
        requires={"aggregate": ("aggregations",), "join": ("join",)},
        refuses={
            "aggregate": ("join", *_HISTORY_KEYS),
            "latest": ("aggregations", "group_by", "source", "window", "join", *_HISTORY_KEYS),
            "join": ("aggregations", "group_by", "source", "window", "changelog", *_HISTORY_KEYS),
            "history": ("aggregations", "group_by", "source", "window", "join", "changelog"),
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
    sequence_by: Identifier | None = None
    """history: the value field (a timestamp or a long) that orders a key's versions and bounds
    them (valid_from, valid_to), instead of the event time"""
    track: list[Identifier] | None = pydantic.Field(
        default=None, min_length=1, json_schema_extra={"uniqueItems": True}
    )
    """history: the fields whose change makes a new version; a change of the other fields
    updates the version in place (default: every field)"""
    history_retention: Duration | None = None
    """history: how far behind its partition's stream time a record may be and still be placed
    into a key's past; an older one goes to the late-records table (default: no limit)"""


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
    notify: Severity = "fail"
    """The least severity whose failed checks notify (through the Airflow connection the
    deployment names, never set here): 'fail' (the default), 'quarantine' (and fail), or 'warn'
    (every failed check)."""


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
    schedule_minutes: Annotated[int, pydantic.Field(ge=1, le=1440)] | None = None
    """How often Airflow runs the topic's pipeline DAG once it is unpaused; left out, it runs
    when triggered (and, for a Kafka topic, when records arrive)."""
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


# -- A document's first problem, in its author's words -----------------------------------------
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


def _contract_error(exc: pydantic.ValidationError, file: str) -> ContractError:
    """The first problem in a document, as its author reads it: the path in the file
    (``tables[1].window.size``) and what is wrong there, in the file's words."""
    errors = exc.errors()
    error = errors[0]
    if error["type"] in {"missing", "missing_keyword_argument"}:
        # A misspelt required key is missing and unknown at once: the unknown one, with the key
        # it is closest to, says more ("unknown key 'steam' (did you mean 'stream'?)").
        parent = list(error["loc"])[:-1]
        error = next(
            (
                e
                for e in errors
                if e["type"] in {"extra_forbidden", "unexpected_keyword_argument"}
                and list(e["loc"])[:-1] == parent
            ),
            error,
        )
    loc, kind, value, ctx = list(error["loc"]), error["type"], error["input"], error.get("ctx", {})
    if loc[-1:] == ["[key]"]:  # a mapping's key is wrong, not its value
        loc.pop()
    if kind in {"missing", "missing_keyword_argument"}:
        problem = f"{loc.pop()!r} is a required property"  # of the section that lacks it
    elif kind in {"extra_forbidden", "unexpected_keyword_argument"}:
        key = loc.pop()
        problem = f"unknown key {key!r}" + _did_you_mean(str(key), known_keys(loc))
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
    return ContractError(file, path, problem + more)


def _did_you_mean(key: str, known: Sequence[str]) -> str:
    """`` (did you mean 'aggregations'?)`` for the known key closest to a misspelt one."""
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


@functools.cache
def _document_schema() -> dict[str, Any]:
    return ContractDoc.model_json_schema(schema_generator=_EditorSchema)


def known_keys(loc: Sequence[str | int]) -> list[str]:
    """The keys a section of the document may have, at ``loc`` (``["tables", 1]``), from the
    document's JSON Schema: what a misspelt key is compared with."""
    schema = _document_schema()
    definitions = schema.get("$defs", {})

    def branches(node: Any) -> list[dict[str, Any]]:
        """The node and the alternatives it stands for, references resolved."""
        if not isinstance(node, dict):
            return []
        if "$ref" in node:
            return branches(definitions.get(node["$ref"].rsplit("/", 1)[-1]))
        found = [node]
        for key in ("anyOf", "oneOf", "allOf"):
            for option in node.get(key, []):
                found += branches(option)
        return found

    nodes = branches(schema)
    for part in loc:
        step = "items" if isinstance(part, int) else part
        nodes = [
            child
            for node in nodes
            for child in branches(
                node.get("items") if step == "items" else node.get("properties", {}).get(step)
            )
        ]
    return sorted({key for node in nodes for key in node.get("properties", {})})


def validate_document(document: Any, file: str) -> ContractDoc:
    """A parsed YAML document as a :class:`ContractDoc`, or its first problem as a ContractError."""
    try:
        return ContractDoc.model_validate(document)
    except pydantic.ValidationError as exc:
        raise _contract_error(exc, file) from None


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
        sys.exit("usage: python -m lakehouse.contracts.document --write-schema")
    SCHEMA_FILE.write_text(json_schema(), encoding="utf-8")
    print(f"wrote {SCHEMA_FILE}")
