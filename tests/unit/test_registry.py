"""The schema registry: each contract version kept, compatibility modes enforced before data
moves, schema ids immutable, column types and wire formats fixed.

The rules are tested on versions kept in memory (no Spark); registering into the registry's
Delta table, by delta-spark, is tested with Spark (``integration``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from textwrap import dedent
from typing import Any

import pytest
import yaml

from lakehouse.contracts.catalog import parse_contract
from lakehouse.contracts.model import Contract, SchemaVersion
from lakehouse.errors import ConfigError, ContractError, LakehouseError, SchemaEvolutionError
from lakehouse.runtime.config import Settings
from lakehouse.streams.registry import (
    SUBJECTS,
    RegisteredVersion,
    SchemaRegistry,
    Subject,
    check_contract,
    contract_text,
    new_version,
    subject_change,
)


def _lake(root: Path) -> Settings:
    """A lake whose schema registry is ``root / "schemas"``."""
    return Settings(home=root, contracts_dir=root)


def _json_contract(fields: list[dict[str, Any]], mode: str = "BACKWARD", **extra: Any) -> Contract:
    doc = {
        "topic": "t",
        "compatibility": mode,
        "key": {"format": "string", "name": "id"},
        "value": {"format": "json", "fields": fields},
        "stream": {"name": "t_stream"},
        **extra,
    }
    return parse_contract(doc, "t.yaml")


def _avro_contract(schemas: list[tuple[int, dict[str, Any]]], mode: str = "BACKWARD") -> Contract:
    doc = {
        "topic": "t",
        "compatibility": mode,
        "key": {"format": "string", "name": "id"},
        "value": {"format": "avro", "schemas": [{"id": i, "schema": s} for i, s in schemas]},
        "stream": {"name": "t_stream"},
    }
    return parse_contract(doc, "t.yaml")


def _record(*fields: dict[str, Any]) -> dict[str, Any]:
    return {"type": "record", "name": "V", "fields": list(fields)}


A = {"name": "a", "type": "long"}
B_OPTIONAL = {"name": "b", "type": ["null", "string"], "default": None}


class Kept:
    """Versions kept in memory, registered by the registry's own rules (:func:`check_contract`,
    :func:`new_version`): the rules, tested without a table or Spark."""

    def __init__(self) -> None:
        self.kept: dict[tuple[str, Subject], list[RegisteredVersion]] = {}

    def versions(self, topic: str, subject: Subject) -> list[RegisteredVersion]:
        return list(self.kept.get((topic, subject), []))

    def register(self, contract: Contract) -> list[RegisteredVersion]:
        history = {s: self.versions(contract.topic, s) for s in SUBJECTS}
        added = [
            new_version(contract, subject, state, history[subject], contract_text(contract))
            for subject, state in check_contract(contract, history).items()
        ]
        for version in added:
            self.kept.setdefault((version.topic, version.subject), []).append(version)
        return added


class NoSpark:
    """A SparkSession stand-in that fails when used."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"Spark was used: {name}")


NO_SPARK: Any = NoSpark()


@pytest.fixture
def registry() -> Kept:
    return Kept()


@pytest.mark.integration
def test_first_contract_registers_version_one_then_nothing_changes(
    spark: Any, tmp_path: Path
) -> None:
    registry = SchemaRegistry(_lake(tmp_path))
    c = _json_contract([{"name": "a", "type": "long"}])
    added = registry.register(c, spark)
    assert [(v.subject, v.version) for v in added] == [("key", 1), ("value", 1)]
    assert registry.register(c, spark) == []
    assert registry.register(c, NO_SPARK) == []  # an unchanged contract costs no Spark job
    (value,) = registry.versions("t", "value")
    assert value.state.columns == {"a": "long"}
    assert value.compatibility == "BACKWARD"


@pytest.mark.integration
def test_each_contract_version_is_kept_with_its_text(spark: Any, tmp_path: Path) -> None:
    registry = SchemaRegistry(_lake(tmp_path))
    path = tmp_path / "t.yaml"
    v1 = dedent(
        """\
        topic: t
        key: {format: string, name: id}
        value: {format: json, fields: [{name: a, type: long}]}
        stream: {name: t_stream}
        """
    )
    path.write_text(v1)
    from lakehouse.contracts.catalog import load_contract

    registry.register(load_contract(path), spark)
    v2 = v1.replace("{name: a, type: long}", "{name: a, type: long}, {name: b, type: string}")
    path.write_text(v2)
    registry.register(load_contract(path), spark)
    versions = registry.versions("t", "value")
    assert [v.version for v in versions] == [1, 2]
    assert [v.contract_text for v in versions] == [v1, v2]
    assert versions[1].state.columns == {"a": "long", "b": "string"}


@pytest.mark.parametrize(
    ("mode", "change", "accepted"),
    [
        # Adding an optional field: old data reads with null (BACKWARD), old readers ignore it.
        ("BACKWARD", "add_optional", True),
        ("FORWARD", "add_optional", True),
        ("FULL", "add_optional", True),
        # Adding a required field: the new schema cannot read old data.
        ("BACKWARD", "add_required", False),
        ("FORWARD", "add_required", True),
        ("FULL", "add_required", False),
        ("NONE", "add_required", True),
        # Removing a required field: old readers cannot read new data.
        ("BACKWARD", "remove_required", True),
        ("FORWARD", "remove_required", False),
        ("FULL", "remove_required", False),
        ("NONE", "remove_required", True),
    ],
)
def test_json_contract_evolution_by_mode(
    registry: Kept, mode: str, change: str, accepted: bool
) -> None:
    base = [{"name": "a", "type": "long", "nullable": False}, {"name": "z", "type": "string"}]
    registry.register(_json_contract(base, mode))
    new = {
        "add_optional": [*base, {"name": "b", "type": "string"}],
        "add_required": [*base, {"name": "b", "type": "string", "nullable": False}],
        "remove_required": base[1:],
    }[change]
    contract = _json_contract(new, mode)
    if accepted:
        assert [v.version for v in registry.register(contract)] == [2]
    else:
        with pytest.raises(SchemaEvolutionError) as info:
            registry.register(contract)
        assert info.value.path == "value"
        assert f"under compatibility {mode}" in info.value.problem
        assert "/fields/" in info.value.problem  # the offending field's location
        assert [v.version for v in registry.versions("t", "value")] == [1]


def test_transitive_modes_check_every_older_version(registry: Kept) -> None:
    # v1 writes colours RED and GREEN; v2 drops the field; v3 brings it back, optional, with
    # RED only. v3 reads v2's data (the field defaults to null) but not v1's (GREEN).
    colour = {"type": "enum", "name": "Colour", "symbols": ["RED", "GREEN"]}
    v1 = _record(A, {"name": "colour", "type": colour})
    v2 = _record(A)
    red_only = {"type": "enum", "name": "Colour", "symbols": ["RED"]}
    v3 = _record(A, {"name": "colour", "type": ["null", red_only], "default": None})

    plain = Kept()
    plain.register(_avro_contract([(1, v1)]))
    plain.register(_avro_contract([(2, v2)]))
    assert [v.version for v in plain.register(_avro_contract([(3, v3)]))] == [3]

    registry.register(_avro_contract([(1, v1)], "BACKWARD_TRANSITIVE"))
    registry.register(_avro_contract([(2, v2)], "BACKWARD_TRANSITIVE"))
    with pytest.raises(SchemaEvolutionError) as info:
        registry.register(_avro_contract([(3, v3)], "BACKWARD_TRANSITIVE"))
    assert "cannot read enum 'Colour'" in info.value.problem
    assert [v.version for v in registry.versions("t", "value")] == [1, 2]

    # A contract that lists all three ids is refused at load time, before any registry.
    with pytest.raises(ContractError, match="schema id 3 breaks BACKWARD_TRANSITIVE"):
        _avro_contract([(1, v1), (2, v2), (3, v3)], "BACKWARD_TRANSITIVE")
    assert _avro_contract([(1, v1), (2, v2), (3, v3)], "BACKWARD").value_schemas[-1].id == 3


def test_schema_ids_are_immutable(registry: Kept) -> None:
    registry.register(_avro_contract([(1, _record(A))]))
    changed = _record(A, B_OPTIONAL)  # compatible, but under the same id
    with pytest.raises(SchemaEvolutionError, match="schema id 1 was registered in version 1"):
        registry.register(_avro_contract([(1, changed)]))
    assert [
        v.version for v in registry.register(_avro_contract([(1, _record(A)), (2, changed)]))
    ] == [2]


def test_column_type_change_is_refused_even_when_avro_allows_it(
    registry: Kept,
) -> None:
    registry.register(_avro_contract([(1, _record({"name": "a", "type": "int"}))]))
    with pytest.raises(SchemaEvolutionError, match="column 'a' would change type from int to long"):
        registry.register(
            _avro_contract([(1, _record({"name": "a", "type": "int"})), (2, _record(A))])
        )


def test_a_decimal_keeps_its_precision_and_scale(registry: Kept) -> None:
    """Widening a decimal's precision is refused twice over: Avro's spec matches decimals only
    of the same precision and scale, and silver's column keeps its type."""

    def price(precision: int, scale: int) -> dict[str, Any]:
        return {"name": "price", "type": "decimal", "precision": precision, "scale": scale}

    registry.register(_json_contract([price(12, 2)]))
    assert registry.register(_json_contract([price(12, 2)])) == []
    with pytest.raises(SchemaEvolutionError) as refused:
        registry.register(_json_contract([price(14, 2)]))
    message = str(refused.value)
    assert "column 'price' would change type from decimal(12,2) to decimal(14,2)" in message
    assert (
        "BACKWARD: version 2 cannot read data written with version 1: field 'price' (at "
        "/fields/0) is union [null, bytes (decimal(14,2))] and cannot read union [null, bytes "
        "(decimal(12,2))] (a decimal reads only a decimal of the same precision and scale, as "
        "Avro's spec says)"
    ) in message


def test_format_change_needs_mode_none(registry: Kept) -> None:
    registry.register(_json_contract([{"name": "a", "type": "long", "nullable": False}]))
    with pytest.raises(SchemaEvolutionError, match="format changes from json to avro"):
        registry.register(_avro_contract([(1, _record(A))]))
    assert [v.version for v in registry.register(_avro_contract([(1, _record(A))], "NONE"))] == [2]


def test_key_schema_is_a_subject_too(registry: Kept) -> None:
    doc: dict[str, Any] = yaml.safe_load(
        dedent(
            """\
            topic: t
            key: {format: json, name: id, type: long}
            value: {format: json, fields: [{name: a, type: long}]}
            stream: {name: t_stream}
            """
        )
    )
    registry.register(parse_contract(doc, "t.yaml"))
    doc["key"]["type"] = "string"
    with pytest.raises(SchemaEvolutionError) as info:
        registry.register(parse_contract(doc, "t.yaml"))
    assert info.value.path == "key"
    assert "column 'id' would change type from long to string" in info.value.problem


@pytest.mark.integration
def test_concurrent_registration_takes_one_version(spark: Any, tmp_path: Path) -> None:
    registry = SchemaRegistry(_lake(tmp_path))
    registry.register(_json_contract([{"name": "a", "type": "long"}]), spark)
    new = _json_contract([{"name": "a", "type": "long"}, {"name": "b", "type": "string"}])
    errors: list[BaseException] = []

    def go() -> None:
        try:
            registry.register(new, spark)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=go) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert [v.version for v in registry.versions("t", "value")] == [1, 2]


@pytest.mark.integration
def test_two_registrants_of_one_version_cannot_both_land(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two jobs decide on version 2 at once with different schemas: one lands, the other finds
    the number taken, decides again after it, and is refused by what it registered."""
    from lakehouse.storage import delta_spark, read_arrow

    registry = SchemaRegistry(_lake(tmp_path))
    registry.register(_json_contract([{"name": "a", "type": "long"}]), spark)
    contracts = [
        _json_contract([{"name": "a", "type": "long"}, {"name": "b", "type": kind}])
        for kind in ("string", "long")
    ]
    both_decided = threading.Barrier(len(contracts), timeout=300)
    real_lock = delta_spark.table_lock

    @contextmanager
    def lock_once_both_decided(settings: Settings, path: Path) -> Iterator[None]:
        both_decided.wait()  # each has read version 1 and chosen number 2
        with real_lock(settings, path):
            yield

    monkeypatch.setattr(delta_spark, "table_lock", lock_once_both_decided)
    added: list[RegisteredVersion] = []
    refused: list[SchemaEvolutionError] = []

    def go(contract: Contract) -> None:
        try:
            added.extend(registry.register(contract, spark))
        except SchemaEvolutionError as exc:
            refused.append(exc)

    threads = [threading.Thread(target=go, args=(c,)) for c in contracts]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [(v.subject, v.version) for v in added] == [("value", 2)]
    (error,) = refused
    assert error.path == "value"
    assert "cannot be registered after version 2 under compatibility BACKWARD" in error.problem
    assert "column 'b' would change type" in error.problem
    versions = registry.versions("t", "value")
    assert [v.version for v in versions] == [1, 2]
    assert versions[1].state.columns == added[0].state.columns
    rows = read_arrow(registry.path).to_pylist()
    assert sorted((r["subject"], r["version"]) for r in rows) == [
        ("key", 1),
        ("value", 1),
        ("value", 2),
    ]


@pytest.mark.integration
def test_registered_versions_are_read_back_by_a_new_process(spark: Any, tmp_path: Path) -> None:
    registry = SchemaRegistry(_lake(tmp_path))
    registry.register(_avro_contract([(1, _record(A))]), spark)
    added = registry.register(_avro_contract([(1, _record(A)), (2, _record(A, B_OPTIONAL))]), spark)
    reader = dedent(
        f"""\
        import json, sys
        from pathlib import Path
        from lakehouse.runtime.config import Settings
        from lakehouse.streams.registry import SchemaRegistry
        lake = Settings(home=Path({str(tmp_path)!r}), contracts_dir=Path({str(tmp_path)!r}))
        registry = SchemaRegistry(lake)
        print(json.dumps([v.to_row() for v in registry.versions("t", "value")], default=str))
        print("spark imported:", "pyspark" in sys.modules)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", reader],
        capture_output=True,
        text=True,
        check=True,
        env=os.environ.copy(),
        timeout=120,
    ).stdout.splitlines()
    rows = json.loads(out[0])
    assert [r["version"] for r in rows] == [1, 2]
    expected = json.loads(json.dumps([v.to_row() for v in added], default=str))
    assert rows[1] == expected[0]  # every field, the registration time and schemas included
    assert sorted(json.loads(rows[1]["ids"])) == ["1", "2"]
    assert out[1] == "spark imported: False"


@pytest.mark.integration
def test_a_number_recorded_as_taken_without_its_row_is_an_error_not_a_loop(
    spark: Any, tmp_path: Path
) -> None:
    registry = SchemaRegistry(_lake(tmp_path))
    registry.register(_json_contract([{"name": "a", "type": "long"}]), spark)
    # Rows deleted behind the registry's back: the value subject's app transaction stays at 1.
    spark.sql(f"DELETE FROM delta.`{registry.path}` WHERE subject = 'value'")
    with pytest.raises(
        LakehouseError, match="version 1 of the value schema of topic 't' is recorded"
    ):
        registry.register(_json_contract([{"name": "b", "type": "long"}]), spark)


# -- values written through a Confluent-compatible registry -----------------------------------
THROUGH_A_REGISTRY = {
    "topic": "t",
    "key": {"format": "string", "name": "id"},
    "value": {
        "format": "avro",
        "registry": {"subject": "topic"},
        "reader": {
            "schema": {"type": "record", "name": "T", "fields": [{"name": "a", "type": "long"}]}
        },
    },
    "stream": {"name": "t_stream"},
}


def test_where_a_registry_topics_ids_are_looked_up_is_said_or_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The contract's URL, else the deployment's, else this lakehouse's running registry; a
    URL carrying credentials is refused, and with none given or running the error says how."""
    from lakehouse.contracts import confluent

    settings = Settings.from_env(home=tmp_path / "home")
    contract = parse_contract(THROUGH_A_REGISTRY, "t.yaml")
    monkeypatch.delenv(confluent.URL_ENV, raising=False)
    with pytest.raises(confluent.SchemaRegistryUnavailableError) as none:
        confluent.resolve(contract, settings)
    assert confluent.URL_ENV in str(none.value) and "lakehouse registry start" in str(none.value)

    monkeypatch.setenv(confluent.URL_ENV, "http://user:pw@127.0.0.1:8081")
    with pytest.raises(ConfigError, match="no credentials"):
        confluent.registry_url(contract, settings)
    monkeypatch.setenv(confluent.URL_ENV, "http://127.0.0.1:8081/apis/ccompat/v7/")
    assert confluent.registry_url(contract, settings) == "http://127.0.0.1:8081/apis/ccompat/v7"
    given = {**THROUGH_A_REGISTRY["value"], "registry": {"url": "http://registry:8081"}}
    mine = parse_contract({**THROUGH_A_REGISTRY, "value": given}, "t.yaml")
    assert confluent.registry_url(mine, settings) == "http://registry:8081"


def test_a_registry_topics_known_ids_only_grow_in_the_schema_history() -> None:
    """A job that looked no id up (bronze, gold) registers nothing new after one that did;
    a new registered id is a new version; an id that changed its schema is refused."""
    contract = parse_contract(THROUGH_A_REGISTRY, "t.yaml")
    reader = contract.value_schemas[-1]
    resolved = replace(contract, value_schemas=(SchemaVersion(7, reader.schema), reader))
    history: list[RegisteredVersion] = []
    for step in (contract, resolved):
        state = subject_change(step, "value", history)
        assert state is not None
        history.append(new_version(step, "value", state, history, ""))
    assert [set(v.state.ids) for v in history] == [set(), {"7"}]
    assert subject_change(contract, "value", history) is None
    assert subject_change(resolved, "value", history) is None
    grown = replace(
        resolved, value_schemas=(SchemaVersion(8, reader.schema), *resolved.value_schemas)
    )
    assert subject_change(grown, "value", history) is not None
    other = {"type": "record", "name": "T", "fields": [{"name": "b", "type": "long"}]}
    changed = replace(resolved, value_schemas=(SchemaVersion(7, other), reader))
    with pytest.raises(SchemaEvolutionError, match="schema id 7 was registered"):
        subject_change(changed, "value", history)


def test_a_json_value_through_a_registry_keeps_its_fields_and_the_topics_subject() -> None:
    json_value = {
        "format": "json",
        "registry": {},
        "fields": [
            {"name": "a", "type": "long", "nullable": False},
            {"name": "b", "type": "string"},
        ],
    }
    contract = parse_contract({**THROUGH_A_REGISTRY, "value": json_value}, "t.yaml")
    assert contract.value_registry is not None and contract.value_registry.subject == "t-value"
    assert contract.value_schemas == () and [f.name for f in contract.fields] == ["a", "b"]
    from lakehouse.contracts import confluent

    schema = confluent.json_schema(contract)
    assert schema["required"] == ["a"] and schema["additionalProperties"] is False
    assert schema["properties"]["b"] == {"type": ["string", "null"]}

    for wrong, says in (
        ({"registry": {"subject": "record"}}, "with format 'json' the subject is the topic's"),
        ({"reader": {"schema": "long"}}, "'reader' is not allowed with format 'json'"),
    ):
        with pytest.raises(ContractError) as refused:
            parse_contract({**THROUGH_A_REGISTRY, "value": {**json_value, **wrong}}, "t.yaml")
        assert says in str(refused.value)


def test_a_changed_key_reader_is_judged_by_the_key_subjects_mode() -> None:
    """A registry key's new reader schema that the subject `<topic>-key` would refuse under its
    mode is refused before any data moves, even where the topic's own mode (NONE) would let
    it through; one the subject would accept is a new version."""
    key = {"format": "avro", "name": "id", "registry": {}, "reader": {"schema": "string"}}
    contract = parse_contract({**THROUGH_A_REGISTRY, "key": key, "compatibility": "NONE"}, "t.yaml")
    assert contract.key_registry is not None

    def looked_up(c: Contract, reader: Any) -> Contract:
        assert c.key_registry is not None
        source = replace(c.key_registry, looked_up=True, compatibility="BACKWARD")
        versions = (SchemaVersion(3, "string"), SchemaVersion(None, reader))
        return replace(c, key_schemas=versions, key_registry=source)

    first = looked_up(contract, "string")
    state = subject_change(first, "key", [])
    assert state is not None
    history = [new_version(first, "key", state, [], "")]
    # An enum reads no string in Avro's resolution: the key subject (BACKWARD) refuses it.
    enum = {"type": "enum", "name": "Who", "symbols": ["ann", "bob"]}
    refused = looked_up(contract, enum)
    assert refused.key_type == "string"  # the column's type is the same: only the subject says no
    with pytest.raises(SchemaEvolutionError) as said:
        subject_change(refused, "key", history)
    assert "subject 't-key' (BACKWARD) would refuse it" in str(said.value)
    # The same reader when the subject's mode is NONE: a new version.
    assert refused.key_registry is not None
    free = replace(refused, key_registry=replace(refused.key_registry, compatibility="NONE"))
    assert subject_change(free, "key", history) is not None


@pytest.mark.parametrize(
    ("key", "problem"),
    [
        ({"format": "protobuf", "name": "id", "type": "string"}, "'registry' is a required"),
        ({"format": "protobuf", "name": "id", "registry": {}}, "'type' is a required"),
        (
            {
                "format": "protobuf",
                "name": "id",
                "type": "long",
                "registry": {},
                "reader": {"schema": "long"},
            },
            "'reader' is not allowed with format 'protobuf'",
        ),
        (
            {
                "format": "json",
                "name": "id",
                "type": "long",
                "registry": {},
                "reader": {"schema": "long"},
            },
            "'reader' is not allowed with format 'json'",
        ),
        (
            {"format": "json", "name": "id", "type": "long", "registry": {"subject": "record"}},
            "a key's subject is the topic's",
        ),
    ],
)
def test_json_schema_and_protobuf_keys_name_their_type_and_the_registry(
    key: dict[str, Any], problem: str
) -> None:
    with pytest.raises(ContractError) as refused:
        parse_contract({**THROUGH_A_REGISTRY, "key": key}, "t.yaml")
    assert problem in str(refused.value), refused.value


def test_json_schema_and_protobuf_keys_through_a_registry_use_the_key_subject() -> None:
    from lakehouse.contracts import confluent

    for fmt in ("json", "protobuf"):
        key = {"format": fmt, "name": "id", "type": "long", "registry": {}}
        contract = parse_contract({**THROUGH_A_REGISTRY, "key": key}, "t.yaml")
        assert contract.key_registry is not None and contract.key_registry.subject == "t-key"
        assert (contract.key_type, contract.key_schemas) == ("long", ())
    json_key = parse_contract(
        {
            **THROUGH_A_REGISTRY,
            "key": {"format": "json", "name": "id", "type": "long", "registry": {}},
        },
        "t.yaml",
    )
    assert confluent.key_json_schema(json_key)["type"] == "integer"
    assert confluent.key_reader_problems(json_key, {"type": "integer"}) == []
    assert confluent.key_reader_problems(json_key, {"type": ["integer", "null"]}) == []
    assert confluent.key_reader_problems(json_key, {"type": "string"}) == [
        "the key is written as string, which a long key cannot read"
    ]
