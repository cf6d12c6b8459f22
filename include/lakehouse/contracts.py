"""Data contracts: one YAML file per topic, the single place a topic is described.

A contract names the topic and its partition count, the key and value formats and schema (the
stream is the topic read with this schema), and the gold tables built from that stream. It is
validated against ``schemas/contract.schema.json`` when loaded; the platform refuses to run on an
invalid one, with an error naming the file, the path inside it and what is wrong.

This module is imported at DAG parse time: it must stay free of Spark, Delta and GX imports.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import yaml
from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError

from lakehouse.errors import ContractError, UnknownTableError, UnknownTopicError

FieldType = Literal["string", "long", "int", "double", "boolean", "timestamp"]
AggFn = Literal["count", "sum", "min", "max"]
NUMERIC_TYPES = frozenset({"long", "int", "double"})

# Columns every stream carries beside the contract's own; contract fields may not shadow them.
STREAM_METADATA_COLUMNS = ("partition", "offset", "timestamp")


@dataclass(frozen=True)
class Field:
    name: str
    type: FieldType
    nullable: bool = True


@dataclass(frozen=True)
class Aggregation:
    name: str
    fn: AggFn
    field: str | None = None


@dataclass(frozen=True)
class TableSpec:
    """A gold table: an aggregated stream (KTable)."""

    name: str
    kind: Literal["latest", "aggregate"]
    aggregations: tuple[Aggregation, ...] = ()
    description: str = ""


@dataclass(frozen=True)
class Contract:
    topic: str
    partitions: int
    key_format: Literal["string"]
    key_name: str
    value_format: Literal["json"]
    fields: tuple[Field, ...]
    stream: str
    tables: tuple[TableSpec, ...] = ()
    schedule_minutes: int = 5
    landing_format: Literal["envelope", "connect_json"] = "envelope"
    max_record_bytes: int = 1_048_576
    description: str = ""
    owner: str = "data-platform"
    source: str = field(default="<memory>", compare=False)

    @property
    def bronze_name(self) -> str:
        return self.topic

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


@cache
def _validator() -> Draft202012Validator:
    text = resources.files("lakehouse").joinpath("schemas/contract.schema.json").read_text()
    return Draft202012Validator(json.loads(text))


def _json_path(error: ValidationError) -> str:
    out = ""
    for part in error.absolute_path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _describe(error: ValidationError) -> str:
    if error.validator == "pattern" and isinstance(error.instance, str):
        return f"{error.instance!r} does not match the required pattern {error.validator_value}"
    if error.validator == "not" and "required" in str(error.validator_value):
        return "'aggregations' is only allowed on tables of kind 'aggregate'"
    return error.message


def parse_contract(document: Any, source: str = "<memory>") -> Contract:
    """Validate a parsed YAML document and build a :class:`Contract`, or raise ContractError."""
    errors = sorted(_validator().iter_errors(document), key=lambda e: list(e.absolute_path))
    if errors:
        first = errors[0]
        more = f" (and {len(errors) - 1} more problem(s))" if len(errors) > 1 else ""
        raise ContractError(source, _json_path(first), _describe(first) + more)

    fields = tuple(
        Field(name=f["name"], type=f["type"], nullable=f.get("nullable", True))
        for f in document["value"]["fields"]
    )
    tables = tuple(
        TableSpec(
            name=t["name"],
            kind=t["kind"],
            description=t.get("description", ""),
            aggregations=tuple(
                Aggregation(name=a["name"], fn=a["fn"], field=a.get("field"))
                for a in t.get("aggregations", [])
            ),
        )
        for t in document.get("tables", [])
    )
    contract = Contract(
        topic=document["topic"],
        partitions=document.get("partitions", 1),
        key_format=document["key"]["format"],
        key_name=document["key"]["name"],
        value_format=document["value"]["format"],
        fields=fields,
        stream=document["stream"]["name"],
        tables=tables,
        schedule_minutes=document.get("schedule_minutes", 5),
        landing_format=document.get("landing", {}).get("format", "envelope"),
        max_record_bytes=document.get("landing", {}).get("max_record_bytes", 1_048_576),
        description=document.get("description", ""),
        owner=document.get("owner", "data-platform"),
        source=source,
    )
    _check_semantics(contract, document)
    return contract


def _check_semantics(c: Contract, doc: dict[str, Any]) -> None:
    """Rules a JSON schema cannot say: names must not collide, fields must exist and fit."""
    if c.topic in {".", ".."}:
        raise ContractError(c.source, "topic", "'.' and '..' are not legal topic names")
    columns = [c.key_name, *(f.name for f in c.fields)]
    for i, name in enumerate(columns):
        where = "key.name" if i == 0 else f"value.fields[{i - 1}].name"
        if name in STREAM_METADATA_COLUMNS:
            raise ContractError(
                c.source,
                where,
                f"{name!r} is reserved for stream metadata {STREAM_METADATA_COLUMNS}",
            )
        if name in columns[:i]:
            raise ContractError(c.source, where, f"column {name!r} is declared twice")
    seen: set[str] = set()
    for ti, t in enumerate(c.tables):
        if t.name in seen:
            raise ContractError(c.source, f"tables[{ti}].name", f"table {t.name!r} declared twice")
        seen.add(t.name)
        out_names: set[str] = {c.key_name}
        for ai, a in enumerate(t.aggregations):
            where = f"tables[{ti}].aggregations[{ai}]"
            if a.name in out_names:
                raise ContractError(c.source, f"{where}.name", f"column {a.name!r} already exists")
            out_names.add(a.name)
            if a.fn == "count":
                if a.field is not None and a.field not in columns[1:]:
                    raise ContractError(
                        c.source, f"{where}.field", f"no value field named {a.field!r}"
                    )
                continue
            if a.field is None:
                raise ContractError(c.source, where, f"'{a.fn}' needs a 'field' to aggregate")
            try:
                f = c.field(a.field)
            except KeyError:
                raise ContractError(
                    c.source, f"{where}.field", f"no value field named {a.field!r}"
                ) from None
            if a.fn == "sum" and f.type not in NUMERIC_TYPES:
                raise ContractError(
                    c.source, f"{where}.field", f"cannot sum {a.field!r} of type {f.type}"
                )


def load_contract(path: Path) -> Contract:
    """Read and validate one contract file."""
    source = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ContractError(source, "", f"cannot read the file: {exc.strerror}") from exc
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ContractError(source, where, f"not valid YAML: {exc}") from exc
    contract = parse_contract(document, source)
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
        return cls(contracts)

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
