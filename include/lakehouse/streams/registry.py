"""A schema registry for contracts, in the manner of Confluent's.

Each topic has two subjects, ``key`` and ``value``. Whenever a job runs with a contract whose key
or value schema differs from the subject's latest registered version, the new schema is checked
against the topic's compatibility mode (BACKWARD, FORWARD, FULL, their transitive forms, or
NONE) by Avro's reader/writer rules, and registered as a new version only if it passes; a schema
that breaks the mode is refused with the reasons before any data moves. JSON contracts are
compared by the same rules, through the Avro record their fields describe (a nullable field is
an optional one, defaulting to null).

Three more rules protect the data already written:

* a Confluent schema id, once registered, always means the same schema (ids are immutable);
* a column keeps its type, even after a version without it: silver keeps its history as written, so a type change, even a
  promotion Avro allows (int to long), would need a new stream rather than an evolution;
* the wire format of a key or value (string, json, avro) does not change under a mode other
  than NONE, since records already in bronze would no longer decode.

Every version keeps the contract text it came from, so each contract version is kept. The
versions of every topic are the rows of one Delta table (``Settings.registry_path``), one row
per version, as Confluent's registry keeps its state in one log (the ``_schemas`` topic). Rows
are appended by delta-spark, so registering needs a SparkSession; they are read from delta-rs
snapshots, so a job whose contract is unchanged, ``lakehouse schemas`` and a dry run pay no Spark
job. A version's commit carries the app transaction ``lakehouse.registry/<topic>/<subject>``
at the version's number, and Delta skips a commit of a number already recorded: two jobs
registering at once cannot both take a number. The one that finds its commit skipped reads the
versions again and decides again.

The rules are pure Python (:func:`check_contract`): imported by jobs and the CLI, not by Spark
workers.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from lakehouse.contracts.model import Contract, canonical_json
from lakehouse.errors import ConcurrentWriteError, LakehouseError, SchemaEvolutionError
from lakehouse.runtime.config import Settings, validate_topic_name
from lakehouse.storage import is_table

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import SparkSession

Subject = Literal["key", "value"]
SUBJECTS: tuple[Subject, ...] = ("key", "value")


@dataclass(frozen=True)
class SchemaState:
    """What a contract says about one subject: comparable with a registered version."""

    format: str
    schema: Any
    ids: dict[str, str]  # Confluent schema id -> canonical schema (Avro formats only)
    columns: dict[str, str]  # silver column -> type

    @classmethod
    def of(cls, contract: Contract, subject: Subject) -> SchemaState:
        if subject == "key":
            return cls(
                format=contract.key_format,
                schema=contract.key_avro_schema(),
                ids={str(v.id): v.canonical for v in contract.key_schemas if v.id is not None},
                columns={contract.key_name: contract.key_type},
            )
        return cls(
            format=contract.value_format,
            schema=contract.value_avro_schema(),
            ids={str(v.id): v.canonical for v in contract.value_schemas if v.id is not None},
            columns={f.name: f.type_name for f in contract.fields},
        )

    def same_as(self, other: SchemaState) -> bool:
        return (self.format, canonical_json(self.schema), self.ids, self.columns) == (
            other.format,
            canonical_json(other.schema),
            other.ids,
            other.columns,
        )


@dataclass(frozen=True)
class RegisteredVersion:
    topic: str
    subject: Subject
    version: int
    state: SchemaState
    compatibility: str
    registered_at: str
    contract_source: str
    contract_text: str

    def to_row(self) -> dict[str, Any]:
        """The version as a row of the registry's table (:func:`registry_schema`)."""
        return {
            "topic": self.topic,
            "subject": self.subject,
            "version": self.version,
            "format": self.state.format,
            "schema": json.dumps(self.state.schema),
            "ids": json.dumps(self.state.ids),
            "columns": json.dumps(self.state.columns),
            "compatibility": self.compatibility,
            "registered_at": datetime.fromisoformat(self.registered_at),
            "contract_source": self.contract_source,
            "contract_text": self.contract_text,
        }

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> RegisteredVersion:
        state = SchemaState(
            row["format"],
            json.loads(row["schema"]),
            json.loads(row["ids"]),
            json.loads(row["columns"]),
        )
        registered_at = row["registered_at"].astimezone(UTC)
        return cls(
            topic=row["topic"],
            subject=row["subject"],
            version=int(row["version"]),
            state=state,
            compatibility=row["compatibility"],
            registered_at=registered_at.isoformat(timespec="milliseconds"),
            contract_source=row["contract_source"],
            contract_text=row["contract_text"],
        )


def registry_schema() -> pa.Schema:
    """The registry's table: one row per registered version; the schema, its ids and columns
    as JSON text."""
    import pyarrow as pa

    def column(name: str, kind: pa.DataType) -> pa.Field:
        return pa.field(name, kind, nullable=False)

    return pa.schema(
        [
            column("topic", pa.string()),
            column("subject", pa.string()),
            column("version", pa.int64()),
            column("format", pa.string()),
            column("schema", pa.string()),
            column("ids", pa.string()),
            column("columns", pa.string()),
            column("compatibility", pa.string()),
            column("registered_at", pa.timestamp("us", tz="UTC")),
            column("contract_source", pa.string()),
            column("contract_text", pa.string()),
        ]
    )


def evolution_problems(mode: str, new: SchemaState, history: list[RegisteredVersion]) -> list[str]:
    """Why ``new`` cannot follow ``history`` (oldest first) under ``mode``; empty if it can."""
    from lakehouse.contracts import avro

    if not history:
        return []
    latest = history[-1].state
    problems: list[str] = []
    for version in history:
        for schema_id, canonical in new.ids.items():
            before = version.state.ids.get(schema_id)
            if before is not None and before != canonical:
                problems.append(
                    f"schema id {schema_id} was registered in version {version.version} with a "
                    "different schema; a schema id cannot change its meaning (give the new "
                    "schema a new id)"
                )
    stored: dict[str, str] = {}  # every column silver has ever had keeps its first type
    for version in history:
        for column, kind in version.state.columns.items():
            stored.setdefault(column, kind)
    for column, kind in new.columns.items():
        was = stored.get(column)
        if was is not None and was != kind:
            problems.append(
                f"column {column!r} would change type from {was} to {kind}; silver keeps its "
                "history as written, so publish the new type as a new field or a new stream"
            )
    if mode != "NONE" and new.format != latest.format:
        problems.append(
            f"the format changes from {latest.format} to {new.format}; records already in "
            "bronze would no longer decode (allowed only under compatibility NONE)"
        )
    if canonical_json(new.schema) != canonical_json(latest.schema):
        previous = [v.state.schema for v in history]
        try:
            problems += avro.check_compatibility(mode, new.schema, previous)
        except ValueError as exc:  # a schema Apache's stricter parser refuses
            problems.append(str(exc))
    return list(dict.fromkeys(problems))


def _avro_reader(contract: Contract, subject: Subject) -> tuple[Any, dict[int, Any]] | None:
    """An Avro key's or value's reader schema and writers, if it is written through a schema
    registry whose versions were looked up (else None)."""
    if subject == "key":
        source, fmt, schemas = contract.key_registry, contract.key_format, contract.key_schemas
        writers = contract.key_writers
    else:
        source, fmt, schemas = (
            contract.value_registry,
            contract.value_format,
            contract.value_schemas,
        )
        writers = contract.value_writers
    if source is None or fmt != "avro":
        return None
    return schemas[-1].schema, writers


def subject_problems(
    contract: Contract, history: Sequence[RegisteredVersion], subject: Subject = "value"
) -> list[str]:
    """Why a changed reader schema of a value (or key) written through a schema registry would
    be refused by the registry's subject, were it registered after the subject's versions (its
    mode, Avro's rules); empty when the reader is unchanged or the versions were not looked
    up."""
    from lakehouse.contracts import avro

    source = contract.value_registry if subject == "value" else contract.key_registry
    found_reader = _avro_reader(contract, subject)
    if source is None or not source.looked_up or found_reader is None:
        return []
    reader, writers = found_reader
    if history and canonical_json(reader) == canonical_json(history[-1].state.schema):
        return []
    mode = source.compatibility or "BACKWARD"
    try:
        found = avro.check_compatibility(mode, reader, list(writers.values()))
    except ValueError as exc:
        found = [str(exc)]
    return [
        f"the registry's subject {source.subject!r} ({mode}) would refuse it: {p}" for p in found
    ]


def subject_change(
    contract: Contract, subject: Subject, history: Sequence[RegisteredVersion]
) -> SchemaState | None:
    """The contract's schema of ``subject`` if it would become a new version after ``history``
    (oldest first), None if it is the latest version's; raises SchemaEvolutionError (naming the
    contract, the subject, the latest version and every problem) if it is refused."""
    state = SchemaState.of(contract, subject)
    if history and state.same_as(history[-1].state):
        return None
    through = contract.value_registry if subject == "value" else contract.key_registry
    if history and through is not None:
        # A registry's subject only gains ids: a job that did not look them up (bronze, gold),
        # or saw fewer, changes nothing; one that found a new version records it.
        latest = history[-1].state
        if replace(state, ids={**latest.ids, **state.ids}).same_as(latest):
            return None
    problems = evolution_problems(contract.compatibility, state, list(history))
    problems += subject_problems(contract, history, subject)
    if problems:
        after = f"version {history[-1].version}" if history else "the registry's versions"
        raise SchemaEvolutionError(
            contract.file,
            subject,
            f"the {subject} schema of topic {contract.topic!r} cannot be registered after "
            f"{after} under compatibility {contract.compatibility}: " + "; ".join(problems),
        )
    return state


def check_contract(
    contract: Contract, history: Mapping[Subject, Sequence[RegisteredVersion]]
) -> dict[Subject, SchemaState]:
    """The subjects whose schema would be registered as a new version after ``history`` (each
    subject's versions, oldest first); raises SchemaEvolutionError if any is refused."""
    pending: dict[Subject, SchemaState] = {}
    for subject in SUBJECTS:
        state = subject_change(contract, subject, history.get(subject, ()))
        if state is not None:
            pending[subject] = state
    return pending


def new_version(
    contract: Contract,
    subject: Subject,
    state: SchemaState,
    history: Sequence[RegisteredVersion],
    text: str,
) -> RegisteredVersion:
    """The version that registers ``state`` after ``history``: the next number, now, with the
    contract's ``text``."""
    return RegisteredVersion(
        topic=contract.topic,
        subject=subject,
        version=history[-1].version + 1 if history else 1,
        state=state,
        compatibility=contract.compatibility,
        registered_at=datetime.now(UTC).isoformat(timespec="milliseconds"),
        contract_source=contract.file,
        contract_text=text,
    )


def contract_text(contract: Contract) -> str:
    """The text of the contract's file ("" for a contract made in code)."""
    try:
        return Path(contract.file).read_text(encoding="utf-8")
    except OSError:
        return ""


class SchemaRegistry:
    """The registered schema versions of every topic: the Delta table at ``settings``'
    :attr:`~lakehouse.runtime.config.Settings.registry_path`."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.path = settings.registry_path

    def history(self, topic: str) -> dict[Subject, list[RegisteredVersion]]:
        """Each subject's registered versions of ``topic``, oldest first (a delta-rs read)."""
        from lakehouse.storage import snapshots
        from lakehouse.storage.store import snapshot_arrow

        topic = validate_topic_name(topic)  # no quote can reach the predicate
        out: dict[Subject, list[RegisteredVersion]] = {subject: [] for subject in SUBJECTS}
        if not is_table(self.path):
            return out
        rows = snapshot_arrow(snapshots.latest(self.path), f"\"topic\" = '{topic}'")
        for row in rows.to_pylist():
            version = RegisteredVersion.from_row(row)
            out[version.subject].append(version)
        for versions in out.values():
            versions.sort(key=lambda v: v.version)
        return out

    def versions(self, topic: str, subject: Subject) -> list[RegisteredVersion]:
        return self.history(topic)[subject]

    def reader_changed(self, contract: Contract) -> bool:
        """Whether ``contract``'s Avro value or key is written through a schema registry and its
        reader schema is not the latest registered (a contract change, or the topic's first
        job)."""
        readers = {s: r for s in SUBJECTS if (r := _avro_reader(contract, s)) is not None}
        if not readers:
            return False
        history = self.history(contract.topic)
        for subject, (reader, _) in readers.items():
            versions = history[subject]
            if not versions or canonical_json(versions[-1].state.schema) != canonical_json(reader):
                return True
        return False

    def check(self, contract: Contract) -> dict[Subject, SchemaState]:
        """The subjects whose schema would be registered as a new version; raises
        SchemaEvolutionError (naming the contract and every problem) if any is refused."""
        return check_contract(contract, self.history(contract.topic))

    def register(self, contract: Contract, spark: SparkSession) -> list[RegisteredVersion]:
        """Check the contract and register what changed, with ``spark``; return the new
        versions (often none, which costs no Spark job). Every subject is checked before any
        is registered."""
        pending = self.check(contract)
        if not pending:
            return []
        text = contract_text(contract)
        return [self._add(spark, contract, subject, text) for subject in pending]

    def _add(
        self, spark: SparkSession, contract: Contract, subject: Subject, text: str
    ) -> RegisteredVersion:
        taken = 0  # the number another job took first
        while True:
            history = self.versions(contract.topic, subject)
            if (history[-1].version if history else 0) < taken:
                raise LakehouseError(
                    f"{self.path}: version {taken} of the {subject} schema of topic "
                    f"{contract.topic!r} is recorded as taken (app transaction), but the table "
                    "has no row for it"
                )
            state = subject_change(contract, subject, history)
            if state is None:
                return history[-1]  # another job registered the same schema meanwhile
            version = new_version(contract, subject, state, history, text)
            if self._append(spark, version):
                return version
            # Another job took this number first: decide again after what it registered.
            taken = version.version

    def _append(self, spark: SparkSession, version: RegisteredVersion) -> bool:
        """Append one version's row in a commit fenced by its number (the app transaction of
        its topic and subject); False if the number was taken first, and nothing written."""
        import pyarrow as pa

        from lakehouse.storage import Txn, delta_spark

        schema = registry_schema()
        row = delta_spark.arrow_frame(spark, pa.Table.from_pylist([version.to_row()], schema))
        app = f"lakehouse.registry/{version.topic}/{version.subject}"
        try:
            with delta_spark.table_lock(self.settings, self.path):
                result = delta_spark.append(
                    row.coalesce(1), self.path, txn=Txn(app, version.version), create=schema
                )
        except ConcurrentWriteError:
            return False  # a driver without this machine's lock committed the number first
        return result.committed
