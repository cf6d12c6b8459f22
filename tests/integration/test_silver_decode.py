"""Silver decoding by contract, on tiny inline bronze batches: every key and value format, and
the reason given for each kind of bad record."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pytest

from lakehouse.contracts import avro
from lakehouse.contracts.catalog import parse_contract
from lakehouse.contracts.model import Contract
from lakehouse.streams.decode import decode, stream_rows
from lakehouse.streams.silver import quarantine_rows

pytestmark = pytest.mark.integration

T0 = datetime(2026, 1, 1, tzinfo=UTC)
BRONZE = "key binary, value binary, topic string, partition int, offset long, timestamp timestamp"


def _bronze(spark: Any, pairs: list[tuple[bytes | None, bytes | None]]) -> Any:
    rows = [(k, v, "t", 0, i, T0) for i, (k, v) in enumerate(pairs)]
    return spark.createDataFrame(rows, BRONZE)


def _contract(key: dict[str, Any], value: dict[str, Any], **extra: Any) -> Contract:
    doc = {"topic": "t", "key": key, "value": value, "stream": {"name": "t_stream"}, **extra}
    return parse_contract(doc, "t.yaml")


def _decoded(spark: Any, contract: Contract, pairs: list[tuple[Any, Any]]) -> list[dict[str, Any]]:
    df = decode(_bronze(spark, pairs), contract)
    return [r.asDict() for r in df.orderBy("offset").collect()]


JSON_VALUE = {
    "format": "json",
    "fields": [
        {"name": "name", "type": "string", "nullable": False},
        {"name": "age", "type": "int"},
        {"name": "score", "type": "double"},
        {"name": "active", "type": "boolean"},
        {"name": "seen", "type": "timestamp"},
        {"name": "visits", "type": "long"},
    ],
}
STRING_KEY = {"format": "string", "name": "id"}


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (b'{"name": "a", "age": 3', "value is not valid JSON"),
        (b"", "value is not valid JSON"),
        (b"[1, 2]", "value is a JSON array, not an object"),
        (b'"text"', "value is a JSON string, not an object"),
        (b'{"name": "a", "age": "three"}', "field 'age' should be an int, found a JSON string"),
        (b'{"name": "a", "age": 4000000000}', "field 'age' is not a valid int: 4000000000"),
        (b'{"name": "a", "age": 1.5}', "field 'age' should be an int, found a JSON decimal"),
        (b'{"name": 5}', "field 'name' should be a string, found a JSON bigint"),
        (b'{"name": {"first": "a"}}', "field 'name' should be a string, found a JSON object"),
        (
            b'{"name": "a", "active": "yes"}',
            "field 'active' should be a boolean, found a JSON string",
        ),
        (
            b'{"name": "a", "seen": "not a time"}',
            "field 'seen' is not a valid timestamp: not a time",
        ),
        (
            b'{"name": "a", "seen": 1767225600}',
            "field 'seen' should be a timestamp, found a JSON bigint",
        ),
        (b'{"age": 3}', "required field 'name' is missing or null"),
        (b'{"name": null}', "required field 'name' is missing or null"),
        (b'{"name": "\xff\xfe"}', "value is not valid UTF-8"),
    ],
)
def test_json_value_problems_have_precise_reasons(spark: Any, value: bytes, reason: str) -> None:
    contract = _contract(STRING_KEY, JSON_VALUE)
    (row,) = _decoded(spark, contract, [(b"k", value)])
    assert row["_reason"] == reason


def test_json_values_that_fit_decode_with_their_types(spark: Any) -> None:
    contract = _contract(STRING_KEY, JSON_VALUE)
    good = [
        (
            b"k1",
            b'{"name": "a", "age": 3, "score": 2, "active": true, "seen": "2026-01-02T03:04:05Z", "visits": 12345678901}',
        ),
        # strings that look like numbers, objects or booleans are strings when quoted
        (b"k2", b'{"name": "5", "extra": [1, 2]}'),
        (b"k3", b'{"name": "true", "score": 1.25}'),
        (b"k4", b'{"name": "{not json}", "age": null}'),
        (b"k5", None),  # a tombstone
        (None, b'{"name": "no key"}'),  # a null key is kept: tables decide
    ]
    rows = _decoded(spark, contract, good)
    assert [r["_reason"] for r in rows] == [None] * 6
    first = rows[0]
    assert (first["id"], first["name"], first["age"], first["score"], first["active"]) == (
        "k1",
        "a",
        3,
        2.0,
        True,
    )
    assert first["visits"] == 12345678901
    assert first["seen"] == datetime(2026, 1, 2, 3, 4, 5)  # session time zone is UTC
    assert [r["name"] for r in rows] == ["a", "5", "true", "{not json}", None, "no key"]
    assert [r["tombstone"] for r in rows] == [False, False, False, False, True, False]
    assert rows[5]["id"] is None


DECIMAL_VALUE = {
    "format": "json",
    "fields": [
        {"name": "price", "type": "decimal", "precision": 6, "scale": 2},
        {"name": "label", "type": "string"},
    ],
}


def test_json_decimals_decode_exactly_or_say_why_not(spark: Any) -> None:
    """A JSON number, or a string holding one, in plain notation, with at most the scale's
    digits after the point (trailing zeros aside) and precision - scale before it."""
    contract = _contract(STRING_KEY, DECIMAL_VALUE)
    values = [
        b'{"price": 1234.56}',
        b'{"price": "0.10", "label": "5 stars"}',
        b'{"price": 12}',
        b'{"price": -0.500}',
        b'{"price": "007.5"}',
        b'{"price": null}',
        b'{"price": 12.505}',
        b'{"price": "12.505"}',
        b'{"price": 12345.6}',
        b'{"price": 1.25e1}',
        b'{"price": "12,50"}',
        b'{"price": true}',
        b'{"price": {"units": 12}, "label": "x"}',
    ]
    rows = _decoded(spark, contract, [(b"k", v) for v in values])
    assert [(r["price"], r["_reason"]) for r in rows] == [
        (Decimal("1234.56"), None),
        (Decimal("0.10"), None),
        (Decimal("12.00"), None),
        (Decimal("-0.50"), None),
        (Decimal("7.50"), None),
        (None, None),
        (None, "field 'price' has more than 2 digit(s) after the point for a decimal(6,2): 12.505"),
        (None, "field 'price' has more than 2 digit(s) after the point for a decimal(6,2): 12.505"),
        (
            None,
            "field 'price' has more than 4 digit(s) before the point for a decimal(6,2): 12345.6",
        ),
        (
            None,
            "field 'price' should be a decimal(6,2) in plain notation, found a JSON number in "
            "exponent notation or of more than 38 digits",
        ),
        (None, "field 'price' is not a valid decimal(6,2): 12,50"),
        (None, "field 'price' should be a decimal(6,2), found a JSON boolean"),
        (None, "field 'price' should be a decimal(6,2), found a JSON object"),
    ]
    assert rows[1]["label"] == "5 stars"


def test_avro_decimals_decode_exactly(spark: Any) -> None:
    def schema(precision: int) -> dict[str, Any]:
        decimal = {"type": "bytes", "logicalType": "decimal", "precision": precision, "scale": 2}
        price = {"name": "price", "type": ["null", decimal], "default": None}
        return {"type": "record", "name": "Price", "fields": [price]}

    contract = _contract(
        STRING_KEY, {"format": "avro", "schemas": [{"id": 1, "schema": schema(6)}]}
    )
    rows = _decoded(
        spark,
        contract,
        [
            (b"k", _avro(1, schema(6), {"price": Decimal("1234.56")})),
            (b"k", _avro(1, schema(6), {"price": None})),
            # Avro's bytes hold any number of digits: more than the precision is a reason.
            (b"k", _avro(1, schema(9), {"price": Decimal("1234567.89")})),
        ],
    )
    assert [(r["price"], r["_reason"]) for r in rows] == [
        (Decimal("1234.56"), None),
        (None, None),
        (
            None,
            "decimal field 'price' does not fit decimal(6,2) (at most 4 digit(s) before the "
            "point): 1234567.89",
        ),
    ]


def test_string_key_must_be_utf8(spark: Any) -> None:
    contract = _contract(STRING_KEY, JSON_VALUE)
    (row,) = _decoded(spark, contract, [(b"\xff", b'{"name": "a"}')])
    assert row["_reason"] == "key is not valid UTF-8"


def test_json_key_of_a_declared_type(spark: Any) -> None:
    contract = _contract({"format": "json", "name": "id", "type": "long"}, JSON_VALUE)
    rows = _decoded(
        spark,
        contract,
        [
            (b"42", b'{"name": "a"}'),
            (b'"42"', b'{"name": "a"}'),
            (b"4x", b'{"name": "a"}'),
            (b"null", b'{"name": "a"}'),
        ],
    )
    assert [(r["id"], r["_reason"]) for r in rows] == [
        (42, None),
        (None, "key should be a long, found a JSON string"),
        (None, "key is not valid JSON"),
        (None, None),  # JSON null is a null key
    ]


def test_string_value_format(spark: Any) -> None:
    contract = _contract(STRING_KEY, {"format": "string", "name": "line"})
    rows = _decoded(spark, contract, [(b"k", b"hello {world}"), (b"k", b"\xc3\x28"), (b"k", None)])
    assert [(r["line"], r["_reason"]) for r in rows] == [
        ("hello {world}", None),
        (None, "value is not valid UTF-8"),
        (None, None),
    ]


V1 = {
    "type": "record",
    "name": "P",
    "fields": [
        {"name": "name", "type": "string"},
        {"name": "age", "type": ["null", "int"], "default": None},
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    ],
}
V2 = {
    **V1,
    "fields": [*V1["fields"], {"name": "email", "type": ["null", "string"], "default": None}],
}
AVRO_VALUE = {"format": "avro", "schemas": [{"id": 7, "schema": V1}, {"id": 8, "schema": V2}]}


def _avro(schema_id: int, schema: dict[str, Any], record: dict[str, Any]) -> bytes:
    return avro.encode(schema_id, avro.parse(schema, "test", ""), record)


def test_avro_values_of_old_and_new_schema_ids_decode_into_the_latest_shape(spark: Any) -> None:
    contract = _contract(STRING_KEY, AVRO_VALUE, event_time="at")
    at = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
    rows = _decoded(
        spark,
        contract,
        [
            (b"a", _avro(7, V1, {"name": "Ann", "age": 30, "at": at})),
            (b"b", _avro(8, V2, {"name": "Bo", "age": None, "at": at, "email": "b@x.org"})),
            (b"c", None),
        ],
    )
    assert [(r["id"], r["name"], r["age"], r["email"], r["_reason"]) for r in rows] == [
        ("a", "Ann", 30, None, None),
        ("b", "Bo", None, "b@x.org", None),
        ("c", None, None, None, None),
    ]
    assert rows[0]["event_time"] == datetime(2026, 3, 1, 12, 0)
    assert rows[2]["event_time"] == datetime(2026, 1, 1)  # a tombstone: the record timestamp


def test_avro_problems_have_precise_reasons(spark: Any) -> None:
    contract = _contract(STRING_KEY, AVRO_VALUE)
    at = datetime(2026, 3, 1, tzinfo=UTC)
    good = _avro(8, V2, {"name": "Bo", "age": 3, "at": at, "email": None})
    unknown = b"\x00\x00\x00\x00\x09" + good[5:]
    rows = _decoded(
        spark,
        contract,
        [
            (b"k", unknown),
            (b"k", good[:-3]),
            (b"k", b"\x01" + good[1:]),
            (b"k", b"\x00\x00"),
            (b"k", good + b"\x00"),
        ],
    )
    reasons = [r["_reason"] for r in rows]
    assert reasons[0] == "unknown Avro schema id 9 (the contract knows 7, 8)"
    assert reasons[1].startswith("Avro record is truncated")
    assert reasons[2] == "value does not start with the Avro wire-format magic byte 0 (found 0x01)"
    assert reasons[3].startswith("value is too short for the Confluent Avro wire format")
    assert reasons[4].startswith("1 unexpected bytes after the Avro record")


def test_avro_key(spark: Any) -> None:
    key = {"format": "avro", "name": "id", "schemas": [{"id": 3, "schema": "long"}]}
    contract = _contract(key, {"format": "string", "name": "line"})
    rows = _decoded(
        spark,
        contract,
        [(_avro(3, "long", 12), b"x"), (b"\x00\x00\x00\x00\x04\x02", b"y"), (None, b"z")],  # type: ignore[arg-type]
    )
    assert [(r["id"], r["_reason"]) for r in rows] == [
        (12, None),
        (None, "unknown Avro schema id 4 (the contract knows 3)"),
        (None, None),
    ]


def test_event_time_from_a_long_field_or_the_record_timestamp(spark: Any) -> None:
    value = {"format": "json", "fields": [{"name": "ms", "type": "long"}]}
    contract = _contract(STRING_KEY, value, event_time="ms")
    rows = _decoded(spark, contract, [(b"k", b'{"ms": 1767225600000}'), (b"k", b"{}")])
    assert rows[0]["event_time"] == datetime(2026, 1, 1)
    assert rows[1]["event_time"] == datetime(2026, 1, 1)  # null field: the record timestamp
    contract = _contract(STRING_KEY, value)
    (row,) = _decoded(spark, contract, [(b"k", b'{"ms": 5}')])
    assert row["event_time"] == datetime(2026, 1, 1)


def test_a_long_event_time_out_of_range_is_quarantined_not_a_failed_job(spark: Any) -> None:
    value = {"format": "json", "fields": [{"name": "ms", "type": "long"}]}
    contract = _contract(STRING_KEY, value, event_time="ms")
    pairs = [(b"k", b'{"ms": 9223372036854775807}'), (b"k", b'{"ms": -9223372036854775}')]
    # Only the reasons are collected: Python's datetime cannot hold the second event time.
    df = decode(_bronze(spark, pairs), contract).orderBy("offset").select("_reason")
    assert [r["_reason"] for r in df.collect()] == [
        "event-time field 'ms' is out of range (epoch milliseconds)",
        None,  # the smallest that fits
    ]


def test_good_and_quarantined_rows_partition_the_input(spark: Any) -> None:
    contract = _contract(STRING_KEY, JSON_VALUE)
    pairs = [(b"k", json.dumps({"name": f"n{i}"}).encode() if i % 3 else b"{") for i in range(30)]
    df = decode(_bronze(spark, pairs), contract)
    good, bad = stream_rows(df, contract), quarantine_rows(df)
    assert (good.count(), bad.count()) == (20, 10)
    assert set(bad.columns) == {
        "topic",
        "partition",
        "offset",
        "timestamp",
        "key",
        "value",
        "reason",
    }
    assert {r.offset for r in good.collect()} | {r.offset for r in bad.collect()} == set(range(30))


def test_a_contract_decodes_every_batch_alike_and_a_changed_contract_by_its_own_rules(
    spark: Any,
) -> None:
    """The decoding's column expressions are built once per contract and reused for its later
    batches; a contract that changed (one field's type) is not decoded by the old rules."""
    from lakehouse.streams import decode as decoding

    def numbers(kind: str) -> Contract:
        return _contract(STRING_KEY, {"format": "json", "fields": [{"name": "n", "type": kind}]})

    before = decoding._cached_decode_steps.cache_info()
    first = _decoded(spark, numbers("int"), [(b"a", b'{"n": 1}')])
    second = _decoded(spark, numbers("int"), [(b"b", b'{"n": "x"}')])
    changed = _decoded(spark, numbers("string"), [(b"b", b'{"n": "x"}')])
    after = decoding._cached_decode_steps.cache_info()
    assert (first[0]["n"], first[0]["_reason"]) == (1, None)
    assert second[0]["n"] is None
    assert second[0]["_reason"] == "field 'n' should be an int, found a JSON string"
    assert (changed[0]["n"], changed[0]["_reason"]) == ("x", None)
    assert after.hits > before.hits  # the second batch reused the first one's expressions
