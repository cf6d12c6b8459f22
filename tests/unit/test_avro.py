from __future__ import annotations

import datetime as dt
from decimal import Decimal
from typing import Any

import fastavro
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lakehouse.contracts.avro import (
    MAGIC,
    WireDecoder,
    check_compatibility,
    compatibility_problems,
    encode,
    fields_of,
    parse,
    primitive_of,
    record_schema,
)
from lakehouse.contracts.fields import Field
from lakehouse.errors import ContractError

UTC = dt.UTC

EVERY_TYPE: dict[str, Any] = {
    "type": "record",
    "name": "every",
    "namespace": "test",
    "fields": [
        {"name": "s", "type": "string"},
        {"name": "i", "type": "int"},
        {"name": "l", "type": "long"},
        {"name": "f", "type": "float"},
        {"name": "d", "type": "double"},
        {"name": "b", "type": "boolean"},
        {"name": "e", "type": {"type": "enum", "name": "Colour", "symbols": ["RED", "GREEN"]}},
        {"name": "ms", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "us", "type": {"type": "long", "logicalType": "timestamp-micros"}},
        {"name": "ns", "type": ["null", "string"], "default": None},
        {"name": "nl", "type": ["long", "null"], "default": 0},
        {"name": "ne", "type": ["null", "Colour"], "default": None},
        {
            "name": "nts",
            "type": ["null", {"type": "long", "logicalType": "timestamp-millis"}],
            "default": None,
        },
    ],
}

V1 = {
    "type": "record",
    "name": "location",
    "fields": [{"name": "user", "type": "string"}, {"name": "visits", "type": "long"}],
}
V2 = {
    "type": "record",
    "name": "location",
    "fields": [
        {"name": "user", "type": "string"},
        {"name": "visits", "type": "long"},
        {"name": "city", "type": ["null", "string"], "default": None},
    ],
}


def _binary(*values: bytes | None) -> pa.Array:
    return pa.array(list(values), type=pa.binary())


def _decoder(writers: dict[int, Any], reader: Any) -> WireDecoder:
    return WireDecoder(writers, reader, fields_of(reader, "test", "value"))


def _framed(schema_id: int, schema: Any, record: Any) -> bytes:
    return encode(schema_id, parse(schema, "test", "value"), record)


# -- wire format and round trips -----------------------------------------------------------------


def test_encode_frames_magic_byte_and_big_endian_id() -> None:
    value = _framed(258, "string", "hi")
    assert value == bytes([MAGIC, 0, 0, 1, 2]) + b"\x04hi"


def test_every_supported_type_round_trips_with_nulls() -> None:
    when = dt.datetime(2024, 5, 1, 12, 30, 15, 123456, tzinfo=UTC)
    full = {
        "s": "héllo",
        "i": -(2**31),
        "l": 2**62,
        "f": 1.5,
        "d": -2.25,
        "b": True,
        "e": "GREEN",
        "ms": when,  # millisecond precision on the wire: the micros are truncated
        "us": when,
        "ns": "x",
        "nl": -1,
        "ne": "RED",
        "nts": 1_700_000_000_123,
    }
    empty = {**full, "ns": None, "nl": None, "ne": None, "nts": None, "b": False}
    decoder = _decoder({3: EVERY_TYPE}, EVERY_TYPE)
    rows, reasons = decoder.decode(
        _binary(_framed(3, EVERY_TYPE, full), _framed(3, EVERY_TYPE, empty), None)
    )

    assert reasons.to_pylist() == [None, None, None]
    assert rows.type == decoder.arrow_type
    assert [(f.name, f.type, f.nullable) for f in rows.type] == [
        ("s", pa.string(), False),
        ("i", pa.int32(), False),
        ("l", pa.int64(), False),
        ("f", pa.float64(), False),
        ("d", pa.float64(), False),
        ("b", pa.bool_(), False),
        ("e", pa.string(), False),
        ("ms", pa.timestamp("us", tz="UTC"), False),
        ("us", pa.timestamp("us", tz="UTC"), False),
        ("ns", pa.string(), True),
        ("nl", pa.int64(), True),
        ("ne", pa.string(), True),
        ("nts", pa.timestamp("us", tz="UTC"), True),
    ]
    first, second, tombstone = rows.to_pylist()
    assert first == {
        **full,
        "ms": when.replace(microsecond=123000),
        "nts": dt.datetime(2023, 11, 14, 22, 13, 20, 123000, tzinfo=UTC),
    }
    assert second == {**empty, "ms": when.replace(microsecond=123000)}
    assert tombstone is None
    assert rows.is_null().to_pylist() == [False, False, True]


def test_timestamps_keep_exact_units_including_before_the_epoch() -> None:
    schema = {
        "type": "record",
        "name": "t",
        "fields": [
            {"name": "ms", "type": {"type": "long", "logicalType": "timestamp-millis"}},
            {"name": "us", "type": {"type": "long", "logicalType": "timestamp-micros"}},
        ],
    }
    decoder = _decoder({1: schema}, schema)
    rows, _ = decoder.decode(
        _binary(
            _framed(1, schema, {"ms": 1_700_000_000_123, "us": 1_700_000_000_123_456}),
            _framed(1, schema, {"ms": -1, "us": -1}),
        )
    )
    assert rows.field("ms").cast(pa.int64()).to_pylist() == [1_700_000_000_123_000, -1000]
    assert rows.field("us").cast(pa.int64()).to_pylist() == [1_700_000_000_123_456, -1]


def test_millis_written_by_an_older_schema_scale_to_micros_of_the_reader() -> None:
    # Avro resolution ignores logical types: the bytes keep the writer's unit, so it is the
    # writer's unit that says how to read them.
    old = {
        "type": "record",
        "name": "t",
        "fields": [{"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}}],
    }
    new = {
        "type": "record",
        "name": "t",
        "fields": [
            {"name": "at", "type": {"type": "long", "logicalType": "timestamp-micros"}},
            {
                "name": "seen",
                "type": ["null", {"type": "long", "logicalType": "timestamp-millis"}],
                "default": None,
            },
        ],
    }
    decoder = _decoder({1: old, 2: new}, new)
    rows, reasons = decoder.decode(
        _binary(_framed(1, old, {"at": 5}), _framed(2, new, {"at": 5, "seen": 7}))
    )
    assert reasons.to_pylist() == [None, None]
    assert rows.field("at").cast(pa.int64()).to_pylist() == [5000, 5]
    assert rows.field("seen").cast(pa.int64()).to_pylist() == [None, 7000]


def test_older_writer_decodes_into_the_latest_shape() -> None:
    decoder = _decoder({1: V1, 2: V2}, V2)
    rows, reasons = decoder.decode(
        _binary(
            _framed(1, V1, {"user": "ann", "visits": 3}),
            _framed(2, V2, {"user": "bob", "visits": 4, "city": "Oslo"}),
        )
    )
    assert reasons.to_pylist() == [None, None]
    assert rows.to_pylist() == [
        {"user": "ann", "visits": 3, "city": None},
        {"user": "bob", "visits": 4, "city": "Oslo"},
    ]


def test_int_written_is_read_as_long_after_promotion() -> None:
    old = {"type": "record", "name": "r", "fields": [{"name": "n", "type": "int"}]}
    new = {"type": "record", "name": "r", "fields": [{"name": "n", "type": "long"}]}
    rows, reasons = _decoder({1: old, 2: new}, new).decode(_binary(_framed(1, old, {"n": -7})))
    assert (rows.to_pylist(), reasons.to_pylist()) == ([{"n": -7}], [None])
    assert rows.type.field("n").type == pa.int64()


def test_large_binary_and_empty_batches() -> None:
    decoder = _decoder({1: V1}, V1)
    value = _framed(1, V1, {"user": "ann", "visits": 1})
    rows, reasons = decoder.decode(pa.array([value, None], type=pa.large_binary()))
    assert rows.to_pylist() == [{"user": "ann", "visits": 1}, None]
    assert reasons.to_pylist() == [None, None]
    rows, reasons = decoder.decode(pa.array([], type=pa.binary()))
    assert (len(rows), len(reasons), rows.type) == (0, 0, decoder.arrow_type)


def test_non_binary_input_is_refused() -> None:
    with pytest.raises(TypeError, match="binary Arrow array, not string"):
        _decoder({1: V1}, V1).decode(pa.array(["x"]))


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.none()
        | st.fixed_dictionaries(
            {
                "user": st.text(max_size=40),
                "visits": st.integers(-(2**63), 2**63 - 1),
                "city": st.none() | st.text(max_size=10),
            }
        ),
        max_size=30,
    )
)
def test_round_trip_property(records: list[dict[str, Any] | None]) -> None:
    parsed = parse(V2, "test", "value")
    values = [None if r is None else encode(9, parsed, r) for r in records]
    rows, reasons = _decoder({9: V2}, V2).decode(_binary(*values))
    assert rows.to_pylist() == records
    assert reasons.null_count == len(records)


# -- undecodable values --------------------------------------------------------------------------

STRING_AND_UNION = {
    "type": "record",
    "name": "r",
    "fields": [{"name": "a", "type": "string"}, {"name": "b", "type": ["null", "long"]}],
}


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (b"", "value is too short for the Confluent Avro wire format (0 bytes)"),
        (b"\x00\x00\x00\x01", "value is too short for the Confluent Avro wire format (4 bytes)"),
        (
            b"\x01\x00\x00\x00\x01\x02a\x00",
            "value does not start with the Avro wire-format magic byte 0 (found 0x01)",
        ),
        (
            b'{"a": 1}',
            "value does not start with the Avro wire-format magic byte 0 (found 0x7b)",
        ),
        (b"\x00\x00\x00\x00\x07\x02a\x00", "unknown Avro schema id 7 (the contract knows 1, 2)"),
        (
            b"\x00\x00\x00\x00\x01\x0ahel",
            "Avro record is truncated: does not decode with schema id 1 (ran out after 4 bytes)",
        ),
        (
            b"\x00\x00\x00\x00\x01\x02a",
            "Avro record is truncated: does not decode with schema id 1 (ran out after 2 bytes)",
        ),
        (
            b"\x00\x00\x00\x00\x01\x02a\x00\xff\xff",
            "2 unexpected bytes after the Avro record (schema id 1)",
        ),
        (
            b"\x00\x00\x00\x00\x01\x02a\x08",
            "Avro record does not decode with schema id 1: list index out of range (IndexError)",
        ),
    ],
    ids=[
        "empty",
        "short",
        "bad-magic",
        "json",
        "unknown-id",
        "truncated-string",
        "truncated-union",
        "trailing",
        "bad-union-index",
    ],
)
def test_undecodable_value_gives_a_reason_and_a_null_row(value: bytes, reason: str) -> None:
    decoder = _decoder({1: STRING_AND_UNION, 2: STRING_AND_UNION}, STRING_AND_UNION)
    good = _framed(1, STRING_AND_UNION, {"a": "ok", "b": 1})
    rows, reasons = decoder.decode(_binary(good, value, good))
    assert reasons.to_pylist() == [None, reason, None]
    assert rows.to_pylist() == [{"a": "ok", "b": 1}, None, {"a": "ok", "b": 1}]


def test_a_record_cut_anywhere_is_truncated() -> None:
    # fastavro reports a short read as EOFError or IndexError depending on the type it reads.
    value = _framed(
        1,
        EVERY_TYPE,
        {
            "s": "hello",
            "i": 99999,
            "l": 123456789,
            "f": 2.5,
            "d": 1.5,
            "b": True,
            "e": "RED",
            "ms": 1,
            "us": 2**40,
            "ns": "x",
            "nl": 300,
            "ne": "GREEN",
            "nts": 5,
        },
    )
    cuts = [value[:n] for n in range(5, len(value))]
    _, reasons = _decoder({1: EVERY_TYPE}, EVERY_TYPE).decode(_binary(*cuts))
    assert reasons.to_pylist() == [
        f"Avro record is truncated: does not decode with schema id 1 (ran out after {n} bytes)"
        for n in range(len(value) - 5)
    ]


def test_invalid_utf8_is_a_decode_error() -> None:
    decoder = _decoder({1: STRING_AND_UNION}, STRING_AND_UNION)
    _, reasons = decoder.decode(_binary(b"\x00\x00\x00\x00\x01\x04\xff\xfe\x00"))
    (reason,) = reasons.to_pylist()
    assert reason.startswith("Avro record does not decode with schema id 1: 'utf-8' codec")
    assert reason.endswith("(UnicodeDecodeError)")


def test_writer_the_reader_cannot_resolve_is_a_reason() -> None:
    old = {"type": "record", "name": "r", "fields": [{"name": "a", "type": "string"}]}
    new = {"type": "record", "name": "r", "fields": [{"name": "a", "type": "long"}]}
    _, reasons = _decoder({1: old, 2: new}, new).decode(_binary(_framed(1, old, {"a": "x"})))
    assert reasons.to_pylist() == [
        "Avro record written with schema id 1 cannot be read with the latest schema: "
        "Schema mismatch: string is not long"
    ]


def test_millis_beyond_int64_micros_is_out_of_range() -> None:
    schema = {
        "type": "record",
        "name": "t",
        "fields": [{"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}}],
    }
    rows, reasons = _decoder({1: schema}, schema).decode(
        _binary(_framed(1, schema, {"at": 2**62}), _framed(1, schema, {"at": 1}))
    )
    assert reasons.to_pylist() == [f"timestamp field 'at' is out of range ({2**62} ms)", None]
    assert rows.to_pylist() == [None, {"at": dt.datetime(1970, 1, 1, 0, 0, 0, 1000, tzinfo=UTC)}]


# -- keys ----------------------------------------------------------------------------------------


def test_decode_key_returns_a_flat_typed_array() -> None:
    decoder = WireDecoder({1: "string"}, "string", ())
    assert (decoder.scalar, decoder.arrow_type) == ("string", pa.string())
    keys, reasons = decoder.decode_key(_binary(_framed(1, "string", "ann"), None, b"\x00"))
    assert keys.type == pa.string()
    assert keys.to_pylist() == ["ann", None, None]
    assert reasons.to_pylist() == [
        None,
        None,
        "key is too short for the Confluent Avro wire format (1 bytes)",
    ]


def test_decode_key_with_nullable_and_promoted_types() -> None:
    decoder = WireDecoder({1: "int", 2: ["null", "long"]}, ["null", "long"], ())
    keys, reasons = decoder.decode_key(
        _binary(_framed(1, "int", 5), _framed(2, ["null", "long"], None))
    )
    assert (keys.type, keys.to_pylist(), reasons.to_pylist()) == (
        pa.int64(),
        [5, None],
        [None, None],
    )


def test_decoder_modes_are_not_mixed() -> None:
    with pytest.raises(TypeError, match="use decode_key"):
        WireDecoder({1: "string"}, "string", ()).decode(_binary())
    with pytest.raises(TypeError, match="use decode"):
        _decoder({1: V1}, V1).decode_key(_binary())
    with pytest.raises(ContractError, match="key schema must be"):
        WireDecoder({1: V1}, V1, ())
    with pytest.raises(ValueError, match="'visits' \\(int\\) is not a field of that type"):
        WireDecoder({1: V1}, V1, [Field("visits", "int")])


def _decimal(precision: int, scale: int) -> dict[str, Any]:
    return {"type": "bytes", "logicalType": "decimal", "precision": precision, "scale": scale}


def _priced(precision: int = 12, scale: int = 2) -> dict[str, Any]:
    """A record of one optional decimal field ``n``."""
    optional = {"name": "n", "type": ["null", _decimal(precision, scale)], "default": None}
    return {"type": "record", "name": "r", "fields": [optional]}


def test_decimals_decode_exactly_with_their_scale() -> None:
    decoder = _decoder({1: _priced()}, _priced())
    values = [Decimal("3537.58"), Decimal("-0.05"), Decimal("9999999999.99"), Decimal(12)]
    rows, reasons = decoder.decode(
        _binary(*(_framed(1, _priced(), {"n": v}) for v in values), _framed(1, _priced(), {}))
    )
    assert reasons.to_pylist() == [None] * 5
    assert rows.type == pa.struct([pa.field("n", pa.decimal128(12, 2), nullable=True)])
    assert [r["n"] for r in rows.to_pylist()] == [
        Decimal("3537.58"),
        Decimal("-0.05"),
        Decimal("9999999999.99"),
        Decimal("12.00"),
        None,
    ]


def test_all_38_digits_of_a_decimal_are_exact() -> None:
    # Python's default decimal context keeps 28 digits; a column keeps 38.
    widest = "-123456789012345678901234567890123456.78"
    decoder = _decoder({1: _priced(38, 2)}, _priced(38, 2))
    rows, _ = decoder.decode(_binary(_framed(1, _priced(38, 2), {"n": Decimal(widest)})))
    assert rows.to_pylist() == [{"n": Decimal(widest)}]


def test_a_decimal_that_does_not_fit_its_column_is_a_reason() -> None:
    # Avro's bytes can hold more digits than the precision says; a writer's scale is its own.
    wide = _priced(20, 2)
    finer = _priced(12, 3)
    decoder = _decoder({1: wide, 2: finer, 3: _priced()}, _priced())
    rows, reasons = decoder.decode(
        _binary(
            _framed(1, wide, {"n": Decimal("123456789012.34")}),
            _framed(2, finer, {"n": Decimal("12.345")}),
            _framed(2, finer, {"n": Decimal("12.340")}),
        )
    )
    assert reasons.to_pylist() == [
        "decimal field 'n' does not fit decimal(12,2) (at most 10 digit(s) before the point): "
        "123456789012.34",
        "decimal field 'n' does not fit decimal(12,2) (at most 2 digit(s) after the point): 12.345",
        None,
    ]
    assert rows.to_pylist() == [None, None, {"n": Decimal("12.34")}]


# -- schemas to columns --------------------------------------------------------------------------


def test_fields_of_maps_every_supported_type() -> None:
    assert fields_of(EVERY_TYPE, "c.yaml", "value.schemas[0]") == (
        Field("s", "string", False),
        Field("i", "int", False),
        Field("l", "long", False),
        Field("f", "double", False),
        Field("d", "double", False),
        Field("b", "boolean", False),
        Field("e", "string", False),
        Field("ms", "timestamp", False),
        Field("us", "timestamp", False),
        Field("ns", "string", True),
        Field("nl", "long", True),
        Field("ne", "string", True),
        Field("nts", "timestamp", True),
    )


def test_fields_of_maps_bytes_decimals_to_decimal_columns() -> None:
    schema = {
        "type": "record",
        "name": "r",
        "fields": [
            {"name": "price", "type": _decimal(12, 2)},
            {
                "name": "rate",
                "type": ["null", {"type": "bytes", "logicalType": "decimal", "precision": 38}],
            },
        ],
    }
    assert fields_of(schema, "c.yaml", "value.schemas[0]") == (
        Field("price", "decimal", False, 12, 2),
        Field("rate", "decimal", True, 38, 0),
    )


@pytest.mark.parametrize(
    ("avro_type", "problem"),
    [
        (
            _decimal(39, 2),
            "bytes (decimal) with precision 39 (a decimal column has a precision of 1 to 38)",
        ),
        (
            {"type": "bytes", "logicalType": "decimal"},
            "bytes (decimal) with precision None (a decimal column has a precision of 1 to 38)",
        ),
        (
            {"type": "fixed", "name": "F", "size": 8, "logicalType": "decimal", "precision": 9},
            "fixed 'F'",
        ),
    ],
)
def test_fields_of_refuses_decimals_a_column_cannot_hold(avro_type: Any, problem: str) -> None:
    with pytest.raises(ContractError) as raised:
        fields_of(_one_field(avro_type), "c.yaml", "value")
    assert raised.value.problem.startswith(f"field 'n' has unsupported Avro type {problem};")


def test_a_decimal_scale_beyond_its_precision_is_not_avro() -> None:
    with pytest.raises(ContractError, match="scale must be less than or equal to the precision"):
        fields_of(_one_field(_decimal(4, 5)), "c.yaml", "value")


def test_a_key_cannot_be_a_decimal() -> None:
    with pytest.raises(ContractError, match="an Avro key schema cannot be a decimal"):
        primitive_of(_decimal(12, 2), "c.yaml", "key.schemas[0]")


@pytest.mark.parametrize(
    ("avro_type", "described"),
    [
        ({"type": "record", "name": "Inner", "fields": []}, "record 'Inner'"),
        ({"type": "array", "items": "long"}, "array"),
        ({"type": "map", "values": "long"}, "map"),
        ("bytes", "bytes"),
        ({"type": "fixed", "name": "F", "size": 4}, "fixed 'F'"),
        (["null", "string", "long"], "union [null, string, long]"),
        (["string", "long"], "union [string, long]"),
        ({"type": "int", "logicalType": "date"}, "int (date)"),
        (
            {"type": "long", "logicalType": "local-timestamp-millis"},
            "long (local-timestamp-millis)",
        ),
        ("null", "null"),
    ],
)
def test_fields_of_refuses_what_silver_cannot_hold(avro_type: Any, described: str) -> None:
    schema = {
        "type": "record",
        "name": "r",
        "fields": [{"name": "ok", "type": "long"}, {"name": "bad", "type": avro_type}],
    }
    with pytest.raises(ContractError) as raised:
        fields_of(schema, "c.yaml", "value.schemas[1]")
    assert (raised.value.file, raised.value.path) == ("c.yaml", "value.schemas[1].fields[1]")
    assert raised.value.problem.startswith(f"field 'bad' has unsupported Avro type {described};")


def test_fields_of_refuses_non_records_duplicates_and_invalid_schemas() -> None:
    with pytest.raises(ContractError, match="value schema must be a record, not string"):
        fields_of("string", "c.yaml", "value")
    duplicate = {
        "type": "record",
        "name": "r",
        "fields": [{"name": "a", "type": "long"}, {"name": "a", "type": "string"}],
    }
    with pytest.raises(ContractError) as raised:
        fields_of(duplicate, "c.yaml", "value")
    assert (raised.value.path, raised.value.problem) == (
        "value.fields[1]",
        "duplicate field name 'a'",
    )
    with pytest.raises(ContractError) as raised:
        fields_of({"type": "record", "fields": []}, "c.yaml", "value")
    assert raised.value.problem.startswith("not a valid Avro schema: ")
    with pytest.raises(ContractError, match="not a valid Avro schema: nosuch"):
        parse({"type": "record", "name": "r", "fields": [{"name": "a", "type": "nosuch"}]}, "c", "")


@pytest.mark.parametrize(
    ("schema", "expected"),
    [
        ("string", "string"),
        ("int", "int"),
        ("long", "long"),
        ("float", "double"),
        ({"type": "double"}, "double"),
        ("boolean", "boolean"),
        (["null", "string"], "string"),
        (["long", "null"], "long"),
    ],
)
def test_primitive_of(schema: Any, expected: str) -> None:
    assert primitive_of(schema, "c.yaml", "key.schemas[0]") == expected


@pytest.mark.parametrize(
    "schema", [V1, "bytes", ["string", "long"], {"type": "array", "items": "int"}]
)
def test_primitive_of_refuses_compound_keys(schema: Any) -> None:
    with pytest.raises(ContractError) as raised:
        primitive_of(schema, "c.yaml", "key.schemas[0]")
    assert raised.value.path == "key.schemas[0]"
    assert "an Avro key schema must be a " in raised.value.problem


def test_record_schema_is_the_avro_equivalent_of_columns() -> None:
    columns = (
        Field("user", "string", False),
        Field("visits", "long"),
        Field("n", "int", False),
        Field("score", "double"),
        Field("active", "boolean", False),
        Field("at", "timestamp"),
        Field("price", "decimal", False, 12, 2),
    )
    schema = record_schema("user-locations", columns)
    assert schema == {
        "type": "record",
        "name": "user_locations",
        "fields": [
            {"name": "user", "type": "string"},
            {"name": "visits", "type": ["null", "long"], "default": None},
            {"name": "n", "type": "int"},
            {"name": "score", "type": ["null", "double"], "default": None},
            {"name": "active", "type": "boolean"},
            {
                "name": "at",
                "type": ["null", {"type": "long", "logicalType": "timestamp-micros"}],
                "default": None,
            },
            {
                "name": "price",
                "type": {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 2},
            },
        ],
    }
    assert fields_of(schema, "c", "") == columns
    assert record_schema("2024.events", ())["name"] == "_2024_events"
    fastavro.parse_schema(record_schema("2024.events", ()))  # a valid Avro name


# -- compatibility -------------------------------------------------------------------------------

A = {"type": "record", "name": "r", "fields": [{"name": "a", "type": "string"}]}
AB = {
    "type": "record",
    "name": "r",
    "fields": [
        {"name": "a", "type": "string"},
        {"name": "b", "type": ["null", "long"], "default": None},
    ],
}
ABC = {
    "type": "record",
    "name": "r",
    "fields": [*AB["fields"], {"name": "c", "type": "long"}],
}


def _one_field(avro_type: Any) -> dict[str, Any]:
    return {"type": "record", "name": "r", "fields": [{"name": "n", "type": avro_type}]}


def test_compatible_schemas_have_no_problems() -> None:
    assert compatibility_problems(AB, A) == []  # new optional field: defaults to null
    assert compatibility_problems(A, AB) == []  # dropped field: the reader skips it
    assert compatibility_problems(_one_field("long"), _one_field("int")) == []
    assert compatibility_problems(_one_field(["null", "long"]), _one_field("long")) == []


def test_compatibility_problems_name_the_field_and_why() -> None:
    assert compatibility_problems(ABC, AB) == [
        "field 'c' (at /fields/2) has no default, so data written without it cannot be read"
    ]
    assert compatibility_problems(_one_field("int"), _one_field("long")) == [
        "field 'n' (at /fields/0) is int and cannot read long "
        "(reader type: int not compatible with writer type: long)"
    ]
    # Under a union the checker loses the location; the field walk keeps it.
    assert compatibility_problems(_one_field("string"), _one_field(["null", "string"])) == [
        "field 'n' (at /fields/0) is string and cannot read union [null, string] "
        "(reader type: string not compatible with writer type: null)"
    ]
    enum = {"type": "enum", "name": "E", "symbols": ["X"]}
    assert compatibility_problems(
        _one_field(enum), _one_field({**enum, "symbols": ["X", "Y"]})
    ) == [
        "field 'n' (at /fields/0) is enum 'E' and cannot read enum 'E' (the reader's enum lacks symbols {'Y'})"
    ]


def test_decimals_match_only_with_their_precision_and_scale() -> None:
    """Avro's spec: two decimals match if their scales and precisions match. Apache's checker
    does not look (AVRO-2078); the scale says where the point is in the bytes."""
    assert compatibility_problems(_one_field(_decimal(12, 2)), _one_field(_decimal(12, 2))) == []
    rule = "a decimal reads only a decimal of the same precision and scale, as Avro's spec says"
    assert compatibility_problems(_one_field(_decimal(12, 2)), _one_field(_decimal(12, 3))) == [
        f"field 'n' (at /fields/0) is bytes (decimal(12,2)) and cannot read bytes "
        f"(decimal(12,3)) ({rule})"
    ]
    assert compatibility_problems(
        _one_field(["null", _decimal(14, 2)]), _one_field(_decimal(12, 2))
    ) == [
        f"field 'n' (at /fields/0) is union [null, bytes (decimal(14,2))] and cannot read bytes "
        f"(decimal(12,2)) ({rule})"
    ]
    assert compatibility_problems(_one_field(_decimal(12, 2)), _one_field("bytes")) == [
        f"field 'n' (at /fields/0) is bytes (decimal(12,2)) and cannot read bytes ({rule})"
    ]
    assert compatibility_problems(_decimal(12, 2), _decimal(10, 2)) == [
        f"bytes (decimal(12,2)) cannot read bytes (decimal(10,2)) ({rule})"
    ]


def test_compatibility_problems_for_non_records_and_renamed_records() -> None:
    assert compatibility_problems("long", "string") == [
        "long cannot read string (reader type: long not compatible with writer type: string)"
    ]
    renamed = {**A, "name": "s"}
    assert compatibility_problems(renamed, A) == [
        "the record is named 's' but the data was written as 'r' "
        "(list the old name in the record's aliases)"
    ]
    assert compatibility_problems({**renamed, "aliases": ["r"]}, A) == []


def test_compatibility_problems_refuses_invalid_schemas() -> None:
    with pytest.raises(ValueError, match="not a valid Avro schema"):
        compatibility_problems({"type": "record", "name": "1r", "fields": []}, A)


def test_backward_checks_the_new_schema_reads_the_latest_previous() -> None:
    assert check_compatibility("BACKWARD", AB, [A]) == []
    assert check_compatibility("BACKWARD", ABC, [A, AB]) == [
        "BACKWARD: version 3 cannot read data written with version 2: field 'c' (at /fields/2) "
        "has no default, so data written without it cannot be read"
    ]
    long_n, int_n = _one_field("long"), _one_field("int")
    assert check_compatibility("BACKWARD", long_n, [int_n]) == []
    assert len(check_compatibility("BACKWARD", int_n, [long_n])) == 1


def test_forward_checks_the_latest_previous_reads_the_new_schema() -> None:
    assert check_compatibility("FORWARD", ABC, [A, AB]) == []  # old readers ignore c
    assert check_compatibility("FORWARD", _one_field("long"), [_one_field("int")]) != []
    required = {
        "type": "record",
        "name": "r",
        "fields": [*A["fields"], {"name": "x", "type": "int"}],
    }
    assert check_compatibility("FORWARD", A, [required]) == [
        "FORWARD: version 1 cannot read data written with version 2: field 'x' (at /fields/1) "
        "has no default, so data written without it cannot be read"
    ]


def test_full_checks_both_directions() -> None:
    assert check_compatibility("FULL", AB, [A]) == []
    assert check_compatibility("FULL", _one_field("long"), [_one_field("int")]) == [
        "FULL: version 1 cannot read data written with version 2: field 'n' (at /fields/0) is "
        "int and cannot read long (reader type: int not compatible with writer type: long)"
    ]


def test_transitive_modes_check_every_previous_version() -> None:
    # v3 drops z. v2 gave z a default, so v2's readers cope with v3's data; v1's do not.
    v1 = {
        "type": "record",
        "name": "r",
        "fields": [{"name": "a", "type": "string"}, {"name": "z", "type": "long"}],
    }
    v2 = {
        "type": "record",
        "name": "r",
        "fields": [{"name": "a", "type": "string"}, {"name": "z", "type": "long", "default": 0}],
    }
    v3 = A
    assert check_compatibility("FORWARD", v3, [v1, v2]) == []
    assert check_compatibility("FORWARD_TRANSITIVE", v3, [v1, v2]) == [
        "FORWARD_TRANSITIVE: version 1 cannot read data written with version 3: field 'z' "
        "(at /fields/1) has no default, so data written without it cannot be read"
    ]
    assert check_compatibility("BACKWARD_TRANSITIVE", v3, [v1, v2]) == []
    assert check_compatibility("FULL", v3, [v1, v2]) == []
    assert check_compatibility("FULL_TRANSITIVE", v3, [v1, v2]) == [
        "FULL_TRANSITIVE: version 1 cannot read data written with version 3: field 'z' "
        "(at /fields/1) has no default, so data written without it cannot be read"
    ]
    assert check_compatibility("BACKWARD_TRANSITIVE", ABC, [A, AB]) == [
        "BACKWARD_TRANSITIVE: version 3 cannot read data written with version 1: field 'c' "
        "(at /fields/2) has no default, so data written without it cannot be read",
        "BACKWARD_TRANSITIVE: version 3 cannot read data written with version 2: field 'c' "
        "(at /fields/2) has no default, so data written without it cannot be read",
    ]


def test_none_mode_and_first_version_pass_everything() -> None:
    assert check_compatibility("NONE", _one_field("string"), [_one_field("long")]) == []
    assert check_compatibility("BACKWARD", _one_field("string"), []) == []
    assert check_compatibility("backward", AB, [A]) == []
    with pytest.raises(ValueError, match="unknown compatibility mode 'SIDEWAYS'"):
        check_compatibility("SIDEWAYS", AB, [A])
