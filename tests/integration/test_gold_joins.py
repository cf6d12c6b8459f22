"""Gold joins (Kafka Streams' KStream-KTable with a versioned table, KTable-KTable, and windowed
KStream-KStream), built incrementally in micro-batches with both inputs' positions committed."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from lakehouse.contracts.catalog import Catalog
from lakehouse.runtime.config import Settings
from lakehouse.storage import DeltaStore, changes_arrow, read_arrow
from lakes import histories, lake_with, produce, record, row_order, rows, run_pipeline
from oracle import StreamsOracle, left, right

pytestmark = pytest.mark.integration

USERS = """\
topic: users
partitions: 1
key: {format: string, name: user}
value:
  format: json
  fields:
    - {name: name, type: string}
    - {name: city, type: string}
    - {name: ts, type: long}
event_time: ts
stream: {name: users_stream}
"""

IMPRESSIONS = """\
topic: impressions
partitions: 1
key: {format: string, name: ad}
value:
  format: json
  fields:
    - {name: placement, type: string}
    - {name: ts, type: long}
event_time: ts
stream: {name: impressions_stream}
"""

CLICKS = """\
topic: clicks
partitions: 1
key: {format: string, name: user}
value:
  format: json
  fields:
    - {name: page, type: string}
    - {name: ad, type: string}
    - {name: ts, type: long}
event_time: ts
stream: {name: clicks_stream}
tables:
"""


def _version(lake: Settings, table: str) -> int:
    from deltalake import DeltaTable

    return int(DeltaTable(str(lake.gold_path(table))).version())


def _feed(lake: Settings, table: str, start: int, *columns: str) -> list[tuple[Any, ...]]:
    rows = changes_arrow(lake.gold_path(table), start).to_pylist()
    out = [(r["_change_type"], *(r[c] for c in columns)) for r in rows]
    return sorted(out, key=row_order)


# -- stream-table -------------------------------------------------------------------------------

STREAM_TABLE = """\
  - name: clicks_left
    kind: join
    join: {type: stream-table, with: users, how: left, fields: [city]}
  - name: clicks_inner
    kind: join
    join: {type: stream-table, with: users, fields: [name, city], prefix: u_}
"""


def test_stream_table_is_as_of_the_event_time_and_never_rewrites_history(
    spark: Any, tmp_path: Path
) -> None:
    lake = lake_with(tmp_path, CLICKS + STREAM_TABLE, USERS)
    produce(
        lake,
        "users",
        [("ann", {"name": "Ann", "city": "Oslo", "ts": 100}), ("ann", {"city": "Rome", "ts": 200})],
    )
    produce(
        lake,
        "clicks",
        [
            ("ann", {"page": "p1", "ts": 50}),  # before ann's first profile
            ("ann", {"page": "p2", "ts": 150}),  # between Oslo (100) and Rome (200): Oslo
            ("ann", {"page": "p3", "ts": 250}),  # Rome
            ("bob", {"page": "p4", "ts": 100}),  # no profile at all
            (None, {"page": "p5", "ts": 100}),  # a null key: no value (left: kept, KIP-962)
            ("ann", None),  # a tombstone is ignored
        ],
    )
    run_pipeline(spark, lake)
    left = [
        ("ann", "p1", None),
        ("ann", "p2", "Oslo"),
        ("ann", "p3", "Rome"),
        ("bob", "p4", None),
        (None, "p5", None),
    ]
    assert rows(lake.gold_path("clicks_left"), "user", "page", "city") == left
    assert rows(lake.gold_path("clicks_inner"), "user", "page", "u_name", "u_city") == [
        ("ann", "p2", "Ann", "Oslo"),
        ("ann", "p3", None, "Rome"),
    ]
    # A late profile update (event time 120) arrives, then ann is deleted at 400. Rows already
    # emitted keep their values; later events see the history as it is now.
    tombstone = record("ann", None, timestamp_ms=400)  # its event time: its record timestamp
    produce(lake, "users", [("ann", {"city": "Paris", "ts": 120}), tombstone])
    produce(
        lake,
        "clicks",
        [
            ("ann", {"page": "p6", "ts": 130}),  # after the late update: Paris
            ("ann", {"page": "p7", "ts": 110}),  # before it: still Oslo
            ("ann", {"page": "p8", "ts": 300}),  # Rome
            ("ann", {"page": "p9", "ts": 500}),  # after the deletion: no value
        ],
    )
    run_pipeline(spark, lake)
    assert rows(lake.gold_path("clicks_left"), "user", "page", "city") == sorted(
        [
            *left,
            ("ann", "p6", "Paris"),
            ("ann", "p7", "Oslo"),
            ("ann", "p8", "Rome"),
            ("ann", "p9", None),
        ],
        key=repr,
    )
    assert rows(lake.gold_path("clicks_inner"), "page", "u_city") == [
        ("p2", "Oslo"),
        ("p3", "Rome"),
        ("p6", "Paris"),
        ("p7", "Oslo"),
        ("p8", "Rome"),
    ]
    # The output carries this side's event identity and times; both inputs' positions are
    # recorded in the commit.
    row = next(
        r for r in read_arrow(lake.gold_path("clicks_left")).to_pylist() if r["page"] == "p2"
    )
    assert (row["partition"], row["offset"], row["ts"]) == (0, 1, 150)
    assert row["event_time"].timestamp() == 0.15
    store = DeltaStore(spark)
    gold = lake.gold_path("clicks_left")
    assert store.transaction_version(gold, "silver.clicks_stream") == store.version(
        lake.silver_path("clicks_stream")
    )
    assert store.transaction_version(gold, "silver.users_stream") == store.version(
        lake.silver_path("users_stream")
    )
    # Rerun: nothing new, nothing written.
    versions = {t: _version(lake, t) for t in ("clicks_left", "clicks_inner")}
    run_pipeline(spark, lake)
    assert {t: _version(lake, t) for t in versions} == versions
    # Only the other side moved: a stream-table join does not re-emit anything.
    produce(lake, "users", [("bob", {"city": "Lima", "ts": 0})])
    run_pipeline(spark, lake)
    assert {t: _version(lake, t) for t in versions} == versions


# -- table-table --------------------------------------------------------------------------------

TABLE_TABLE = """\
  - name: last_click_profile
    kind: join
    join: {type: table-table, with: users, fields: [city], prefix: u_}
  - name: last_click_profile_left
    kind: join
    join: {type: table-table, with: users, how: left, fields: [city], prefix: u_}
  - name: last_click_ad
    kind: join
    join: {type: table-table, with: impressions, on_field: ad, how: left, fields: [placement]}
"""


def test_table_table_follows_both_sides_changes_and_deletes(spark: Any, tmp_path: Path) -> None:
    lake = lake_with(tmp_path, CLICKS + TABLE_TABLE, USERS, IMPRESSIONS)
    inner, left = "last_click_profile", "last_click_profile_left"
    produce(lake, "users", [("ann", {"city": "Oslo"}), ("bob", {"city": "Rome"})])
    produce(lake, "impressions", [("ad1", {"placement": "top"})])
    produce(lake, "clicks", [("ann", {"page": "p1", "ad": "ad1"}), ("cy", {"page": "p2"})])
    run_pipeline(spark, lake)
    assert rows(lake.gold_path(inner), "user", "page", "u_city") == [("ann", "p1", "Oslo")]
    assert rows(lake.gold_path(left), "user", "page", "u_city") == [
        ("ann", "p1", "Oslo"),
        ("cy", "p2", None),
    ]
    assert rows(lake.gold_path("last_click_ad"), "user", "ad", "placement") == [
        ("ann", "ad1", "top"),
        ("cy", None, None),
    ]

    # The other side changes: ann moves, cy gets a profile, an ad's placement changes.
    before = {t: _version(lake, t) for t in (inner, left, "last_click_ad")}
    produce(lake, "users", [("ann", {"city": "Lima"}), ("cy", {"city": "Paris"})])
    produce(lake, "impressions", [("ad1", {"placement": "side"})])
    run_pipeline(spark, lake)
    assert rows(lake.gold_path(inner), "user", "page", "u_city") == [
        ("ann", "p1", "Lima"),
        ("cy", "p2", "Paris"),
    ]
    assert _feed(lake, inner, before[inner] + 1, "user", "u_city") == [
        ("insert", "cy", "Paris"),
        ("update_postimage", "ann", "Lima"),
        ("update_preimage", "ann", "Oslo"),
    ]
    assert _feed(lake, left, before[left] + 1, "user", "u_city") == [
        ("update_postimage", "ann", "Lima"),
        ("update_postimage", "cy", "Paris"),
        ("update_preimage", "ann", "Oslo"),
        ("update_preimage", "cy", None),
    ]
    assert _feed(lake, "last_click_ad", before["last_click_ad"] + 1, "user", "placement") == [
        ("update_postimage", "ann", "side"),
        ("update_preimage", "ann", "top"),
    ]

    # This side changes (ann clicks again, now on no ad; bob clicks) and the other deletes cy.
    before = {t: _version(lake, t) for t in before}
    produce(lake, "clicks", [("ann", {"page": "p3"}), ("bob", {"page": "p4", "ad": "ad1"})])
    produce(lake, "users", [("cy", None)])
    run_pipeline(spark, lake)
    assert rows(lake.gold_path(inner), "user", "page", "u_city") == [
        ("ann", "p3", "Lima"),
        ("bob", "p4", "Rome"),
    ]
    assert _feed(lake, inner, before[inner] + 1, "user", "page") == [
        ("delete", "cy", "p2"),
        ("insert", "bob", "p4"),
        ("update_postimage", "ann", "p3"),
        ("update_preimage", "ann", "p1"),
    ]
    assert rows(lake.gold_path(left), "user", "page", "u_city") == [
        ("ann", "p3", "Lima"),
        ("bob", "p4", "Rome"),
        ("cy", "p2", None),
    ]
    assert rows(lake.gold_path("last_click_ad"), "user", "ad", "placement") == [
        ("ann", None, None),
        ("bob", "ad1", "side"),
        ("cy", None, None),
    ]

    # This side deletes: the row goes from both joins.
    before = {t: _version(lake, t) for t in before}
    produce(lake, "clicks", [("ann", None)])
    run_pipeline(spark, lake)
    assert _feed(lake, inner, before[inner] + 1, "user") == [("delete", "ann")]
    assert _feed(lake, left, before[left] + 1, "user") == [("delete", "ann")]
    # A change of the other side that changes no row (a field not taken, a key no row has)
    # moves the positions without rewriting rows.
    before = {t: _version(lake, t) for t in before}
    produce(lake, "users", [("bob", {"city": "Rome", "name": "Bob"}), ("zed", {"city": "X"})])
    run_pipeline(spark, lake)
    assert _feed(lake, inner, before[inner] + 1, "user") == []
    store = DeltaStore(spark)
    for table in (inner, left):
        assert store.transaction_version(
            lake.gold_path(table), "silver.users_stream"
        ) == store.version(lake.silver_path("users_stream"))
    # Rerun: a no-op.
    before = {t: _version(lake, t) for t in before}
    run_pipeline(spark, lake)
    assert {t: _version(lake, t) for t in before} == before


def test_table_table_recovers_from_a_crash_between_the_gold_and_state_commits(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from lakehouse.tables import table_table

    lake = lake_with(tmp_path, CLICKS + PROPERTY_TABLES.split("  - name: tt_left")[0], USERS)
    produce(lake, "users", [("a", {"city": "x"}), ("b", {"city": "y"})])
    produce(lake, "clicks", [("a", {"page": "p"})])
    run_pipeline(spark, lake)

    def crash(*_args: Any) -> None:
        raise RuntimeError("killed before the state commits")

    produce(lake, "users", [("a", None)])
    produce(lake, "clicks", [("b", {"page": "q"})])
    with monkeypatch.context() as m:
        m.setattr(table_table, "merge_latest", crash)
        with pytest.raises(RuntimeError, match="killed"):
            run_pipeline(spark, lake)
    assert _table(lake, "tt_inner") == {"b": ("q", "y")}  # the gold commit went through
    # The next run catches the states up first; later changes build on the right state.
    # (Stale states would lose b, whose click the state missed, and give a the deleted city.)
    produce(lake, "users", [("b", {"city": "w"})])
    produce(lake, "clicks", [("a", {"page": "p2"})])
    run_pipeline(spark, lake)
    assert _table(lake, "tt_inner") == {"b": ("q", "w")}
    assert _replayed(lake, "tt_inner") == {"b": ("q", "w")}


# -- stream-stream ------------------------------------------------------------------------------

STREAM_STREAM = """\
  - name: clicked_impressions
    kind: join
    join: {type: stream-stream, with: impressions, on_field: ad, within: 10s, fields: [placement],
           prefix: imp_}
"""


def test_stream_stream_pairs_events_within_the_window_once(spark: Any, tmp_path: Path) -> None:
    lake = lake_with(tmp_path, CLICKS + STREAM_STREAM, IMPRESSIONS)
    table = "clicked_impressions"
    columns = ("user", "imp_placement", "ts", "imp_offset")
    produce(
        lake,
        "impressions",
        [("ad1", {"placement": "top", "ts": 1_000}), ("ad2", {"placement": "side", "ts": 1_000})],
    )
    produce(
        lake,
        "clicks",
        [
            ("ann", {"ad": "ad1", "ts": 11_000}),  # 10 s after ad1's impression: a pair
            ("bob", {"ad": "ad2", "ts": 20_000}),  # 19 s after: none
            ("cy", {"page": "p", "ts": 1_000}),  # no ad: none
            ("dee", None),  # a tombstone: none
        ],
    )
    run_pipeline(spark, lake)
    assert rows(lake.gold_path(table), *columns) == [("ann", "top", 11_000, 0)]
    # Both sides move: a new click pairs with an old impression, new impressions pair with old
    # clicks and with the new click, each pair once.
    produce(lake, "clicks", [("eve", {"ad": "ad1", "ts": 9_000})])
    produce(
        lake,
        "impressions",
        [
            ("ad2", {"placement": "side2", "ts": 15_000}),
            ("ad1", {"placement": "low", "ts": 12_000}),
        ],
    )
    run_pipeline(spark, lake)
    expected = [
        ("ann", "low", 11_000, 3),
        ("ann", "top", 11_000, 0),
        ("bob", "side2", 20_000, 2),
        ("eve", "low", 9_000, 3),
        ("eve", "top", 9_000, 0),
    ]
    assert rows(lake.gold_path(table), *columns) == expected
    row = next(r for r in read_arrow(lake.gold_path(table)).to_pylist() if r["user"] == "bob")
    assert (row["partition"], row["offset"], row["imp_partition"]) == (0, 1, 0)
    assert (row["event_time"].timestamp(), row["imp_event_time"].timestamp()) == (20.0, 15.0)
    # Only the other side moves: pairs with clicks consumed earlier.
    produce(lake, "impressions", [("ad2", {"placement": "late", "ts": 29_000})])
    run_pipeline(spark, lake)
    assert rows(lake.gold_path(table), *columns) == sorted(
        [*expected, ("bob", "late", 20_000, 4)], key=row_order
    )
    # Rerun: a no-op; the table is append-only (its change feed has inserts only).
    version = _version(lake, table)
    run_pipeline(spark, lake)
    assert _version(lake, table) == version
    assert {r[0] for r in _feed(lake, table, 0)} == {"insert"}


def test_a_left_stream_stream_join_is_refused(spark: Any, tmp_path: Path) -> None:
    from lakehouse.errors import ContractError
    from lakehouse.tables import gold

    left = STREAM_STREAM.replace("within: 10s", "within: 10s, how: left")
    lake = lake_with(tmp_path, CLICKS + left, IMPRESSIONS)
    with pytest.raises(ContractError, match=r"left|inner"):
        catalog = Catalog.load(lake.contracts_dir)
        clicks = catalog.topic("clicks")
        gold.build_table(spark, lake, clicks, clicks.tables[0], catalog)
    assert not lake.gold_path("clicked_impressions").exists()


# -- property: table-table, incremental == one batch == Kafka Streams ----------------------------

PROPERTY_TABLES = """\
  - name: tt_inner
    kind: join
    join: {type: table-table, with: users, fields: [city]}
  - name: tt_left
    kind: join
    join: {type: table-table, with: users, how: left, fields: [city]}
"""

SIDES = st.sampled_from(["clicks", "users"])
KEYS = st.sampled_from(["a", "b", "c", None])
HISTORIES = st.lists(
    st.tuples(SIDES, KEYS, st.one_of(st.none(), st.sampled_from(["x", "y"]))),
    min_size=1,
    max_size=10,
)
Step = tuple[str, str | None, str | None]


def _produce_steps(lake: Settings, steps: list[Step]) -> None:
    for topic in ("clicks", "users"):
        field = "page" if topic == "clicks" else "city"
        produce(
            lake,
            topic,
            [(k, None if v is None else {field: v}) for t, k, v in steps if t == topic],
        )


def _kafka(oracle: StreamsOracle, how: str, history: list[Step]) -> dict[str, tuple[Any, ...]]:
    """The join as Kafka Streams computes it, fed the two sides' records in the order given."""
    records = [
        (left if topic == "clicks" else right)(
            key,
            None if value is None else {"page" if topic == "clicks" else "city": value},
            0,
        )
        for topic, key, value in history
    ]
    result = oracle.compute(
        {"kind": "join", "type": "table-table", "how": how, "on": None}, records
    )
    return {
        key: (value["left"]["page"], None if value["right"] is None else value["right"]["city"])
        for (key, _window), value in result.rows.items()
    }


def _table(lake: Settings, name: str) -> dict[str, tuple[Any, ...]]:
    return {r["user"]: (r["page"], r["city"]) for r in read_arrow(lake.gold_path(name)).to_pylist()}


def _replayed(lake: Settings, name: str) -> dict[str, tuple[Any, ...]]:
    """The table rebuilt from its changelog alone."""
    out: dict[str, tuple[Any, ...]] = {}
    feed = changes_arrow(lake.gold_path(name), 0).to_pylist()
    for r in sorted(feed, key=lambda r: (r["_commit_version"], r["_change_type"] != "delete")):
        if r["_change_type"] in {"insert", "update_postimage"}:
            out[r["user"]] = (r["page"], r["city"])
        elif r["_change_type"] == "delete":
            out.pop(r["user"], None)
    return out


# A key deleted and back on either side, across and within batches.
BOTH_SIDES: list[Step] = [
    ("clicks", "a", "x"),
    ("users", "a", "x"),
    ("users", "a", None),
    ("clicks", "b", "y"),
    ("users", "b", "x"),
    ("users", "a", "y"),
    ("clicks", "a", None),
    ("clicks", None, "x"),
    ("users", "a", "x"),
    ("clicks", "a", "y"),
]


@pytest.mark.property
@histories()
@given(history=HISTORIES, cuts=st.lists(st.integers(1, 9), max_size=2, unique=True))
@example(history=BOTH_SIDES, cuts=[3, 6])
@example(history=BOTH_SIDES, cuts=[])  # one batch: a full recompute
def test_table_table_every_batching_equals_kafka_streams(
    spark: Any,
    streams_oracle: StreamsOracle,
    tmp_path_factory: pytest.TempPathFactory,
    history: list[Step],
    cuts: list[int],
) -> None:
    """Both sides' changes cut into micro-batches anywhere (no cut: one batch) end in the joins
    Kafka Streams computes from the same records, and their change feeds replay to them."""
    lake = lake_with(tmp_path_factory.mktemp("joins"), CLICKS + PROPERTY_TABLES, USERS)
    bounds = [0, *sorted(c for c in cuts if c < len(history)), len(history)]
    for lo, hi in itertools.pairwise(bounds):
        _produce_steps(lake, history[lo:hi])
        run_pipeline(spark, lake)
    for name, how in (("tt_inner", "inner"), ("tt_left", "left")):
        expected = _kafka(streams_oracle, how, history)
        assert _table(lake, name) == expected, (name, history, bounds)
        assert _replayed(lake, name) == expected, (name, history, bounds)
