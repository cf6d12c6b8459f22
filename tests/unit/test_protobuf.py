"""Protobuf values in Confluent's wire format (:mod:`lakehouse.contracts.protobuf`): a writer's
schema as base64 descriptors or as ``.proto`` text compiled by protoc, its records framed as
Confluent's ``ProtobufSerializer`` frames them (checked against that serializer's own message
index encoding), read by field name with proto3's rules."""

from __future__ import annotations

import base64
import json
import struct
from datetime import UTC, datetime
from textwrap import dedent
from typing import Any

import pytest
import yaml

from lakehouse.contracts import protobuf
from lakehouse.contracts.catalog import parse_contract

VISIT = dedent(
    """
    syntax = "proto3";
    package example.visits;
    import "google/protobuf/timestamp.proto";
    import "google/protobuf/wrappers.proto";

    message Visit {
      string city = 1;
      optional int64 age = 2;
      repeated string tags = 3;
      Kind kind = 4;
      google.protobuf.Timestamp at = 5;
      google.protobuf.Int32Value score = 6;
      bytes raw = 7;
      Place place = 8;
      map<string, int64> counts = 9;
      message Place { string name = 1; double lat = 2; }
      enum Kind { UNKNOWN = 0; HOME = 1; WORK = 2; }
    }
    message Other { string note = 1; }
    """
)


def _classes(text: str = VISIT) -> tuple[str, Any]:
    from google.protobuf import message_factory

    data = protobuf.descriptor_set(protobuf.file_proto("visit.proto", text))
    found = protobuf._pool_file(data)
    return data, lambda name: message_factory.GetMessageClass(found.message_types_by_name[name])


def _frame(schema_id: int, indexes: list[int], message: Any) -> bytes:
    """Framed with confluent-kafka's own message-index encoding (zigzag varints)."""
    import io

    from confluent_kafka.schema_registry.protobuf import ProtobufSerializer

    out = io.BytesIO()
    ProtobufSerializer._encode_varints(out, indexes, zigzag=True)
    return struct.pack(">bI", 0, schema_id) + out.getvalue() + message.SerializeToString()


def test_text_schemas_compile_and_records_read_by_name_with_proto3_rules() -> None:
    data, cls = _classes()
    visit = cls("Visit")
    sent = visit(city="Oslo", tags=["a", "b"], kind=2, raw=b"\x00\x01", counts={"x": 3})
    sent.at.FromDatetime(datetime(2024, 5, 1, 12, 30, tzinfo=UTC))
    sent.score.value = 7
    sent.place.name = "harbour"
    decoder = protobuf.WireDecoder({5: data}, "subject 's-value' has 5")
    text, problem = decoder.decode(_frame(5, [0], sent))
    assert problem is None and text is not None
    assert json.loads(text) == {
        "city": "Oslo",
        "age": None,  # optional and left out: null
        "tags": ["a", "b"],
        "kind": "WORK",
        "at": "2024-05-01T12:30:00Z",
        "score": 7,
        "raw": base64.b64encode(b"\x00\x01").decode(),
        "place": {"name": "harbour", "lat": 0.0},  # a scalar without presence: its default
        "counts": {"x": 3},
    }
    empty, problem = decoder.decode(_frame(5, [0], visit(age=0)))
    assert problem is None and json.loads(empty or b"")["age"] == 0  # set, though the default
    assert json.loads(empty or b"")["at"] is None and json.loads(empty or b"")["city"] == ""


def test_message_indexes_pick_the_second_and_nested_messages() -> None:
    data, cls = _classes()
    decoder = protobuf.WireDecoder({1: data}, "k")
    other, problem = decoder.decode(_frame(1, [1], cls("Other")(note="n")))
    assert problem is None and json.loads(other or b"") == {"note": "n"}
    from confluent_kafka.schema_registry.common.protobuf import _create_index_array

    place = cls("Visit").Place(name="p", lat=1.5)
    indexes = _create_index_array(place.DESCRIPTOR)  # the serializer's: the map entry is first
    assert indexes == [0, 1]
    nested, problem = decoder.decode(_frame(1, indexes, place))
    assert problem is None and json.loads(nested or b"") == {"name": "p", "lat": 1.5}


def test_base64_descriptors_as_confluents_python_serializer_registers_them() -> None:
    """The registry may hold a version as the serializer sent it: a base64 FileDescriptorProto."""
    from confluent_kafka.schema_registry.common.protobuf import _schema_to_str

    _, cls = _classes()
    visit = cls("Visit")
    registered = _schema_to_str(visit.DESCRIPTOR.file)
    data = protobuf.descriptor_set(protobuf.file_proto("any.proto", registered))
    decoder = protobuf.WireDecoder({9: data}, "k")
    text, problem = decoder.decode(_frame(9, [0], visit(city="Rome", age=4)))
    assert problem is None and json.loads(text or b"")["age"] == 4


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b"\x00\x00\x00", "too short for the Confluent Protobuf wire format (3 bytes)"),
        (b"\x01\x00\x00\x00\x05\x00\x0a", "magic byte 0 (found 0x01)"),
        (struct.pack(">bI", 0, 77) + b"\x00\x0a\x00", "unknown Protobuf schema id 77 (subject"),
        (struct.pack(">bI", 0, 5) + b"\x02\x0e\x0a\x00", "message index 7 is not a message"),
        (struct.pack(">bI", 0, 5) + b"\x00\x0a\x09Oslo", "does not parse as Protobuf schema id 5"),
        (struct.pack(">bI", 0, 5) + b"\x02", "the message indexes end early"),
    ],
)
def test_what_cannot_be_read_says_why(raw: bytes, reason: str) -> None:
    data, _ = _classes()
    _, problem = protobuf.WireDecoder({5: data}, "subject 's-value' has 5").decode(raw)
    assert problem is not None and reason in problem, problem


def test_a_schema_protoc_refuses_is_an_error_that_says_so() -> None:
    with pytest.raises(protobuf.ProtobufSchemaError, match="protoc cannot compile"):
        protobuf.file_proto("bad.proto", 'syntax = "proto3";\nmessage M { strin city = 1; }\n')


def test_imports_are_given_by_their_names() -> None:
    place = 'syntax = "proto3";\npackage geo;\nmessage Place { string name = 1; }\n'
    visit = (
        'syntax = "proto3";\nimport "geo/place.proto";\nmessage Visit { geo.Place place = 1; }\n'
    )
    files = protobuf.file_proto("visit.proto", visit, {"geo/place.proto": place})
    assert [f.name for f in files] == ["geo/place.proto", "visit.proto"]
    data = protobuf.descriptor_set(files)
    from google.protobuf import message_factory

    found = protobuf._pool_file(data)
    cls = message_factory.GetMessageClass(found.message_types_by_name["Visit"])
    text, _ = protobuf.WireDecoder({1: data}, "k").decode(_frame(1, [0], cls(place={"name": "x"})))
    assert json.loads(text or b"") == {"place": {"name": "x"}}


CONTRACT = """
topic: visits
stream: {name: visit_events}
key: {format: string, name: user}
value:
  format: protobuf
  registry: {subject: topic}
  fields:
    - {name: city, type: string, nullable: false}
    - {name: age, type: long}
    - {name: seen, type: timestamp}
    - {name: price, type: decimal, precision: 9, scale: 2}
"""


def test_the_contracts_fields_as_a_message_a_producer_registers() -> None:
    contract = parse_contract(yaml.safe_load(CONTRACT), "visits.yaml")
    cls = protobuf.contract_message(contract)
    fields = {f.name: f for f in cls.DESCRIPTOR.fields}
    assert list(fields) == ["city", "age", "seen", "price"]
    assert not fields["city"].has_presence and fields["age"].has_presence
    assert fields["seen"].message_type.full_name == "google.protobuf.Timestamp"
    message = protobuf.message_of(
        cls, {"city": "Oslo", "age": None, "seen": "2024-05-01T12:30:00Z", "price": "1.50"}
    )
    assert protobuf.plain(message) == {
        "city": "Oslo",
        "age": None,
        "seen": "2024-05-01T12:30:00Z",
        "price": "1.50",
    }


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("format: protobuf\n  fields: [{name: a, type: string}]\n", "registry"),
        (
            "format: protobuf\n  registry: {subject: record}\n  fields: [{name: a, type: string}]\n",
            "the subject is the topic's",
        ),
        ("format: protobuf\n  registry: {subject: topic}\n", "fields"),
    ],
)
def test_a_protobuf_value_needs_the_registry_its_fields_and_the_topics_subject(
    value: str, problem: str
) -> None:
    from lakehouse.errors import ContractError

    text = (
        "topic: visits\nstream: {name: v}\nkey: {format: string, name: user}\n"
        f"value:\n  {value}"
    )
    with pytest.raises(ContractError, match=problem):
        parse_contract(yaml.safe_load(text), "visits.yaml")


def test_schemas_check_says_what_a_reader_of_fields_cannot_read() -> None:
    """`lakehouse schemas --check` for values read into fields: a required field a writer
    lacks, or one it writes as a kind the field's type does not read, is a break; an optional
    one left out is not."""
    from lakehouse.contracts.confluent import reader_problems

    contract = parse_contract(yaml.safe_load(CONTRACT), "visits.yaml")
    same = protobuf.descriptor_set([protobuf.contract_file(contract)])
    assert reader_problems(contract, same) == []
    other = dedent(
        """
        syntax = "proto3";
        import "google/protobuf/timestamp.proto";
        message Visit { int64 age = 2; string seen = 3; optional bool price = 4; string x = 5; }
        """
    )
    writer = protobuf.descriptor_set(protobuf.file_proto("v.proto", other))
    assert reader_problems(contract, writer) == [
        "the writer has no field 'city', which is required",
        "field 'price' is written as boolean, which a decimal cannot read",
    ]
    as_json = {
        "type": "object",
        "properties": {"city": {"type": ["integer", "null"]}, "age": {"type": "integer"}},
    }
    json_contract = parse_contract(
        yaml.safe_load(CONTRACT.replace("format: protobuf", "format: json")), "visits.yaml"
    )
    assert reader_problems(json_contract, as_json) == [
        "field 'city' is written as integer, which a string cannot read"
    ]


KEYED = dedent(
    """
    topic: visits
    stream: {name: visit_events}
    key: {format: protobuf, name: user, type: long, registry: {}}
    value:
      format: protobuf
      registry: {}
      fields: [{name: city, type: string}]
    """
)


def test_a_protobuf_key_is_its_messages_key_field_or_only_field() -> None:
    """A key is a message (what Confluent's ProtobufSerializer takes): the field named as the
    contract's key, else the message's only one; a message with neither is a reason."""
    from lakehouse.contracts.confluent import key_reader_problems

    contract = parse_contract(yaml.safe_load(KEYED), "visits.yaml")
    cls = protobuf.contract_message(contract, "key")
    assert cls.DESCRIPTOR.full_name == "lakehouse.visit_events.VisitEventsKey"
    assert [(f.name, f.number) for f in cls.DESCRIPTOR.fields] == [("user", 1)]
    ours = protobuf.descriptor_set([protobuf.contract_file(contract, "key")])
    decoder = protobuf.WireDecoder({4: ours}, "subject 'visits-key' has 4", "key", "user")
    assert decoder.decode(_frame(4, [0], protobuf.message_of(cls, {"user": 42}))) == (b"42", None)

    data, message = _classes(
        'syntax = "proto3";\nmessage Id { int64 account = 1; }\n'
        "message Pair { string a = 1; string b = 2; }\n"
    )
    only = protobuf.WireDecoder({5: data}, "subject 'visits-key' has 5", "key", "user")
    assert only.decode(_frame(5, [0], message("Id")(account=7))) == (b"7", None)
    payload, problem = only.decode(_frame(5, [1], message("Pair")(a="x", b="y")))
    assert payload is None and problem == (
        "key message Pair (schema id 5) has no field 'user', nor only one field"
    )
    assert only.decode(b"\x01\x00\x00\x00\x05\x00")[1] == (
        "key does not start with the Protobuf wire-format magic byte 0 (found 0x01)"
    )
    assert key_reader_problems(contract, ours) == []
    texts = protobuf.descriptor_set(
        protobuf.file_proto("k.proto", 'syntax = "proto3";\nmessage K { string user = 1; }\n')
    )
    assert key_reader_problems(contract, texts) == [
        "the key is written as string, which a long key cannot read"
    ]
    pair = protobuf.descriptor_set(
        protobuf.file_proto(
            "p.proto", 'syntax = "proto3";\nmessage P { int64 a = 1; int64 b = 2; }\n'
        )
    )
    assert key_reader_problems(contract, pair) == [
        "the key message has no field 'user', nor only one field (it has a, b)"
    ]
