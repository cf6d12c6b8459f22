"""A topic written through a schema registry, end to end: records serialized by
``confluent-kafka``'s own ``AvroSerializer`` against the project's registry (Apicurio Registry,
``lakehouse registry start``) reach gold with no schema id in the contract; a compatible second
version registered by the producer is read on the next batch with no contract change and
recorded in ``schemas.registry``; unknown ids and unframed values are quarantined with their
reason; a registry that does not answer fails silver before anything is written. The oracle for
the tables is the same records through a contract that lists the registry's ids by hand."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lakehouse.contracts.catalog import Catalog
from lakehouse.contracts.confluent import URL_ENV, SchemaRegistryUnavailableError
from lakehouse.contracts.serde import Serializer
from lakehouse.errors import SchemaEvolutionError
from lakehouse.pipeline import reads
from lakehouse.quality.ledger import read_ledger
from lakehouse.runtime import registry
from lakehouse.runtime.config import Settings
from lakehouse.runtime.process import free_port
from lakehouse.streams.registry import SchemaRegistry
from lakehouse.topics.landing import Record
from lakes import lake_with, produce, rows, run_layers, run_pipeline, shipped_topic

pytestmark = pytest.mark.integration

TOPIC = "profiles"
V1 = {
    "type": "record",
    "name": "Profile",
    "namespace": "example.accounts",
    "fields": [
        {"name": "city", "type": "string"},
        {"name": "age", "type": ["null", "int"], "default": None},
    ],
}
# A field with a default: BACKWARD, a v2 reader reads what v1 wrote.
V2 = {
    **V1,
    "fields": [*V1["fields"], {"name": "email", "type": ["null", "string"], "default": None}],
}
# A field without a default: a reader with it cannot read what v2 wrote.
BREAKS = {**V2, "fields": [*V2["fields"], {"name": "score", "type": "double"}]}

TABLES = """
stream: {name: profile_changes}
tables:
  - {name: profiles_now, kind: latest}
  - name: profile_counts
    kind: aggregate
    aggregations:
      - {name: updates, fn: count}
      - {name: oldest, fn: max, field: age}
"""


def _contract(value: str) -> str:
    return (
        f"topic: {TOPIC}\npartitions: 2\nkey: {{format: string, name: username}}\n{value}{TABLES}"
    )


THROUGH_REGISTRY = _contract(
    f"value:\n  format: avro\n  registry: {{subject: topic}}\n  reader: {{schema: {json.dumps(V2)}}}\n"
)


def _listing(ids: dict[int, Any]) -> str:
    """The oracle's contract: the registry's ids written in by hand."""
    entries = "".join(f"    - {{id: {i}, schema: {json.dumps(s)}}}\n" for i, s in ids.items())
    return _contract(f"value:\n  format: avro\n  schemas:\n{entries}")


def _lakehouse(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "lakehouse.cli", *args],
        env={**os.environ, "LAKEHOUSE_HOME": str(home)},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


@pytest.fixture(scope="module")
def registry_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The project's registry, started by its own command, for this module."""
    home = tmp_path_factory.mktemp("registry-topics") / "lakehouse"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(registry.PORT_ENV, str(free_port()))
        try:
            started = _lakehouse(home, "registry", "start")
            assert started.returncode == 0, started.stderr[-3000:]
            yield registry.url(Settings.from_env(home=home))
        finally:
            _lakehouse(home, "registry", "stop")


def _serializer(url: str, schema: dict[str, Any]) -> Any:
    """A producer's value serializer, as Confluent documents it: auto-registering under
    ``<topic>-value``."""
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    serializer = AvroSerializer(SchemaRegistryClient({"url": url}), json.dumps(schema))
    context = SerializationContext(TOPIC, MessageField.VALUE)
    return lambda value: serializer(value, context)


def _framed(schema_id: int) -> bytes:
    return struct.pack(">bI", 0, schema_id) + b"\x02x\x00"


def _ids(value: bytes) -> int:
    return int(struct.unpack_from(">bI", value)[1])


def test_a_confluent_producers_topic_reaches_gold_and_evolves_through_the_registry(
    spark: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    registry_url: str,
) -> None:
    from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
    from confluent_kafka.schema_registry.error import SchemaRegistryError

    monkeypatch.setenv(URL_ENV, registry_url)
    lake = lake_with(tmp_path / "registry", THROUGH_REGISTRY)
    v1 = _serializer(registry_url, V1)
    first = [
        Record(b"ann", v1({"city": "Oslo", "age": 31}), partition=0),
        Record(b"bob", v1({"city": "Rome", "age": None}), partition=1),
        Record(b"ann", v1({"city": "Bergen", "age": 32}), partition=0),
        Record(None, v1({"city": "Nowhere", "age": 1}), partition=1),  # a null key
        Record(b"cid", v1({"city": "Lima", "age": 40}), partition=1),
        Record(b"cid", None, partition=1),  # a tombstone
        Record(b"eve", _framed(999_999), partition=0),  # an id the registry never gave
        Record(b"eve", b"\x07not framed", partition=0),  # no magic byte
    ]
    id1 = _ids(first[0].value or b"")
    produce(lake, TOPIC, first)
    run_pipeline(spark, lake)

    contract = Catalog.load(lake.contracts_dir).topic(TOPIC)
    assert contract.value_writers == {}  # no id in the contract: the registry's
    silver = rows(lake.silver_path("profile_changes"), "username", "city", "age", "email")
    assert ("ann", "Bergen", 32, None) in silver and ("bob", "Rome", None, None) in silver
    reasons = sorted(
        r for (r,) in rows(lake.quarantine_path("silver", "profile_changes"), "reason")
    )
    assert len(reasons) == 2, reasons
    assert f"unknown Avro schema id 999999 (subject '{TOPIC}-value' has {id1})" in reasons
    assert any("magic byte 0" in r for r in reasons), reasons
    registered = SchemaRegistry(lake).versions(TOPIC, "value")
    assert registered[-1].state.ids == {
        str(id1): json.dumps(V1, sort_keys=True, separators=(",", ":"))
    }

    # The producer evolves its schema the normal way: a second version, registered by its own
    # serializer; the next batch reads it, the contract untouched.
    v2 = _serializer(registry_url, V2)
    second = [
        Record(b"bob", v2({"city": "Milan", "age": 50, "email": "bob@example.com"}), partition=1),
        Record(b"dan", v2({"city": "Oslo", "age": None, "email": None}), partition=0),
        Record(b"ann", v1({"city": "Tromsø", "age": 33}), partition=0),  # an old producer
    ]
    id2 = _ids(second[0].value or b"")
    assert id2 != id1
    # `lakehouse produce` of a registry topic writes through the same registry: the reader
    # schema, already registered by the producer as v2, gets its id.
    ours = Serializer(contract).value({"city": "Quito", "age": 20, "email": None}, "test")
    assert ours is not None and _ids(ours) == id2
    second.append(Record(b"fay", ours, partition=1))
    produce(lake, TOPIC, second)
    run_pipeline(spark, lake)
    silver = rows(lake.silver_path("profile_changes"), "username", "city", "email")
    assert ("bob", "Milan", "bob@example.com") in silver and ("fay", "Quito", None) in silver
    assert ("ann", "Tromsø", None) in silver
    registered = SchemaRegistry(lake).versions(TOPIC, "value")
    assert set(registered[-1].state.ids) == {str(id1), str(id2)}
    # The ids the topic's first job found (it looks them up: its reader is new), then the
    # version the producer added.
    assert [set(v.state.ids) for v in registered] == [{str(id1)}, {str(id1), str(id2)}]
    # The ledger says, for each silver batch, which writer schemas it was decoded with.
    batches = sorted(
        (r for r in read_ledger(lake, layer="silver").to_pylist() if r["kind"] == "batch"),
        key=lambda r: r["validated_at"],
    )
    assert [json.loads(r["source"])["schemas"] for r in batches] == [
        {"subject": f"{TOPIC}-value", "ids": [id1]},
        {"subject": f"{TOPIC}-value", "ids": sorted([id1, id2])},
    ]

    # An incompatible version is the registry's to refuse (BACKWARD, set at its start).
    client = SchemaRegistryClient({"url": registry_url})
    with pytest.raises(SchemaRegistryError) as refused:
        client.register_schema(f"{TOPIC}-value", Schema(json.dumps(BREAKS), "AVRO"))
    assert refused.value.http_status_code == 409

    # `lakehouse schemas --check`: the reader against every registered version, and a reader
    # that would break (a field the writers never had, with no default) named with the ids.
    assert reads.schemas(lake, Catalog.load(lake.contracts_dir), [TOPIC], check=True) == 0
    assert f"reads every version (ids {id1}, {id2})" in capsys.readouterr().out
    stricter = lake_with(
        tmp_path / "stricter", THROUGH_REGISTRY.replace(json.dumps(V2), json.dumps(BREAKS))
    )
    assert reads.schemas(stricter, Catalog.load(stricter.contracts_dir), [TOPIC], check=True) == 1
    said = capsys.readouterr().out
    assert "cannot read 2 of its versions" in said and "score" in said, said

    # The oracle: the same bytes, in the same batches, through a contract listing the ids.
    oracle = lake_with(tmp_path / "listed", _listing({id1: V1, id2: V2}))
    for batch in (first, second):
        produce(oracle, TOPIC, batch)
        run_pipeline(spark, oracle)
    for table, columns in {
        "profiles_now": ("username", "city", "age", "email"),
        "profile_counts": ("username", "updates", "oldest"),
    }.items():
        ours_rows = rows(lake.gold_path(table), *columns)
        assert ours_rows and ours_rows == rows(oracle.gold_path(table), *columns), table
    assert rows(lake.silver_path("profile_changes"), "partition", "offset", "city") == rows(
        oracle.silver_path("profile_changes"), "partition", "offset", "city"
    )

    # A contract change the registry's subject would refuse (a field its writers lack, with no
    # default: BACKWARD) is refused before any data moves, even where the contract's own mode
    # (NONE) allows it.
    from deltalake import DeltaTable

    breaking = THROUGH_REGISTRY.replace(json.dumps(V2), json.dumps(BREAKS)).replace(
        "partitions: 2\n", "partitions: 2\ncompatibility: NONE\n"
    )
    (lake.contracts_dir / f"{TOPIC}.yaml").write_text(breaking)
    produce(lake, TOPIC, [Record(b"zed", v2({"city": "Kyiv", "age": 9, "email": None}))])
    bronze_version = DeltaTable(str(lake.bronze_path(TOPIC))).version()
    with pytest.raises(SchemaEvolutionError) as refused_change:
        run_layers(spark, lake, TOPIC, "bronze")
    assert f"the registry's subject '{TOPIC}-value' (BACKWARD) would refuse it" in str(
        refused_change.value
    )
    assert "score" in str(refused_change.value)
    assert DeltaTable(str(lake.bronze_path(TOPIC))).version() == bronze_version


def test_a_registry_that_does_not_answer_fails_silver_before_anything_is_written(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, registry_url: str
) -> None:
    from deltalake import DeltaTable

    monkeypatch.setenv(URL_ENV, registry_url)
    lake = lake_with(tmp_path / "down", THROUGH_REGISTRY)
    # `lakehouse produce` writes through the registry (Confluent's serializer, in its process).
    line = {"key": "ann", "value": {"city": "Oslo", "age": 1, "email": None}, "partition": 0}
    produced = subprocess.run(
        [sys.executable, "-m", "lakehouse.cli", "produce", TOPIC],
        input=json.dumps(line) + "\n",
        env={
            **os.environ,
            "LAKEHOUSE_HOME": str(lake.home),
            "LAKEHOUSE_CONTRACTS": str(lake.contracts_dir),
        },
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert produced.returncode == 0, produced.stderr[-2000:]
    run_pipeline(spark, lake)
    silver = lake.silver_path("profile_changes")
    assert rows(silver, "username", "city") == [("ann", "Oslo")]
    before = DeltaTable(str(silver)).version()
    v2 = _serializer(registry_url, V2)

    produce(lake, TOPIC, [Record(b"bob", v2({"city": "Rome", "age": 2, "email": None}))])
    nobody = f"http://127.0.0.1:{free_port()}/apis/ccompat/v7"
    monkeypatch.setenv(URL_ENV, nobody)
    run_layers(spark, lake, TOPIC, "bronze")
    with pytest.raises(SchemaRegistryUnavailableError, match=f"{nobody}.*cannot be reached"):
        run_layers(spark, lake, TOPIC, "silver")
    assert DeltaTable(str(silver)).version() == before
    assert not rows(lake.quarantine_path("silver", "profile_changes"), "reason")

    monkeypatch.setenv(URL_ENV, registry_url)  # back: the batch that failed is read now
    run_layers(spark, lake, TOPIC, "silver")
    assert ("bob", "Rome") in rows(silver, "username", "city")


JSON_TOPIC = "visits"
THROUGH_REGISTRY_JSON = f"""\
topic: {JSON_TOPIC}
partitions: 2
key: {{format: string, name: username}}
value:
  format: json
  registry: {{subject: topic}}
  fields:
    - {{name: city, type: string, nullable: false}}
    - {{name: age, type: long}}
stream: {{name: visit_events}}
tables:
  - {{name: visits_now, kind: latest}}
  - name: visit_counts
    kind: aggregate
    aggregations:
      - {{name: visits, fn: count}}
      - {{name: oldest, fn: max, field: age}}
"""
# The oracle: the same JSON, not framed, through a contract of plain JSON.
PLAIN_JSON = THROUGH_REGISTRY_JSON.replace("  registry: {subject: topic}\n", "")
JSON_V2 = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "title": "Visit",
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "age": {"type": ["integer", "null"]},
        "email": {"type": ["string", "null"]},
    },
    "required": ["city"],
    "additionalProperties": False,
}


def test_json_schema_values_through_the_registry_are_validated_by_their_writers_schema(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, registry_url: str
) -> None:
    """`lakehouse produce` registers the contract's JSON Schema and frames with Confluent's
    JSONSerializer; a producer's own second version (a new optional property) is read with no
    contract change; a value its writer's schema refuses, an unknown id and an unframed value
    are quarantined with their reasons; gold equals the same JSON through a plain JSON
    contract."""
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.json_schema import JSONSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    monkeypatch.setenv(URL_ENV, registry_url)
    lake = lake_with(tmp_path / "json", THROUGH_REGISTRY_JSON)
    ours = Serializer(Catalog.load(lake.contracts_dir).topic(JSON_TOPIC))
    theirs = JSONSerializer(json.dumps(JSON_V2), SchemaRegistryClient({"url": registry_url}))
    context = SerializationContext(JSON_TOPIC, MessageField.VALUE)
    good = [
        (b"ann", ours.value({"city": "Oslo", "age": 31}, "test"), 0),
        (b"bob", ours.value({"city": "Rome", "age": None}, "test"), 1),
        (b"ann", theirs({"city": "Bergen", "age": 32, "email": "a@example.com"}, context), 0),
        (b"cid", theirs({"city": "Lima"}, context), 1),
        (b"cid", None, 1),  # a tombstone
    ]
    id_ours, id_theirs = (_ids(good[0][1] or b""), _ids(good[2][1] or b""))
    assert id_ours != id_theirs
    bad = [
        (b"eve", struct.pack(">bI", 0, id_theirs) + b'{"city": "Oslo", "age": "old"}', 0),
        (b"eve", struct.pack(">bI", 0, 888_888) + b'{"city": "Oslo"}', 1),
        (b"eve", b'{"city": "Oslo"}', 0),  # JSON, but not framed
    ]
    produce(lake, JSON_TOPIC, [Record(k, v, partition=p) for k, v, p in good + bad])
    run_pipeline(spark, lake)

    reasons = sorted(r for (r,) in rows(lake.quarantine_path("silver", "visit_events"), "reason"))
    assert len(reasons) == 3, reasons
    assert any(
        f"does not match JSON Schema id {id_theirs} at $.age: 'old' is not of type" in r
        for r in reasons
    ), reasons
    assert (
        f"unknown JSON Schema id 888888 (subject '{JSON_TOPIC}-value' has {id_ours}, {id_theirs})"
        in reasons
    )
    assert any("magic byte 0" in r for r in reasons), reasons
    registered = SchemaRegistry(lake).versions(JSON_TOPIC, "value")
    assert set(registered[-1].state.ids) == {str(id_ours), str(id_theirs)}

    oracle = lake_with(tmp_path / "plain", PLAIN_JSON)
    produce(
        oracle,
        JSON_TOPIC,
        [Record(k, None if v is None else v[5:], partition=p) for k, v, p in good],
    )
    run_pipeline(spark, oracle)
    for table, columns in {
        "visits_now": ("username", "city", "age"),
        "visit_counts": ("username", "visits", "oldest"),
    }.items():
        mine = rows(lake.gold_path(table), *columns)
        assert mine and mine == rows(oracle.gold_path(table), *columns), table


def test_a_broker_topic_written_by_a_confluent_producer_is_read_by_the_kafka_topics_subject(
    spark: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    registry_url: str,
    kafka_broker: Any,
) -> None:
    """From a broker: a Kafka producer with Confluent's AvroSerializer writes to a Kafka topic
    named unlike the contract; its subject is the Kafka topic's (TopicNameStrategy), which is
    where silver looks the ids up."""
    import io
    import uuid

    from confluent_kafka import Producer
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    from lakehouse.topics import produce as producing

    monkeypatch.setenv(URL_ENV, registry_url)
    kafka_topic = f"accounts-{uuid.uuid4().hex[:8]}"
    text = THROUGH_REGISTRY + (
        f"kafka: {{topic: {kafka_topic}, bootstrap_servers: '{kafka_broker.bootstrap_servers}'}}\n"
    )
    lake = lake_with(tmp_path / "broker", text)
    contract = Catalog.load(lake.contracts_dir).topic(TOPIC)
    assert contract.value_registry is not None
    assert contract.value_registry.subject == f"{kafka_topic}-value"
    assert producing.create_topic(lake, contract, io.StringIO()) == 0

    serializer = AvroSerializer(SchemaRegistryClient({"url": registry_url}), json.dumps(V2))
    context = SerializationContext(kafka_topic, MessageField.VALUE)
    producer = Producer({"bootstrap.servers": kafka_broker.bootstrap_servers})
    sent = {
        "ann": {"city": "Oslo", "age": 31, "email": None},
        "bob": {"city": "Rome", "age": 40, "email": "bob@example.com"},
    }
    for key, value in sent.items():
        producer.produce(kafka_topic, key=key.encode(), value=serializer(value, context))
    producer.produce(
        kafka_topic, key=b"ann", value=serializer({**sent["ann"], "city": "Bergen"}, context)
    )
    assert producer.flush(30) == 0
    run_pipeline(spark, lake)
    assert rows(lake.gold_path("profiles_now"), "username", "city", "email") == [
        ("ann", "Bergen", None),
        ("bob", "Rome", "bob@example.com"),
    ]
    assert rows(lake.gold_path("profile_counts"), "username", "updates") == [("ann", 2), ("bob", 1)]


PROTO_TOPIC = "checkins"
THROUGH_REGISTRY_PROTOBUF = (
    THROUGH_REGISTRY_JSON.replace(f"topic: {JSON_TOPIC}", f"topic: {PROTO_TOPIC}")
    .replace("format: json", "format: protobuf")
    .replace("visit_events", "checkin_events")
)
PLAIN_PROTO_ORACLE = THROUGH_REGISTRY_PROTOBUF.replace(
    "  registry: {subject: topic}\n", ""
).replace("format: protobuf", "format: json")
# The producer's own second version, as .proto text: the message `lakehouse produce` registers
# (the contract's fields, numbered in order) with a new optional field, which BACKWARD allows.
PROTO_V2 = """\
syntax = "proto3";
package lakehouse.checkin_events;
message CheckinEvents {
  string city = 1;
  optional int64 age = 2;
  optional string email = 3;
}
"""


def test_protobuf_values_through_the_registry_reach_gold_by_their_writers_descriptors(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, registry_url: str
) -> None:
    """`lakehouse produce` registers the contract's fields as a proto3 message and frames with
    Confluent's ProtobufSerializer; a producer's own second version (compiled from .proto text,
    one more optional field) is read with no contract change; an unknown id, an unframed value
    and a message that does not parse are quarantined with their reasons; gold equals the same
    records as plain JSON."""
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext
    from google.protobuf import message_factory

    from lakehouse.contracts import protobuf

    monkeypatch.setenv(URL_ENV, registry_url)
    lake = lake_with(tmp_path / "protobuf", THROUGH_REGISTRY_PROTOBUF)
    ours = Serializer(Catalog.load(lake.contracts_dir).topic(PROTO_TOPIC))
    first = [
        (b"ann", {"city": "Oslo", "age": 31}, 0),
        (b"bob", {"city": "Rome", "age": None}, 1),
    ]
    sent = [(k, ours.value(v, "test"), p) for k, v, p in first]

    v2_file = protobuf._pool_file(protobuf.descriptor_set(protobuf.file_proto("c.proto", PROTO_V2)))
    v2 = message_factory.GetMessageClass(v2_file.message_types_by_name["CheckinEvents"])
    theirs = ProtobufSerializer(
        v2, SchemaRegistryClient({"url": registry_url}), {"use.deprecated.format": False}
    )
    context = SerializationContext(PROTO_TOPIC, MessageField.VALUE)
    second = [
        (b"ann", {"city": "Bergen", "age": 32, "email": "a@example.com"}, 0),
        (b"cid", {"city": "Lima"}, 1),
    ]
    sent += [(k, theirs(v2(**v), context), p) for k, v, p in second]
    sent.append((b"cid", None, 1))  # a tombstone
    id_ours, id_theirs = _ids(sent[0][1] or b""), _ids(sent[2][1] or b"")
    assert id_ours != id_theirs
    bad = [
        (b"eve", struct.pack(">bI", 0, 777_777) + b"\x00\x0a\x02xy", 0),
        (b"eve", b'{"city": "Oslo"}', 1),  # not framed
        (b"eve", struct.pack(">bI", 0, id_theirs) + b"\x00\x0a\x09Os", 0),  # cut short
    ]
    produce(lake, PROTO_TOPIC, [Record(k, v, partition=p) for k, v, p in sent + bad])
    run_pipeline(spark, lake)

    reasons = sorted(r for (r,) in rows(lake.quarantine_path("silver", "checkin_events"), "reason"))
    assert len(reasons) == 3, reasons
    assert (
        f"unknown Protobuf schema id 777777 (subject '{PROTO_TOPIC}-value' has "
        f"{id_ours}, {id_theirs})" in reasons
    ), reasons
    assert any("magic byte 0" in r for r in reasons), reasons
    assert any(f"does not parse as Protobuf schema id {id_theirs}" in r for r in reasons), reasons
    registered = SchemaRegistry(lake).versions(PROTO_TOPIC, "value")
    assert set(registered[-1].state.ids) == {str(id_ours), str(id_theirs)}
    # The contract's fields read both versions; a field the writers lack, required, breaks.
    assert reads.schemas(lake, Catalog.load(lake.contracts_dir), [PROTO_TOPIC], check=True) == 0
    stricter = lake_with(
        tmp_path / "stricter",
        THROUGH_REGISTRY_PROTOBUF.replace(
            "    - {name: age, type: long}\n",
            "    - {name: age, type: long}\n    - {name: phone, type: string, nullable: false}\n",
        ),
    )
    assert (
        reads.schemas(stricter, Catalog.load(stricter.contracts_dir), [PROTO_TOPIC], check=True)
        == 1
    )

    oracle = lake_with(tmp_path / "plain", PLAIN_PROTO_ORACLE)
    plain = [(k, {"city": v["city"], "age": v.get("age")}, p) for k, v, p in first + second]
    produce(
        oracle,
        PROTO_TOPIC,
        [Record(k, json.dumps(v).encode(), partition=p) for k, v, p in plain]
        + [Record(b"cid", None, partition=1)],
    )
    run_pipeline(spark, oracle)
    for table, columns in {
        "visits_now": ("username", "city", "age"),
        "visit_counts": ("username", "visits", "oldest"),
    }.items():
        mine = rows(lake.gold_path(table), *columns)
        assert mine and mine == rows(oracle.gold_path(table), *columns), table


def test_json_schema_and_protobuf_producers_to_the_broker_reach_gold(
    spark: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    registry_url: str,
    kafka_broker: Any,
) -> None:
    """Kafka producers with Confluent's JSONSerializer and ProtobufSerializer write two broker
    topics; bronze keeps their bytes as they came, and gold has their latest values and counts
    with no id in either contract."""
    import io
    import uuid

    from confluent_kafka import Producer
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.json_schema import JSONSerializer
    from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext
    from google.protobuf import message_factory

    from lakehouse.contracts import protobuf
    from lakehouse.topics import produce as producing

    monkeypatch.setenv(URL_ENV, registry_url)
    run = uuid.uuid4().hex[:8]
    json_topic, proto_topic = f"visits-{run}", f"checkins-{run}"
    servers = kafka_broker.bootstrap_servers

    def on_broker(text: str, kafka_topic: str, prefix: str) -> str:
        return text.replace("visits_now", f"{prefix}_now").replace(
            "visit_counts", f"{prefix}_counts"
        ) + (f"kafka: {{topic: {kafka_topic}, bootstrap_servers: '{servers}'}}\n")

    lake = lake_with(
        tmp_path / "broker",
        on_broker(THROUGH_REGISTRY_JSON, json_topic, "visit"),
        on_broker(THROUGH_REGISTRY_PROTOBUF, proto_topic, "checkin"),
    )
    catalog = Catalog.load(lake.contracts_dir)
    for topic in (JSON_TOPIC, PROTO_TOPIC):
        assert producing.create_topic(lake, catalog.topic(topic), io.StringIO()) == 0

    client = SchemaRegistryClient({"url": registry_url})
    as_json = JSONSerializer(json.dumps(JSON_V2), client)
    v2_file = protobuf._pool_file(protobuf.descriptor_set(protobuf.file_proto("c.proto", PROTO_V2)))
    checkin = message_factory.GetMessageClass(v2_file.message_types_by_name["CheckinEvents"])
    as_proto = ProtobufSerializer(checkin, client, {"use.deprecated.format": False})
    sent = [
        ("ann", {"city": "Oslo", "age": 31, "email": None}),
        ("bob", {"city": "Rome", "age": 40, "email": "bob@example.com"}),
        ("ann", {"city": "Bergen", "age": 32, "email": None}),
    ]
    producer = Producer({"bootstrap.servers": servers})
    bytes_sent: dict[str, list[bytes]] = {json_topic: [], proto_topic: []}
    for key, value in sent:
        for kafka_topic, framed in (
            (json_topic, as_json(value, SerializationContext(json_topic, MessageField.VALUE))),
            (
                proto_topic,
                as_proto(
                    checkin(**{k: v for k, v in value.items() if v is not None}),
                    SerializationContext(proto_topic, MessageField.VALUE),
                ),
            ),
        ):
            assert framed is not None
            bytes_sent[kafka_topic].append(framed)
            producer.produce(kafka_topic, key=key.encode(), value=framed)
    assert producer.flush(30) == 0
    run_pipeline(spark, lake)

    for topic, kafka_topic, prefix in (
        (JSON_TOPIC, json_topic, "visit"),
        (PROTO_TOPIC, proto_topic, "checkin"),
    ):
        assert sorted(v for (v,) in rows(lake.bronze_path(topic), "value")) == sorted(
            bytes_sent[kafka_topic]
        )
        assert rows(lake.gold_path(f"{prefix}_now"), "username", "city", "age") == [
            ("ann", "Bergen", 32),
            ("bob", "Rome", 40),
        ], topic
        assert rows(lake.gold_path(f"{prefix}_counts"), "username", "visits", "oldest") == [
            ("ann", 2, 32),
            ("bob", 1, 40),
        ], topic


KEYED = "keyed"


def _keyed(key: str, value: str) -> str:
    return _contract(f"{key}{value}").replace(
        f"topic: {TOPIC}\npartitions: 2\nkey: {{format: string, name: username}}\n",
        f"topic: {KEYED}\npartitions: 2\n",
    )


def test_avro_keys_written_through_the_registry_are_read_by_their_subjects_ids(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, registry_url: str
) -> None:
    """Keys serialized by Confluent's AvroSerializer register under `<topic>-key`; silver reads
    them by the ids it looks up there (none in the contract), an unknown key id is quarantined
    naming the subject, `lakehouse produce` frames keys through the same registry, and gold
    equals the same bytes through a contract listing the key's and value's ids by hand; a key
    reader the key subject's mode refuses is refused before bronze moves."""
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    monkeypatch.setenv(URL_ENV, registry_url)
    key_reader = (
        "key:\n  format: avro\n  name: username\n  registry: {}\n  reader: {schema: string}\n"
    )
    value_reader = (
        f"value:\n  format: avro\n  registry: {{subject: topic}}\n"
        f"  reader: {{schema: {json.dumps(V2)}}}\n"
    )
    lake = lake_with(tmp_path / "keyed", _keyed(key_reader, value_reader))
    contract = Catalog.load(lake.contracts_dir).topic(KEYED)
    assert contract.key_registry is not None and contract.key_registry.subject == f"{KEYED}-key"

    client = SchemaRegistryClient({"url": registry_url})
    keys = AvroSerializer(client, json.dumps("string"))
    values = AvroSerializer(client, json.dumps(V2))
    key_context = SerializationContext(KEYED, MessageField.KEY)
    value_context = SerializationContext(KEYED, MessageField.VALUE)

    def sent(key: str, value: dict[str, Any], partition: int) -> Record:
        return Record(keys(key, key_context), values(value, value_context), partition=partition)

    good = [
        sent("ann", {"city": "Oslo", "age": 31, "email": None}, 0),
        sent("bob", {"city": "Rome", "age": None, "email": "b@example.com"}, 1),
        sent("ann", {"city": "Bergen", "age": 32, "email": None}, 0),
    ]
    ours = Serializer(contract)
    good.append(
        Record(
            ours.key("cid", "test"),
            ours.value({"city": "Lima", "age": 40, "email": None}, "test"),
            partition=1,
        )
    )
    key_id = _ids(good[0].key or b"")
    assert _ids(good[3].key or b"") == key_id  # the same schema: the same id
    bad = [Record(_framed(888_888), good[0].value, partition=0)]
    produce(lake, KEYED, good + bad)
    run_pipeline(spark, lake)

    reasons = [r for (r,) in rows(lake.quarantine_path("silver", "profile_changes"), "reason")]
    assert len(reasons) == 1 and (
        f"unknown Avro schema id 888888 (subject '{KEYED}-key' has {key_id})" in reasons[0]
    ), reasons
    keyed = SchemaRegistry(lake).versions(KEYED, "key")
    assert set(keyed[-1].state.ids) == {str(key_id)}

    value_id = _ids(good[0].value or b"")
    listed = _keyed(
        f"key:\n  format: avro\n  name: username\n  schemas:\n    - {{id: {key_id}, schema: string}}\n",
        f"value:\n  format: avro\n  schemas:\n    - {{id: {value_id}, schema: {json.dumps(V2)}}}\n",
    )
    oracle = lake_with(tmp_path / "listed", listed)
    produce(oracle, KEYED, good)
    run_pipeline(spark, oracle)
    for table, columns in {
        "profiles_now": ("username", "city", "age", "email"),
        "profile_counts": ("username", "updates", "oldest"),
    }.items():
        mine = rows(lake.gold_path(table), *columns)
        assert mine and mine == rows(oracle.gold_path(table), *columns), table
    now = rows(lake.gold_path("profiles_now"), "username", "city", "age", "email")
    assert ("cid", "Lima", 40, None) in now and ("ann", "Bergen", 32, None) in now

    # A key reader the key subject would refuse (an enum reads no string: BACKWARD) is refused
    # before any data moves, though the contract's own mode (NONE) and the column's type (a
    # string either way) would let it through.
    from deltalake import DeltaTable

    enum = {"type": "enum", "name": "Who", "symbols": ["ann", "bob", "cid"]}
    changed = _keyed(
        key_reader.replace("{schema: string}", f"{{schema: {json.dumps(enum)}}}"), value_reader
    ).replace("partitions: 2\n", "partitions: 2\ncompatibility: NONE\n")
    (lake.contracts_dir / f"{KEYED}.yaml").write_text(changed)
    produce(lake, KEYED, good[:1])
    bronze_version = DeltaTable(str(lake.bronze_path(KEYED))).version()
    with pytest.raises(SchemaEvolutionError) as refused:
        run_layers(spark, lake, KEYED, "bronze")
    assert f"the registry's subject '{KEYED}-key' (BACKWARD) would refuse it" in str(refused.value)
    assert DeltaTable(str(lake.bronze_path(KEYED))).version() == bronze_version


DRAFT_7 = "http://json-schema.org/draft-07/schema#"


def _key_topic(fmt: str, key: str) -> str:
    """A topic of plain JSON values whose key is ``key`` (YAML), its tables named by ``fmt``."""
    return f"""\
topic: keys-{fmt}
partitions: 2
key: {key}
value:
  format: json
  fields:
    - {{name: city, type: string, nullable: false}}
    - {{name: age, type: long}}
stream: {{name: {fmt}_key_events}}
tables:
  - {{name: {fmt}_keys_now, kind: latest}}
  - name: {fmt}_key_counts
    kind: aggregate
    aggregations:
      - {{name: visits, fn: count}}
      - {{name: oldest, fn: max, field: age}}
"""


@pytest.mark.parametrize("fmt", ["json", "protobuf"])
def test_json_schema_and_protobuf_keys_through_the_registry_reach_gold(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, registry_url: str, fmt: str
) -> None:
    """Keys serialized by Confluent's JSONSerializer (a JSON Schema scalar) or
    ProtobufSerializer (a message whose one field is the key) register under `<topic>-key`:
    `lakehouse produce` frames the first version, a producer of its own registers a second;
    silver reads both by the ids it looks up there (none in the contract), an unknown key id
    and an unframed key are quarantined with their reasons, `lakehouse schemas --check` judges
    the key's type against the subject's versions, and gold equals the same records through a
    contract of plain string keys."""
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.json_schema import JSONSerializer
    from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext
    from google.protobuf import message_factory

    from lakehouse.contracts import protobuf

    monkeypatch.setenv(URL_ENV, registry_url)
    topic = f"keys-{fmt}"
    through = _key_topic(fmt, f"{{format: {fmt}, name: username, type: string, registry: {{}}}}")
    lake = lake_with(tmp_path / fmt, through)
    contract = Catalog.load(lake.contracts_dir).topic(topic)
    assert contract.key_registry is not None and contract.key_registry.subject == f"{topic}-key"
    ours = Serializer(contract)
    first = [("ann", {"city": "Oslo", "age": 31}, 0), ("bob", {"city": "Rome", "age": None}, 1)]
    sent = [(ours.key(k, "test"), json.dumps(v).encode(), p) for k, v, p in first]

    client = SchemaRegistryClient({"url": registry_url})
    context = SerializationContext(topic, MessageField.KEY)
    if fmt == "json":  # a second version: the same scalar, described
        json_key = JSONSerializer(
            json.dumps({"$schema": DRAFT_7, "type": "string", "description": "an account"}), client
        )
        theirs = lambda key: json_key(key, context)  # noqa: E731
    else:  # a second version, as .proto text: the key message with a second field
        text = (
            'syntax = "proto3";\npackage lakehouse.protobuf_key_events;\n'
            "message ProtobufKeyEventsKey { string username = 1; string tenant = 2; }\n"
        )
        found = protobuf._pool_file(protobuf.descriptor_set(protobuf.file_proto("k.proto", text)))
        who = message_factory.GetMessageClass(found.message_types_by_name["ProtobufKeyEventsKey"])
        proto_key = ProtobufSerializer(who, client, {"use.deprecated.format": False})
        theirs = lambda key: proto_key(who(username=key, tenant="acme"), context)  # noqa: E731
    second = [("ann", {"city": "Bergen", "age": 32}, 0), ("cid", {"city": "Lima", "age": 5}, 1)]
    sent += [(theirs(k), json.dumps(v).encode(), p) for k, v, p in second]
    id_ours, id_theirs = _ids(sent[0][0] or b""), _ids(sent[2][0] or b"")
    assert id_ours != id_theirs
    bad = [
        (_framed(999_999), b'{"city": "Oslo"}', 0),
        (b"eve-not-framed", b'{"city": "Oslo"}', 1),
    ]
    produce(lake, topic, [Record(k, v, partition=p) for k, v, p in sent + bad])
    run_pipeline(spark, lake)

    kind = "JSON Schema" if fmt == "json" else "Protobuf"
    unknown = "JSON Schema id" if fmt == "json" else "Protobuf schema id"
    reasons = sorted(
        r for (r,) in rows(lake.quarantine_path("silver", f"{fmt}_key_events"), "reason")
    )
    assert len(reasons) == 2, (reasons, id_ours, id_theirs)
    assert any(
        f"unknown {unknown} 999999 (subject '{topic}-key' has {id_ours}, {id_theirs})" in r
        for r in reasons
    ), (reasons, id_ours, id_theirs)
    assert any(f"key does not start with the {kind} wire-format magic byte 0" in r for r in reasons)
    keyed = SchemaRegistry(lake).versions(topic, "key")
    assert set(keyed[-1].state.ids) == {str(id_ours), str(id_theirs)}
    # Each key version reads as a string; a long key reads neither.
    assert reads.schemas(lake, Catalog.load(lake.contracts_dir), [topic], check=True) == 0
    longer = lake_with(tmp_path / f"{fmt}-long", through.replace("type: string,", "type: long,"))
    assert reads.schemas(longer, Catalog.load(longer.contracts_dir), [topic], check=True) == 1

    oracle = lake_with(
        tmp_path / f"{fmt}-plain", _key_topic(fmt, "{format: string, name: username}")
    )
    produce(
        oracle,
        topic,
        [Record(k.encode(), json.dumps(v).encode(), partition=p) for k, v, p in first + second],
    )
    run_pipeline(spark, oracle)
    for table, columns in {
        f"{fmt}_keys_now": ("username", "city", "age"),
        f"{fmt}_key_counts": ("username", "visits", "oldest"),
    }.items():
        mine = rows(lake.gold_path(table), *columns)
        assert mine and mine == rows(oracle.gold_path(table), *columns), table
    assert ("ann", "Bergen", 32) in rows(
        lake.gold_path(f"{fmt}_keys_now"), "username", "city", "age"
    )


def test_the_shipped_avro_topic_is_produced_through_a_running_registry_else_by_its_listed_ids(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, registry_url: str
) -> None:
    """`user-profiles` lists its ids and names a registry: with one given (as `make airflow`
    runs it), the sample's older and newer producers register their schemas under
    `user-profiles-value` through Confluent's AvroSerializer and frame with the ids it gives,
    and silver reads those; with none (`make demo`), the listed ids 1 and 2 alone. Gold is the
    same either way. A listed id the registry has as another schema stops the topic's first job
    before anything is written."""
    import shutil

    from lakehouse.errors import ConfigError
    from lakehouse.topics import samples

    tables = ["user_profiles", "user_city_history"]
    folder = shipped_topic(tmp_path / "contracts", "user-profiles", tables)
    topic = "user-profiles"
    monkeypatch.delenv(URL_ENV, raising=False)
    alone = Settings.from_env(tmp_path / "alone", folder)
    assert samples.produce_seed(alone, Catalog.load(folder).topic(topic)) == 6
    run_pipeline(spark, alone)

    monkeypatch.setenv(URL_ENV, registry_url)
    through = Settings.from_env(tmp_path / "through", folder)
    contract = Catalog.load(folder).topic(topic)
    assert samples.produce_seed(through, contract) == 6
    run_pipeline(spark, through)
    from confluent_kafka.schema_registry import SchemaRegistryClient

    client = SchemaRegistryClient({"url": registry_url})
    given = {client.get_version(f"{topic}-value", n).schema_id for n in (1, 2)}
    framed = {_ids(v) for (v,) in rows(through.bronze_path(topic), "value") if v is not None}
    assert framed == given, (framed, given)
    assert {_ids(v) for (v,) in rows(alone.bronze_path(topic), "value") if v} == {1, 2}
    assert rows(through.quarantine_path("silver", "user_profile_changes"), "reason") == []
    for table in tables:
        mine = rows(through.gold_path(table), "username", "name", "city", "age", "email")
        assert mine and mine == rows(
            alone.gold_path(table), "username", "name", "city", "age", "email"
        )

    # A listed id the registry's subject has as another schema: which one is meant cannot be
    # guessed, so silver stops before it writes.
    import yaml

    v1_id = client.get_version(f"{topic}-value", 1).schema_id
    clash = tmp_path / "clash"
    shutil.copytree(folder, clash)
    document = yaml.safe_load((folder / f"{topic}.yaml").read_text())
    document["value"]["schemas"] = [
        {"id": 999_001, "file": "user-profiles/value-v1.avsc"},
        {"id": v1_id, "file": "user-profiles/value-v2.avsc"},
    ]
    (clash / f"{topic}.yaml").write_text(yaml.safe_dump(document, sort_keys=False))
    clashing = Settings.from_env(tmp_path / "clash-home", clash)
    produce(clashing, topic, samples.seed_records(contract, through)[:1])
    with pytest.raises(ConfigError) as refused:  # its first job looks the registry up
        run_layers(spark, clashing, topic, "bronze", "silver")
    assert f"value.schemas lists schema id {v1_id} (user-profiles/value-v2.avsc)" in str(
        refused.value
    ) and "as another schema" in str(refused.value)
    from lakehouse.storage import is_table

    assert not is_table(clashing.bronze_path(topic))
    assert not is_table(clashing.silver_path("user_profile_changes"))
