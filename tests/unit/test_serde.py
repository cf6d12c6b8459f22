"""The producer's checks: every key and field is checked against its type before anything is
written, for JSON and Avro topics alike, and a refused line names itself, the field, what the
type takes and what was given. Through ``lakehouse produce``, as a user runs it."""

from __future__ import annotations

import base64
import io
import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from lakehouse import cli
from lakehouse.contracts import avro
from lakehouse.contracts.catalog import Catalog
from lakehouse.runtime.config import Settings
from lakehouse.topics.landing import list_segments
from lakes import lake_with

FIELDS = """\
    - {name: customer, type: string, nullable: false}
    - {name: amount, type: long}
    - {name: items, type: int}
    - {name: rate, type: double}
    - {name: paid, type: boolean}
    - {name: ts, type: timestamp}
    - {name: total, type: decimal, precision: 12, scale: 2}
"""
JSON_TOPIC = f"""\
topic: payments
partitions: 2
key: {{format: json, type: long, name: id}}
value:
  format: json
  fields:
{FIELDS}stream: {{name: payments_stream}}
"""


def _optional(avro_type: Any) -> dict[str, Any]:
    return {"type": ["null", avro_type], "default": None}


AVRO_SCHEMA = {
    "type": "record",
    "name": "Payment",
    "fields": [
        {"name": "customer", "type": "string"},
        {"name": "amount", **_optional("long")},
        {"name": "items", **_optional("int")},
        {"name": "rate", **_optional("double")},
        {"name": "paid", **_optional("boolean")},
        {"name": "ts", **_optional({"type": "long", "logicalType": "timestamp-millis"})},
        {
            "name": "total",
            **_optional({"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 2}),
        },
    ],
}
AVRO_TOPIC = f"""\
topic: payments-avro
partitions: 2
key: {{format: json, type: long, name: id}}
value:
  format: avro
  schemas:
    - {{id: 1, schema: {json.dumps(AVRO_SCHEMA)}}}
stream: {{name: payments_avro_stream}}
"""
TOPICS = ("payments", "payments-avro")


@pytest.fixture
def lake(tmp_path: Path) -> Settings:
    return lake_with(tmp_path, JSON_TOPIC, AVRO_TOPIC)


def _produce(
    lake: Settings,
    topic: str,
    lines: list[Any],
    capsys: pytest.CaptureFixture[str],
    *flags: str,
) -> tuple[int, str]:
    """``lakehouse produce topic [flags]`` of the lines (JSON texts as given, anything else
    dumped): its exit code and what it wrote to stderr."""
    text = "".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines)
    argv = ["--home", str(lake.home), "--contracts", str(lake.contracts_dir), "produce", topic]
    argv += flags
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("sys.stdin", io.StringIO(text))
        code = cli.main(argv)
    return code, capsys.readouterr().err


def _written(lake: Settings, topic: str) -> list[bytes]:
    """The values the topic holds, as bytes."""
    out = []
    for seg in list_segments(lake, topic):
        for line in seg.path.read_text().splitlines():
            envelope = json.loads(line)
            value = envelope["value"]
            encoded = envelope.get("valueEncoding") == "base64"
            out.append(base64.b64decode(value) if encoded else value.encode())
    return out


GOOD = {"customer": "ann", "amount": 3, "items": 2, "rate": 0.5, "paid": True}


@pytest.mark.parametrize("topic", TOPICS)
@pytest.mark.parametrize(
    ("field", "given", "message"),
    [
        ("customer", 5, "field 'customer': expected a string, got the number 5"),
        (
            "amount",
            '"12.50"',
            """field 'amount': expected a long (a JSON integer), got the string "12.50\"""",
        ),
        ("amount", "12.5", "field 'amount': expected a long (a JSON integer), got the number 12.5"),
        ("amount", "5.0", "field 'amount': expected a long (a JSON integer), got the number 5.0"),
        (
            "amount",
            "true",
            "field 'amount': expected a long (a JSON integer), got the boolean true",
        ),
        (
            "amount",
            str(2**63),
            "field 'amount': expected a long (a JSON integer from -9223372036854775808 to "
            "9223372036854775807), got the number 9223372036854775808",
        ),
        (
            "items",
            '"3"',
            """field 'items': expected an int (a JSON integer), got the string "3\"""",
        ),
        (
            "items",
            str(2**31),
            "field 'items': expected an int (a JSON integer from -2147483648 to 2147483647), got "
            "the number 2147483648",
        ),
        (
            "rate",
            '"0.5"',
            """field 'rate': expected a double (a JSON number), got the string "0.5\"""",
        ),
        (
            "rate",
            "1e400",
            "field 'rate': expected a double (a finite JSON number), got the number 1E+400",
        ),
        (
            "paid",
            '"yes"',
            """field 'paid': expected a boolean (true or false), got the string "yes\"""",
        ),
        ("paid", "1", "field 'paid': expected a boolean (true or false), got the number 1"),
        (
            "ts",
            '"yesterday"',
            "field 'ts': expected a timestamp (ISO-8601 text or epoch milliseconds), got the "
            'string "yesterday"',
        ),
        (
            "ts",
            "1700000000000.5",
            "field 'ts': expected a timestamp (ISO-8601 text or epoch milliseconds), got the "
            "number 1700000000000.5",
        ),
        (
            "total",
            '"12,50"',
            "field 'total': expected a decimal(12,2) (a JSON number, or a string holding one), "
            'got the string "12,50"',
        ),
        (
            "total",
            '"1e3"',
            "field 'total': expected a decimal(12,2) (a JSON number, or a string holding one), "
            'got the string "1e3"',
        ),
        (
            "total",
            "12.505",
            "field 'total': expected a decimal(12,2) (at most 2 digit(s) after the point), got "
            "the number 12.505",
        ),
        (
            "total",
            '"12.505"',
            "field 'total': expected a decimal(12,2) (at most 2 digit(s) after the point), got "
            'the string "12.505"',
        ),
        (
            "total",
            "12345678901",
            "field 'total': expected a decimal(12,2) (at most 10 digit(s) before the point), got "
            "the number 12345678901",
        ),
        (
            "total",
            '{"units": 12}',
            "field 'total': expected a decimal(12,2) (a JSON number, or a string holding one), "
            "got an object",
        ),
        (
            "customer",
            "null",
            "field 'customer': expected a string, got null; the field is not nullable",
        ),
    ],
)
def test_a_value_its_type_does_not_take_is_refused_naming_line_and_field(
    lake: Settings,
    capsys: pytest.CaptureFixture[str],
    topic: str,
    field: str,
    given: str,
    message: str,
) -> None:
    others = json.dumps({k: v for k, v in GOOD.items() if k != field})
    value = f'{others[:-1]}, "{field}": {given}}}'  # the field as written, e.g. 12.50
    lines = [{"key": 1, "value": GOOD}, f'{{"key": 2, "value": {value}}}']
    code, err = _produce(lake, topic, lines, capsys)
    assert code == 1
    assert err.splitlines()[-1] == f"error: stdin line 2: {message}"
    assert _written(lake, topic) == []  # not even line 1


@pytest.mark.parametrize("topic", TOPICS)
def test_a_missing_field_that_is_not_nullable_is_refused(
    lake: Settings, capsys: pytest.CaptureFixture[str], topic: str
) -> None:
    without = {k: v for k, v in GOOD.items() if k != "customer"}
    code, err = _produce(lake, topic, [{"key": 1, "value": without}], capsys)
    assert (code, err.splitlines()[-1]) == (
        1,
        "error: stdin line 1: field 'customer': expected a string, got nothing (the field is "
        "missing); the field is not nullable",
    )


def test_a_field_the_contract_does_not_declare_is_refused_naming_line_and_field(
    lake: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    """A typo is not data: ``custmer`` would become a null customer in silver."""
    typo = {**{k: v for k, v in GOOD.items() if k != "customer"}, "custmer": "ann"}
    lines = [{"key": 1, "value": GOOD}, {"key": 2, "value": {**typo, "customer": "bo"}}]
    code, err = _produce(lake, "payments", lines, capsys)
    contract = lake.contracts_dir / "payments.yaml"
    assert (code, err.splitlines()[-1]) == (
        1,
        f"error: stdin line 2: field 'custmer' is not declared by the contract of payments "
        f"({contract}), whose fields are 'customer', 'amount', 'items', 'rate', 'paid', 'ts', "
        "'total'; did you mean 'customer'? (--allow-undeclared-fields writes such fields as "
        "given, for a producer ahead of its contract)",
    )
    assert _written(lake, "payments") == []  # not even line 1
    # Asked for, the field is written as given.
    code, err = _produce(lake, "payments", lines, capsys, "--allow-undeclared-fields")
    assert (code, err.split(" (")[0]) == (0, "produced 2 record(s) to payments")
    assert sorted(json.loads(v)["customer"] for v in _written(lake, "payments")) == ["ann", "bo"]
    assert [json.loads(v).get("custmer") for v in _written(lake, "payments")].count("ann") == 1


def test_an_avro_value_holds_its_schemas_fields_only(
    lake: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    """Avro has no place for a field its schema lacks: refused even when asked to keep such
    fields (it would be dropped in silence)."""
    value = {**GOOD, "colour": "red"}
    for flags in ((), ("--allow-undeclared-fields",)):
        code, err = _produce(lake, "payments-avro", [{"key": 1, "value": value}], capsys, *flags)
        assert (code, err.splitlines()[-1]) == (
            1,
            "error: stdin line 1: field 'colour' is not declared by the Avro schema id 1, "
            "whose fields are 'customer', 'amount', 'items', 'rate', 'paid', 'ts', 'total' (an "
            "Avro value holds its schema's fields only)",
        )
    assert _written(lake, "payments-avro") == []


def test_a_key_is_checked_against_its_type(
    lake: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = _produce(lake, "payments", [{"key": "12", "value": GOOD}], capsys)
    assert (code, err.splitlines()[-1]) == (
        1,
        'error: stdin line 1: key: expected a long (a JSON integer), got the string "12"',
    )


def test_a_bad_line_writes_nothing_of_the_input_and_says_so(
    lake: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = [{"key": i, "value": GOOD} for i in range(3)]
    lines.insert(2, '{"key": 9, "value": {"customer": "bo", "rate": NaN}}')
    code, err = _produce(lake, "payments", lines, capsys)
    assert code == 1
    assert err.splitlines() == [
        "nothing produced to payments: every line is checked before any is written, and this "
        "one is refused:",
        "error: stdin line 3: not valid JSON: NaN is not a JSON number",
    ]
    assert _written(lake, "payments") == []
    code, err = _produce(lake, "payments", [{"key": 1, "value": GOOD, "partition": 2}], capsys)
    assert err.splitlines()[-1] == (
        "error: stdin line 1: partition 2 out of range: the topic has 2"
    )
    assert _written(lake, "payments") == []


def test_json_values_are_written_as_silver_reads_them_exactly(
    lake: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    """A decimal as a number with its scale's digits (from a number or a string), a timestamp
    as ISO-8601 text in UTC (from epoch milliseconds or any ISO-8601 form), fields the contract
    does not declare as given when the producer is asked to keep them, and numbers never
    through a binary float."""
    lines = [
        '{"key": 1, "value": {"customer": "ann", "total": 3537.5, "ts": 1700000000000}}',
        '{"key": 2, "value": {"customer": "bo", "total": "0.05", '
        '"ts": "2023-11-15T00:13:20+02:00"}}',
        '{"key": 3, "value": {"customer": "cy", "total": 9999999999.99, "rate": 0.1, '
        '"note": {"x": 1.10}}}',
        '{"key": 4, "value": {"customer": "di", "total": 1.25e1}}',
    ]
    code, err = _produce(lake, "payments", lines, capsys, "--allow-undeclared-fields")
    assert (code, err.split(" (")[0]) == (0, "produced 4 record(s) to payments")
    assert sorted(_written(lake, "payments")) == sorted(
        [
            b'{"customer":"ann","total":3537.50,"ts":"2023-11-14T22:13:20.000Z"}',
            b'{"customer":"bo","total":0.05,"ts":"2023-11-14T22:13:20.000Z"}',
            b'{"customer":"cy","total":9999999999.99,"rate":0.1,"note":{"x":1.10}}',
            b'{"customer":"di","total":12.50}',
        ]
    )


def test_avro_values_carry_exact_decimals(
    lake: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = [{"key": 1, "value": {"customer": "ann", "total": "12.5", "ts": 1700000000000}}]
    code, _ = _produce(lake, "payments-avro", lines, capsys)
    assert code == 0
    contract = Catalog.load(lake.contracts_dir).topic("payments-avro")
    decoder = avro.WireDecoder({1: AVRO_SCHEMA}, AVRO_SCHEMA, contract.fields)
    import pyarrow as pa

    rows, reasons = decoder.decode(pa.array(_written(lake, "payments-avro"), pa.binary()))
    assert reasons.to_pylist() == [None]
    (row,) = rows.to_pylist()
    assert (row["customer"], row["total"], row["ts"].isoformat()) == (
        "ann",
        Decimal("12.50"),
        "2023-11-14T22:13:20+00:00",
    )
