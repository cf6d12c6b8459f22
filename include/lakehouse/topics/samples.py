"""Sample data for the shipped example topics.

``user-locations`` (JSON values) carries the seed's check-ins; ``user-profiles`` (Avro values in
the Confluent wire format) carries users' profiles, written partly by an older producer with
schema id 1 and partly with id 2, which added an optional e-mail address, so every run exercises
schema resolution of older records.
"""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from lakehouse.contracts.model import Contract
from lakehouse.contracts.serde import Serializer
from lakehouse.runtime.config import Settings
from lakehouse.topics.landing import (
    CITIES,
    Producer,
    Record,
    generate_user_locations,
    list_segments,
)

BASE_MS = 1_700_000_000_000

# The seed's example: a stream of (username, location) events.
SAMPLE_EVENTS = [
    ("alice", "Paris"),
    ("bob", "Sydney"),
    ("alice", "Rome"),
    ("bob", "Lima"),
    ("alice", "Berlin"),
]

# (username, schema id, profile or None for a deleted account)
SAMPLE_PROFILES: list[tuple[str, int, dict[str, Any] | None]] = [
    ("alice", 1, {"name": "Alice", "city": "Paris", "age": 34}),
    ("bob", 1, {"name": "Bob", "city": "Sydney", "age": 27}),
    ("carol", 1, {"name": "Carol", "city": None, "age": None}),
    ("alice", 2, {"name": "Alice", "city": "Berlin", "age": 35, "email": "alice@example.org"}),
    ("bob", 2, {"name": "Bob", "city": "Lima", "age": 27, "email": None}),
    ("carol", 2, None),
]


def seed_records(contract: Contract, settings: Settings | None = None) -> list[Record]:
    """The fixed, small sample of a shipped topic, as records (``settings``: where a schema
    registry may run, for a topic written through one)."""
    if contract.topic == "user-locations":
        return [
            Record(
                key=user.encode(),
                value=json.dumps({"location": place}, separators=(",", ":")).encode(),
                timestamp_ms=BASE_MS + 60_000 * i,
            )
            for i, (user, place) in enumerate(SAMPLE_EVENTS)
        ]
    if contract.topic == "user-profiles":
        serializers = profile_serializers(settings or Settings.from_env(), contract)
        out = []
        for i, (user, schema_id, profile) in enumerate(SAMPLE_PROFILES):
            ts = BASE_MS + 60_000 * i
            value = None if profile is None else {**profile, "updated_at": ts}
            origin = f"sample profile {i}"
            out.append(
                Record(
                    key=user.encode(),
                    value=serializers[schema_id].value(value, origin),
                    timestamp_ms=ts,
                )
            )
        return out
    raise KeyError(contract.topic)


SAMPLE_TOPICS = ("user-locations", "user-profiles")


def profile_serializers(settings: Settings, contract: Contract) -> dict[int, Serializer]:
    """The serializers of the profiles an older producer writes (the contract's first schema)
    and a newer one (its second), by the ids the contract lists: through the schema registry
    when the contract names one and one is given or runs (Confluent's ``AvroSerializer``
    registers each schema under the topic's subject, and the registry gives the ids), else
    framed with the listed ids."""
    from lakehouse.contracts import confluent

    listed = [v for v in contract.value_schemas if v.id is not None]
    source = contract.value_registry
    if source is None or not confluent.registry_given(contract, settings, source):
        plain = replace(contract, value_registry=None)
        return {v.id: Serializer(plain, value_schema_id=v.id) for v in listed if v.id}
    unlisted = replace(contract, value_registry=replace(source, listed=False))
    return {
        v.id: Serializer(replace(unlisted, value_schemas=(replace(v, id=None),)))
        for v in listed
        if v.id
    }


def produce_seed(settings: Settings, contract: Contract) -> int:
    """Produce the topic's fixed sample once, into an empty topic; return the records written."""
    if list_segments(settings, contract.topic):
        return 0
    records = seed_records(contract, settings)
    Producer(settings, contract.topic, contract.partitions).send_batch(records)
    return len(records)


def generate(
    settings: Settings, contract: Contract, records: int, *, value_bytes: int = 0, seed: int = 0
) -> int:
    """Produce ``records`` random records to a shipped topic; return how many were written."""
    if contract.topic == "user-locations":
        return generate_user_locations(
            settings,
            contract.topic,
            contract.partitions,
            records,
            value_bytes=value_bytes,
            seed=seed,
        )
    if contract.topic == "user-profiles":
        return generate_user_profiles(settings, contract, records, seed=seed)
    raise KeyError(contract.topic)


def generate_user_profiles(
    settings: Settings, contract: Contract, records: int, *, seed: int = 0, chunk: int = 100_000
) -> int:
    """Random profile changes, alternately encoded with schema ids 1 and 2 (about one in 50 a
    tombstone). Encoding is per record (fastavro), so this takes a few seconds per million."""
    import random

    rng = random.Random(seed)
    serializers = profile_serializers(settings, contract)
    producer = Producer(settings, contract.topic, contract.partitions)
    users = max(100, min(100_000, records // 10))
    start = datetime.fromtimestamp(BASE_MS / 1000, tz=UTC)
    written = 0
    while written < records:
        batch: list[Record] = []
        for n in range(written, min(records, written + chunk)):
            user = f"user-{rng.randrange(users):06d}"
            ts = start + timedelta(milliseconds=10 * n)
            schema_id = 1 + (n & 1)
            value: dict[str, Any] | None = None
            if rng.random() >= 0.02:
                value = {
                    "name": user.replace("-", " ").title(),
                    "city": rng.choice(CITIES) if rng.random() < 0.9 else None,
                    "age": rng.randrange(16, 90) if rng.random() < 0.8 else None,
                    "updated_at": ts,
                }
                if schema_id == 2:
                    value["email"] = f"{user}@example.org" if rng.random() < 0.7 else None
            batch.append(
                Record(
                    key=user.encode(),
                    value=serializers[schema_id].value(value, f"generated record {n}"),
                    timestamp_ms=int(ts.timestamp() * 1000),
                )
            )
        producer.send_batch(batch)
        written += len(batch)
    return written
