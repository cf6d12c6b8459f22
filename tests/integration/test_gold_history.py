"""More aggregations (count_distinct, earliest, latest, collect), a table read back as a stream
(its changelog), and rebuilding tables: full refresh, reprocess from an input version, restore
from the changelog, and the table as of an event time."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from lakehouse.contracts.catalog import Catalog
from lakehouse.runtime.config import Settings
from lakehouse.storage import changes_arrow, read_arrow
from lakehouse.tables.rebuild import at_event_time, refresh, restore
from lakes import Event, lake_with, produce, run_pipeline

pytestmark = pytest.mark.integration

CONTRACT = """\
topic: trips
partitions: 1
event_time: at
key: {format: string, name: user}
value:
  format: json
  fields:
    - {name: city, type: string}
    - {name: km, type: long}
    - {name: at, type: long}
stream: {name: trips_stream}
tables:
  - name: per_user
    kind: aggregate
    aggregations:
      - {name: trips, fn: count}
      - {name: cities, fn: count_distinct, field: city}
      - {name: first_city, fn: earliest, field: city}
      - {name: last_city, fn: latest, field: city}
      - {name: trail, fn: collect, field: city}
      - {name: km, fn: sum, field: km}
  - name: current
    kind: latest
  - name: living_in
    kind: aggregate
    source: table
    group_by: city
    aggregations:
      - {name: users, fn: count}
  - name: current_again
    kind: latest
    changelog: current
  - name: moves
    kind: aggregate
    changelog: current
    aggregations:
      - {name: versions, fn: count}
"""


def _catalog(lake: Settings) -> Catalog:
    return Catalog.load(lake.contracts_dir)


def _rows(path: Path, key: str, version: int | None = None) -> dict[Any, dict[str, Any]]:
    rows = read_arrow(path, version).to_pylist()
    return {
        r[key]: {c: v for c, v in r.items() if c != key and not c.startswith("__")} for r in rows
    }


def _trip(city: str | None, km: int | None = 1, at: int = 0) -> dict[str, Any]:
    return {"city": city, "km": km, "at": at}


def test_changelog_read_as_stream_counts_each_version_of_a_row(spark: Any, tmp_path: Path) -> None:
    lake = lake_with(tmp_path, CONTRACT)
    produce(lake, "trips", [("a", _trip("Oslo")), ("b", _trip("Rome"))])
    run_pipeline(spark, lake)
    produce(lake, "trips", [("a", _trip("Lima"))])
    run_pipeline(spark, lake)
    produce(lake, "trips", [("b", None), ("a", _trip("Oslo"))])
    run_pipeline(spark, lake)
    # current's changelog: a inserted, updated twice; b inserted then deleted (a tombstone,
    # which an aggregation ignores, as Kafka Streams does).
    assert _rows(lake.gold_path("moves"), "user") == {"a": {"versions": 3}, "b": {"versions": 1}}
    assert _rows(lake.gold_path("current_again"), "user") == {"a": _trip("Oslo")}


def test_table_group_left_by_its_last_key_is_deleted(spark: Any, tmp_path: Path) -> None:
    lake = lake_with(tmp_path, CONTRACT)
    produce(lake, "trips", [("a", _trip("Oslo")), ("b", _trip("Rome"))])
    run_pipeline(spark, lake)
    produce(lake, "trips", [("a", _trip("Rome"))])
    run_pipeline(spark, lake)
    assert _rows(lake.gold_path("living_in"), "city") == {"Rome": {"users": 2}}
    feed = changes_arrow(lake.gold_path("living_in"), 2).to_pylist()
    assert ("delete", "Oslo") in {(r["_change_type"], r["city"]) for r in feed}


BATCHES: list[list[Event]] = [
    [("a", _trip("Oslo", 2, 100)), ("b", _trip("Rome", 3, 200))],
    [("a", _trip("Lima", 5, 300))],
    [("b", _trip("Oslo", 1, 400)), ("c", _trip("Rome", 7, 500)), ("c", None)],
]


@pytest.fixture(scope="module")
def built(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[Settings, list[int]]:
    """One lake for the rebuild tests, three micro-batches in (the last deletes c); returns it
    with per_user's table version after each batch. Every test leaves the tables as it found
    them."""
    lake = lake_with(tmp_path_factory.mktemp("built"), CONTRACT)
    versions = []
    for batch in BATCHES:
        produce(lake, "trips", batch)
        run_pipeline(spark, lake)
        versions.append(_version(lake.gold_path("per_user")))
    return lake, versions


def _version(path: Path) -> int:
    from deltalake import DeltaTable

    return int(DeltaTable(str(path)).version())


def test_full_refresh_changes_nothing_when_the_table_is_right(
    spark: Any, built: tuple[Settings, list[int]]
) -> None:
    lake, _ = built
    catalog = _catalog(lake)
    contract = catalog.topic("trips")
    before = read_arrow(lake.gold_path("per_user")).sort_by("user")
    version = _version(lake.gold_path("per_user"))
    result = refresh(spark, lake, catalog, contract, contract.table("per_user"))
    assert read_arrow(lake.gold_path("per_user")).sort_by("user").equals(before)
    # Nothing differed, so nothing was committed: the changelog shows no change.
    assert result.table_version == version == _version(lake.gold_path("per_user"))


def test_full_refresh_repairs_a_damaged_table(
    spark: Any, built: tuple[Settings, list[int]]
) -> None:
    from deltalake import DeltaTable

    lake, _ = built
    good = read_arrow(lake.gold_path("living_in")).sort_by("city")
    DeltaTable(str(lake.gold_path("living_in"))).delete("city = 'Oslo'")  # damage
    catalog = _catalog(lake)
    contract = catalog.topic("trips")
    refresh(spark, lake, catalog, contract, contract.table("living_in"))
    assert read_arrow(lake.gold_path("living_in")).sort_by("city").equals(good)
    # The refresh's changelog re-inserts just the lost row.
    feed = changes_arrow(lake.gold_path("living_in"), _version(lake.gold_path("living_in")))
    assert [(r["_change_type"], r["city"]) for r in feed.to_pylist()] == [("insert", "Oslo")]
    run_pipeline(spark, lake)  # and the next micro-batch finds nothing new
    assert read_arrow(lake.gold_path("living_in")).sort_by("city").equals(good)


def test_reprocess_from_a_version_then_catch_up(
    spark: Any, built: tuple[Settings, list[int]]
) -> None:
    from deltalake import DeltaTable

    lake, versions = built
    final = _rows(lake.gold_path("per_user"), "user")
    after_first = _rows(lake.gold_path("per_user"), "user", versions[0])
    catalog = _catalog(lake)
    contract = catalog.topic("trips")
    # The stream version the second batch landed in (one stream commit per batch).
    second_batch = int(DeltaTable(str(lake.silver_path("trips_stream"))).version()) - 1
    refresh(spark, lake, catalog, contract, contract.table("per_user"), from_version=second_batch)
    assert _rows(lake.gold_path("per_user"), "user") == after_first
    run_pipeline(spark, lake)  # the next micro-batch re-reads from there
    assert _rows(lake.gold_path("per_user"), "user") == final


def test_restore_from_changelog_equals_table(
    spark: Any, built: tuple[Settings, list[int]], tmp_path: Path
) -> None:
    lake, _ = built
    contract = _catalog(lake).topic("trips")
    for name, key in (("current", "user"), ("living_in", "city"), ("per_user", "user")):
        target = tmp_path / "restored" / name
        rows = restore(spark, lake, contract, contract.table(name), target)
        original = read_arrow(lake.gold_path(name)).sort_by(key)
        assert rows == original.num_rows
        assert read_arrow(target).sort_by(key).equals(original), name
        # changelog inserts - deletes == rows
        feed = changes_arrow(lake.gold_path(name)).column("_change_type").to_pylist()
        assert feed.count("insert") - feed.count("delete") == original.num_rows


def test_table_at_event_time(spark: Any, built: tuple[Settings, list[int]]) -> None:
    lake, _ = built
    catalog = _catalog(lake)
    contract = catalog.topic("trips")
    when = datetime.fromtimestamp(0.3, tz=UTC)  # the events at 100, 200 and 300 ms happened
    table = at_event_time(spark, lake, catalog, contract, contract.table("current"), when)
    assert {r["user"]: r["city"] for r in table.to_pylist()} == {"a": "Lima", "b": "Rome"}
    table = at_event_time(spark, lake, catalog, contract, contract.table("living_in"), when)
    assert {r["city"]: r["users"] for r in table.to_pylist()} == {"Lima": 1, "Rome": 1}
    # The real tables are untouched.
    assert _rows(lake.gold_path("current"), "user") == {
        "a": _trip("Lima", 5, 300),
        "b": _trip("Oslo", 1, 400),
    }
