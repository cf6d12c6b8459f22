from __future__ import annotations

import json
from pathlib import Path
from textwrap import dedent, indent

import pytest

from lakehouse.contracts.catalog import Catalog, load_contract
from lakehouse.contracts.fields import Field
from lakehouse.errors import ContractError, UnknownTableError, UnknownTopicError
from lakehouse.runtime.config import REPO_ROOT

VALID = dedent(
    """\
    topic: t
    partitions: 2
    key: {format: string, name: id}
    value:
      format: json
      fields:
        - {name: amount, type: long}
        - {name: label, type: string, nullable: false}
    stream: {name: t_stream}
    tables:
      - {name: t_latest, kind: latest}
      - name: t_totals
        kind: aggregate
        aggregations:
          - {name: n, fn: count}
          - {name: total, fn: sum, field: amount}
    """
)


def _write(tmp_path: Path, text: str, name: str = "t.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_shipped_contracts_load() -> None:
    catalog = Catalog.load(REPO_ROOT / "contracts")
    c = catalog.topic("user-locations")
    assert (c.partitions, c.key_name, c.stream) == (3, "username", "user_locations")
    assert [t.name for t in c.tables][:2] == ["user_latest_location", "user_location_counts"]
    assert c.table("user_location_counts").aggregations[0].fn == "count"


def test_valid_contract_parses(tmp_path: Path) -> None:
    c = load_contract(_write(tmp_path, VALID))
    assert c.field("label").nullable is False
    assert c.table("t_totals").aggregations[1].field == "amount"


@pytest.mark.parametrize(
    ("old", "new", "where", "problem"),
    [
        ("partitions: 2", "partitions: two", "partitions", "'two' is not of type 'integer'"),
        ("kind: latest}", "kind: lastest}", "tables[0].kind", "'lastest' is not one of"),
        (
            "{name: n, fn: count}",
            "{name: n, fn: median}",
            "tables[1].aggregations[0].fn",
            "'median'",
        ),
        ("format: json", "format: xml", "value.format", "'xml' is not one of"),
        (
            "stream: {name: t_stream}",
            "stream: {name: t_stream}\nquality: {notify: loud}",
            "quality.notify",
            "'loud' is not one of 'warn', 'quarantine' or 'fail'",
        ),
        ("name: t_stream", "name: T-Stream", "stream.name", "does not match the required pattern"),
        ("key: {format: string, name: id}", "key: {format: string}", "key", "'name' is a required"),
        (
            "fn: sum, field: amount}",
            "fn: sum, field: label}",
            "tables[1].aggregations[1].field",
            "cannot sum 'label'",
        ),
        (
            "fn: sum, field: amount}",
            "fn: sum, field: nope}",
            "tables[1].aggregations[1].field",
            "no value field named 'nope'",
        ),
        ("fn: sum, field: amount}", "fn: sum}", "tables[1].aggregations[1]", "needs a 'field'"),
        (
            "{name: amount, type: long}",
            "{name: offset, type: long}",
            "value.fields[0].name",
            "reserved",
        ),
        (
            "{name: amount, type: long}",
            "{name: label, type: long}",
            "value.fields[1].name",
            "declared twice",
        ),
        (
            "kind: latest}",
            "kind: latest, aggregations: [{name: n, fn: count}]}",
            "tables[0]",
            "only allowed",
        ),
        (
            "kind: aggregate\n",
            "kind: aggregate\n    group_by: nope\n",
            "tables[1].group_by",
            "no value field named 'nope'",
        ),
        (
            "{name: total, fn: sum, field: amount}",
            "{name: total, fn: max, field: amount}\n    source: table\n    group_by: label",
            "tables[1].aggregations[1].fn",
            "only avg, count, sum can do that",
        ),
        (
            "{name: t_latest, kind: latest}",
            "{name: t_latest, kind: latest, group_by: label}",
            "tables[0]",
            "'group_by' is not allowed with kind 'latest'",
        ),
        (
            "fn: sum, field: amount}",
            "fn: avg, field: label}",
            "tables[1].aggregations[1].field",
            "cannot avg 'label'",
        ),
        (
            "stream: {name: t_stream}",
            "stream: {name: t_stream}\ncolour: red",
            "",
            "unknown key 'colour'",
        ),
        (
            "kind: aggregate\n",
            "kind: aggregate\n    window: {type: tumbling, size: 5 minutes}\n",
            "tables[1].window.size",
            "does not match the required pattern",
        ),
        (
            "kind: aggregate\n",
            "kind: aggregate\n    window: {type: tumbling, size: 5m, gap: 1m}\n",
            "tables[1].window",
            "'gap' is not allowed with type 'tumbling'",
        ),
        (
            "kind: aggregate\n",
            "kind: aggregate\n    window: {type: hopping, size: 5m, advance: 10m}\n",
            "tables[1].window.advance",
            "cannot advance by more than its size",
        ),
        (
            "kind: aggregate\n",
            "kind: aggregate\n    source: table\n    window: {type: session, gap: 5m}\n",
            "tables[1].window",
            "a table source cannot be windowed",
        ),
        (
            "kind: aggregate\n",
            "kind: aggregate\n    changelog: t_totals\n",
            "tables[1].changelog",
            "no earlier table named 't_totals'",
        ),
        (
            "{name: total, fn: sum, field: amount}",
            "{name: total, fn: sum, field: amount}\n"
            "  - {name: t_again, kind: latest, changelog: t_totals}\n"
            "  - {name: t_odd, kind: latest, changelog: t_x}",
            "tables[3].changelog",
            "no earlier table named 't_x'",
        ),
        (
            "{name: total, fn: sum, field: amount}",
            "{name: total, fn: collect, field: label}\n"
            "  - {name: t_again, kind: latest, changelog: t_totals}",
            "tables[2].changelog",
            "'collect' column",
        ),
        (
            "{name: n, fn: count}",
            "{name: n, fn: earliest}",
            "tables[1].aggregations[0]",
            "'earliest' needs a 'field'",
        ),
        (
            "{name: t_latest, kind: latest}",
            "{name: t_latest, kind: join}",
            "tables[0]",
            "'join' is a required property",
        ),
        (
            "{name: amount, type: long}",
            "{name: amount, type: decimal}",
            "value.fields[0]",
            "'precision' is a required property with type 'decimal'",
        ),
        (
            "{name: amount, type: long}",
            "{name: amount, type: long, precision: 12}",
            "value.fields[0]",
            "'precision' is not allowed with type 'long' (only allowed with type 'decimal')",
        ),
        (
            "{name: amount, type: long}",
            "{name: amount, type: decimal, precision: 39}",
            "value.fields[0].precision",
            "39 is greater than the maximum of 38",
        ),
        (
            "{name: amount, type: long}",
            "{name: amount, type: decimal, precision: 4, scale: 5}",
            "value.fields[0]",
            "scale 5 is greater than the precision 4",
        ),
    ],
)
def test_broken_contract_names_file_path_and_problem(
    tmp_path: Path, old: str, new: str, where: str, problem: str
) -> None:
    assert old in VALID
    path = _write(tmp_path, VALID.replace(old, new))
    with pytest.raises(ContractError) as info:
        load_contract(path)
    err = info.value
    assert err.file == str(path)
    assert err.path == where
    assert problem in err.problem
    assert str(path) in str(err)


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        (
            "aggregations:",
            "agregations:",
            "tables[1] (table 't_totals'): unknown key 'agregations' (did you mean "
            "'aggregations'?)",
        ),
        (
            "{name: total, fn: sum, field: amount}",
            "{name: total, fn: sum, feild: amount}",
            "tables[1].aggregations[1] (table 't_totals', aggregation 'total'): unknown key "
            "'feild' (did you mean 'field'?)",
        ),
        (
            "{name: label, type: string, nullable: false}",
            "{name: label, type: string, nulable: false}",
            "value.fields[1] (field 'label'): unknown key 'nulable' (did you mean 'nullable'?)",
        ),
        # A required key misspelt: unknown rather than missing.
        (
            "stream: {name: t_stream}",
            "steam: {name: t_stream}",
            "unknown key 'steam' (did you mean 'stream'?) (and 1 more problem(s))",
        ),
        # Nothing close: no guess.
        ("stream: {name: t_stream}", "stream: {name: t_stream, colour: red}", "stream: unknown"),
        # Found by the checks after the document's shape: the table is named too.
        (
            "{name: total, fn: sum, field: amount}",
            "{name: total, fn: sum, field: amont}",
            "tables[1].aggregations[1].field (table 't_totals', aggregation 'total'): no value "
            "field named 'amont'",
        ),
    ],
)
def test_a_misspelt_key_is_named_with_its_table_and_the_key_meant(
    tmp_path: Path, old: str, new: str, message: str
) -> None:
    assert old in VALID
    path = _write(tmp_path, VALID.replace(old, new))
    with pytest.raises(ContractError) as info:
        load_contract(path)
    assert f"{path}: {message}" in str(info.value)
    if "colour" in new:
        assert str(info.value).endswith("unknown key 'colour'")


@pytest.mark.parametrize(
    ("quality", "notified"),
    [
        ("", ("fail",)),
        ("quality: {notify: quarantine}\n", ("quarantine", "fail")),
        ("quality: {notify: warn}\n", ("warn", "quarantine", "fail")),
    ],
)
def test_quality_notify_names_the_least_severity_that_notifies(
    tmp_path: Path, quality: str, notified: tuple[str, ...]
) -> None:
    c = load_contract(_write(tmp_path, VALID + quality))
    assert c.quality.notified == notified


def test_a_decimal_field_has_a_precision_and_a_scale(tmp_path: Path) -> None:
    text = VALID.replace(
        "{name: amount, type: long}", "{name: amount, type: decimal, precision: 12, scale: 2}"
    ).replace(
        "- {name: total, fn: sum, field: amount}",
        "- {name: total, fn: sum, field: amount}\n"
        "      - {name: mean, fn: avg, field: amount}\n"
        "      - {name: top, fn: max, field: amount}\n"
        "  - {name: t_moves, kind: latest, changelog: t_totals}",
    )
    c = load_contract(_write(tmp_path, text))
    assert c.field("amount") == Field("amount", "decimal", True, 12, 2)
    assert load_contract(
        _write(tmp_path, VALID.replace("type: long}", "type: decimal, precision: 5}"))
    ).field("amount") == Field("amount", "decimal", True, 5, 0)
    # A table's columns as Spark types them: a sum 10 digits wider, an average 4 more digits
    # on each side of the point, at most 38 in all.
    assert c.changelog_stream(c.table("t_totals")).fields == (
        Field("n", "long"),
        Field("total", "decimal", True, 22, 2),
        Field("mean", "decimal", True, 16, 6),
        Field("top", "decimal", True, 12, 2),
    )
    wide = text.replace("precision: 12, scale: 2", "precision: 36, scale: 36")
    widest = load_contract(_write(tmp_path, wide))
    fields = widest.changelog_stream(widest.table("t_totals")).fields
    assert [f.type_name for f in fields] == [
        "long",
        "decimal(38,36)",
        "decimal(38,38)",
        "decimal(36,36)",
    ]
    with pytest.raises(ContractError) as info:
        load_contract(
            _write(
                tmp_path,
                text.replace("kind: aggregate\n", "kind: aggregate\n    group_by: amount\n"),
            )
        )
    assert (info.value.path, info.value.problem) == (
        "tables[1].group_by",
        "cannot re-key by 'amount' of type decimal(12,2): a key is a string, long, int, "
        "double, boolean or timestamp",
    )


def test_yaml_syntax_error_gives_line(tmp_path: Path) -> None:
    path = _write(tmp_path, VALID.replace("partitions: 2", "partitions: [2"))
    with pytest.raises(ContractError, match=r"line \d+, column \d+: not valid YAML"):
        load_contract(path)


def test_file_name_must_match_topic(tmp_path: Path) -> None:
    with pytest.raises(ContractError, match=r"must live in a file named t\.yaml"):
        load_contract(_write(tmp_path, VALID, name="other.yaml"))


def test_table_names_are_global_across_contracts(tmp_path: Path) -> None:
    _write(tmp_path, VALID)
    _write(
        tmp_path, VALID.replace("topic: t", "topic: u").replace("t_stream", "u_stream"), "u.yaml"
    )
    with pytest.raises(ContractError, match="'t_latest' is already used by"):
        Catalog.load(tmp_path)


def test_catalog_resolves_names_by_layer() -> None:
    catalog = Catalog.load(REPO_ROOT / "contracts")
    assert catalog.resolve_table("user_latest_location")[:2] == ("gold", "user_latest_location")
    assert catalog.resolve_table("silver.user_locations")[:2] == ("silver", "user_locations")
    assert catalog.resolve_table("bronze.user-locations")[:2] == ("bronze", "user-locations")
    with pytest.raises(UnknownTableError, match=r"unknown table .nope.*user_latest_location"):
        catalog.resolve_table("nope")
    with pytest.raises(
        UnknownTopicError,
        match="unknown topic 'nope'; topics with a contract: user-locations, user-profiles",
    ):
        catalog.topic("nope")


def test_shipped_avro_contract_derives_fields_from_the_latest_schema() -> None:
    c = Catalog.load(REPO_ROOT / "contracts").topic("user-profiles")
    assert (c.key_format, c.value_format, c.compatibility) == ("string", "avro", "BACKWARD")
    assert [v.id for v in c.value_schemas] == [1, 2]
    assert [(f.name, f.type, f.nullable) for f in c.fields] == [
        ("name", "string", False),
        ("city", "string", True),
        ("age", "int", True),
        ("updated_at", "timestamp", False),
        ("email", "string", True),
    ]
    assert c.event_time == "updated_at"


AVRO = dedent(
    """\
    topic: t
    event_time: at
    key: {format: string, name: id}
    value:
      format: avro
      schemas:
        - id: 1
          file: t/v1.avsc
    stream: {name: t_stream}
    expectations:
      silver:
        - {name: name_given, expect: not_null, column: name, severity: quarantine}
        - {name: sane_at, expect: between, column: offset, min: 0, severity: warn}
      gold:
        - {name: one_row_per_id, expect: unique, column: id, table: t_latest, severity: fail}
    tables:
      - {name: t_latest, kind: latest}
    """
)
V1 = {
    "type": "record",
    "name": "T",
    "fields": [
        {"name": "name", "type": "string"},
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    ],
}


def _avro_dir(tmp_path: Path, schema: object = V1) -> Path:
    (tmp_path / "t").mkdir(exist_ok=True)
    (tmp_path / "t" / "v1.avsc").write_text(json.dumps(schema))
    return _write(tmp_path, AVRO)


def test_avro_contract_reads_schema_files_beside_it(tmp_path: Path) -> None:
    c = load_contract(_avro_dir(tmp_path))
    assert [f.name for f in c.fields] == ["name", "at"]
    assert [(e.layer, e.name, e.severity) for e in c.expectations] == [
        ("silver", "name_given", "quarantine"),
        ("silver", "sane_at", "warn"),
        ("gold", "one_row_per_id", "fail"),
    ]
    assert c.expectations_of("gold")[0].table == "t_latest"
    assert c.expectations_of("silver")[1].param("min") == 0


@pytest.mark.parametrize(
    ("strategy", "subject"),
    [
        ("topic", "t-value"),
        ("record", "example.T"),
        ("topic-record", "t-example.T"),
    ],
)
def test_a_value_written_through_a_registry_lists_no_id_and_names_its_subject(
    tmp_path: Path, strategy: str, subject: str
) -> None:
    """The reader schema gives the stream's columns; the subject follows the producers'
    naming strategy (Confluent's TopicNameStrategy by default)."""
    path = _avro_dir(tmp_path, {**V1, "namespace": "example"})
    path.write_text(
        AVRO.replace(
            "  schemas:\n    - id: 1\n      file: t/v1.avsc",
            f"  registry: {{subject: {strategy}, url: 'https://registry.example:8081/api'}}\n"
            "  reader: {file: t/v1.avsc}",
        )
    )
    c = load_contract(path)
    assert [f.name for f in c.fields] == ["name", "at"]
    assert c.value_registry is not None
    assert (c.value_registry.subject, c.value_registry.url) == (
        subject,
        "https://registry.example:8081/api",
    )
    assert c.value_writers == {}  # the registry's, looked up by the jobs that decode
    assert [v.id for v in c.value_schemas] == [None]


def test_an_avro_key_written_through_a_registry_reads_its_subject_topic_key(
    tmp_path: Path,
) -> None:
    """A key's reader is a primitive; its subject is `<topic>-key` (of the Kafka topic the
    producers write to), and it lists no id."""
    path = _avro_dir(tmp_path)
    key = "key:\n  format: avro\n  name: id\n  registry: {}\n  reader: {schema: long}\n"
    path.write_text(AVRO.replace("key: {format: string, name: id}\n", key))
    c = load_contract(path)
    assert c.key_registry is not None and c.key_registry.subject == "t-key"
    assert (c.key_type, c.key_writers, [v.id for v in c.key_schemas]) == ("long", {}, [None])
    path.write_text(
        AVRO.replace("key: {format: string, name: id}\n", key)
        + "kafka: {topic: accounts.v1, bootstrap_servers: 'localhost:9092'}\n"
    )
    on_broker = load_contract(path).key_registry
    assert on_broker is not None and on_broker.subject == "accounts.v1-key"


@pytest.mark.parametrize(
    ("key", "problem"),
    [
        ("registry: {}", "'reader' is a required property with 'registry'"),
        ("reader: {schema: long}", "'schemas' or 'registry'"),
        (
            "registry: {subject: record}\n  reader: {schema: long}",
            "a key's subject is the topic's",
        ),
        (
            "schemas: [{id: 1, schema: long}]\n  registry: {}\n  reader: {schema: long}",
            "either 'schemas' (the ids listed) or 'registry'",
        ),
    ],
)
def test_a_registry_key_needs_a_reader_and_the_topics_subject(
    tmp_path: Path, key: str, problem: str
) -> None:
    path = _avro_dir(tmp_path)
    text = f"key:\n  format: avro\n  name: id\n  {key}\n"
    path.write_text(AVRO.replace("key: {format: string, name: id}\n", text))
    with pytest.raises(ContractError) as info:
        load_contract(path)
    assert problem in info.value.problem, info.value.problem


@pytest.mark.parametrize(
    ("old", "new", "where", "problem"),
    [
        ("file: t/v1.avsc", "file: t/v9.avsc", "value.schemas[0].file", "cannot read"),
        ("file: t/v1.avsc", "file: ../v1.avsc", "value.schemas[0].file", "does not match"),
        ("file: t/v1.avsc", "file: /etc/v1.avsc", "value.schemas[0].file", "does not match"),
        (
            "format: avro",
            "format: avro\n  fields: [{name: a, type: long}]",
            "value",
            "'fields' is not allowed with format 'avro'",
        ),
        ("key: {format: string, name: id}", "key: {format: avro, name: id}", "key", "'schemas'"),
        ("key: {format: string, name: id}", "key: {format: json, name: id}", "key", "'type'"),
        ("event_time: at", "event_time: nope", "event_time", "no value field named 'nope'"),
        ("event_time: at", "event_time: name", "event_time", "must be a timestamp or a long"),
        ("event_time: at", "compatibility: SOMETIMES", "compatibility", "is not one of"),
        (
            "column: name, severity",
            "column: nope, severity",
            "expectations.silver[0].column",
            "no column 'nope' in silver",
        ),
        (
            "table: t_latest, severity",
            "table: nope, severity",
            "expectations.gold[0].table",
            "no table named 'nope'",
        ),
        (
            "table: t_latest, severity: fail",
            "table: t_latest, severity: quarantine",
            "expectations.gold[0].severity",
            "gold tables have no quarantine",
        ),
        (
            "column: offset, min: 0,",
            "column: offset, min: 5, max: 1,",
            "expectations.silver[1].min",
            "min 5 is greater than max 1",
        ),
        (
            "expect: between, column: offset, min: 0,",
            "expect: match_regex, column: name, pattern: '(',",
            "expectations.silver[1].pattern",
            "not a valid regular expression",
        ),
        (
            "expect: between, column: offset, min: 0,",
            "expect: between, column: offset,",
            "expectations.silver[1]",
            "expect 'between' needs 'min' or 'max'",
        ),
        ("severity: warn", "severity: panic", "expectations.silver[1].severity", "is not one of"),
        # Written through a schema registry: a reader schema, no ids, a URL without secrets.
        (
            "  schemas:\n    - id: 1\n      file: t/v1.avsc",
            "  registry: {subject: topic}",
            "value",
            "'reader' is a required property with 'registry'",
        ),
        (
            "  schemas:\n    - id: 1\n      file: t/v1.avsc",
            "  schemas: [{id: 1, file: t/v1.avsc}]\n  registry: {}\n  reader: {file: t/v1.avsc}",
            "value",
            "with both 'schemas' and 'registry' the stream is read with the last schema listed",
        ),
        (
            "      file: t/v1.avsc",
            "      file: t/v1.avsc\n  reader: {file: t/v1.avsc}",
            "value",
            "'reader' is only allowed with 'registry'",
        ),
        (
            "  schemas:\n    - id: 1\n      file: t/v1.avsc",
            "  registry: {subject: value}\n  reader: {file: t/v1.avsc}",
            "value.registry.subject",
            "is not one of",
        ),
        (
            "  schemas:\n    - id: 1\n      file: t/v1.avsc",
            "  registry: {url: 'http://me:secret@registry:8081'}\n  reader: {file: t/v1.avsc}",
            "value.registry.url",
            "does not match",
        ),
        (
            "  schemas:\n    - id: 1\n      file: t/v1.avsc",
            "  registry: {}\n  reader: {file: t/v9.avsc}",
            "value.reader.file",
            "cannot read",
        ),
        (
            "  schemas:\n    - id: 1\n      file: t/v1.avsc",
            "  registry: {}",
            "value",
            "'reader' is a required property with 'registry'",
        ),
    ],
)
def test_broken_avro_contract_names_file_path_and_problem(
    tmp_path: Path, old: str, new: str, where: str, problem: str
) -> None:
    assert old in AVRO
    path = _avro_dir(tmp_path)
    path.write_text(AVRO.replace(old, new))
    with pytest.raises(ContractError) as info:
        load_contract(path)
    assert (info.value.path, str(path)) == (where, info.value.file)
    assert problem in info.value.problem


def test_invalid_or_unsupported_avro_schemas_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ContractError, match="not a valid Avro schema") as info:
        load_contract(
            _avro_dir(tmp_path, {"type": "record", "name": "T", "fields": [{"name": "a"}]})
        )
    assert info.value.path == "value.schemas[0]"
    nested = {
        **V1,
        "fields": [*V1["fields"], {"name": "tags", "type": {"type": "array", "items": "string"}}],
    }
    with pytest.raises(ContractError, match="array"):
        load_contract(_avro_dir(tmp_path, nested))
    reserved = {**V1, "fields": [*V1["fields"], {"name": "offset", "type": "long"}]}
    with pytest.raises(ContractError, match="reserved for stream metadata"):
        load_contract(_avro_dir(tmp_path, reserved))


def test_schema_list_must_follow_the_compatibility_mode(tmp_path: Path) -> None:
    path = _avro_dir(tmp_path)
    v2 = {**V1, "fields": [*V1["fields"], {"name": "required_now", "type": "string"}]}
    (tmp_path / "t" / "v2.avsc").write_text(json.dumps(v2))
    text = AVRO.replace("file: t/v1.avsc", "file: t/v1.avsc\n    - id: 2\n      file: t/v2.avsc")
    path.write_text(text)
    with pytest.raises(ContractError, match="schema id 2 breaks BACKWARD compatibility") as info:
        load_contract(path)
    assert info.value.path == "value.schemas[1]"
    path.write_text("compatibility: FORWARD\n" + text)
    assert [v.id for v in load_contract(path).value_schemas] == [1, 2]
    path.write_text(text.replace("- id: 2", "- id: 1"))
    with pytest.raises(ContractError, match="schema id 1 is listed twice"):
        load_contract(path)


def test_windows_joins_and_changelog_sources_parse(tmp_path: Path) -> None:
    other = VALID.replace("topic: t", "topic: u").replace("t_stream", "u_stream")
    other = other.replace("t_latest", "u_latest").replace("t_totals", "u_totals")
    _write(tmp_path, other, "u.yaml")
    extra = indent(
        dedent(
            """\
          - name: t_5m
            kind: aggregate
            window: {type: hopping, size: 10m, advance: 5m, grace: 30s}
            aggregations: [{name: n, fn: count}, {name: seen, fn: count_distinct, field: label}]
          - name: t_sessions
            kind: aggregate
            window: {type: session, gap: 1h}
            aggregations: [{name: trail, fn: collect, field: label}]
          - name: t_enriched
            kind: join
            join: {type: stream-table, with: u, fields: [label], prefix: u_, how: left}
          - name: t_pairs
            kind: join
            join: {type: stream-stream, with: u, fields: [amount], prefix: u_, within: 2m}
          - name: t_moves
            kind: aggregate
            changelog: t_latest
            group_by: label
            aggregations: [{name: n, fn: count}]
        """
        ),
        "  ",
    )
    _write(tmp_path, VALID + extra)
    c = Catalog.load(tmp_path).topic("t")
    hop = c.table("t_5m").window
    assert hop is not None
    assert (hop.type, hop.size_ms, hop.advance_ms, hop.grace_ms) == (
        "hopping",
        600_000,
        300_000,
        30_000,
    )
    session = c.table("t_sessions").window
    assert session is not None and (session.gap_ms, session.grace_ms) == (3_600_000, 0)
    assert c.table_columns(c.table("t_5m")) == ("id", "window_start", "window_end", "n", "seen")
    assert c.table_columns(c.table("t_enriched")) == (
        "id", "amount", "label", "u_label", "partition", "offset", "timestamp", "event_time"
    )  # fmt: skip
    assert c.table_key_columns(c.table("t_pairs")) == (
        "partition",
        "offset",
        "u_partition",
        "u_offset",
    )
    moves = c.input(c.table("t_moves"))
    assert (moves.key_name, [f.name for f in moves.fields]) == ("id", ["amount", "label"])
    assert c.table_key(c.table("t_moves")) == "label"


@pytest.mark.parametrize(
    ("join", "where", "problem"),
    [
        ("{type: stream-table, with: nope, fields: [label]}", "join.with", "no contract for topic"),
        ("{type: stream-table, with: u, fields: [colour]}", "join.fields[0]", "no value field"),
        ("{type: table-table, with: u, fields: [label]}", "join.fields", "would appear twice"),
        ("{type: stream-table, with: u, on_field: amount, fields: [label], prefix: u_}", "join.on_field", "is long"),
        ("{type: stream-stream, with: u, fields: [label], within: 1m}", "join.prefix", "needs a prefix"),
        ("{type: stream-stream, with: u, fields: [label], within: 1m, how: left, prefix: u_}", "join.how", "inner only"),
        ("{type: stream-table, with: u, fields: [label], within: 1m}", "tables[2].join", "'within' is not allowed with type 'stream-table'"),
    ],
)  # fmt: skip
def test_broken_joins_are_refused_with_where_and_why(
    tmp_path: Path, join: str, where: str, problem: str
) -> None:
    other = VALID.replace("topic: t", "topic: u").replace("t_stream", "u_stream")
    other = other.replace("t_latest", "u_latest").replace("t_totals", "u_totals")
    _write(tmp_path, other, "u.yaml")
    _write(tmp_path, VALID + f"  - {{name: t_join, kind: join, join: {join}}}\n")
    with pytest.raises(ContractError) as err:
        Catalog.load(tmp_path)
    assert where in str(err.value) and problem in str(err.value), str(err.value)


KAFKA = VALID + dedent(
    """\
    kafka:
      topic: payments.v1
      bootstrap_servers: broker-1:9092,broker-2:9092
      properties: {security.protocol: SASL_SSL, sasl.mechanism: PLAIN, enable.ssl.certificate.verification: true}
      secrets: {sasl.password: PAYMENTS_KAFKA_PASSWORD, sasl.username: PAYMENTS_KAFKA_USER}
      on_data_loss: record
    """
)


def test_a_kafka_source_parses(tmp_path: Path) -> None:
    k = load_contract(_write(tmp_path, KAFKA)).kafka
    assert k is not None
    assert (k.topic, k.bootstrap_servers, k.on_data_loss) == (
        "payments.v1",
        "broker-1:9092,broker-2:9092",
        "record",
    )
    assert dict(k.properties) == {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "PLAIN",
        "enable.ssl.certificate.verification": "true",
    }
    assert dict(k.secrets)["sasl.password"] == "PAYMENTS_KAFKA_PASSWORD"
    # Defaults: the contract's topic, servers from the environment or the local broker.
    minimal = load_contract(_write(tmp_path, VALID + "kafka: {}\n")).kafka
    assert minimal is not None
    assert (minimal.topic, minimal.bootstrap_servers, minimal.on_data_loss) == ("t", None, "fail")
    assert load_contract(_write(tmp_path, VALID)).kafka is None


@pytest.mark.parametrize(
    ("extra", "where", "problem"),
    [
        (
            "kafka: {properties: {sasl.password: hunter2}}",
            "kafka.properties.sasl.password",
            "looks like a credential",
        ),
        (
            "kafka: {properties: {sasl.jaas.config: x}}",
            "kafka.properties.sasl.jaas.config",
            "looks like a credential",
        ),
        (
            "kafka: {properties: {bootstrap.servers: 'h:1'}}",
            "kafka.properties.bootstrap.servers",
            "use kafka.bootstrap_servers",
        ),
        ("kafka: {properties: {group.id: g}}", "kafka.properties.group.id", "set by the platform"),
        (
            "kafka: {properties: {a: b}, secrets: {a: A}}",
            "kafka.secrets.a",
            "also set in kafka.properties",
        ),
        (
            "kafka: {secrets: {sasl.password: 'not a name'}}",
            "kafka.secrets.sasl.password",
            "does not match",
        ),
        ("kafka: {bootstrap_servers: 'no-port'}", "kafka.bootstrap_servers", "does not match"),
        ("kafka: {on_data_loss: skip}", "kafka.on_data_loss", "'skip' is not one of"),
        ("kafka: {}\nlanding: {format: envelope}", "kafka", "one source"),
    ],
)
def test_bad_kafka_sources_are_refused_with_where_and_why(
    tmp_path: Path, extra: str, where: str, problem: str
) -> None:
    with pytest.raises(ContractError) as info:
        load_contract(_write(tmp_path, VALID + extra + "\n"))
    assert info.value.path == where
    assert problem in info.value.problem


def _with_history_tables(tmp_path: Path) -> None:
    """Topic u, whose tables include two history tables (by event time and by a long)."""
    other = VALID.replace("topic: t", "topic: u").replace("t_stream", "u_stream")
    other = other.replace("t_latest", "u_latest").replace("t_totals", "u_totals")
    other += "  - {name: u_versions, kind: history, track: [label], history_retention: 1d}\n"
    other += "  - {name: u_by_amount, kind: history, sequence_by: amount}\n"
    _write(tmp_path, other, "u.yaml")


def test_history_tables_and_joins_with_them_parse(tmp_path: Path) -> None:
    _with_history_tables(tmp_path)
    join = "{type: stream-table, with: u, table: u_versions, fields: [label], prefix: u_}"
    _write(tmp_path, VALID + f"  - {{name: t_then, kind: join, join: {join}}}\n")
    catalog = Catalog.load(tmp_path)
    versions = catalog.topic("u").table("u_versions")
    assert (versions.kind, versions.track, versions.retention_ms) == (
        "history",
        ("label",),
        86_400_000,
    )
    by_amount = catalog.topic("u").table("u_by_amount")
    assert (by_amount.sequence_by, by_amount.retention_ms) == ("amount", None)
    then = catalog.topic("t").table("t_then")
    assert then.join is not None and (then.kind, then.join.table) == ("stream-table", "u_versions")


@pytest.mark.parametrize(
    ("table", "where", "problem"),
    [
        ("{name: h, kind: history, sequence_by: nope}", "tables[2].sequence_by", "no value field named 'nope'"),
        ("{name: h, kind: history, sequence_by: label}", "tables[2].sequence_by", "'label' is of type string"),
        ("{name: h, kind: history, sequence_by: amount, history_retention: 1h}", "tables[2].history_retention", "have no retention"),
        ("{name: h, kind: history, track: [colour]}", "tables[2].track[0]", "no value field named 'colour'"),
        ("{name: h, kind: history, track: []}", "tables[2].track", "must have at least 1 item"),
        ("{name: h, kind: latest, track: [label]}", "tables[2]", "'track' is not allowed with kind 'latest'"),
        ("{name: h, kind: aggregate, history_retention: 1h, aggregations: [{name: n, fn: count}]}", "tables[2]", "'history_retention' is not allowed with kind 'aggregate'"),
        ("{name: h, kind: join, join: {type: stream-table, with: u, table: u_latest, fields: [label], prefix: u_}}", "tables[2].join.table", "no history table named 'u_latest' ('u_latest' is a latest table)"),
        ("{name: h, kind: join, join: {type: stream-table, with: u, table: nope, fields: [label], prefix: u_}}", "tables[2].join.table", "no history table named 'nope'"),
        ("{name: h, kind: join, join: {type: stream-table, with: u, table: u_by_amount, fields: [label], prefix: u_}}", "tables[2].join.table", "'amount', a long, which an event time cannot be compared with"),
        ("{name: h, kind: join, join: {type: table-table, with: u, table: u_versions, fields: [label], prefix: u_}}", "tables[2].join", "'table' is not allowed with type 'table-table'"),
    ],
)  # fmt: skip
def test_broken_history_tables_are_refused_with_where_and_why(
    tmp_path: Path, table: str, where: str, problem: str
) -> None:
    _with_history_tables(tmp_path)
    _write(tmp_path, VALID + f"  - {table}\n")
    with pytest.raises(ContractError) as err:
        Catalog.load(tmp_path)
    assert where in str(err.value) and problem in str(err.value), str(err.value)
