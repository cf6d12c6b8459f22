"""Windowed aggregations on event time (Kafka Streams' TimeWindows and SessionWindows): window
bounds, grace and the late-records table, stream time per partition, sessions merging across
micro-batches, exactly-once after a crash, reprocessing, and the upgrade of a lake built when
stream time was one per topic. test_semantics compares them with Kafka Streams itself."""

from __future__ import annotations

import itertools
import shutil
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from lakehouse.contracts.catalog import Catalog
from lakehouse.pipeline.request import RunRequest
from lakehouse.pipeline.runner import run_layer
from lakehouse.runtime.config import Settings
from lakehouse.storage import DeltaStore, changes_arrow, delta_spark, read_arrow
from lakes import Event, lake_with, produce, run_pipeline

pytestmark = pytest.mark.integration

HEAD = """\
topic: clicks
partitions: 1
key: {format: string, name: user}
value:
  format: json
  fields:
    - {name: event_time, type: timestamp}
    - {name: page, type: string}
    - {name: amount, type: long}
event_time: event_time
stream: {name: clicks_stream}
tables:
"""

T0 = datetime(2026, 1, 1, tzinfo=UTC)
MIN = 60_000


def _iso(minutes: float) -> str:
    return (T0 + timedelta(minutes=minutes)).isoformat().replace("+00:00", "Z")


def _minutes(t: datetime | None) -> float | None:
    return None if t is None else (t - T0) / timedelta(minutes=1)


def _produce(lake: Settings, events: list[Event]) -> None:
    """Clicks of ``(key, value)``, a value ``{"m": event time in minutes after T0 or None,
    "page": ..., "amount": ... (default 1)}``."""

    def value(v: dict[str, Any]) -> dict[str, Any]:
        m = v.get("m")
        time = None if m is None else _iso(m)
        return {"event_time": time, "page": v.get("page"), "amount": v.get("amount", 1)}

    produce(lake, "clicks", [(k, None if v is None else value(v)) for k, v in events])


def _windows(lake: Settings, name: str) -> dict[tuple[Any, ...], dict[str, Any]]:
    """(group, start, end in minutes) -> visible columns; the group is the first column."""
    out = {}
    for r in read_arrow(lake.gold_path(name)).to_pylist():
        group = next(iter(r))
        key = (r[group], _minutes(r["window_start"]), _minutes(r["window_end"]))
        out[key] = {
            c: v
            for c, v in r.items()
            if c not in (group, "window_start", "window_end") and not c.startswith("__")
        }
    return out


def _late(lake: Settings, name: str) -> list[dict[str, Any]]:
    rows = read_arrow(lake.late_path(name)).to_pylist()
    return sorted(rows, key=lambda r: r["offset"])


BEFORE_EPOCH = (datetime(1969, 12, 31, 23, 59, tzinfo=UTC) - T0) / timedelta(minutes=1)


def _ev(user: str, m: float | None, page: str, amount: int = 1) -> Event:
    return (user, {"m": m, "page": page, "amount": amount})


def test_spark_window_assignment_matches_the_reference(spark: Any) -> None:
    from lakehouse.contracts.model import Window
    from lakehouse.tables.windowed import assign_time_windows, time_windows

    times = [0, 1, 4, 5, 6, 7, 11, 12]
    df = spark.createDataFrame([(t, 10) for t in times], "__t long, __st long")
    for size, advance in [(5, 2), (5, 5), (6, 3), (4, 1)]:
        placed = assign_time_windows(df, Window("hopping", size, advance, grace_ms=1))
        got = sorted((r["__t"], r["__ws"], r["__we"], r["__late"]) for r in placed.collect())
        want = sorted(
            (t, s, e, e + 1 <= 10) for t in times for s, e in time_windows(t, size, advance)
        )
        assert got == want, (size, advance)


TIME_TABLES = """\
  - name: per_minute
    kind: aggregate
    window: {type: tumbling, size: 1m, grace: 30s}
    aggregations:
      - {name: n, fn: count}
      - {name: total, fn: sum, field: amount}
      - {name: pages, fn: collect, field: page}
  - name: two_minutes_hopping
    kind: aggregate
    window: {type: hopping, size: 2m, advance: 1m}
    aggregations:
      - {name: n, fn: count}
"""


def test_tumbling_and_hopping_windows_grace_and_late_records(spark: Any, tmp_path: Path) -> None:
    lake = lake_with(tmp_path, HEAD + TIME_TABLES)
    _produce(
        lake,
        [
            _ev("a", 0 + 10 / 60, "p1", 1),
            _ev("b", 0 + 20 / 60, "p2", 5),
            _ev("a", 1 + 20 / 60, "p3", 2),  # stream time 1:20; [0, 1) is open until 1:30
            _ev("a", None, "no-time"),  # no event time: to the late table, never dropped
            (None, {"m": 0, "page": "no-key"}),  # ignored
            ("a", None),  # a tombstone: ignored
            _ev("a", BEFORE_EPOCH, "pre-epoch"),  # invalid, as in Kafka: to the late table
        ],
    )
    run_pipeline(spark, lake)
    _produce(
        lake,
        [
            _ev("a", 0 + 30 / 60, "p4", 3),  # within grace: counted in [0, 1)
            _ev("a", 1 + 45 / 60, "p5", 4),  # stream time 1:45: [0, 1) closed at 1:30
            _ev("a", 0 + 40 / 60, "p6", 100),  # late for [0, 1)
        ],
    )
    run_pipeline(spark, lake)
    run_pipeline(spark, lake)  # nothing new: nothing changes, nothing is written twice
    assert _windows(lake, "per_minute") == {
        ("a", 0, 1): {"n": 2, "total": 4, "pages": ["p1", "p4"]},
        ("a", 1, 2): {"n": 2, "total": 6, "pages": ["p3", "p5"]},
        ("b", 0, 1): {"n": 1, "total": 5, "pages": ["p2"]},
    }
    # size 2m, advance 1m, no grace: every record is in two windows. p4 (0:30, stream time
    # 1:20) and p6 (0:40, stream time 1:45) are late for [-1, 1) and count in [0, 2).
    assert _windows(lake, "two_minutes_hopping") == {
        ("a", -1, 1): {"n": 1},
        ("a", 0, 2): {"n": 5},
        ("a", 1, 3): {"n": 2},
        ("b", -1, 1): {"n": 1},
        ("b", 0, 2): {"n": 1},
    }
    late = _late(lake, "per_minute")
    assert [(r["page"], r["reason"]) for r in late] == [
        ("no-time", "no event time"),
        ("pre-epoch", "event time before 1970-01-01 (a negative timestamp, invalid as in Kafka)"),
        (
            "p6",
            "window [2026-01-01T00:00:00.000Z, 2026-01-01T00:01:00.000Z) closed at stream "
            "time 2026-01-01T00:01:45.000Z; grace 30s",
        ),
    ]
    assert late[0]["window_start"] is None and late[0]["event_time"] is None
    assert (late[0]["stream_time"], late[0]["offset"]) == (T0 + timedelta(seconds=80), 3)
    p6 = late[2]
    assert (p6["user"], p6["amount"], p6["partition"], p6["offset"]) == ("a", 100, 0, 9)
    assert _minutes(p6["event_time"]) == 40 / 60
    assert (_minutes(p6["window_start"]), _minutes(p6["window_end"])) == (0, 1)
    assert p6["stream_time"] == T0 + timedelta(seconds=105)
    hopping_late = _late(lake, "two_minutes_hopping")
    assert [(r["page"], _minutes(r["window_start"])) for r in hopping_late] == [
        ("no-time", None),
        ("pre-epoch", None),
        ("p4", -1),
        ("p6", -1),
    ]
    assert hopping_late[2]["reason"].endswith("; grace 0s")
    assert hopping_late[2]["stream_time"] == T0 + timedelta(seconds=80)


IN_ORDER = """\
topic: clicks
partitions: {partitions}
key: {{format: string, name: user}}
value:
  format: json
  fields:
    - {{name: event_time, type: timestamp}}
    - {{name: page, type: string}}
event_time: event_time
stream: {{name: clicks_stream}}
tables:
  - name: per_minute
    kind: aggregate
    window: {{type: tumbling, size: 1m, grace: 30s}}
    aggregations:
      - {{name: n, fn: count}}
  - name: visits
    kind: aggregate
    window: {{type: session, gap: 1m}}
    aggregations:
      - {{name: n, fn: count}}
  - name: per_page
    kind: aggregate
    group_by: page
    window: {{type: tumbling, size: 1m}}
    aggregations:
      - {{name: n, fn: count}}
"""


@pytest.mark.parametrize(("partitions", "cuts"), [(1, [300]), (3, [97, 210]), (12, [1, 150])])
def test_in_order_records_are_never_late_whatever_the_partitions_and_the_cuts(
    spark: Any, tmp_path: Path, partitions: int, cuts: list[int]
) -> None:
    """300 records whose event times only increase (one every 2 s, keys spread over 30 users
    by Kafka's default partitioner) are all counted, none late, however many partitions the
    topic has and wherever the micro-batches are cut: each partition has its own stream time
    (a single stream time for the topic let partition 0's later records close the windows of
    the others)."""
    lake = lake_with(tmp_path, IN_ORDER.format(partitions=partitions))
    records = [
        (f"user-{i % 30}", {"event_time": _iso(2 * i / 60), "page": f"page-{i % 7}"})
        for i in range(300)
    ]
    # Kafka's default partitioner: the keys spread over the partitions.
    placed = {m.partition for m in produce(lake, "clicks", records[: cuts[0]], partition=None)}
    run_pipeline(spark, lake)
    for lo, hi in itertools.pairwise([*cuts, 300]):
        placed |= {m.partition for m in produce(lake, "clicks", records[lo:hi], partition=None)}
        run_pipeline(spark, lake)
    assert placed == set(range(partitions))  # the records did spread over every partition
    for table in ("per_minute", "visits", "per_page"):
        assert sum(row["n"] for row in _windows(lake, table).values()) == 300, table
        assert _late(lake, table) == [], table
    assert len(_windows(lake, "per_page")) == 70  # 7 pages x 10 one-minute windows


V1_LAKE = Path(__file__).parents[1] / "data" / "stream_time_v1" / "lake"


def test_a_lake_built_with_one_stream_time_per_topic_is_rebuilt_by_its_next_run(
    spark: Any, tmp_path: Path
) -> None:
    """A lake whose windowed tables were built when stream time was one per topic (written by
    that code: tests/data/stream_time_v1/make_lake.py) is put right by the next pipeline run:
    each windowed table is rebuilt with a stream time per partition, publishing only the rows
    that differ, and the late tables lose the records that were never late."""
    shutil.copytree(V1_LAKE, tmp_path / "lake")
    lake = Settings.from_env(tmp_path / "lake" / "home", tmp_path / "lake" / "contracts")
    tables = ("orders_per_minute", "order_sessions")
    # As the earlier rule left them: 120 in-order records over 3 partitions, many sent to late.
    assert {t: len(_late(lake, t)) for t in tables} == {
        "orders_per_minute": 50,
        "order_sessions": 48,
    }
    store = DeltaStore(spark)
    before = {t: store.version(lake.gold_path(t)) for t in tables}
    contract = Catalog.load(lake.contracts_dir).topic("orders")
    planned = run_layer(spark, lake, contract, "gold", request=RunRequest(dry_run=True))
    for t in tables:
        assert any(
            line.startswith(f"gold {t} (dry run): built when stream time was one per table")
            for line in planned
        ), (t, planned)
    assert {t: store.version(lake.gold_path(t)) for t in tables} == before
    lines = run_pipeline(spark, lake)
    for t in tables:
        assert any(
            # (A checkout gives the landing files new times: bronze reads them again, finds
            # every offset re-delivered, and the stream may gain an empty version.)
            line.startswith(f"gold {t}: rebuilt from input versions 0..")
            and line.endswith("rebuilt with a stream time per partition)")
            for line in lines
        ), (t, lines)
        assert sum(row["n"] for row in _windows(lake, t).values()) == 120, t
        assert _late(lake, t) == [], t
    # One commit per table, changing only what differs: 48 one-minute windows per user were
    # right for partition 0's users and stay as they were.
    feed = changes_arrow(lake.gold_path("orders_per_minute"), before["orders_per_minute"] + 1)
    assert set(feed.column("_commit_version").to_pylist()) == {before["orders_per_minute"] + 1}
    rows = {
        (r["user"], r["window_start"])
        for r in read_arrow(lake.gold_path("orders_per_minute")).to_pylist()
    }
    changed = {(r["user"], r["window_start"]) for r in feed.to_pylist()}
    assert 0 < len(changed) < len(rows)
    # The next micro-batch goes on incrementally, with nothing to rebuild.
    more = [
        (f"user-{i % 20}", {"event_time": _iso(2 * i / 60), "amount": i}) for i in range(120, 180)
    ]
    produce(lake, "orders", more, partition=None)
    lines = run_pipeline(spark, lake)
    assert not [line for line in lines if "rebuilt" in line], lines
    for t in tables:
        assert sum(row["n"] for row in _windows(lake, t).values()) == 180, t
        assert _late(lake, t) == [], t


SESSION_TABLE = """\
  - name: visits
    kind: aggregate
    window: {type: session, gap: 5m, grace: 10m}
    aggregations:
      - {name: n, fn: count}
      - {name: total, fn: sum, field: amount}
      - {name: mean, fn: avg, field: amount}
      - {name: pages, fn: collect, field: page}
      - {name: first_page, fn: earliest, field: page}
      - {name: last_page, fn: latest, field: page}
      - {name: distinct_pages, fn: count_distinct, field: page}
      - {name: low, fn: min, field: amount}
      - {name: high, fn: max, field: amount}
"""


def _session(pages: list[str], amounts: list[int]) -> dict[str, Any]:
    return {
        "n": len(pages),
        "total": sum(amounts),
        "mean": sum(amounts) / len(amounts),
        "pages": pages,
        "first_page": pages[0],
        "last_page": pages[-1],
        "distinct_pages": len(set(pages)),
        "low": min(amounts),
        "high": max(amounts),
    }


def test_sessions_merge_across_micro_batches_and_late_records(spark: Any, tmp_path: Path) -> None:
    lake = lake_with(tmp_path, HEAD + SESSION_TABLE)
    _produce(
        lake,
        [
            _ev("a", 0, "home", 1),
            _ev("a", 2, "cart", 2),
            _ev("a", 10, "home", 3),
            _ev("b", 1, "home", 7),
            _ev("b", 4, "pay", 8),
        ],
    )
    run_pipeline(spark, lake)
    assert _windows(lake, "visits") == {
        ("a", 0, 2): _session(["home", "cart"], [1, 2]),
        ("a", 10, 10): _session(["home"], [3]),
        ("b", 1, 4): _session(["home", "pay"], [7, 8]),
    }
    first = DeltaStore(spark).version(lake.gold_path("visits"))
    _produce(
        lake,
        [
            _ev("a", 6, "bridge", 4),  # within 5m of [0, 2] and of [10, 10]: merges them
            _ev("b", 3, "back", 9),  # inside [1, 4]: updated in place
            _ev("c", 60, "x", 1),  # stream time 60: a's and b's sessions close (end + 15 < 60)
            _ev("a", 23, "late", 1),  # no open session of a near 23, and 23 + 15 < 60: late
            _ev("a", 45, "on-time", 1),  # 45 + 15 = 60 is not < 60: a new session
        ],
    )
    run_pipeline(spark, lake)
    assert _windows(lake, "visits") == {
        # arrival order, not event-time order, for collect/earliest/latest (ksqlDB's by-offset)
        ("a", 0, 10): _session(["home", "cart", "home", "bridge"], [1, 2, 3, 4]),
        ("a", 45, 45): _session(["on-time"], [1]),
        ("b", 1, 4): _session(["home", "pay", "back"], [7, 8, 9]),
        ("c", 60, 60): _session(["x"], [1]),
    }
    # The changelog: the merged sessions' rows are deleted (Kafka's tombstones for them), the
    # merged one inserted, the one grown in place updated.
    feed = changes_arrow(lake.gold_path("visits"), (first or 0) + 1).to_pylist()
    got = sorted(
        (r["_change_type"], r["user"], _minutes(r["window_start"]), _minutes(r["window_end"]))
        for r in feed
    )
    assert got == [
        ("delete", "a", 0, 2),
        ("delete", "a", 10, 10),
        ("insert", "a", 0, 10),
        ("insert", "a", 45, 45),
        ("insert", "c", 60, 60),
        ("update_postimage", "b", 1, 4),
        ("update_preimage", "b", 1, 4),
    ]
    late = _late(lake, "visits")
    assert [(r["page"], r["reason"]) for r in late] == [
        (
            "late",
            "session window [2026-01-01T00:23:00.000Z, 2026-01-01T00:23:00.000Z] closed at "
            "stream time 2026-01-01T01:00:00.000Z; gap 5m, grace 10m",
        )
    ]
    # The state keeps the open sessions' records only: a's [0, 10] and b's [1, 4] are closed.
    state = read_arrow(lake.state_path("visits")).to_pylist()
    assert sorted((r["user"], r["page"]) for r in state) == [("a", "on-time"), ("c", "x")]


def test_a_batch_commits_the_late_table_and_the_state_only_when_they_change(
    spark: Any, tmp_path: Path
) -> None:
    lake = lake_with(
        tmp_path,
        HEAD
        + SESSION_TABLE
        + """\
  - name: per_minute
    kind: aggregate
    window: {type: tumbling, size: 1m, grace: 1m}
    aggregations:
      - {name: n, fn: count}
""",
    )
    store = DeltaStore(spark)
    paths = {
        "gold": lake.gold_path("visits"),
        "late": lake.late_path("visits"),
        "state": lake.state_path("visits"),
        "tumbling gold": lake.gold_path("per_minute"),
        "tumbling late": lake.late_path("per_minute"),
    }

    def commits() -> dict[str, int]:
        return {name: store.version(path) for name, path in paths.items()}

    _produce(lake, [_ev("a", 0, "home"), _ev("a", 60, "later")])  # in order: nothing late
    run_pipeline(spark, lake)
    created = commits()
    assert _late(lake, "visits") == [] and _late(lake, "per_minute") == []

    _produce(lake, [("a", None), ("b", None)])  # tombstones: windows do not take them
    run_pipeline(spark, lake)
    assert commits() == {
        **created,
        "gold": created["gold"] + 1,  # its position moves on
        "tumbling gold": created["tumbling gold"] + 1,
    }

    _produce(lake, [_ev("b", 1, "late")])  # behind stream time 60 in both tables: late only
    run_pipeline(spark, lake)
    assert commits() == {
        "gold": created["gold"] + 2,
        "late": created["late"] + 1,
        "state": created["state"],
        "tumbling gold": created["tumbling gold"] + 2,
        "tumbling late": created["tumbling late"] + 1,
    }
    assert [r["page"] for r in _late(lake, "visits")] == ["late"]
    assert [r["page"] for r in _late(lake, "per_minute")] == ["late"]

    _produce(lake, [_ev("a", 62, "joins")])  # joins a's open session [60, 60]
    run_pipeline(spark, lake)
    after = commits()
    assert after["state"] == created["state"] + 1 and after["late"] == created["late"] + 1
    assert _windows(lake, "visits")[("a", 60, 62)]["pages"] == ["later", "joins"]


def test_a_crash_between_commits_is_finished_by_the_next_run_without_double_counting(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lake = lake_with(tmp_path, HEAD + SESSION_TABLE)
    real_append = delta_spark.append

    def crash_on(path: Path) -> None:
        """Die at the first write to ``path`` that would commit (not one already applied)."""

        def append(df: Any, target: Path, **kwargs: Any) -> Any:
            if target != path:  # another table (the quality ledger's Txns are a list)
                return real_append(df, target, **kwargs)
            txn = kwargs["txn"]
            done = DeltaStore(spark).transaction_version(target, txn.app_id)
            if (done if done is not None else -1) < txn.version:
                raise RuntimeError(f"crash before committing {path.name}")
            return real_append(df, target, **kwargs)

        monkeypatch.setattr(delta_spark, "append", append)

    # Batch 1 dies after the gold and late commits, before the state's.
    _produce(lake, [_ev("a", 0, "p1", 1), _ev("a", 10, "p2", 2)])
    crash_on(lake.state_path("visits"))
    with pytest.raises(RuntimeError, match="crash before committing"):
        run_pipeline(spark, lake)
    monkeypatch.undo()
    # Batch 2 arrives meanwhile. The next run finishes batch 1, then dies in batch 2 after its
    # gold commit, before its late commit; the run after that finishes batch 2.
    _produce(
        lake,
        [
            _ev("a", 2, "p3", 3),  # joins [0, 0] (open: 0 + 15 >= 10)
            _ev("a", 30, "p4", 4),  # stream time 30: [0, 2] and [10, 10] close
            _ev("a", 1, "p5", 5),  # 1 + 15 < 30 and no open session near: late
            _ev("a", 16, "p6", 6),  # 16 + 15 >= 30: a new session
        ],
    )
    crash_on(lake.late_path("visits"))
    with pytest.raises(RuntimeError, match="crash before committing"):
        run_pipeline(spark, lake)
    monkeypatch.undo()
    run_pipeline(spark, lake)
    run_pipeline(spark, lake)
    assert _windows(lake, "visits") == {
        ("a", 0, 2): _session(["p1", "p3"], [1, 3]),
        ("a", 10, 10): _session(["p2"], [2]),
        ("a", 16, 16): _session(["p6"], [6]),
        ("a", 30, 30): _session(["p4"], [4]),
    }
    assert [r["page"] for r in _late(lake, "visits")] == ["p5"]
    state = read_arrow(lake.state_path("visits")).to_pylist()
    assert sorted(r["page"] for r in state) == ["p4", "p6"]


# -- reprocessing -----------------------------------------------------------------------------

REPROCESSED = """\
  - name: tumbling
    kind: aggregate
    window: {type: tumbling, size: 2m, grace: 1m}
    aggregations:
      - {name: n, fn: count}
      - {name: pages, fn: collect, field: page}
  - name: sessions
    kind: aggregate
    window: {type: session, gap: 2m, grace: 1m}
    aggregations:
      - {name: n, fn: count}
      - {name: pages, fn: collect, field: page}
"""


def test_reprocess_moves_the_stream_time_back_with_the_position(spark: Any, tmp_path: Path) -> None:
    """A rebuild from an earlier input version moves the table's position back; its stream time
    must move back with it (carried from the rebuilt table's commit, or computed again from the
    input), so the batches re-read afterwards are judged as they were the first time: the
    tables end as those of a lake that got the same batches and no reprocess (whose windows the
    Kafka Streams oracle checks in test_semantics)."""
    from lakehouse.tables.rebuild import refresh

    events = [_ev("a", m, f"r{i}") for i, m in enumerate([0, 4, 1, 2, 9, 1, 7, 3])]
    reprocessed = lake_with(tmp_path / "reprocessed", HEAD + REPROCESSED)
    straight = lake_with(tmp_path / "straight", HEAD + REPROCESSED)
    for lake in (reprocessed, straight):
        _produce(lake, events[:3])
        run_pipeline(spark, lake)
        _produce(lake, events[3:6])
        run_pipeline(spark, lake)  # stream time 9: would make the re-read batch's records late
    catalog = Catalog.load(reprocessed.contracts_dir)
    contract = catalog.topic("clicks")
    for spec in contract.tables:
        refresh(spark, reprocessed, catalog, contract, spec, from_version=2)  # before batch 2
    for lake in (reprocessed, straight):
        _produce(lake, events[6:])
        run_pipeline(spark, lake)
    for name in ("tumbling", "sessions"):
        assert _windows(reprocessed, name) == _windows(straight, name), name
        judged = ("page", "window_start", "window_end", "stream_time", "reason")
        assert [[r[c] for c in judged] for r in _late(reprocessed, name)] == [
            [r[c] for c in judged] for r in _late(straight, name)
        ], name
    # [0, 2) closes at 3: r2 (1, at 4) and r5 (1, at 9); [6, 8) and [2, 4) close by 9: r6, r7
    assert [r["page"] for r in _late(straight, "tumbling")] == ["r2", "r5", "r6", "r7"]
