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

Every version keeps the contract text it came from, so each contract version is kept. Versions
are files ``<root>/<topic>/<subject>/v000001.json``, written whole and then hard-linked into place
(which fails if the name exists), so two jobs registering at once cannot take the same number
and a reader never sees half a file.

Pure Python: imported by jobs and the CLI, not by Spark workers.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from lakehouse.config import validate_topic_name
from lakehouse.contracts import Contract, canonical_json
from lakehouse.errors import SchemaEvolutionError

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
                ids={str(v.id): v.canonical for v in contract.key_schemas},
                columns={contract.key_name: contract.key_type},
            )
        return cls(
            format=contract.value_format,
            schema=contract.value_avro_schema(),
            ids={str(v.id): v.canonical for v in contract.value_schemas},
            columns={f.name: f.type for f in contract.fields},
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

    def to_json(self) -> dict[str, Any]:
        return {
            "topic": self.topic,
            "subject": self.subject,
            "version": self.version,
            "format": self.state.format,
            "schema": self.state.schema,
            "ids": self.state.ids,
            "columns": self.state.columns,
            "compatibility": self.compatibility,
            "registered_at": self.registered_at,
            "contract_source": self.contract_source,
            "contract_text": self.contract_text,
        }

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> RegisteredVersion:
        return cls(
            topic=doc["topic"],
            subject=doc["subject"],
            version=doc["version"],
            state=SchemaState(doc["format"], doc["schema"], doc["ids"], doc["columns"]),
            compatibility=doc["compatibility"],
            registered_at=doc["registered_at"],
            contract_source=doc["contract_source"],
            contract_text=doc["contract_text"],
        )


def evolution_problems(mode: str, new: SchemaState, history: list[RegisteredVersion]) -> list[str]:
    """Why ``new`` cannot follow ``history`` (oldest first) under ``mode``; empty if it can."""
    from lakehouse import avro

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


def subject_change(
    contract: Contract, subject: Subject, history: Sequence[RegisteredVersion]
) -> SchemaState | None:
    """The contract's schema of ``subject`` if it would become a new version after ``history``
    (oldest first), None if it is the latest version's; raises SchemaEvolutionError (naming the
    contract, the subject, the latest version and every problem) if it is refused."""
    state = SchemaState.of(contract, subject)
    if history and state.same_as(history[-1].state):
        return None
    problems = evolution_problems(contract.compatibility, state, list(history))
    if problems:
        raise SchemaEvolutionError(
            contract.source,
            subject,
            f"the {subject} schema of topic {contract.topic!r} cannot be registered after "
            f"version {history[-1].version} under compatibility {contract.compatibility}: "
            + "; ".join(problems),
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
        contract_source=contract.source,
        contract_text=text,
    )


def contract_text(contract: Contract) -> str:
    """The text of the contract's file ("" for a contract made in code)."""
    try:
        return Path(contract.source).read_text(encoding="utf-8")
    except OSError:
        return ""


class SchemaRegistry:
    """The registered schema versions of every topic, kept under ``root``."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def _dir(self, topic: str, subject: Subject) -> Path:
        return self.root / validate_topic_name(topic) / subject

    def versions(self, topic: str, subject: Subject) -> list[RegisteredVersion]:
        folder = self._dir(topic, subject)
        if not folder.is_dir():
            return []
        out = [
            RegisteredVersion.from_json(json.loads(p.read_text(encoding="utf-8")))
            for p in sorted(folder.glob("v*.json"))
        ]
        return sorted(out, key=lambda v: v.version)

    def check(self, contract: Contract) -> dict[Subject, SchemaState]:
        """The subjects whose schema would be registered as a new version; raises
        SchemaEvolutionError (naming the contract and every problem) if any is refused."""
        return check_contract(
            contract, {subject: self.versions(contract.topic, subject) for subject in SUBJECTS}
        )

    def register(self, contract: Contract) -> list[RegisteredVersion]:
        """Check the contract and register what changed; return the new versions (often none)."""
        added: list[RegisteredVersion] = []
        for subject, state in self.check(contract).items():
            added.append(self._write(contract, subject, state))
        return added

    def _write(self, contract: Contract, subject: Subject, state: SchemaState) -> RegisteredVersion:
        folder = self._dir(contract.topic, subject)
        folder.mkdir(parents=True, exist_ok=True)
        text = contract_text(contract)
        while True:
            history = self.versions(contract.topic, subject)
            if history and state.same_as(history[-1].state):
                return history[-1]  # another job registered the same schema meanwhile
            version = new_version(contract, subject, state, history, text)
            target = folder / f"v{version.version:06d}.json"
            fd, name = tempfile.mkstemp(dir=folder, prefix=".tmp-")
            tmp = Path(name)
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                out.write(json.dumps(version.to_json(), indent=2, sort_keys=True))
            try:
                os.link(tmp, target)
            except FileExistsError:
                # Someone took this number first: re-check against what they registered.
                self.check(contract)
                continue
            finally:
                tmp.unlink()
            return version
