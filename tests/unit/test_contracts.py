from __future__ import annotations

from pathlib import Path
from textwrap import dedent

import pytest

from lakehouse.config import REPO_ROOT
from lakehouse.contracts import Catalog, load_contract
from lakehouse.errors import ContractError, UnknownTableError, UnknownTopicError

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
    assert [t.name for t in c.tables] == ["user_latest_location", "user_location_counts"]
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
            "stream: {name: t_stream}",
            "stream: {name: t_stream}\ncolour: red",
            "",
            "Additional properties",
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
    assert err.source == str(path)
    assert err.path == where
    assert problem in err.problem
    assert str(path) in str(err)


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
        UnknownTopicError, match="unknown topic 'nope'; topics with a contract: user-locations"
    ):
        catalog.topic("nope")
