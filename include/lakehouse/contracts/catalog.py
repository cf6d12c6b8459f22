"""Reading contracts: a YAML document into a checked :class:`~lakehouse.contracts.model.Contract`
(:func:`parse_contract`, :func:`load_contract`), and a folder of them into a :class:`Catalog`,
checked together (names are global, a join's other side must exist and fit).

A file is read in three steps. The pydantic models of the document (``ContractDoc`` and its
sections, in :mod:`lakehouse.contracts.document`) check its shape: keys, types, names, and the
keys one key's value requires or refuses. The platform's view is then built from it: the frozen
:class:`~lakehouse.contracts.model.Contract` and its parts, with Avro schemas read from their files
and durations in milliseconds. Last come the checks across the document and, in a
:class:`Catalog`, across contracts (:mod:`lakehouse.contracts.checks`). Each problem is a
ContractError naming the file, the path inside it and what is wrong.

This module is imported at DAG parse time: it must stay free of Spark, Delta and GX imports
(the Avro helpers are imported only when a contract uses Avro).
"""

from __future__ import annotations

import contextlib
import json
import re
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from lakehouse.contracts.checks import check_contract, check_join, claim_names
from lakehouse.contracts.document import (
    ContractDoc,
    ExpectationDoc,
    ExpectationsDoc,
    JoinDoc,
    LandingDoc,
    SchemaDoc,
    SchemaVersionDoc,
    TableDoc,
    ValueDoc,
    WindowDoc,
    validate_document,
)
from lakehouse.contracts.fields import Field, FieldType
from lakehouse.contracts.model import (
    OWNED_SETTINGS,
    SECRET_SETTING,
    Contract,
    Expectation,
    Join,
    KafkaOrigin,
    Kind,
    QualityChecks,
    RegistrySource,
    SchemaVersion,
    TableSpec,
    Window,
    duration_ms,
    subject_name,
)
from lakehouse.errors import ConfigError, ContractError, UnknownTableError, UnknownTopicError
from lakehouse.runtime.config import LAYERS


# -- Reading a file: the document, then the platform's view of it ------------------------------
def parse_contract(document: Any, file: str = "<memory>", base: Path | None = None) -> Contract:
    """Validate a parsed YAML document and build a :class:`Contract`, or raise ContractError.

    ``base`` is the folder Avro schema files are read from (the contract's own folder).
    """
    doc = validate_document(document, file)
    key_schemas = _schema_versions(doc.key.schemas or [], file, "key.schemas", base)
    value_schemas = _schema_versions(doc.value.schemas or [], file, "value.schemas", base)
    # The serializers name the subjects after the Kafka topic they write to.
    kafka_topic = doc.kafka.topic if doc.kafka is not None and doc.kafka.topic else doc.topic
    value_registry = None
    if (where := doc.value.registry) is not None:
        reader = None  # JSON: the fields are the reader's shape
        if doc.value.reader is not None:  # Avro (the document's rule)
            reader = _schema(doc.value.reader, file, "value.reader", base)
            value_schemas = (SchemaVersion(id=None, schema=reader, file=doc.value.reader.file),)
        elif value_schemas:  # Avro ids listed too: the last one is the reader
            reader = value_schemas[-1].schema
        value_registry = RegistrySource(
            subject_name(kafka_topic, where.subject, reader),
            where.subject,
            where.url,
            listed=doc.value.schemas is not None,
        )
    key_registry = None
    if (where := doc.key.registry) is not None:
        reader = None  # JSON Schema and Protobuf: the key's type is the reader's shape
        if doc.key.reader is not None:  # Avro (the document's rule)
            reader = _schema(doc.key.reader, file, "key.reader", base)
            key_schemas = (SchemaVersion(id=None, schema=reader, file=doc.key.reader.file),)
        key_registry = RegistrySource(
            subject_name(kafka_topic, "topic", reader, "key"), "topic", where.url
        )
    key_type: FieldType = doc.key.type or "string"
    if doc.key.format == "avro":
        from lakehouse.contracts import avro

        latest = "key.reader" if key_registry else f"key.schemas[{len(key_schemas) - 1}]"
        key_type = avro.primitive_of(key_schemas[-1].schema, file, latest)
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
        key_registry=key_registry,
        value_registry=value_registry,
        fields=_value_fields(doc.value, value_schemas, file),
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
        kafka=_kafka(doc, file),
        description=doc.description,
        owner=doc.owner,
        file=file,
    )
    check_contract(contract)
    return contract


def _ms(duration: str | None) -> int:
    return 0 if duration is None else duration_ms(duration)


def _table(t: TableDoc) -> TableSpec:
    return TableSpec(
        name=t.name,
        kind=_kind(t),
        aggregations=tuple(t.aggregations or ()),
        description=t.description,
        group_by=t.group_by,
        read_as=t.source,
        window=None if t.window is None else _window(t.window),
        join=None if t.join is None else _join(t.join),
        changelog=t.changelog,
        sequence_by=t.sequence_by,
        track=tuple(t.track or ()),
        retention_ms=None if t.history_retention is None else duration_ms(t.history_retention),
    )


def _kind(t: TableDoc) -> Kind:
    """The kind of table a document describes (the file's ``kind``, a window making an
    aggregate a windowed one and a join's type naming the join)."""
    if t.kind == "aggregate" and t.window is not None:
        return "windowed"
    if t.kind == "join":
        assert t.join is not None
        return t.join.type
    return t.kind


def _window(w: WindowDoc) -> Window:
    size = _ms(w.size)
    return Window(w.type, size, _ms(w.advance) or size, _ms(w.gap), _ms(w.grace))


def _join(j: JoinDoc) -> Join:
    return Join(
        j.type, j.with_, tuple(j.fields), j.how, j.on_field, j.prefix, _ms(j.within), j.table
    )


def _kafka(doc: ContractDoc, file: str) -> KafkaOrigin | None:
    if doc.kafka is None:
        return None
    if doc.landing is not None:
        raise ContractError(
            file,
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
                file,
                where,
                "looks like a credential: a contract never holds one; name the environment "
                f"variable that does under kafka.secrets ({name}: SOME_VARIABLE)",
            )
        if name in OWNED_SETTINGS:
            raise ContractError(
                file,
                where,
                "is set by the platform"
                + (" (use kafka.bootstrap_servers)" if name == "bootstrap.servers" else ""),
            )
    for name in doc.kafka.secrets:
        if name in props or name in OWNED_SETTINGS:
            raise ContractError(
                file,
                f"kafka.secrets.{name}",
                "is also set in kafka.properties or by the platform",
            )
    return KafkaOrigin(
        topic=doc.kafka.topic or doc.topic,
        bootstrap_servers=doc.kafka.bootstrap_servers,
        properties=tuple(sorted(props.items())),
        secrets=tuple(sorted(doc.kafka.secrets.items())),
        on_data_loss=doc.kafka.on_data_loss,
    )


def _schema_versions(
    items: list[SchemaVersionDoc], file: str, where: str, base: Path | None
) -> tuple[SchemaVersion, ...]:
    """Load each listed Avro schema (file beside the contract, or inline) and validate it."""
    out: list[SchemaVersion] = []
    seen: set[int] = set()
    for i, item in enumerate(items):
        path = f"{where}[{i}]"
        if item.id in seen:
            raise ContractError(file, f"{path}.id", f"schema id {item.id} is listed twice")
        seen.add(item.id)
        out.append(
            SchemaVersion(id=item.id, schema=_schema(item, file, path, base), file=item.file)
        )
    return tuple(out)


def _schema(item: SchemaDoc, file: str, path: str, base: Path | None) -> Any:
    """One Avro schema (a file beside the contract, or inline), read and validated."""
    from lakehouse.contracts import avro

    schema = item.schema_
    if item.file is not None:
        if base is None:
            raise ContractError(file, f"{path}.file", "schema files need a contract file")
        schema_file = base / item.file
        if not schema_file.resolve().is_relative_to(base.resolve()):  # e.g. through a symlink
            raise ContractError(
                file, f"{path}.file", f"{item.file!r} is outside the contract's folder"
            )
        try:
            schema = json.loads(schema_file.read_text(encoding="utf-8"))
        except OSError as exc:
            raise ContractError(
                file, f"{path}.file", f"cannot read {schema_file}: {exc.strerror}"
            ) from None
        except json.JSONDecodeError as exc:
            raise ContractError(
                file,
                f"{path}.file",
                f"{schema_file} is not JSON: {exc.msg} (line {exc.lineno})",
            ) from None
    elif isinstance(schema, str):
        with contextlib.suppress(json.JSONDecodeError):  # else a bare name such as "string"
            schema = json.loads(schema)
    avro.parse(schema, file, path)
    return schema


def _value_fields(
    value: ValueDoc, schemas: tuple[SchemaVersion, ...], file: str
) -> tuple[Field, ...]:
    if value.format == "string":
        assert value.name is not None  # ValueDoc's rules require it
        return (Field(name=value.name, type="string", nullable=True),)
    if value.format == "avro":
        from lakehouse.contracts import avro

        latest = "value.reader" if value.registry else f"value.schemas[{len(schemas) - 1}]"
        return avro.fields_of(schemas[-1].schema, file, latest)
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


# -- A contract file, and a folder of them -----------------------------------------------------
def load_contract(path: Path) -> Contract:
    """Read and validate one contract file."""
    file = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ContractError(file, "", f"cannot read the file: {exc.strerror}") from exc
    try:
        # libyaml's parser where it is built in (a fifth of a DAG file's parse time otherwise).
        document = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ContractError(file, where, f"not valid YAML: {exc}") from exc
    try:
        contract = parse_contract(document, file, base=path.parent)
    except ContractError as exc:
        exc.name_items(item_names(document, exc.path))
        raise
    if path.stem != contract.topic:
        raise ContractError(
            file,
            "topic",
            f"topic {contract.topic!r} must live in a file named {contract.topic}.yaml",
        )
    return contract


_PATH_PART = re.compile(r"([^.\[\]]+)|\[([0-9]+)\]")
# What an item of a list is called, by the list's key (an expectation's list is its layer's).
_ITEM: dict[str, str] = {
    "tables": "table",
    "fields": "field",
    "aggregations": "aggregation",
    **dict.fromkeys(LAYERS, "expectation"),
}


def item_names(document: Any, path: str) -> str:
    """What the named items along ``path`` (``tables[1].aggregations[0].fn``) are called in
    ``document``: ``table 'order_counts', aggregation 'total'`` (items without a ``name`` are
    left out)."""
    node, key, names = document, "", []
    for found in _PATH_PART.finditer(path):
        part, index = found.group(1), found.group(2)
        if index is None:
            key = part
            node = node.get(part) if isinstance(node, dict) else None
        else:
            i = int(index)
            node = node[i] if isinstance(node, list) and i < len(node) else None
            if isinstance(node, dict) and isinstance(node.get("name"), str):
                names.append(f"{_ITEM.get(key, key)} {node['name']!r}")
        if node is None:
            break
    return ", ".join(names)


def _named(error: ContractError, contract: Contract) -> ContractError:
    """``error`` (found across contracts, after the file was read) with the names of its
    path's items, from the contract."""
    if not error.items:
        outline = {
            "tables": [{"name": t.name} for t in contract.tables],
            "value": {"fields": [{"name": f.name} for f in contract.fields]},
        }
        error.name_items(item_names(outline, error.path))
    return error


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
            except ContractError as exc:
                errors[str(path)] = exc
                continue
            try:
                claim_names(contract, owners)
            except ContractError as exc:
                errors[str(path)] = _named(exc, contract)
                continue
            loaded.append(contract)
        broken = {Path(file).stem: file for file in errors}
        while True:
            try:
                catalog = cls.of(loaded, broken=broken)
            except ContractError as exc:  # a join names a topic no contract has
                owner = next((c for c in loaded if c.file == exc.file), None)
                errors[exc.file] = exc if owner is None else _named(exc, owner)
                broken[Path(exc.file).stem] = exc.file
                loaded = [c for c in loaded if c.file != exc.file]
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
            claim_names(c, owners)
        catalog = cls(contracts)
        by_topic: dict[str, Contract] = {}
        for c in contracts:
            by_topic.setdefault(c.topic, c)
        for c in contracts:
            for ti, t in enumerate(c.tables):
                if t.join is not None and t.join.other not in broken:
                    check_join(by_topic, c, t, f"tables[{ti}].join")
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

    def for_command(self, command: str, topics: Sequence[str], every_topic: bool) -> Catalog:
        """The catalog a command works on: a contract that does not load fails the command if
        it concerns its topic (named in ``topics``, or every topic when none is named and
        ``every_topic``), with its error; otherwise the command goes on without it, saying so on
        stderr."""
        for topic in topics:
            self.topic(topic)  # its own contract's error, if it has one
        if self.errors and not topics and every_topic:
            raise ConfigError(
                f"{len(self.errors)} contract(s) do not load, so `lakehouse {command}` would "
                "leave their topics out: "
                + "; ".join(str(e) for e in self.errors.values())
                + " (fix them, or name the topics to act on with --topic)"
            )
        for error in self.errors.values():
            print(f"note: left out, its contract does not load: {error}", file=sys.stderr)
        return self.catalog

    def topic(self, name: str) -> Contract:
        """The contract of topic ``name``; the error of its file when that does not load (a
        task or a command about one topic fails on its own contract only)."""
        for file, error in self.errors.items():
            if Path(file).stem == name:
                raise error
        return self.catalog.topic(name)
