"""Every kind of gold table against Kafka Streams itself (the oracle of tests/oracle.py, real
Kafka Streams in a TopologyTestDriver), on histories over several partitions with repeated and
null keys, tombstones, out-of-order and late records, cut into micro-batches anywhere.

How each kind is fed to the oracle (the platform's rules, docs/reliability.md "What Kafka Streams would do"):

* latest, aggregates over a stream or a table (by key or re-keyed), table-table joins: one
  driver, the records in the order the pipeline reads them (micro-batch, then partition, then
  offset: the stream commit that brought them, then partition and offset). A key lives in one
  partition, so its own records keep their offset order; only earliest, latest and collect of a
  re-keyed aggregate see the order across partitions.
* windows grouped by key: one driver per partition, its records in offset order, since Kafka
  Streams runs one task per partition and stream time belongs to the task. A re-keyed window is
  judged by its source partition's stream time, so it is fed the same way and the partitions'
  windows are added up (count and sum).
* the changelog table: the change feed of the table it reads, commit by commit.
* stream-table joins: one driver, both inputs in the order a Kafka Streams task picks records
  from its partitions by timestamp (a record's partition time, the other side first on ties),
  with the other topic complete before the stream's first micro-batch. Joined with the other
  topic's history table (``table:``): the other topic's records first, then the stream's, since
  the history table has every version before the join reads it.
* stream-stream joins: one driver, with a grace longer than the history.
* history tables: one driver per partition, its records in offset order, put into a versioned
  store with the table's history retention (stream time is the task's); the table's version
  valid at each time a key's versions can change is compared with the store's ``get(key,
  asOf)`` there, for the times the store still answers (not older than its stream time minus
  the retention: Kafka's store drops those versions, the table keeps them), and the records the
  store refused are the table's late records.

The platform's deliberate differences are taken out of what the oracle is fed and pinned by
tests of their own at the end: a tombstone is not counted by a windowed aggregate, nor does it
move stream time; a table aggregate deletes a group its last member left.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from lakehouse.contracts.catalog import Catalog
from lakehouse.runtime.config import Settings
from lakehouse.storage import changes_arrow, read_arrow
from lakehouse.tables.rebuild import refresh
from lakehouse.tables.windowed import time_windows
from lakes import histories, lake_with, produce, record, run_pipeline
from oracle import Result, StreamsOracle, left, right

pytestmark = pytest.mark.integration

PARTITIONS = 3
MIN = 60_000
T0 = int(datetime(2026, 1, 1, tzinfo=UTC).timestamp() * 1000)  # a multiple of every window

CLICKS = f"""\
topic: clicks
partitions: {PARTITIONS}
key: {{format: string, name: user}}
value:
  format: json
  fields:
    - {{name: id, type: string}}
    - {{name: event_time, type: timestamp}}
    - {{name: page, type: string}}
    - {{name: amount, type: long}}
event_time: event_time
stream: {{name: clicks_stream}}
tables:
  - name: last_click
    kind: latest
  - name: per_user
    kind: aggregate
    aggregations:
      - {{name: n, fn: count}}
      - {{name: amounts, fn: count, field: amount}}
      - {{name: total, fn: sum, field: amount}}
      - {{name: low, fn: min, field: amount}}
      - {{name: high, fn: max, field: amount}}
      - {{name: mean, fn: avg, field: amount}}
      - {{name: pages, fn: count_distinct, field: page}}
      - {{name: first_page, fn: earliest, field: page}}
      - {{name: last_page, fn: latest, field: page}}
      - {{name: ids, fn: collect, field: id}}
  - name: per_page
    kind: aggregate
    group_by: page
    aggregations:
      - {{name: n, fn: count}}
      - {{name: total, fn: sum, field: amount}}
      - {{name: ids, fn: collect, field: id}}
  - name: page_now
    kind: aggregate
    source: table
    group_by: page
    aggregations:
      - {{name: n, fn: count}}
      - {{name: total, fn: sum, field: amount}}
      - {{name: mean, fn: avg, field: amount}}
  - name: user_now
    kind: aggregate
    source: table
    aggregations:
      - {{name: n, fn: count}}
      - {{name: total, fn: sum, field: amount}}
  - name: tumbling
    kind: aggregate
    window: {{type: tumbling, size: 2m, grace: 1m}}
    aggregations:
      - {{name: n, fn: count}}
      - {{name: ids, fn: collect, field: id}}
  - name: hopping
    kind: aggregate
    window: {{type: hopping, size: 3m, advance: 1m, grace: 1m}}
    aggregations:
      - {{name: n, fn: count}}
      - {{name: total, fn: sum, field: amount}}
  - name: sessions
    kind: aggregate
    window: {{type: session, gap: 2m, grace: 1m}}
    aggregations:
      - {{name: n, fn: count}}
      - {{name: total, fn: sum, field: amount}}
      - {{name: ids, fn: collect, field: id}}
  - name: page_minutes
    kind: aggregate
    group_by: page
    window: {{type: tumbling, size: 2m, grace: 1m}}
    aggregations:
      - {{name: n, fn: count}}
      - {{name: total, fn: sum, field: amount}}
  - name: moves
    kind: aggregate
    changelog: last_click
    aggregations:
      - {{name: n, fn: count}}
  - name: with_profile
    kind: join
    join: {{type: stream-table, with: profiles, how: left, fields: [id, city], prefix: p_}}
  - name: user_city
    kind: join
    join: {{type: table-table, with: profiles, how: left, fields: [id, city], prefix: p_}}
  - name: near
    kind: join
    join: {{type: stream-stream, with: profiles, within: 2m, fields: [id], prefix: p_}}
  - name: click_history
    kind: history
    history_retention: 4m
  - name: with_profile_then
    kind: join
    join:
      type: stream-table
      with: profiles
      table: profile_history
      how: left
      fields: [id, city]
      prefix: p_
"""

PROFILES = f"""\
topic: profiles
partitions: {PARTITIONS}
key: {{format: string, name: user}}
value:
  format: json
  fields:
    - {{name: id, type: string}}
    - {{name: event_time, type: timestamp}}
    - {{name: city, type: string}}
event_time: event_time
stream: {{name: profiles_stream}}
tables:
  - name: profile_history
    kind: history
"""

AGGREGATIONS = {  # the oracle's terms for the contract's aggregations, per table
    "per_user": [
        ("n", "count", None),
        ("amounts", "count", "amount"),
        ("total", "sum", "amount"),
        ("low", "min", "amount"),
        ("high", "max", "amount"),
        ("mean", "avg", "amount"),
        ("pages", "count_distinct", "page"),
        ("first_page", "earliest", "page"),
        ("last_page", "latest", "page"),
        ("ids", "collect", "id"),
    ],
    "per_page": [("n", "count", None), ("total", "sum", "amount"), ("ids", "collect", "id")],
    "page_now": [("n", "count", None), ("total", "sum", "amount"), ("mean", "avg", "amount")],
    "user_now": [("n", "count", None), ("total", "sum", "amount")],
    "tumbling": [("n", "count", None), ("ids", "collect", "id")],
    "hopping": [("n", "count", None), ("total", "sum", "amount")],
    "sessions": [("n", "count", None), ("total", "sum", "amount"), ("ids", "collect", "id")],
    "page_minutes": [("n", "count", None), ("total", "sum", "amount")],
    "moves": [("n", "count", None)],
}
WINDOWS = {
    "tumbling": {"type": "tumbling", "size": 2 * MIN, "grace": MIN},
    "hopping": {"type": "hopping", "size": 3 * MIN, "advance": MIN, "grace": MIN},
    "sessions": {"type": "session", "gap": 2 * MIN, "grace": MIN},
    "page_minutes": {"type": "tumbling", "size": 2 * MIN, "grace": MIN},
}
FAR = 100 * 365 * 24 * 60 * MIN  # a stream-stream join's grace: longer than any history
HISTORY_RETENTION = 4 * MIN  # click_history's

# A record of the history: (key, value); a value is {"m": event minute, "page"/"city", "amount"}
# or None, a tombstone, whose event time (its record timestamp) is in the key's slot below.
Click = tuple[str | None, dict[str, Any] | None, int]  # key, value, event minute
Profile = tuple[str | None, dict[str, Any] | None, int]


@dataclass(frozen=True)
class Produced:
    """One record as Kafka would hold it, and when the pipeline read it."""

    topic: str
    batch: int
    partition: int
    offset: int
    key: str | None
    value: dict[str, Any] | None  # as produced: id, event_time, page/city, amount
    ts: int  # event time, ms (a tombstone's: its record timestamp)

    def fed(self, side: str = "left") -> dict[str, Any]:
        """The record for the oracle, its value as the stream has it."""
        record = left if side == "left" else right
        return record(self.key, self.value, self.ts)


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat().replace("+00:00", "Z")


def _produce(
    lake: Settings, topic: str, batch: int, items: Sequence[tuple[str, Click]]
) -> list[Produced]:
    """Append ``(id, (key, value, minute))`` items with Kafka's default partitioner."""
    records, made = [], []
    for ident, (key, value, minute) in items:
        ts = T0 + minute * MIN
        body = None if value is None else {"id": ident, "event_time": _iso(ts), **value}
        made.append((key, body, ts))
        records.append(record(key, body, partition=None, timestamp_ms=ts))
    placed = produce(lake, topic, records)
    return [
        Produced(topic, batch, m.partition, m.offset, key, body, ts)
        for m, (key, body, ts) in zip(placed, made, strict=True)
    ]


def _arrival(records: Iterable[Produced]) -> list[Produced]:
    """The order the pipeline reads a stream in: micro-batch (its stream commit), partition,
    offset."""
    return sorted(records, key=lambda r: (r.batch, r.partition, r.offset))


def _partition_times(records: Iterable[Produced]) -> dict[tuple[str, int, int], int]:
    """Each record's partition time: the largest event time of its partition up to it."""
    out, top = {}, {}
    for r in sorted(records, key=lambda r: (r.topic, r.partition, r.offset)):
        where = (r.topic, r.partition)
        top[where] = max(top.get(where, r.ts), r.ts)
        out[(r.topic, r.partition, r.offset)] = top[where]
    return out


def _aggregate(table: str, group_by: str | None = None, source: str = "stream") -> dict[str, Any]:
    return {
        "kind": "aggregate",
        "source": source,
        "group_by": group_by,
        "aggregations": [{"name": n, "fn": f, "field": c} for n, f, c in AGGREGATIONS[table]],
        "window": WINDOWS.get(table),
    }


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        return a is not None and b is not None and abs(a - b) < 1e-9
    return bool(a == b)


def _assert_rows(name: str, got: dict[Any, dict[str, Any]], want: dict[Any, Any]) -> None:
    assert set(got) == set(want), (name, sorted(got, key=repr), sorted(want, key=repr))
    for where, row in got.items():
        bad = {
            c: (row[c], want[where].get(c)) for c in row if not _same(row[c], want[where].get(c))
        }
        assert not bad, (name, where, bad)


def _table(lake: Settings, name: str, key: str) -> dict[Any, dict[str, Any]]:
    """(group, window start, window end or None) -> the visible columns, times in ms."""
    out = {}
    for r in read_arrow(lake.gold_path(name)).to_pylist():
        window = None
        if "window_start" in r:
            window = (_ms(r.pop("window_start")), _ms(r.pop("window_end")))
        group = r.pop(key)
        out[(group, window)] = {c: v for c, v in r.items() if not c.startswith("__")}
    return out


def _ms(t: datetime) -> int:
    return int(t.timestamp() * 1000)


def _late(lake: Settings, name: str) -> set[tuple[str, int, int]]:
    return {
        (r["id"], _ms(r["window_start"]), _ms(r["window_end"]))
        for r in read_arrow(lake.late_path(name)).to_pylist()
    }


def _window_late(result: Result, fed: Sequence[Produced], window: dict[str, Any]) -> set[Any]:
    """The (record, window) pairs Kafka Streams dropped as late: each window a record falls in
    and did not update; for a session, the record that changed nothing, as ``[t, t]``."""
    late = set()
    for i, r in enumerate(fed):
        assert r.value is not None
        updated = {c.window for c in result.by(i) if c.value is not None}
        if window["type"] == "session":
            if not result.by(i):
                late.add((r.value["id"], r.ts, r.ts))
            continue
        advance = window.get("advance", window["size"])
        for start, end in time_windows(r.ts, window["size"], advance):
            if (start, end) not in updated:
                late.add((r.value["id"], start, end))
    return late


def _windowed(
    oracle: StreamsOracle, name: str, clicks: Sequence[Produced], group_by: str | None
) -> tuple[dict[Any, dict[str, Any]], set[Any]]:
    """A windowed table as Kafka Streams computes it, one task per partition: the windows
    (re-keyed: the partitions' counts and sums added) and the late (record, window) pairs. A
    tombstone is not fed (a deliberate difference, pinned below), nor a record without a group
    (Kafka skips it without a trace, as the platform does)."""
    rows: dict[Any, dict[str, Any]] = {}
    late: set[Any] = set()
    for p in range(PARTITIONS):
        fed = [
            r
            for r in _arrival(clicks)
            if r.partition == p
            and r.value is not None
            and (r.key if group_by is None else r.value.get(group_by)) is not None
        ]
        if not fed:
            continue
        result = oracle.compute(_aggregate(name, group_by), [r.fed() for r in fed])
        late |= _window_late(result, fed, WINDOWS[name])
        for where, value in result.table().items():
            if where in rows:  # a re-keyed group's window in several partitions: add up
                assert group_by is not None, where
                rows[where] = {c: _add(rows[where][c], v) for c, v in value.items()}
            else:
                rows[where] = value
    return rows, late


def _add(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else a + b


def _check(
    spark: Any,
    lake: Settings,
    oracle: StreamsOracle,
    clicks: list[Produced],
    profiles: list[Produced],
) -> None:
    ordered = [r.fed() for r in _arrival(clicks)]
    # latest
    got = {k: v["id"] for (k, _w), v in _table(lake, "last_click", "user").items()}
    want = {k: v["id"] for (k, _w), v in oracle.compute({"kind": "latest"}, ordered).rows.items()}
    assert got == want, ("last_click", got, want)
    # aggregates over the stream, by key and re-keyed
    _assert_rows(
        "per_user",
        _table(lake, "per_user", "user"),
        oracle.compute(_aggregate("per_user"), ordered).table(),
    )
    _assert_rows(
        "per_page",
        _table(lake, "per_page", "page"),
        oracle.compute(_aggregate("per_page", "page"), ordered).table(),
    )
    # aggregates over the table: Kafka keeps a group its last member left (count 0)
    for name, group_by in (("page_now", "page"), ("user_now", None)):
        now = oracle.compute(_aggregate(name, group_by, "table"), ordered)
        members = now.table(bookkeeping=True)
        kept = {w: v for w, v in now.table().items() if members[w]["__members"] > 0}
        _assert_rows(name, _table(lake, name, group_by or "user"), kept)
    # windows: per partition, and their late records
    for name, group_by in (
        ("tumbling", None),
        ("hopping", None),
        ("sessions", None),
        ("page_minutes", "page"),
    ):
        rows, late = _windowed(oracle, name, clicks, group_by)
        _assert_rows(name, _table(lake, name, group_by or "user"), rows)
        assert _late(lake, name) == late, (name, _late(lake, name), late)
    # the changelog table: last_click's change feed, commit by commit, as a stream
    feed = changes_arrow(lake.gold_path("last_click")).to_pylist()
    changes = [
        left(r["user"], None if r["_change_type"] == "delete" else {"id": r["id"]}, 0)
        for r in sorted(feed, key=lambda r: (r["_commit_version"], r["user"]))
        if r["_change_type"] != "update_preimage"
    ]
    _assert_rows(
        "moves", _table(lake, "moves", "user"), oracle.compute(_aggregate("moves"), changes).table()
    )
    _check_joins(lake, oracle, clicks, profiles)
    _check_history(lake, oracle, clicks)


def _check_history(lake: Settings, oracle: StreamsOracle, clicks: list[Produced]) -> None:
    rows = read_arrow(lake.gold_path("click_history")).to_pylist()
    late = sorted(
        ((r["user"], r["id"]) for r in read_arrow(lake.late_path("click_history")).to_pylist()),
        key=repr,
    )
    refused: list[tuple[str | None, str | None]] = []
    for p in range(PARTITIONS):
        fed = [r for r in _arrival(clicks) if r.partition == p and r.key is not None]
        if not fed:
            continue
        # Every time a key's version can change (each record's time, and just before it), for
        # the times the store still answers.
        stream_time = max(r.ts for r in fed)
        probes = sorted(
            {
                (r.key, t)
                for r in fed
                for t in (r.ts - 1, r.ts, stream_time + MIN)
                if t >= stream_time - HISTORY_RETENTION
            }
        )
        result = oracle.compute(
            {"kind": "history", "retention": HISTORY_RETENTION}, [r.fed() for r in fed], probes
        )
        for i, r in enumerate(fed):
            (outcome,) = (c.value for c in result.by(i))
            if outcome["not_put"]:
                refused.append((r.key, None if r.value is None else r.value["id"]))
        for (key, t), kafka in zip(probes, result.probes, strict=True):
            valid = [
                v
                for v in rows
                if v["user"] == key
                and _ms(v["valid_from"]) <= t
                and (v["valid_to"] is None or t < _ms(v["valid_to"]))
            ]
            got = [(v["id"], _ms(v["valid_from"])) for v in valid]
            want = [] if kafka is None else [(kafka["value"]["id"], kafka["valid_from"])]
            assert got == want, ("click_history", key, t, got, want)
    assert late == sorted(refused, key=repr), ("click_history late", late, refused)


def _check_joins(
    lake: Settings, oracle: StreamsOracle, clicks: list[Produced], profiles: list[Produced]
) -> None:
    def ident(value: dict[str, Any] | None) -> str | None:
        return None if value is None else value["id"]

    # stream-table: both inputs merged by partition time, the table first on ties
    times = _partition_times([*clicks, *profiles])
    both = sorted(
        [*clicks, *profiles],
        key=lambda r: (
            times[(r.topic, r.partition, r.offset)],
            r.topic == "clicks",
            r.partition,
            r.offset,
        ),
    )
    joined = oracle.compute(
        {"kind": "join", "type": "stream-table", "how": "left", "on": None},
        [r.fed("left" if r.topic == "clicks" else "right") for r in both],
    )
    want = sorted(
        (c.value["left"]["id"], ident(c.value["right"])) for c in joined.changelog if c.value
    )
    got = sorted(
        (r["id"], r["p_id"]) for r in read_arrow(lake.gold_path("with_profile")).to_pylist()
    )
    assert got == want, ("with_profile", got, want)
    # stream-table with the history table: every version there before the stream's records
    then = oracle.compute(
        {"kind": "join", "type": "stream-table", "how": "left", "on": None},
        [r.fed("right") for r in _arrival(profiles)] + [r.fed() for r in _arrival(clicks)],
    )
    want_then = sorted(
        ((c.value["left"]["id"], ident(c.value["right"])) for c in then.changelog if c.value),
        key=repr,
    )
    got_then = sorted(
        ((r["id"], r["p_id"]) for r in read_arrow(lake.gold_path("with_profile_then")).to_pylist()),
        key=repr,
    )
    assert got_then == want_then, ("with_profile_then", got_then, want_then)
    # table-table: the final table
    ordered = [r.fed() for r in _arrival(clicks)] + [r.fed("right") for r in _arrival(profiles)]
    tt = oracle.compute({"kind": "join", "type": "table-table", "how": "left", "on": None}, ordered)
    want_tt = {k: ident(v["right"]) for (k, _w), v in tt.rows.items()}
    got_tt = {r["user"]: r["p_id"] for r in read_arrow(lake.gold_path("user_city")).to_pylist()}
    assert got_tt == want_tt, ("user_city", got_tt, want_tt)
    # stream-stream: every pair, whatever the order
    ss = oracle.compute(
        {
            "kind": "join",
            "type": "stream-stream",
            "how": "inner",
            "on": None,
            "within": 2 * MIN,
            "grace": FAR,
        },
        ordered,
    )
    want_ss = sorted(
        (c.value["left"]["id"], c.value["right"]["id"]) for c in ss.changelog if c.value
    )
    got_ss = sorted((r["id"], r["p_id"]) for r in read_arrow(lake.gold_path("near")).to_pylist())
    assert got_ss == want_ss, ("near", got_ss, want_ss)


def _click(key: str | None, minute: int, page: str | None = "p1", amount: int | None = 1) -> Click:
    return (key, {"page": page, "amount": amount}, minute)


def _gone(key: str | None, minute: int) -> Click:
    return (key, None, minute)


def _profile(key: str | None, minute: int, city: str | None = "Oslo") -> Profile:
    return (key, {"city": city}, minute)


# Keys by Kafka's default partitioner over 3 partitions: a -> 1, b -> 2, f -> 0, g -> 0.
KEYS = ["a", "b", "f", "g"]

# Out of order within a partition (late windows, a session too late, one merged), a key moved
# between pages and deleted, null keys, tombstones; profiles updated out of order and deleted.
MIXED: list[Click] = [
    _click("a", 0, "p1", 5),
    _click("f", 1, "p2", 3),
    _click("b", 2, "p1", None),
    _click("a", 6, "p2", 2),  # a's partition: stream time 6
    _click("g", 3, "p1", 4),
    _click(None, 4, "p2", 9),  # a null key: ignored, except by the left stream-table join
    _click("a", 1, "p1", 7),  # late for [0, 2) (closes at 3) and its sessions
    _click("f", 3, None, 1),  # bridges nothing; f's sessions [1] and [3] merge
    _gone("b", 5),  # b deleted: leaves the table and its page
    _click("b", 9, "p2", 6),
    _click("g", 0, "p2", 2),  # g's partition is f's: stream time 3, so [0, 2) is still open
    _click("a", 4, "p2", None),  # [4, 6) open at 6; joins a's session [6] (gap 2m)
    _gone(None, 7),
    _click("f", 10, "p1", 8),
]
MIXED_PROFILES: list[Profile] = [
    _profile("a", 1, "Oslo"),
    _profile("a", 5, "Rome"),
    _profile("a", 3, "Lima"),  # out of order: after Rome in its partition
    _profile("f", 2, "Oslo"),
    _gone("f", 8),
    _profile("g", 0, None),
    _profile(None, 1, "Nowhere"),
]

CLICKS_ST = st.lists(
    st.tuples(
        st.sampled_from([*KEYS, None]),
        st.one_of(
            st.none(),
            st.fixed_dictionaries(
                {
                    "page": st.sampled_from(["p1", "p2", None]),
                    "amount": st.one_of(st.none(), st.integers(-3, 20)),
                }
            ),
        ),
        st.integers(0, 12),
    ),
    min_size=1,
    max_size=16,
)
PROFILES_ST = st.lists(
    st.tuples(
        st.sampled_from([*KEYS, None]),
        st.one_of(st.none(), st.fixed_dictionaries({"city": st.sampled_from(["Oslo", "Rome"])})),
        st.integers(0, 12),
    ),
    max_size=8,
)


@pytest.mark.property
@histories()
@given(
    history=CLICKS_ST,
    others=PROFILES_ST,
    cuts=st.lists(st.integers(1, 15), max_size=2, unique=True),
)
@example(history=MIXED, others=MIXED_PROFILES, cuts=[4, 9])
@example(history=MIXED, others=MIXED_PROFILES, cuts=[])  # one batch: a full recompute
def test_every_table_kind_equals_kafka_streams(
    spark: Any,
    streams_oracle: StreamsOracle,
    tmp_path_factory: pytest.TempPathFactory,
    history: list[Click],
    others: list[Profile],
    cuts: list[int],
) -> None:
    """A history over three partitions, its profiles complete before the first micro-batch
    and its clicks cut into micro-batches anywhere: every gold table equals what Kafka Streams
    computes from the same records."""
    lake = lake_with(tmp_path_factory.mktemp("semantics"), CLICKS, PROFILES)
    profiles = _produce(lake, "profiles", 0, [(f"q{i}", p) for i, p in enumerate(others)])
    bounds = [0, *sorted(c for c in cuts if c < len(history)), len(history)]
    clicks: list[Produced] = []
    for batch, (lo, hi) in enumerate(itertools.pairwise(bounds)):
        items = [(f"r{i}", history[i]) for i in range(lo, hi)]
        clicks += _produce(lake, "clicks", batch, items)
        run_pipeline(spark, lake)
    _check(spark, lake, streams_oracle, clicks, profiles)
    # A history table rebuilt from its stream (`lakehouse refresh`) equals Kafka's store too.
    catalog = Catalog.load(lake.contracts_dir)
    contract = catalog.topic("clicks")
    refresh(spark, lake, catalog, contract, contract.table("click_history"))
    _check_history(lake, streams_oracle, clicks)


# -- the deliberate differences, pinned -----------------------------------------------------------


def _clicks_with(*tables: str) -> str:
    """The clicks contract with only the ``tables`` named (a pinned difference needs one)."""
    import yaml

    doc = yaml.safe_load(CLICKS)
    doc["tables"] = [t for t in doc["tables"] if t["name"] in tables]
    return yaml.safe_dump(doc, sort_keys=False)


def test_a_windowed_count_ignores_tombstones_where_kafka_streams_counts_them(
    spark: Any, streams_oracle: StreamsOracle, tmp_path: Path
) -> None:
    """Kafka Streams' windowed aggregations pass a record with a null value to the aggregator
    (its ``count()`` counts it) and let it move stream time, although its documentation says
    such records are ignored. The platform ignores them, as its other aggregations and Kafka
    Streams' own non-windowed ones do: a tombstone is a deletion, not an event."""
    lake = lake_with(tmp_path, _clicks_with("tumbling"))
    clicks = _produce(
        lake, "clicks", 0, [("r0", _click("a", 0)), ("r1", _gone("a", 1)), ("r2", _click("a", 9))]
    )
    run_pipeline(spark, lake)
    kafka = streams_oracle.compute(_aggregate("tumbling"), [r.fed() for r in clicks]).table()
    assert kafka[("a", (T0, T0 + 2 * MIN))]["n"] == 2  # Kafka counts the tombstone
    ours = _table(lake, "tumbling", "user")
    assert ours[("a", (T0, T0 + 2 * MIN))]["n"] == 1
    assert ours[("a", (T0 + 8 * MIN, T0 + 10 * MIN))]["n"] == 1
    # The tombstone at minute 1 does not move stream time: minute 9's record still does.
    tombstone_late = _produce(lake, "clicks", 1, [("r3", _gone("a", 20)), ("r4", _click("a", 8))])
    run_pipeline(spark, lake)
    assert _late(lake, "tumbling") == set()  # minute 8 is in [8, 10), open at stream time 9
    kafka = streams_oracle.compute(
        _aggregate("tumbling"), [r.fed() for r in [*clicks, *tombstone_late]]
    )
    assert not kafka.by(4)  # Kafka: the tombstone at 20 moved stream time; minute 8 is late


def test_a_table_aggregate_deletes_a_group_its_last_member_left(
    spark: Any, streams_oracle: StreamsOracle, tmp_path: Path
) -> None:
    """Kafka Streams' KGroupedTable keeps a group whose last member left, with a count of 0;
    the platform deletes it (as ksqlDB does), so the table equals one computed from the current
    keys alone, and its changelog shows the delete."""
    lake = lake_with(tmp_path, _clicks_with("page_now"))
    clicks = _produce(
        lake, "clicks", 0, [("r0", _click("a", 0, "p1", 5)), ("r1", _click("a", 1, "p2", 6))]
    )
    run_pipeline(spark, lake)
    kafka = streams_oracle.compute(
        _aggregate("page_now", "page", "table"), [r.fed() for r in clicks]
    )
    assert kafka.table()[("p1", None)]["n"] == 0  # kept, empty
    assert _table(lake, "page_now", "page") == {("p2", None): {"n": 1, "total": 6, "mean": 6.0}}


def test_a_changelog_has_one_change_per_key_per_micro_batch(
    spark: Any, streams_oracle: StreamsOracle, tmp_path: Path
) -> None:
    """Kafka Streams (with record caching off) sends a table's every update down its changelog;
    a Delta change data feed has one change per key per commit, so a table that reads the
    changelog sees a key changed twice in one micro-batch as one change (Kafka Streams with
    record caching on does much the same)."""
    lake = lake_with(tmp_path, _clicks_with("last_click", "moves"))
    clicks = _produce(lake, "clicks", 0, [("r0", _click("a", 0)), ("r1", _click("a", 1))])
    run_pipeline(spark, lake)
    table_changes = streams_oracle.compute({"kind": "latest"}, [r.fed() for r in clicks])
    per_record = [left(c.key, c.value, c.ts) for c in table_changes.changelog]
    kafka = streams_oracle.compute(_aggregate("moves"), per_record).table()
    assert kafka[("a", None)]["n"] == 2
    assert _table(lake, "moves", "user") == {("a", None): {"n": 1}}
