"""History tables (``kind: history``): each key's versions with ``valid_from``, ``valid_to`` and
``is_current``, built incrementally: out-of-order records placed into a key's past, tombstones
closing the current version, same-time records replaced by the later one, tracked fields,
a sequence field, the history retention sending records to the late table, the changelog, a
rebuild that equals the incremental build, and the versions valid at a time."""

from __future__ import annotations

import io
import json
from contextlib import redirect_stdout
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from lakehouse import cli
from lakehouse.contracts.catalog import Catalog
from lakehouse.errors import LakehouseError
from lakehouse.pipeline import reads
from lakehouse.runtime.config import Settings
from lakehouse.storage import changes_arrow, read_arrow
from lakes import lake_with, produce, record, run_pipeline

pytestmark = pytest.mark.integration

PROFILES = """\
topic: profiles
partitions: 2
key: {format: string, name: user}
value:
  format: json
  fields:
    - {name: city, type: string}
    - {name: plan, type: string}
    - {name: seq, type: long}
    - {name: at, type: timestamp}
event_time: at
stream: {name: profile_changes}
tables:
  - name: profile_history
    kind: history
  - name: city_history
    kind: history
    track: [city]
  - name: seq_history
    kind: history
    sequence_by: seq
  - name: recent_history
    kind: history
    history_retention: 10s
  - name: profile_latest
    kind: latest
"""


def _at(s: int) -> str:
    return datetime.fromtimestamp(s, tz=UTC).isoformat()


def _ts(s: int | None) -> datetime | None:
    return None if s is None else datetime.fromtimestamp(s, tz=UTC)


def _send(lake: Settings, events: list[tuple[str, dict[str, Any] | None, int]], p: int = 0) -> None:
    """Records (key, value, event time in s) to partition ``p``, in that order; a tombstone's
    time is its record timestamp."""
    produce(
        lake,
        "profiles",
        [
            record(
                k, None if v is None else {**v, "at": _at(t)}, partition=p, timestamp_ms=t * 1000
            )
            for k, v, t in events
        ],
    )


def _versions(lake: Settings, table: str) -> list[tuple[Any, ...]]:
    rows = read_arrow(lake.gold_path(table)).to_pylist()
    return sorted(
        (r["user"], r["city"], r["plan"], r["valid_from"], r["valid_to"], r["is_current"])
        for r in rows
    )


def _show(lake: Settings, *args: str) -> list[dict[str, Any]]:
    """``lakehouse show ... --format json``: its rows."""
    out = io.StringIO()
    home = ["--home", str(lake.home), "--contracts", str(lake.contracts_dir)]
    with redirect_stdout(out):
        assert cli.main([*home, "show", *args, "--format", "json"]) == 0
    return [json.loads(line) for line in out.getvalue().splitlines()]


@pytest.fixture
def lake(tmp_path: Path) -> Settings:
    return lake_with(tmp_path, PROFILES)


def test_versions_take_their_place_by_time_whatever_the_arrival(spark: Any, lake: Settings) -> None:
    """alice moves Paris (t=10), Rome (t=30); then a record of t=20 arrives late (Oslo): it
    splits Paris's interval. A tombstone at t=40 closes Rome; Lima at t=50 starts a new current
    version. A record of bob at t=5 with the same time as an earlier one replaces it."""
    _send(lake, [("alice", {"city": "Paris", "plan": "free", "seq": 1}, 10)])
    _send(lake, [("alice", {"city": "Rome", "plan": "free", "seq": 3}, 30)])
    _send(lake, [("bob", {"city": "Lima", "plan": "free", "seq": 1}, 5)], p=1)
    run_pipeline(spark, lake)
    assert _versions(lake, "profile_history") == [
        ("alice", "Paris", "free", _ts(10), _ts(30), False),
        ("alice", "Rome", "free", _ts(30), None, True),
        ("bob", "Lima", "free", _ts(5), None, True),
    ]
    _send(lake, [("alice", {"city": "Oslo", "plan": "paid", "seq": 2}, 20)])
    _send(lake, [("alice", None, 40)])
    _send(lake, [("bob", {"city": "Quito", "plan": "free", "seq": 1}, 5)], p=1)
    run_pipeline(spark, lake)
    _send(lake, [("alice", {"city": "Lima", "plan": "paid", "seq": 5}, 50)])
    run_pipeline(spark, lake)
    assert _versions(lake, "profile_history") == [
        ("alice", "Lima", "paid", _ts(50), None, True),
        ("alice", "Oslo", "paid", _ts(20), _ts(30), False),
        ("alice", "Paris", "free", _ts(10), _ts(20), False),
        ("alice", "Rome", "free", _ts(30), _ts(40), False),
        ("bob", "Quito", "free", _ts(5), None, True),
    ]
    # The changelog: Paris's interval updated in place when Oslo took its place.
    changes = changes_arrow(lake.gold_path("profile_history")).to_pylist()
    moved = [c for c in changes if c["city"] == "Paris" and c["_change_type"] == "update_postimage"]
    assert [c["valid_to"] for c in moved] == [_ts(20)]
    # Each key's version at an event time, as `lakehouse show --as-of-event-time` prints it:
    # alice in Oslo at 25 (the late record's place), nowhere at 45 (deleted at 40).
    at_25 = _show(lake, "profile_history", "--as-of-event-time", _at(25))
    assert sorted((r["user"], r["city"]) for r in at_25) == [("alice", "Oslo"), ("bob", "Quito")]
    at_45 = _show(lake, "gold.profile_history", "--as-of-event-time", _at(45))
    assert [(r["user"], r["city"]) for r in at_45] == [("bob", "Quito")]
    assert _show(lake, "profile_history", "--as-of-event-time", _at(4)) == []
    # A table that keeps no versions says so (and where to look instead).
    with pytest.raises(LakehouseError, match=r"keeps no versions.*--at-event-time"):
        reads.show(
            lake,
            Catalog.load(lake.contracts_dir),
            "profile_latest",
            "json",
            None,
            None,
            None,
            _at(25),
        )


def test_tracked_fields_make_versions_the_others_update_in_place(
    spark: Any, lake: Settings
) -> None:
    _send(lake, [("alice", {"city": "Paris", "plan": "free", "seq": 1}, 10)])
    _send(lake, [("alice", {"city": "Paris", "plan": "paid", "seq": 2}, 20)])
    _send(lake, [("alice", {"city": "Rome", "plan": "paid", "seq": 3}, 30)])
    run_pipeline(spark, lake)
    assert _versions(lake, "city_history") == [
        ("alice", "Paris", "paid", _ts(10), _ts(30), False),
        ("alice", "Rome", "paid", _ts(30), None, True),
    ]


def test_a_sequence_field_orders_and_bounds_the_versions(spark: Any, lake: Settings) -> None:
    """The sequence field, not the event time: seq 2 arrives after seq 3 and goes before it."""
    _send(lake, [("alice", {"city": "Paris", "plan": "free", "seq": 1}, 10)])
    _send(lake, [("alice", {"city": "Rome", "plan": "free", "seq": 3}, 11)])
    _send(lake, [("alice", {"city": "Oslo", "plan": "free", "seq": 2}, 12)])
    run_pipeline(spark, lake)
    assert _versions(lake, "seq_history") == [
        ("alice", "Oslo", "free", 2, 3, False),
        ("alice", "Paris", "free", 1, 2, False),
        ("alice", "Rome", "free", 3, None, True),
    ]
    at_2 = _show(lake, "seq_history", "--as-of-event-time", "2")
    assert [(r["city"], r["valid_from"]) for r in at_2] == [("Oslo", 2)]
    with pytest.raises(LakehouseError, match="give a whole number"):
        reads.show(
            lake, Catalog.load(lake.contracts_dir), "seq_history", "json", None, None, None, _at(2)
        )


def test_a_record_older_than_the_retention_goes_to_the_late_table(
    spark: Any, lake: Settings
) -> None:
    """Retention 10 s: with partition 0 at stream time 100, a record of t=85 is late there,
    while partition 1, at stream time 50, still places a record of t=45."""
    _send(lake, [("alice", {"city": "Paris", "plan": "free", "seq": 1}, 100)])
    _send(lake, [("bob", {"city": "Lima", "plan": "free", "seq": 1}, 50)], p=1)
    run_pipeline(spark, lake)
    _send(lake, [("alice", {"city": "Rome", "plan": "free", "seq": 2}, 85)])
    _send(lake, [("bob", {"city": "Quito", "plan": "free", "seq": 2}, 45)], p=1)
    _send(lake, [("carol", {"city": "Oslo", "plan": "free", "seq": 1}, 95)])
    run_pipeline(spark, lake)
    assert _versions(lake, "recent_history") == [
        ("alice", "Paris", "free", _ts(100), None, True),
        ("bob", "Lima", "free", _ts(50), None, True),
        ("bob", "Quito", "free", _ts(45), _ts(50), False),
        ("carol", "Oslo", "free", _ts(95), None, True),
    ]
    (late,) = read_arrow(lake.late_path("recent_history")).to_pylist()
    assert late["user"] == "alice" and late["city"] == "Rome"
    assert late["stream_time"] == _ts(100)
    assert late["reason"].startswith(
        "older than its partition's stream time minus the history retention 10s"
    )


def test_a_refresh_equals_the_incremental_build(spark: Any, lake: Settings) -> None:
    from lakehouse.tables.rebuild import refresh

    _send(lake, [("alice", {"city": "Paris", "plan": "free", "seq": 1}, 10)])
    run_pipeline(spark, lake)
    _send(lake, [("alice", {"city": "Oslo", "plan": "paid", "seq": 2}, 5)])
    _send(lake, [("alice", None, 40)])
    run_pipeline(spark, lake)
    built = _versions(lake, "profile_history")
    catalog = Catalog.load(lake.contracts_dir)
    contract = catalog.topic("profiles")
    refresh(spark, lake, catalog, contract, contract.table("profile_history"))
    assert _versions(lake, "profile_history") == built
    assert built == [
        ("alice", "Oslo", "paid", _ts(5), _ts(10), False),
        ("alice", "Paris", "free", _ts(10), _ts(40), False),
    ]


VISITS = """\
topic: visits
partitions: 1
key: {format: string, name: user}
value:
  format: json
  fields:
    - {name: shop, type: string}
    - {name: at, type: timestamp}
event_time: at
stream: {name: visit_events}
tables:
  - name: visits_where
    kind: join
    join: {type: stream-table, with: profiles, table: profile_history, how: left, fields: [city]}
"""


def test_a_stream_table_join_takes_the_version_valid_at_each_event(
    tmp_path: Path, spark: Any
) -> None:
    """Each visit joins alice's version valid at its event time in ``profile_history``; a
    profile change that arrives late is found by the visits joined after it took its place and
    rewrites no visit joined before."""
    lake = lake_with(tmp_path, PROFILES, VISITS)

    def visit(shop: str, t: int, user: str | None = "alice") -> None:
        produce(lake, "visits", [record(user, {"shop": shop, "at": _at(t)}, partition=0)])

    _send(lake, [("alice", {"city": "Paris", "plan": "free", "seq": 1}, 10)])
    _send(lake, [("alice", {"city": "Rome", "plan": "free", "seq": 2}, 30)])
    for shop, t in (("before", 5), ("paris", 22), ("rome", 35)):
        visit(shop, t)
    visit("nobody's", 22, user="bob")
    # One run of every topic: it builds profiles' tables before the join that reads one (else
    # "paris" and "rome" would find no version: the history table would not exist yet).
    run_pipeline(spark, lake)
    _send(lake, [("alice", {"city": "Oslo", "plan": "free", "seq": 3}, 20)])  # late: [20, 30)
    visit("oslo", 23)
    run_pipeline(spark, lake)
    got = sorted(
        (r["shop"], r["city"]) for r in read_arrow(lake.gold_path("visits_where")).to_pylist()
    )
    assert got == [
        ("before", None),
        ("nobody's", None),
        ("oslo", "Oslo"),  # joined after Oslo took its place
        ("paris", "Paris"),  # joined before: not rewritten
        ("rome", "Rome"),
    ]


def test_the_pure_parts_on_a_few_rows(spark: Any, tmp_path: Path) -> None:
    """``versions`` turns a key's timeline into intervals (a tombstone ends one and starts none;
    with ``track``, a run of equal tracked fields is one version with its last record's other
    fields), and ``changed_rows`` keeps only what the table must change."""
    from lakehouse.tables import history

    lake = lake_with(tmp_path, PROFILES)
    contract = Catalog.load(lake.contracts_dir).topic("profiles")
    every, by_city = contract.table("profile_history"), contract.table("city_history")

    def entry(user: str, city: str | None, plan: str | None, t: int, dead: bool = False) -> tuple:
        return (user, city, plan, None, None, dead, t, (0, 0, t))

    timeline = spark.createDataFrame(
        [
            entry("alice", "Paris", "free", 10),
            entry("alice", "Paris", "paid", 20),
            entry("alice", None, None, 30, dead=True),
            entry("alice", "Rome", "paid", 40),
        ],
        history.state_schema(contract),
    )

    def rows(df: Any) -> list[tuple[Any, ...]]:
        return sorted(
            (r["city"], r["plan"], r["valid_from"], r["valid_to"], r["is_current"])
            for r in df.collect()
        )

    def at(ms: int | None) -> datetime | None:
        return (
            None if ms is None else datetime.fromtimestamp(ms / 1000, tz=UTC).replace(tzinfo=None)
        )

    versions = history.versions(timeline, contract, every)
    assert rows(versions) == [
        ("Paris", "free", at(10), at(20), False),
        ("Paris", "paid", at(20), at(30), False),
        ("Rome", "paid", at(40), None, True),
    ]
    assert rows(history.versions(timeline, contract, by_city)) == [
        ("Paris", "paid", at(10), at(30), False),
        ("Rome", "paid", at(40), None, True),
    ]
    # Against what is stored: an unchanged row is left out, a moved one is upserted, a new
    # one too, and a stored version that is gone is deleted.
    stored = spark.createDataFrame(
        [
            ("alice", "Rome", "paid", None, None, at(40), None, True),  # unchanged
            ("alice", "Paris", "free", None, None, at(10), at(25), False),  # moved end
            ("alice", "Lima", "free", None, None, at(5), at(10), False),  # gone
        ],
        history.table_schema(contract, every),
    )
    changes = history.changed_rows(versions, stored, "user")
    assert sorted((r["city"], r["plan"], r["__op"]) for r in changes.collect()) == [
        ("Lima", "free", "delete"),
        ("Paris", "free", "upsert"),
        ("Paris", "paid", "upsert"),
    ]
