"""Producing records to a topic, as ``kafka-console-producer`` does (``lakehouse produce``,
``lakehouse sample``, ``lakehouse create-topic``): to its landing files, or to its Kafka broker
when the contract names one. Keys and values are checked and encoded by the contract first."""

from __future__ import annotations

from dataclasses import replace
from typing import TextIO

from lakehouse.contracts.catalog import Catalog
from lakehouse.contracts.model import Contract
from lakehouse.errors import BadRecordError, ConfigError
from lakehouse.runtime.config import Settings
from lakehouse.topics import kafka
from lakehouse.topics.landing import Producer, Record, record_from_json_line

PRODUCE_CHUNK = 10_000


def produce(
    settings: Settings,
    contract: Contract,
    stream: TextIO,
    err: TextIO,
    value_schema_id: int | None = None,
    *,
    allow_undeclared: bool = False,
) -> int:
    """Produce JSON lines from ``stream``, keys and values checked and encoded in the topic's
    formats (Avro with the latest schema id, or ``value_schema_id``). All or nothing: every line
    is read and checked before any is written, so a bad line (named with its number) writes
    nothing. A value field the contract does not declare is refused unless
    ``allow_undeclared``."""
    from lakehouse.contracts.serde import Serializer

    producer: Producer | kafka.Producer
    if contract.kafka is not None:
        client = kafka.client(settings, contract)
        kafka.check_topic(client, contract)
        producer = kafka.Producer(client, contract.partitions)
    elif contract.landing_format != "envelope":
        raise ConfigError(
            f"topic {contract.topic!r} lands as {contract.landing_format} files (Kafka Connect "
            "writes them); the producer writes envelope segments only"
        )
    else:
        producer = Producer(settings, contract.topic, contract.partitions)
    if contract.value_registry is not None and contract.value_registry.listed:
        from lakehouse.contracts import confluent

        # Ids listed and a registry named: through the registry if one is given or runs, else
        # by the listed ids.
        if not confluent.registry_given(contract, settings, contract.value_registry):
            contract = replace(contract, value_registry=None)
    serializer = Serializer(contract, value_schema_id, allow_undeclared=allow_undeclared)
    records: list[Record] = []
    for n, line in enumerate(stream, start=1):
        if not line.strip():
            continue
        try:
            records.append(record_from_json_line(line, f"stdin line {n}", serializer))
        except BadRecordError:
            print(
                f"nothing produced to {contract.topic}: every line is checked before any is "
                "written, and this one is refused:",
                file=err,
            )
            raise
    per_partition: dict[int, int] = {}
    for start in range(0, len(records), PRODUCE_CHUNK):
        for meta in producer.send_batch(records[start : start + PRODUCE_CHUNK]):
            per_partition[meta.partition] = per_partition.get(meta.partition, 0) + 1
    spread = ", ".join(f"p{p}: {n}" for p, n in sorted(per_partition.items())) or "none"
    print(f"produced {len(records)} record(s) to {contract.topic} ({spread})", file=err)
    return 0


def produce_sample(
    settings: Settings,
    catalog: Catalog,
    err: TextIO,
    topic: str | None = None,
    records: int | None = None,
    value_bytes: int = 0,
    seed: int = 0,
) -> int:
    """The shipped topics' fixed samples (once, into empty topics), or ``records`` random ones
    for one topic (default user-locations)."""
    from lakehouse.topics import samples

    if records is not None:
        contract = catalog.topic(topic or "user-locations")
        n = samples.generate(settings, contract, records, value_bytes=value_bytes, seed=seed)
        print(f"produced {n} generated record(s) to {contract.topic}", file=err)
        return 0
    names = [topic] if topic else [t for t in samples.SAMPLE_TOPICS if t in catalog.topics]
    for name in names:
        contract = catalog.topic(name)
        if contract.topic not in samples.SAMPLE_TOPICS:
            raise ConfigError(
                f"topic {name!r} has no sample data; shipped: {samples.SAMPLE_TOPICS}"
            )
        n = samples.produce_seed(settings, contract)
        if n:
            print(f"produced {n} sample record(s) to {contract.topic}", file=err)
        else:
            print(
                f"{contract.topic} already has data under {settings.landing_root}: left as is",
                file=err,
            )
    return 0


def create_topic(settings: Settings, contract: Contract, err: TextIO) -> int:
    """Create a Kafka-sourced topic on its broker with the contract's partition count."""
    client = kafka.client(settings, contract)
    created = kafka.create_topic(client, contract.partitions)
    kafka.check_topic(client, contract)
    state = "created" if created else "already exists"
    print(
        f"Kafka topic {client.topic} at {client.bootstrap_servers}: {state}, "
        f"{contract.partitions} partition(s)",
        file=err,
    )
    return 0
