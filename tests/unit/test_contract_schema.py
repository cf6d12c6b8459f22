"""The JSON Schema editors check contracts with is generated from the contract models, and an
editor reading it accepts and refuses what loading a contract does."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from lakehouse.contracts.catalog import parse_contract
from lakehouse.contracts.document import SCHEMA_FILE, json_schema
from lakehouse.errors import ContractError
from lakehouse.runtime.config import REPO_ROOT

SHIPPED = sorted((REPO_ROOT / "contracts").glob("*.yaml"))


def _editor() -> jsonschema.Draft202012Validator:
    schema = json.loads(SCHEMA_FILE.read_text(encoding="utf-8"))
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def test_the_committed_schema_is_the_one_the_models_generate() -> None:
    assert SCHEMA_FILE.read_text(encoding="utf-8") == json_schema(), (
        "schemas/contract.schema.json is stale: python -m lakehouse.contracts.document --write-schema"
    )


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_an_editor_accepts_every_shipped_contract(path: Path) -> None:
    document = yaml.safe_load(path.read_text(encoding="utf-8"))
    assert [e.message for e in _editor().iter_errors(document)] == []


def _changed(path: tuple[str | int, ...], value: Any) -> dict[str, Any]:
    document = copy.deepcopy(
        yaml.safe_load((REPO_ROOT / "contracts" / "user-locations.yaml").read_text())
    )
    target = document
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return document


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("colour",), "red"),  # an unknown key
        (("tables", 1, "aggregations", 0, "colour"), "red"),
        (("key", "name"), "User-Name"),
        (("partitions",), 0),
        (("tables", 0, "group_by"), "location"),  # not with kind latest
        (("tables", 4, "window", "gap"), "1m"),  # not with a tumbling window
        (("value", "schemas"), [{"id": 1, "file": "v1.avsc"}]),  # not with format json
        (("key", "format"), "json"),  # then it needs a type
        (("expectations", "silver", 1, "expect"), "in_set"),  # then it needs values
        (("expectations", "gold", 1, "expect"), "row_count_between"),  # and no column
        (("tables", 8, "join", "within"), "1m"),  # only stream-stream joins have one
    ],
)
def test_an_editor_refuses_what_loading_refuses(path: tuple[str | int, ...], value: Any) -> None:
    document = _changed(path, value)
    assert list(_editor().iter_errors(document)), "the editor's schema accepts it"
    with pytest.raises(ContractError):
        parse_contract(document, "user-locations.yaml", REPO_ROOT / "contracts")
