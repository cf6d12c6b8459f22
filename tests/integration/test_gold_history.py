"""More aggregations (count_distinct, earliest, latest, collect), a table read back as a stream
(its changelog), and rebuilding tables: full refresh, reprocess from a source version, restore
from the changelog, and the table as of an event time."""

from __future__ import annotations

import itertools
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from lakehouse.contracts.model import Catalog
from lakehouse.pipeline.runner import run
from lakehouse.runtime.config import Settings
from lakehouse.storage import changes_arrow, read_arrow
from lakehouse.tables.rebuild import at_event_time, refresh, restore
from lakehouse.topics.landing import Producer, Record
from lakes import histories, lake_with

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

Event = tuple[str | None, dict[str, Any] | None]


def _lake(root: Path) -> Settings:
    return lake_with(root, {"trips": CONTRACT})


def _catalog(lake: Settings) -> Catalog:
    return Catalog.load(lake.contracts_dir)


def _produce(lake: Settings, events: list[Event]) -> None:
    Producer(lake, "trips", 1).send_batch(
        Record(
            None if k is None else k.encode(),
            None if v is None else json.dumps(v).encode(),
            partition=0,
        )
        for k, v in events
    )


def _run(spark: Any, lake: Settings) -> None:
    run(spark, lake, _catalog(lake), echo=lambda _line: None)


def _rows(path: Path, key: str, version: int | None = None) -> dict[Any, dict[str, Any]]:
    rows = read_arrow(path, version).to_pylist()
    return {
        r[key]: {c: v for c, v in r.items() if c != key and not c.startswith("__")} for r in rows
    }


def _trip(city: str | None, km: int | None = 1, at: int = 0) -> dict[str, Any]:
    return {"city": city, "km": km, "at": at}


def _model(history: list[Event]) -> dict[str, dict[Any, dict[str, Any]]]:
    """Kafka Streams / ksqlDB semantics written plainly (one partition: arrival = offset)."""
    per_user: dict[str, dict[str, Any]] = {}
    current: dict[str, dict[str, Any]] = {}
    for key, value in history:
        if key is None:
            continue
        if value is None:
            current.pop(key, None)
            continue
        current[key] = value
        row = per_user.setdefault(key, {"trips": 0, "seen": set(), "trail": [], "km": None})
        row["trips"] += 1
        if value["city"] is not None:
            row["seen"].add(value["city"])
            row["trail"].append(value["city"])
        if value["km"] is not None:
            row["km"] = (row["km"] or 0) + value["km"]
    living: dict[str, int] = {}
    for value in current.values():
        if value["city"] is not None:
            living[value["city"]] = living.get(value["city"], 0) + 1
    return {
        "per_user": {
            k: {
                "trips": r["trips"],
                "cities": len(r["seen"]),
                "first_city": r["trail"][0] if r["trail"] else None,
                "last_city": r["trail"][-1] if r["trail"] else None,
                "trail": r["trail"],
                "km": r["km"],
            }
            for k, r in per_user.items()
        },
        "current": current,
        "current_again": current,
        "living_in": {c: {"users": n} for c, n in living.items()},
    }


KEY_OF = {"per_user": "user", "current": "user", "current_again": "user", "living_in": "city"}

KEYS = st.sampled_from(["a", "b", None])
VALUES = st.one_of(
    st.none(),
    st.builds(
        _trip,
        st.one_of(st.none(), st.sampled_from(["Oslo", "Rome", "Lima"])),
        st.one_of(st.none(), st.integers(0, 9)),
    ),
)


# A city seen twice, nulls between, a delete and a comeback, a group emptied.
COMEBACK: list[Event] = [
    ("a", _trip("Oslo")),
    ("a", _trip(None, None)),
    ("b", _trip("Rome")),
    ("a", _trip("Rome")),
    ("b", None),
    ("a", _trip("Oslo", 4)),
    ("a", None),
    ("a", _trip("Lima")),
]


@pytest.mark.property
@histories()
@given(
    history=st.lists(st.tuples(KEYS, VALUES), min_size=1, max_size=9),
    cuts=st.lists(st.integers(1, 8), max_size=2, unique=True),
)
@example(history=COMEBACK, cuts=[2, 5])
@example(history=COMEBACK, cuts=[])  # one batch: a full recompute
def test_every_batching_of_a_history_equals_the_model(
    spark: Any, tmp_path_factory: pytest.TempPathFactory, history: list[Event], cuts: list[int]
) -> None:
    """Micro-batches cut anywhere (no cut: one batch) end in the tables the model computes."""
    lake = _lake(tmp_path_factory.mktemp("hist"))
    bounds = [0, *sorted(c for c in cuts if c < len(history)), len(history)]
    for lo, hi in itertools.pairwise(bounds):
        _produce(lake, history[lo:hi])
        _run(spark, lake)
    expected = _model(history)
    for name, key in KEY_OF.items():
        assert _rows(lake.gold_path(name), key) == expected[name], (name, bounds)


def test_changelog_read_as_stream_counts_each_version_of_a_row(spark: Any, tmp_path: Path) -> None:
    lake = _lake(tmp_path)
    _produce(lake, [("a", _trip("Oslo")), ("b", _trip("Rome"))])
    _run(spark, lake)
    _produce(lake, [("a", _trip("Lima"))])
    _run(spark, lake)
    _produce(lake, [("b", None), ("a", _trip("Oslo"))])
    _run(spark, lake)
    # current's changelog: a inserted, updated twice; b inserted then deleted (a tombstone,
    # which an aggregation ignores, as Kafka Streams does).
    assert _rows(lake.gold_path("moves"), "user") == {"a": {"versions": 3}, "b": {"versions": 1}}
    assert _rows(lake.gold_path("current_again"), "user") == {"a": _trip("Oslo")}


def test_table_group_left_by_its_last_key_is_deleted(spark: Any, tmp_path: Path) -> None:
    lake = _lake(tmp_path)
    _produce(lake, [("a", _trip("Oslo")), ("b", _trip("Rome"))])
    _run(spark, lake)
    _produce(lake, [("a", _trip("Rome"))])
    _run(spark, lake)
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
    lake = _lake(tmp_path_factory.mktemp("built"))
    versions = []
    for batch in BATCHES:
        _produce(lake, batch)
        _run(spark, lake)
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
    _run(spark, lake)  # and the next micro-batch finds nothing new
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
    _run(spark, lake)  # the next micro-batch re-reads from there
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
