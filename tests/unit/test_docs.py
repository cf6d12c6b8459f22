"""What the docs show a reader works: the complete contract example of docs/contracts.md loads,
with its join checked against the other topic's contract, as a contract author would copy it."""

from __future__ import annotations

import re
from pathlib import Path

from lakehouse.contracts.catalog import Catalog
from lakehouse.runtime.config import REPO_ROOT

CONTRACTS_DOC = REPO_ROOT / "docs" / "contracts.md"

# The topic the example's join reads; the example names its key type and the fields it takes.
CUSTOMERS = """\
topic: customers
key: {format: string, name: customer_id}
value:
  format: json
  fields:
    - {name: name, type: string}
    - {name: country, type: string}
stream: {name: customers_stream}
"""


def _example() -> str:
    """The YAML block under the page's "An example" heading."""
    section = CONTRACTS_DOC.read_text(encoding="utf-8").split("\n## An example\n", 1)[1]
    found = re.search(r"```yaml\n(.*?)```", section, re.DOTALL)
    assert found, "docs/contracts.md: no yaml block under 'An example'"
    return found.group(1)


def test_the_contract_reference_example_loads_with_its_join(tmp_path: Path) -> None:
    (tmp_path / "payments.yaml").write_text(_example(), encoding="utf-8")
    (tmp_path / "customers.yaml").write_text(CUSTOMERS, encoding="utf-8")

    payments = Catalog.load(tmp_path).topic("payments")

    assert [t.name for t in payments.tables] == [
        "payment_latest",
        "spend_per_customer",
        "spend_per_hour",
        "payments_with_customer",
    ]
    assert payments.kafka is not None and payments.kafka.topic == "payments.v1"
    assert dict(payments.kafka.secrets) == {"sasl.password": "PAYMENTS_KAFKA_PASSWORD"}
    assert payments.event_time == "paid_at"
    assert payments.field("amount").type_name == "decimal(12,2)"
    assert payments.quality.notify == "quarantine"


def _modules() -> dict[str, list[str]]:
    """Every module of the package by its last name (``bronze`` -> ``lakehouse.topics.bronze``)
    and by each dotted tail of its full name (``topics.bronze``)."""
    import pkgutil

    import lakehouse

    found: dict[str, list[str]] = {}
    for info in pkgutil.walk_packages(lakehouse.__path__, "lakehouse."):
        parts = info.name.split(".")
        for start in range(len(parts)):
            found.setdefault(".".join(parts[start:]), []).append(info.name)
    return found


def _named_code(text: str) -> list[str]:
    """The code a page names in backticks: ``module.function``, ``module.Class.method``,
    ``lakehouse.x.y``, and repository paths such as ``jobs/run_layer.py``."""
    return re.findall(r"`([A-Za-z_][\w./]*)(?:\(\))?`", text)


# Names in the page that look like code but are a contract's keys.
CONTRACT_KEYS = {"quality.notify", "quality.expectations", "quality.freshness"}


def _table_names() -> set[str]:
    """The shipped contracts' topics (as identifiers), streams and tables: ``silver.<stream>``
    in a page is a table, not a function of the silver module."""
    catalog = Catalog.load(REPO_ROOT / "contracts")
    out: set[str] = set()
    for contract in catalog:
        out |= {contract.topic.replace("-", "_"), contract.stream}
        out |= {t.name for t in contract.tables}
    return out


def _missing(name: str, modules: dict[str, list[str]], tables: set[str]) -> str | None:
    """Why ``name`` names no code that exists, or None (it exists, or it is no code name: a
    table, a Spark setting, a contract's key)."""
    import importlib

    if name.startswith("spark.") or name in CONTRACT_KEYS or name.split(".")[-1] in tables:
        return None
    if "/" in name:
        places = (REPO_ROOT / name, REPO_ROOT / "include" / "lakehouse" / name)
        return None if any(p.exists() for p in places) else f"{name}: no such file"
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        owners = modules.get(".".join(parts[:cut]))
        if not owners:
            continue
        if len(owners) > 1:
            return f"{name}: {'.'.join(parts[:cut])} is ambiguous ({', '.join(owners)})"
        obj: object = importlib.import_module(owners[0])
        for attr in parts[cut:]:
            if not hasattr(obj, attr):
                return f"{name}: {owners[0]} has no {'.'.join(parts[cut:])}"
            obj = getattr(obj, attr)
        return None
    return None


def test_the_code_the_batch_walkthrough_names_exists() -> None:
    """docs/batch.md follows a batch through the code by the names of modules, functions and
    files: each must exist, so a rename that forgets the page fails here."""
    modules = _modules()
    text = (REPO_ROOT / "docs" / "batch.md").read_text(encoding="utf-8")
    named = _named_code(text)
    assert len(named) > 50, "the page names the code it follows"
    tables = _table_names()
    missing = [why for name in named if (why := _missing(name, modules, tables)) is not None]
    assert missing == [], missing
