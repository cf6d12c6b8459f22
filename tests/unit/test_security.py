"""Names from contracts, Params and the command line cannot leave the lakehouse root or inject
into SQL: each hostile name is refused with an error naming what and where, before any path is
touched or data moves, and legitimate names keep working. No Spark here (delta-rs where a real
table is needed)."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from lakehouse import cli
from lakehouse.contracts.catalog import Catalog, load_contract, parse_contract
from lakehouse.contracts.model import Expectation
from lakehouse.errors import CONFIG_ERROR_EXIT, ConfigError, ContractError
from lakehouse.orchestration.airflow_env import airflow_secrets
from lakehouse.pipeline.request import RunRequest, own
from lakehouse.quality.expectations import check_constraint
from lakehouse.quality.ledger import ledger_schema, read_ledger, write_ledger
from lakehouse.runtime.config import REPO_ROOT, Settings
from lakehouse.streams.registry import SchemaRegistry

# Each is refused wherever a name goes: traversal, absolute paths, SQL quotes and comments,
# backticks, statement separators, spaces, line breaks (also the trailing one Python's '$'
# lets through), NUL, Unicode lookalikes (Cyrillic 's', full-width letters), too long, empty.
HOSTILE = [
    "../x",
    "/etc",
    "a/../../b",
    "a' OR '1'='1",
    "a`b",
    "a; DROP TABLE t",
    "a b",
    "a -- b",
    "name\n",
    "\nname",
    "a\x00b",
    "u\u0455er",
    "\uff55ser",
    "x" * 300,
    "",
]
SOURCE = "orders.yaml"
USERS: dict[str, Any] = {
    "topic": "users",
    "key": {"format": "string", "name": "user_id"},
    "value": {"format": "json", "fields": [{"name": "label", "type": "string"}]},
    "stream": {"name": "users_stream"},
}
# A contract with a name in every place one can be: columns, event time, tables of each kind
# (latest, re-keyed aggregate, changelog reader, window, join) and expectations of two layers.
ORDERS: dict[str, Any] = {
    "topic": "orders",
    "key": {"format": "string", "name": "user_id"},
    "value": {
        "format": "json",
        "fields": [
            {"name": "amount", "type": "long"},
            {"name": "city", "type": "string"},
            {"name": "at", "type": "timestamp"},
        ],
    },
    "event_time": "at",
    "stream": {"name": "orders_stream"},
    "tables": [
        {"name": "latest_orders", "kind": "latest"},
        {
            "name": "per_city",
            "kind": "aggregate",
            "group_by": "city",
            "aggregations": [{"name": "total", "fn": "sum", "field": "amount"}],
        },
        {
            "name": "order_moves",
            "kind": "aggregate",
            "changelog": "latest_orders",
            "aggregations": [{"name": "moves", "fn": "count"}],
        },
        {
            "name": "per_city_5m",
            "kind": "aggregate",
            "group_by": "city",
            "window": {"type": "tumbling", "size": "5m"},
            "aggregations": [{"name": "n", "fn": "count"}],
        },
        {
            "name": "with_users",
            "kind": "join",
            "join": {
                "type": "stream-table",
                "with": "users",
                "on_field": "city",
                "fields": ["label"],
                "prefix": "u_",
            },
        },
    ],
    "expectations": {
        "silver": [
            {
                "name": "amount_known",
                "expect": "in_set",
                "column": "amount",
                "values": [1, 2],
                "severity": "warn",
            }
        ],
        "gold": [
            {
                "name": "one_per_city",
                "table": "per_city",
                "expect": "unique",
                "column": "city",
                "severity": "fail",
            }
        ],
    },
}
# Where a name sits in a contract: (the path an error names, the keys that lead to it).
PLACES: list[tuple[str, tuple[str | int, ...]]] = [
    ("topic", ("topic",)),
    ("stream.name", ("stream", "name")),
    ("key.name", ("key", "name")),
    ("value.fields[0].name", ("value", "fields", 0, "name")),
    ("event_time", ("event_time",)),
    ("tables[0].name", ("tables", 0, "name")),
    ("tables[1].group_by", ("tables", 1, "group_by")),
    ("tables[1].aggregations[0].name", ("tables", 1, "aggregations", 0, "name")),
    ("tables[1].aggregations[0].field", ("tables", 1, "aggregations", 0, "field")),
    ("tables[2].changelog", ("tables", 2, "changelog")),
    ("tables[3].window.size", ("tables", 3, "window", "size")),
    ("tables[4].join.with", ("tables", 4, "join", "with")),
    ("tables[4].join.on_field", ("tables", 4, "join", "on_field")),
    ("tables[4].join.fields[0]", ("tables", 4, "join", "fields", 0)),
    ("tables[4].join.prefix", ("tables", 4, "join", "prefix")),
    ("expectations.silver[0].name", ("expectations", "silver", 0, "name")),
    ("expectations.silver[0].column", ("expectations", "silver", 0, "column")),
    ("expectations.gold[0].table", ("expectations", "gold", 0, "table")),
]


def _with(doc: dict[str, Any], keys: tuple[str | int, ...], value: Any) -> dict[str, Any]:
    out = copy.deepcopy(doc)
    target: Any = out
    for k in keys[:-1]:
        target = target.setdefault(k, {}) if isinstance(k, str) else target[k]
    target[keys[-1]] = value
    return out


def _catalog(orders: dict[str, Any]) -> Catalog:
    """Both contracts, checked together as the platform loads them (joins included)."""
    return Catalog.of([parse_contract(orders, SOURCE), parse_contract(USERS, "users.yaml")])


def _settings(tmp_path: Path) -> Settings:
    return Settings.from_env(tmp_path / "lakehouse", REPO_ROOT / "contracts")


# -- contracts ---------------------------------------------------------------------------------
def test_the_contract_with_every_kind_of_name_is_valid() -> None:
    catalog = _catalog(ORDERS)
    orders = catalog.topic("orders")
    assert [t.name for t in orders.tables] == [
        "latest_orders",
        "per_city",
        "order_moves",
        "per_city_5m",
        "with_users",
    ]
    assert orders.table_columns(orders.table("with_users"))[:4] == (
        "user_id",
        "amount",
        "city",
        "at",
    )
    assert "u_label" in orders.table_columns(orders.table("with_users"))


@pytest.mark.parametrize("hostile", HOSTILE, ids=repr)
@pytest.mark.parametrize(("where", "keys"), PLACES, ids=[p for p, _ in PLACES])
def test_a_hostile_name_anywhere_in_a_contract_is_refused_naming_the_place(
    where: str, keys: tuple[str | int, ...], hostile: str
) -> None:
    with pytest.raises(ContractError) as caught:
        _catalog(_with(ORDERS, keys, hostile))
    assert (caught.value.file, caught.value.path) == (SOURCE, where), str(caught.value)


@pytest.mark.parametrize(
    ("where", "keys", "value"),
    [
        # Identifiers that delta-rs's SQL reads as values: t.null = s.null is no column match.
        ("key.name", ("key", "name"), "null"),
        ("value.fields[1].name", ("value", "fields", 1, "name"), "true"),
        ("tables[1].aggregations[0].name", ("tables", 1, "aggregations", 0, "name"), "false"),
        # '.' and '..' are legal characters of a topic, but not topic names (they are folders).
        ("topic", ("topic",), ".."),
        ("topic", ("topic",), "."),
        ("tables[4].join.with", ("tables", 4, "join", "with"), ".."),
        # A prefix has no length limit of its own; the columns it makes have one.
        ("tables[4].join.prefix", ("tables", 4, "join", "prefix"), "p" * 124),
        # Python's '$' matches before a final newline: durations used to crash int() instead.
        ("tables[3].window.size", ("tables", 3, "window", "size"), "5m\n"),
        ("quality.freshness", ("quality", "freshness"), "1h\n"),
    ],
)
def test_names_that_only_look_legal_are_refused(
    where: str, keys: tuple[str | int, ...], value: str
) -> None:
    with pytest.raises(ContractError) as caught:
        _catalog(_with(ORDERS, keys, value))
    assert caught.value.path == where, str(caught.value)


def test_legitimate_names_at_their_limits_still_work() -> None:
    doc = _with(ORDERS, ("topic",), "Orders.v2_" + "x" * 239)  # 249 characters
    doc = _with(doc, ("stream", "name"), "s" + "_" * 127)  # 128 characters
    doc = _with(doc, ("tables", 4, "join", "prefix"), "p" * 123)  # + 'label' = 128
    catalog = _catalog(doc)
    (orders,) = [c for c in catalog if c.topic != "users"]
    assert len(orders.topic) == 249 and len(orders.stream) == 128
    assert "p" * 123 + "label" in orders.table_columns(orders.table("with_users"))


def _avro_orders(field_name: str) -> dict[str, Any]:
    record = {
        "type": "record",
        "name": "Order",
        "fields": [{"name": field_name, "type": "long"}, {"name": "city", "type": "string"}],
    }
    doc = _with(USERS, ("topic",), "orders")
    doc = _with(doc, ("stream", "name"), "orders_stream")
    return _with(doc, ("value",), {"format": "avro", "schemas": [{"id": 1, "schema": record}]})


@pytest.mark.parametrize("hostile", [*HOSTILE, "Amount", "_amount", "__state"], ids=repr)
def test_avro_field_names_must_be_column_names(hostile: str) -> None:
    """An Avro schema's field names become silver columns without passing the contract's JSON
    schema: they are checked as the contract's own field names are."""
    assert [f.name for f in parse_contract(_avro_orders("amount"), SOURCE).fields] == [
        "amount",
        "city",
    ]
    with pytest.raises(ContractError) as caught:
        parse_contract(_avro_orders(hostile), SOURCE)
    assert caught.value.path == "value.schemas[0].fields[0].name"
    assert f"invalid column name {hostile!r}" in str(caught.value)


VALUE_SCHEMA = {"type": "record", "name": "V", "fields": [{"name": "label", "type": "string"}]}


def _avro_users_file(folder: Path, file: str) -> Path:
    doc = _with(USERS, ("value",), {"format": "avro", "schemas": [{"id": 1, "file": file}]})
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "users.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.mark.parametrize(
    "file",
    [
        "../outside.avsc",
        "users/../../outside.avsc",
        "./../outside.avsc",
        "{tmp}/outside.avsc",
        "users/v1.avsc\n",
        "users\\..\\..\\outside.avsc",
        "users/v1.json",
        "",
    ],
)
def test_schema_files_must_live_beside_the_contract(tmp_path: Path, file: str) -> None:
    # A valid schema is waiting outside: were it read, the contract would load.
    (tmp_path / "outside.avsc").write_text(json.dumps(VALUE_SCHEMA))
    (tmp_path / "contracts" / "users").mkdir(parents=True)
    (tmp_path / "contracts" / "users" / "v1.avsc").write_text(json.dumps(VALUE_SCHEMA))
    assert load_contract(_avro_users_file(tmp_path / "contracts", "users/v1.avsc")).fields
    with pytest.raises(ContractError) as caught:
        load_contract(_avro_users_file(tmp_path / "contracts", file.format(tmp=tmp_path)))
    assert caught.value.path == "value.schemas[0].file"


def test_a_schema_file_cannot_leave_the_contracts_folder_through_a_symlink(tmp_path: Path) -> None:
    (tmp_path / "outside.avsc").write_text(json.dumps(VALUE_SCHEMA))
    (tmp_path / "contracts").mkdir()
    (tmp_path / "contracts" / "link.avsc").symlink_to(tmp_path / "outside.avsc")
    with pytest.raises(ContractError) as caught:
        load_contract(_avro_users_file(tmp_path / "contracts", "link.avsc"))
    assert caught.value.path == "value.schemas[0].file"
    assert "'link.avsc' is outside the contract's folder" in str(caught.value)


# -- expectations: the SQL of Delta CHECK constraints -----------------------------------------
def _expectation(expect: str, **params: Any) -> dict[str, Any]:
    return {"name": "e", "column": "city", "expect": expect, "severity": "fail", **params}


@pytest.mark.parametrize(
    ("expectation", "problem"),
    [
        (_expectation("in_set", values=[None]), "values[0]: None is not of type"),
        (_expectation("in_set", values=[["a", "b"]]), "values[0]: ['a', 'b'] is not of type"),
        (_expectation("in_set", values=[{"a": "1) OR (1=1"}]), "is not of type"),
        (_expectation("in_set", values=[float("nan")]), "must be finite numbers"),
        (_expectation("between", max=float("inf")), "must be finite numbers"),
        (_expectation("length_between", min=float("-inf")), "must be finite numbers"),
    ],
)
def test_expectation_values_that_are_not_sql_literals_are_refused(
    expectation: dict[str, Any], problem: str
) -> None:
    doc = _with(ORDERS, ("expectations", "silver", 0), expectation)
    with pytest.raises(ContractError) as caught:
        _catalog(doc)
    assert caught.value.path.startswith("expectations.silver[0]"), str(caught.value)
    assert problem in str(caught.value)


def _in_set(values: list[str]) -> Expectation:
    doc = _with(ORDERS, ("expectations", "silver", 0), _expectation("in_set", values=values))
    (e,) = _catalog(doc).topic("orders").expectations_of("silver")
    return e


def test_quotes_and_backslashes_are_written_as_characters_not_inside_literals() -> None:
    """Spark reads a backslash in a literal as an escape and delta-rs does not, and Delta splits
    a doubled quote in two literals: neither character is ever written inside one."""
    sql = check_constraint(_in_set(["c\\' OR 1=1 --", "ok", "C:\\temp"]))
    assert sql == (
        "city IS NULL OR city IN (concat('c', chr(92), chr(39), ' OR 1=1 --'), 'ok', "
        "concat('C:', chr(92), 'temp'))"
    )


def test_a_constraint_refuses_a_value_it_cannot_write_as_a_literal() -> None:
    """Expectations made in code skip the contract's checks: the SQL builder refuses too."""
    for bad in (None, float("nan"), ("a",)):
        e = Expectation("silver", "e", "in_set", "fail", "city", params=(("values", (bad,)),))
        with pytest.raises(ConfigError, match="cannot be a SQL literal"):
            check_constraint(e)
    e = Expectation("silver", "e", "between", "fail", "city", params=(("max", float("inf")),))
    with pytest.raises(ConfigError, match="inf cannot be a SQL literal"):
        check_constraint(e)


# -- paths -------------------------------------------------------------------------------------
def _paths(s: Settings) -> dict[str, Callable[[str], Path]]:
    return {
        "topic_dir": s.topic_dir,
        "bronze_path": s.bronze_path,
        "silver_path": s.silver_path,
        "gold_path": s.gold_path,
        "state_path": s.state_path,
        "late_path": s.late_path,
        "quarantine bronze": lambda n: s.quarantine_path("bronze", n),
        "quarantine silver": lambda n: s.quarantine_path("silver", n),
    }


@pytest.mark.parametrize("hostile", [*HOSTILE, ".."], ids=repr)
def test_no_path_is_made_from_a_hostile_name(tmp_path: Path, hostile: str) -> None:
    s = _settings(tmp_path)
    for what, path in _paths(s).items():
        with pytest.raises(ConfigError, match=r"invalid (topic|stream or table) name") as caught:
            path(hostile)
        assert repr(hostile) in str(caught.value), what
    assert list(tmp_path.iterdir()) == []  # nothing was created


@pytest.mark.parametrize("hostile", [*HOSTILE, ".."], ids=repr)
def test_the_registry_reads_no_hostile_topic_name(tmp_path: Path, hostile: str) -> None:
    """The registry is one table: a topic name becomes part of a query on it, not a path."""
    s = _settings(tmp_path)
    with pytest.raises(ConfigError, match=r"invalid topic name") as caught:
        SchemaRegistry(s).versions(hostile, "value")
    assert repr(hostile) in str(caught.value)
    assert list(tmp_path.iterdir()) == []  # nothing was created


def test_legitimate_names_make_paths_inside_the_root(tmp_path: Path) -> None:
    s = _settings(tmp_path)
    for what, path in _paths(s).items():
        name = "user-locations" if "bronze" in what or what == "topic_dir" else "t_1"
        assert path(name).is_relative_to(s.home), what
    assert s.registry_path.is_relative_to(s.home)
    assert SchemaRegistry(s).versions("user-locations", "value") == []


def test_a_symlink_out_of_the_root_is_refused(tmp_path: Path) -> None:
    s = _settings(tmp_path)
    (tmp_path / "elsewhere").mkdir()
    (s.tables_root).mkdir(parents=True)
    (s.tables_root / "gold").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(ConfigError, match="escapes the lakehouse root"):
        s.gold_path("counts")
    assert s.silver_path("counts") == s.tables_root / "silver" / "counts"


# -- Params ------------------------------------------------------------------------------------
CATALOG = Catalog.load(REPO_ROOT / "contracts")
LOCATIONS = CATALOG.topic("user-locations")


@pytest.mark.parametrize("hostile", [*HOSTILE, "user_places\n", "USER_PLACES"], ids=repr)
def test_a_hostile_full_refresh_param_is_refused(hostile: str) -> None:
    with pytest.raises(ConfigError, match="Param full_refresh") as caught:
        RunRequest.from_params({"full_refresh": [hostile]}, LOCATIONS, own(LOCATIONS))
    assert f"{hostile!r} is not a gold table this DAG builds" in str(caught.value)


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"full_refresh": "user_places"}, "Param full_refresh: 'user_places' is not a list"),
        ({"full_refresh": [["user_places"]]}, "Param full_refresh: ['user_places'] is not a table"),
        ({"full_refresh": [1]}, "Param full_refresh: 1 is not a table name"),
        ({"layers": ["gold; rm -rf /"]}, "Param layers"),
        ({"layers": ["../gold"]}, "Param layers"),
        ({"reprocess_silver_from_offsets": "0:1; DROP"}, "Param reprocess_silver_from_offsets"),
        ({"reprocess_silver_from_offsets": "0:1\n--tables x"}, "not a list of partition:offset"),
        ({"reprocess_silver_from_version": "1 OR 1=1"}, "Param reprocess_silver_from_version"),
        ({"reprocess_gold_from_version": "--from-version"}, "Param reprocess_gold_from_version"),
    ],
)
def test_params_of_the_wrong_shape_are_refused(params: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        RunRequest.from_params(params, LOCATIONS, own(LOCATIONS))
    assert message in str(caught.value)


def test_a_legitimate_full_refresh_still_reaches_the_job() -> None:
    request = RunRequest.from_params({"full_refresh": ["user_places"]}, LOCATIONS, own(LOCATIONS))
    assert json.loads(request.to_json())["full_refresh"] == ["user_places"]


def _no_spark(*_args: object, **_kwargs: object) -> None:
    raise AssertionError("Spark must not start for a bad argument")


@pytest.mark.parametrize(
    ("asked", "message"),
    [
        ({"tables": ["../x"]}, "tables: topic 'user-locations' has no gold table '../x'"),
        (
            {"tables": ["user_places", "a' OR '1'='1"]},
            "tables: topic 'user-locations' has no gold table \"a' OR '1'='1\"",
        ),
        ({"full_refresh": ["/etc"]}, "Param full_refresh: '/etc' is not a gold table"),
        ({"full_refresh": ["user_places\n"]}, "Param full_refresh: 'user_places\\n' is not"),
    ],
)
def test_the_job_refuses_unknown_tables_before_spark_starts(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    asked: dict[str, Any],
    message: str,
    layer_job: ModuleType,
) -> None:
    monkeypatch.setattr("lakehouse.runtime.spark.get_session", _no_spark)
    monkeypatch.setenv("LAKEHOUSE_HOME", str(tmp_path / "lakehouse"))
    monkeypatch.setenv("LAKEHOUSE_CONTRACTS", str(REPO_ROOT / "contracts"))
    argv = ["--topic", "user-locations", "--layer", "gold", f"--request={json.dumps(asked)}"]
    assert layer_job.main(argv) == CONFIG_ERROR_EXIT
    assert message in capsys.readouterr().err
    assert not (tmp_path / "lakehouse").exists()
    fine = {"tables": ["user_places"], "full_refresh": ["user_places"]}
    RunRequest.from_json(json.dumps(fine), LOCATIONS)


@pytest.mark.parametrize("run_id", ["--full-refresh", "--tables=x", "-h", "manual__a b;c'd"])
def test_a_run_id_reaches_the_job_as_one_value(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, run_id: str, layer_job: ModuleType
) -> None:
    """A run id typed into the trigger form may look like a flag; the job still reads it as
    the run's id, and takes no other flag from it (a ``spark`` connection: a spark-submit)."""
    from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

    from lakehouse.orchestration.operators import SPARK_CONN_ID, LayerJobOperator

    monkeypatch.setenv(
        f"AIRFLOW_CONN_{SPARK_CONN_ID.upper()}", json.dumps({"conn_type": "spark", "host": "local"})
    )

    sent: list[list[str]] = []
    monkeypatch.setattr(
        SparkSubmitOperator, "execute", lambda self, context: sent.append(self.application_args)
    )
    operator = LayerJobOperator(
        task_id="gold",
        layer="gold",
        contract=LOCATIONS,
        tables=["user_places"],
        application="run_layer.py",
        application_args=["--topic", LOCATIONS.topic, "--layer", "gold"],
        settings=Settings.from_env(tmp_path / "lakehouse", REPO_ROOT / "contracts"),
        conn_id=SPARK_CONN_ID,
    )
    operator.execute({"params": {}, "run_id": run_id})
    args = layer_job.parser().parse_args(sent[0])
    assert args.dag_run_id == run_id
    assert RunRequest.from_json(args.request, LOCATIONS) == RunRequest(tables=("user_places",))


# -- the command line --------------------------------------------------------------------------
CLI_HOSTILE = ["../x", "/etc", "a/../../b", "a' OR '1'='1", "a; b", "name\n", "u\u0455er", "", ".."]


@pytest.mark.parametrize("hostile", [*CLI_HOSTILE, "x" * 300], ids=repr)
@pytest.mark.parametrize(
    "command",
    [
        ["show", "{}"],
        ["show", "silver.{}"],
        ["show", "bronze.{}"],
        ["show", "late.{}"],
        ["show", "{}", "--at-event-time", "0"],
        ["changes", "{}"],
        ["refresh", "{}"],
        ["restore", "{}"],
        ["produce", "{}"],
        ["run", "--topic", "{}"],
        ["lag", "--topic", "{}"],
        ["maintain", "--topic", "{}"],
        ["sample", "--topic", "{}"],
        ["schemas", "--topic", "{}"],
    ],
    ids=lambda c: " ".join(c),
)
def test_the_cli_refuses_hostile_table_and_topic_names(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    command: list[str],
    hostile: str,
) -> None:
    monkeypatch.setattr("lakehouse.runtime.spark.get_session", _no_spark)
    monkeypatch.setattr("sys.stdin", None)  # produce must fail before reading
    home = tmp_path / "lakehouse"
    argv = ["--home", str(home), "--contracts", str(REPO_ROOT / "contracts")]
    argv += [a.replace("{}", hostile) for a in command]
    if hostile == "" and "--topic" in command:  # not "every topic", as leaving it out would be
        with pytest.raises(SystemExit) as stopped:
            cli.main(argv)
        assert stopped.value.code == 2
        assert "argument --topic: empty topic name" in capsys.readouterr().err
    else:
        assert cli.main(argv) == 1
        err = capsys.readouterr().err
        assert err.startswith(("error: unknown table ", "error: unknown topic ")), err
    assert not home.exists()


def test_the_cli_refuses_a_late_table_that_is_not_a_table_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    home = tmp_path / "lakehouse"
    argv = ["--home", str(home), "--contracts", str(REPO_ROOT / "contracts")]
    assert cli.main([*argv, "show", "late.silver.user_locations"]) == 1
    assert capsys.readouterr().err.startswith("error: unknown table 'late.silver.user_locations'")
    assert not home.exists()


# -- generated keys ----------------------------------------------------------------------------
def test_the_token_signing_key_is_long_enough_for_hs512(tmp_path: Path) -> None:
    """Airflow signs its JWTs with HS512 when given a secret: a key shorter than 64 bytes is
    below RFC 7518's minimum (PyJWT warns on every token)."""
    assert len(airflow_secrets(tmp_path)["jwt_secret"].encode()) >= 64


# -- predicates over the data-quality ledger ---------------------------------------------------
LEDGER_VALUES = [
    "plain",
    "a' OR '1'='1",
    "x\\' OR 1=1 --",
    "a; DROP TABLE snapshot",
    'dq"uote',
    "tick`s",
    "new\nline",
    "u\u0455er",
    "",
]


def test_ledger_filters_match_hostile_values_exactly(spark: Any, tmp_path: Path) -> None:
    """The table, DAG run id (typed in the trigger form) and layer are quoted into delta-rs's
    SQL: each matches its own rows only, and a quote cannot widen the filter."""
    s = _settings(tmp_path)
    rows = [
        {"table": v, "dag_run_id": v, "layer": v, "expectation": str(i), "published": False}
        for i, v in enumerate(LEDGER_VALUES)
    ]
    write_ledger(spark, s, [{**dict.fromkeys(ledger_schema().names), **r} for r in rows])
    for i, value in enumerate(LEDGER_VALUES):
        for column in ("table", "dag_run_id", "layer"):
            found = read_ledger(s, **{column: value}).column("expectation").to_pylist()
            assert found == [str(i)], (column, value)
    for probe in ("' OR ''='", "x' OR 'x'='x", "\\", "plain' --"):
        assert read_ledger(s, probe).num_rows == 0, probe
