"""What the docs show a reader works: the complete contract example of docs/contracts.md loads,
with its join checked against the other topic's contract, as a contract author would copy it."""

from __future__ import annotations

import re
from pathlib import Path

from lakehouse.contracts.model import Catalog
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
