"""Silver streams end to end: bronze -> silver with quarantine, incremental reads, schema
evolution through the registry, and the shipped Avro topic."""

from __future__ import annotations

import json
from pathlib import Path
from textwrap import dedent
from typing import Any

import pytest
from deltalake import DeltaTable

from lakehouse.contracts.catalog import Catalog
from lakehouse.errors import SchemaEvolutionError
from lakehouse.runtime.config import Settings
from lakehouse.storage import read_arrow
from lakehouse.storage.log import commit_metadata
from lakehouse.streams.registry import SchemaRegistry
from lakes import lake_with, produce, run_pipeline

pytestmark = pytest.mark.integration

CONTRACT = dedent(
    """\
    topic: orders
    partitions: 2
    key: {format: string, name: order_id}
    value:
      format: json
      fields:
        - {name: customer, type: string, nullable: false}
        - {name: amount, type: long}
    stream: {name: orders_stream}
    """
)


@pytest.fixture
def lake(tmp_path: Path) -> Settings:
    return lake_with(tmp_path, CONTRACT)


def _produce(lake: Settings, values: list[bytes | None], start: int = 0) -> None:
    """Orders of these values (as they are), keyed o<start>, o<start + 1>, ..."""
    produce(lake, "orders", [(f"o{start + i}", v) for i, v in enumerate(values)], partition=None)


def _input_versions(path: Path) -> list[list[int]]:
    return [
        commit_metadata(c, "lakehouse.source")["versions"]
        for c in reversed(DeltaTable(str(path)).history())
        if commit_metadata(c, "lakehouse.source") is not None
    ]


def test_ten_thousand_bad_among_ninety_thousand_good(spark: Any, lake: Settings) -> None:
    kinds = [
        (b"{broken", "value is not valid JSON"),
        (
            b'{"customer": "c", "amount": "12"}',
            "field 'amount' should be a long, found a JSON string",
        ),
        (b'{"amount": 5}', "required field 'customer' is missing or null"),
        (b"[]", "value is a JSON array, not an object"),
        (b'{"customer": 7}', "field 'customer' should be a string, found a JSON bigint"),
    ]
    values: list[bytes | None] = []
    for i in range(100_000):
        if i % 10 == 9:
            values.append(kinds[(i // 10) % len(kinds)][0])
        else:
            values.append(json.dumps({"customer": f"c{i % 97}", "amount": i}).encode())
    _produce(lake, values)
    run_pipeline(spark, lake, ("bronze", "silver"))

    silver = read_arrow(lake.silver_path("orders_stream"))
    bad = read_arrow(lake.quarantine_path("silver", "orders_stream"))
    assert (silver.num_rows, bad.num_rows) == (90_000, 10_000)
    reasons: dict[str, int] = {}
    for r in bad.column("reason").to_pylist():
        reasons[r] = reasons.get(r, 0) + 1
    assert reasons == {text: 2_000 for _, text in kinds}
    # good + quarantined == input, each record exactly once
    keys = silver.column("order_id").to_pylist() + [
        k.decode() for k in bad.column("key").to_pylist()
    ]
    assert sorted(keys) == sorted(f"o{i}" for i in range(100_000))
    assert sum(silver.column("amount").to_pylist()) == sum(i for i in range(100_000) if i % 10 != 9)


def test_incremental_runs_read_only_new_bronze_versions(spark: Any, lake: Settings) -> None:
    _produce(lake, [b'{"customer": "a", "amount": 1}'] * 3)
    run_pipeline(spark, lake, ("bronze", "silver"))
    bronze_v1 = DeltaTable(str(lake.bronze_path("orders"))).version()
    _produce(lake, [b'{"customer": "b", "amount": 2}'] * 2, start=3)
    run_pipeline(spark, lake, ("bronze",))
    _produce(lake, [b'{"customer": "c", "amount": 3}'], start=5)
    run_pipeline(spark, lake, ("bronze",))
    bronze_v3 = DeltaTable(str(lake.bronze_path("orders"))).version()
    lines = run_pipeline(spark, lake, ("silver",))
    assert f"bronze versions {bronze_v1 + 1}..{bronze_v3} committed: 3 records" in lines[0]
    silver = lake.silver_path("orders_stream")
    assert _input_versions(silver) == [[0, bronze_v1], [bronze_v1 + 1, bronze_v3]]
    assert sorted(read_arrow(silver).column("customer").to_pylist()) == ["a"] * 3 + ["b"] * 2 + [
        "c"
    ]
    assert "no new versions" in run_pipeline(spark, lake, ("silver",))[0]


def test_a_crash_between_quarantine_and_stream_then_new_bronze_quarantines_once(
    spark: Any, lake: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A silver job that died after its quarantine's commit and before the stream's, rerun
    after bronze moved on (found by tests/reliability's kill -9): the rerun's batch covers more
    bronze versions than the commit that survived, yet each bad record is quarantined once."""
    from lakehouse.storage import delta_spark

    silver = lake.silver_path("orders_stream")
    _produce(lake, [b'{"customer": "a", "amount": 1}', b"{broken"])
    run_pipeline(spark, lake, ("bronze",))
    append = delta_spark.append

    def dies_before_the_stream(df: Any, path: Path, **kwargs: Any) -> Any:
        if path == silver:
            raise RuntimeError("killed")
        return append(df, path, **kwargs)

    monkeypatch.setattr(delta_spark, "append", dies_before_the_stream)
    with pytest.raises(RuntimeError, match="killed"):
        run_pipeline(spark, lake, ("silver",))
    monkeypatch.undo()
    quarantine = lake.quarantine_path("silver", "orders_stream")
    assert read_arrow(quarantine).num_rows == 1 and not (silver / "_delta_log").exists()

    _produce(lake, [b"{broken again", b'{"customer": "b", "amount": 2}'], start=2)
    run_pipeline(spark, lake, ("bronze", "silver"))
    bad = read_arrow(quarantine).to_pylist()
    assert sorted(r["value"] for r in bad) == [b"{broken", b"{broken again"]
    assert sorted(read_arrow(silver).column("customer").to_pylist()) == ["a", "b"]


def test_an_added_optional_field_adds_a_column_without_rewriting_history(
    spark: Any, lake: Settings
) -> None:
    _produce(lake, [b'{"customer": "a", "amount": 1}'] * 2)
    run_pipeline(spark, lake, ("bronze", "silver"))
    silver = lake.silver_path("orders_stream")
    files_before = set(DeltaTable(str(silver)).file_uris())

    contract = lake.contracts_dir / "orders.yaml"
    contract.write_text(
        CONTRACT.replace(
            "{name: amount, type: long}",
            "{name: amount, type: long}\n    - {name: coupon, type: string}",
        )
    )
    _produce(lake, [b'{"customer": "b", "amount": 2, "coupon": "X1"}'], start=2)
    run_pipeline(spark, lake, ("bronze", "silver"))

    table = read_arrow(silver).to_pylist()
    assert sorted((r["customer"], r["coupon"]) for r in table) == [
        ("a", None),
        ("a", None),
        ("b", "X1"),
    ]
    dt = DeltaTable(str(silver))
    assert files_before <= set(dt.file_uris())  # the old files are still the old rows
    operations = [c["operation"] for c in dt.history()]
    assert "DELETE" not in operations and "MERGE" not in operations
    registered = SchemaRegistry(lake).versions("orders", "value")[1]
    assert registered.version == 2
    assert registered.state.columns == {"customer": "string", "amount": "long", "coupon": "string"}
    assert "coupon" in registered.contract_text

    # A field dropped later stays as a column (null from then on); history keeps its values.
    contract.write_text(
        CONTRACT.replace(
            "    - {name: amount, type: long}\n", "    - {name: coupon, type: string}\n"
        )
    )
    _produce(lake, [b'{"customer": "c", "coupon": "Y"}'], start=3)
    run_pipeline(spark, lake, ("bronze", "silver"))
    rows = {r["customer"]: r for r in read_arrow(silver).to_pylist()}
    assert (rows["b"]["amount"], rows["c"]["amount"], rows["c"]["coupon"]) == (2, None, "Y")


def test_a_breaking_contract_is_refused_before_any_data_moves(spark: Any, lake: Settings) -> None:
    _produce(lake, [b'{"customer": "a", "amount": 1}'])
    run_pipeline(spark, lake, ("bronze", "silver"))
    versions = {
        p: DeltaTable(str(p)).version()
        for p in (lake.bronze_path("orders"), lake.silver_path("orders_stream"))
    }
    contract = lake.contracts_dir / "orders.yaml"
    contract.write_text(
        CONTRACT.replace(
            "{name: amount, type: long}",
            "{name: amount, type: long}\n    - {name: region, type: string, nullable: false}",
        )
    )
    _produce(lake, [b'{"customer": "b", "amount": 2, "region": "eu"}'], start=1)
    with pytest.raises(SchemaEvolutionError) as info:
        run_pipeline(spark, lake, ("bronze", "silver"))
    assert info.value.file == str(contract)
    assert "region" in info.value.problem and "BACKWARD" in info.value.problem
    assert {p: DeltaTable(str(p)).version() for p in versions} == versions


def test_shipped_avro_topic_through_silver_and_gold(spark: Any, settings: Settings) -> None:
    from lakehouse.topics import samples

    contract = Catalog.load(settings.contracts_dir).topic("user-profiles")
    samples.produce_seed(settings, contract)
    run_pipeline(spark, settings, topics=["user-profiles"])
    silver = read_arrow(settings.silver_path("user_profile_changes")).to_pylist()
    assert len(silver) == len(samples.SAMPLE_PROFILES)
    assert not settings.quarantine_path("silver", "user_profile_changes").exists()
    old = [
        r for r in silver if r["username"] == "bob" and r["email"] is None and not r["tombstone"]
    ]
    assert len(old) == 2  # written with schema id 1 (no email) and with id 2 (email null)
    latest = {r["username"]: r for r in read_arrow(settings.gold_path("user_profiles")).to_pylist()}
    assert sorted(latest) == ["alice", "bob"]  # carol's account was deleted (tombstone)
    assert (latest["alice"]["city"], latest["alice"]["email"]) == ("Berlin", "alice@example.org")
    updates = {
        r["username"]: r for r in read_arrow(settings.gold_path("user_profile_updates")).to_pylist()
    }
    assert (
        updates["alice"]["updates"],
        updates["alice"]["min_age"],
        updates["alice"]["max_age"],
    ) == (2, 34, 35)
    assert updates["carol"]["updates"] == 1  # the tombstone is not an update
    cities = read_arrow(settings.gold_path("users_per_city")).to_pylist()
    assert sorted((r["city"], r["users"], r["average_age"]) for r in cities) == [
        ("Berlin", 1, 35.0),
        ("Lima", 1, 27.0),
    ]
    # The README's question, as `make demo` asks it: where each user lived at 22:16.
    from datetime import UTC, datetime

    from lakehouse.tables.history import valid_at

    history = read_arrow(settings.gold_path("user_city_history"))
    then = valid_at(history, datetime(2023, 11, 14, 22, 16, tzinfo=UTC)).to_pylist()
    assert sorted((r["username"], r["city"]) for r in then) == [
        ("alice", "Paris"),
        ("bob", "Sydney"),
        ("carol", None),
    ]
    # A move starts a version; carol's tombstone ended hers at 22:18:20.
    ends = {(r["username"], r["city"]): r["valid_to"] for r in history.to_pylist()}
    assert ends[("alice", "Paris")] == datetime(2023, 11, 14, 22, 16, 20, tzinfo=UTC)
    assert ends[("carol", None)] == datetime(2023, 11, 14, 22, 18, 20, tzinfo=UTC)
    assert ends[("alice", "Berlin")] is None
