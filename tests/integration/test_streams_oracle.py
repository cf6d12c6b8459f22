"""The Kafka Streams oracle (tests/oracle.py) against Kafka Streams behaviour checked by hand: one
history per table kind, small enough to follow, each with what Kafka Streams drops. These pin
what the property tests compare the platform with; where Kafka Streams does something one might
not guess, the test says so."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from oracle import OracleError, StreamsOracle, left, right

pytestmark = pytest.mark.integration


def _aggregate(
    aggregations: Sequence[tuple[str, str, str | None]],
    *,
    source: str = "stream",
    group_by: str | None = None,
    window: dict[str, Any] | None = None,
) -> dict[str, Any]:
    return {
        "kind": "aggregate",
        "source": source,
        "group_by": group_by,
        "aggregations": [{"name": n, "fn": fn, "field": f} for n, fn, f in aggregations],
        "window": window,
    }


COUNT: list[tuple[str, str, str | None]] = [("n", "count", None)]


def test_latest_value_per_key_a_tombstone_deletes_and_a_null_key_is_skipped(
    streams_oracle: StreamsOracle,
) -> None:
    result = streams_oracle.compute(
        {"kind": "latest"},
        [
            left("a", {"x": 1}, 10),
            left(None, {"x": 2}, 11),
            left("b", {"x": 3}, 12),
            left("a", None, 13),
            left("c", None, 14),
            left("b", {"x": 4}, 5),  # older than b's value: a plain table takes it anyway
        ],
    )
    assert result.result == "table"
    assert result.table() == {("b", None): {"x": 4}}
    assert result.dropped == [1]
    assert [(c.key, c.value, c.ts) for c in result.by(3)] == [("a", None, 13)]
    # A table read without a store forwards the tombstone of a key it never had.
    assert [(c.key, c.value) for c in result.by(4)] == [("c", None)]


def test_a_stream_aggregate_skips_null_keys_and_null_values(
    streams_oracle: StreamsOracle,
) -> None:
    """Without a window, KStreamAggregate drops a record with a null value before the aggregator
    sees it ("Skipping record due to null key or value"): count without a field does not count
    it. Every function, on its own values."""
    table = _aggregate(
        [
            ("n", "count", None),
            ("amounts", "count", "amount"),
            ("total", "sum", "amount"),
            ("mean", "avg", "amount"),
            ("low", "min", "amount"),
            ("high", "max", "amount"),
            ("pages", "count_distinct", "page"),
            ("first", "earliest", "page"),
            ("last", "latest", "page"),
            ("trail", "collect", "page"),
        ]
    )
    result = streams_oracle.compute(
        table,
        [
            left("u1", {"page": "a", "amount": 3}, 1),
            left("u1", None, 2),
            left("u1", {"page": "b"}, 3),
            left(None, {"page": "a", "amount": 2}, 4),
            left("u2", {"page": None, "amount": 5.5}, 5),
            left("u1", {"page": "a", "amount": 4}, 6),
        ],
    )
    assert result.dropped == [1, 3]
    assert result.table() == {
        ("u1", None): {
            "n": 3,
            "amounts": 2,
            "total": 7,
            "mean": 3.5,
            "low": 3,
            "high": 4,
            "pages": 2,
            "first": "a",
            "last": "a",
            "trail": ["a", "b", "a"],
        },
        ("u2", None): {
            "n": 1,
            "amounts": 1,
            "total": 5.5,
            "mean": 5.5,
            "low": 5.5,
            "high": 5.5,
            "pages": 0,
            "first": None,
            "last": None,
            "trail": [],
        },
    }


def test_a_stream_grouped_by_a_field_drops_records_without_it(
    streams_oracle: StreamsOracle,
) -> None:
    """groupBy re-keys through a repartition topic, which drops a null new key (a null value
    too: its field is null); a null-key input record with the field is grouped."""
    result = streams_oracle.compute(
        _aggregate([*COUNT, ("users", "collect", "user")], group_by="page"),
        [
            left("k1", {"page": "a", "user": "u1"}, 1),
            left("k2", {"user": "u2"}, 2),
            left("k3", None, 3),
            left(None, {"page": "a", "user": "u3"}, 4),
            left("k4", {"page": 7, "user": "u4"}, 5),
        ],
    )
    assert result.dropped == [1, 2]
    assert result.table() == {
        ("7", None): {"n": 1, "users": ["u4"]},
        ("a", None): {"n": 2, "users": ["u1", "u3"]},
    }


def test_a_tumbling_window_drops_a_record_after_its_grace(streams_oracle: StreamsOracle) -> None:
    """Windows of 10 ms with 5 ms of grace: [0, 10) takes records while the partition's stream
    time is under 15 (its end plus grace). Stream time is the partition's, not the key's. A
    windowed aggregate, unlike a plain one, passes a null value to the aggregator: it counts."""
    result = streams_oracle.compute(
        _aggregate(COUNT, window={"type": "tumbling", "size": 10, "grace": 5}),
        [
            left("a", {}, 1),
            left("a", {}, 12),
            left("a", {}, 9),  # stream time 12: [0, 10) is open until 15
            left("a", None, 13),
            left("a", {}, 15),
            left("a", {}, 9),  # stream time 15: [0, 10) has closed
            left("b", {}, 5),  # b's first record, but the partition's stream time is 15
        ],
    )
    assert result.dropped == [5, 6]
    assert result.table() == {("a", (0, 10)): {"n": 2}, ("a", (10, 20)): {"n": 3}}
    assert [(c.window, c.value) for c in result.by(3)] == [((10, 20), {"n": 2})]


def test_a_hopping_window_record_can_be_late_for_some_of_its_windows(
    streams_oracle: StreamsOracle,
) -> None:
    """Windows of 10 ms every 5 ms, no grace: a record at 8 falls in [0, 10) and [5, 15); at
    stream time 12 the first has closed, the second takes it."""
    result = streams_oracle.compute(
        _aggregate(COUNT, window={"type": "hopping", "size": 10, "advance": 5, "grace": 0}),
        [left("a", {}, 7), left("a", {}, 12), left("a", {}, 8)],
    )
    assert [c.window for c in result.by(0)] == [(0, 10), (5, 15)]
    assert [c.window for c in result.by(1)] == [(5, 15), (10, 20)]
    assert [(c.window, c.value) for c in result.by(2)] == [((5, 15), {"n": 3})]
    assert result.dropped == []
    assert result.table() == {
        ("a", (0, 10)): {"n": 1},
        ("a", (5, 15)): {"n": 3},
        ("a", (10, 20)): {"n": 1},
    }


def test_a_record_between_two_sessions_merges_them(streams_oracle: StreamsOracle) -> None:
    """Sessions of 10 ms of inactivity: 30 and 10 are two sessions until 20 bridges them; Kafka
    Streams deletes both (a tombstone each) and writes the merged one, its end inclusive.
    earliest, latest and collect follow the input order across the merge."""
    result = streams_oracle.compute(
        _aggregate(
            [
                *COUNT,
                ("first", "earliest", "page"),
                ("last", "latest", "page"),
                ("trail", "collect", "page"),
                ("pages", "count_distinct", "page"),
                ("total", "sum", "amount"),
            ],
            window={"type": "session", "gap": 10, "grace": 100},
        ),
        [
            left("a", {"page": "p", "amount": 1}, 30),
            left("a", {"page": "q", "amount": 2}, 10),
            left("a", {"page": "r"}, 20),
        ],
    )
    assert [(c.window, c.value) for c in result.by(2)] == [
        ((10, 10), None),
        ((30, 30), None),
        (
            (10, 30),
            {
                "n": 3,
                "first": "p",
                "last": "r",
                "trail": ["p", "q", "r"],
                "pages": 3,
                "total": 3,
                "__first": 0,
                "__last": 2,
                "__trail": [0, 1, 2],
                "__pages": ["q", "p", "r"],
                "__total": {"sum": 3, "count": 2},
            },
        ),
    ]
    assert result.table() == {
        ("a", (10, 30)): {
            "n": 3,
            "first": "p",
            "last": "r",
            "trail": ["p", "q", "r"],
            "pages": 3,
            "total": 3,
        }
    }


def test_a_late_record_does_not_open_a_session(streams_oracle: StreamsOracle) -> None:
    """No grace: at stream time 100 a session ending before 90 (100 - gap) has closed; a record
    at 85 would be one, and is dropped. A null value is aggregated (counted)."""
    result = streams_oracle.compute(
        _aggregate(COUNT, window={"type": "session", "gap": 10, "grace": 0}),
        [left("a", {}, 100), left("a", {}, 85), left("a", {}, 90), left("b", None, 100)],
    )
    assert result.dropped == [1]
    assert result.table() == {
        ("a", (90, 100)): {"n": 2},
        ("b", (100, 100)): {"n": 1},
    }


def test_a_table_aggregate_keeps_a_group_whose_last_member_left(
    streams_oracle: StreamsOracle,
) -> None:
    """groupBy on a table: a member moving from group x to y is subtracted from x, then added to
    y; a deleted member is subtracted; a group with no members left stays, its count 0."""
    result = streams_oracle.compute(
        _aggregate(
            [*COUNT, ("total", "sum", "amount"), ("mean", "avg", "amount")],
            source="table",
            group_by="g",
        ),
        [
            left("k1", {"g": "x", "amount": 1}, 1),
            left("k2", {"g": "x", "amount": 2}, 2),
            left("k1", {"g": "y", "amount": 1}, 3),
            left("k2", None, 4),
            left("k3", {"amount": 7}, 5),  # no group: dropped by the repartition
            left("k9", None, 6),  # deletes nothing
        ],
    )
    assert [(c.key, c.value and c.value["n"]) for c in result.by(2)] == [("x", 1), ("y", 1)]
    assert result.dropped == [4, 5]
    assert result.table(bookkeeping=True) == {
        ("x", None): {
            "n": 0,
            "total": None,
            "mean": None,
            "__total": {"sum": 0, "count": 0},
            "__mean": {"sum": 0, "count": 0},
            "__members": 0,
        },
        ("y", None): {
            "n": 1,
            "total": 1,
            "mean": 1.0,
            "__total": {"sum": 1, "count": 1},
            "__mean": {"sum": 1, "count": 1},
            "__members": 1,
        },
    }


STREAM_TABLE_HISTORY = [
    right("u", {"v": 20}, 20),
    left("u", {"c": 1}, 25),
    right("u", {"v": 10}, 10),  # out of order: a version before 20's
    left("u", {"c": 2}, 15),  # joins the version as of 15
    left("u", {"c": 3}, 5),  # before every version
    left(None, {"c": 4}, 30),
    right("u", None, 40),
    left("u", {"c": 5}, 41),
    left("u", {"c": 6}, 35),  # joins the version as of 35, though 40 deleted it
    left("u", None, 50),
]


def test_a_stream_table_join_reads_the_tables_version_as_of_each_record(
    streams_oracle: StreamsOracle,
) -> None:
    """The table side is a versioned store: a stream record joins the table's value as of its
    own timestamp; table updates join nothing (the output is a stream)."""
    inner = streams_oracle.compute(
        {"kind": "join", "type": "stream-table", "how": "inner", "on": None},
        STREAM_TABLE_HISTORY,
    )
    assert inner.result == "stream"
    assert [(c.cause, c.key, c.value, c.ts) for c in inner.changelog] == [
        (1, "u", {"left": {"c": 1}, "right": {"v": 20}}, 25),
        (3, "u", {"left": {"c": 2}, "right": {"v": 10}}, 15),
        (8, "u", {"left": {"c": 6}, "right": {"v": 20}}, 35),
    ]


def test_a_stream_table_left_join_passes_a_null_key_through(
    streams_oracle: StreamsOracle,
) -> None:
    """KIP-962: a left join emits a stream record with a null key, unjoined; a null value is
    still dropped."""
    result = streams_oracle.compute(
        {"kind": "join", "type": "stream-table", "how": "left", "on": None},
        STREAM_TABLE_HISTORY,
    )
    assert [(c.cause, c.key, c.value["right"] if c.value else "-") for c in result.changelog] == [
        (1, "u", {"v": 20}),
        (3, "u", {"v": 10}),
        (4, "u", None),
        (5, None, None),
        (7, "u", None),
        (8, "u", {"v": 20}),
    ]
    assert result.dropped == [0, 2, 6, 9]


def test_a_stream_table_join_on_a_field_rekeys_the_stream(streams_oracle: StreamsOracle) -> None:
    """``on``: the stream is re-keyed by the field (selectKey, then a repartition topic). A record
    without the field gets a null key, which a left join passes through."""
    table = {"kind": "join", "type": "stream-table", "how": "left", "on": "user"}
    result = streams_oracle.compute(
        table,
        [
            right("u1", {"name": "Ann"}, 1),
            left("e1", {"user": "u1"}, 2),
            left("e2", {"page": "a"}, 3),
            left("e3", {"user": "u2"}, 4),
        ],
    )
    assert [(c.key, c.value) for c in result.changelog] == [
        ("u1", {"left": {"user": "u1"}, "right": {"name": "Ann"}}),
        (None, {"left": {"page": "a"}, "right": None}),
        ("u2", {"left": {"user": "u2"}, "right": None}),
    ]


def test_table_table_joins_on_the_key_and_on_a_foreign_key(
    streams_oracle: StreamsOracle,
) -> None:
    history = [
        left("a", {"x": 1}, 1),
        right("a", {"y": 1}, 2),
        right("a", None, 3),
        left("a", None, 4),
        right("b", {"y": 2}, 5),
    ]
    table = {"kind": "join", "type": "table-table", "on": None}
    inner = streams_oracle.compute({**table, "how": "inner"}, history)
    assert [(c.cause, c.key, c.value) for c in inner.changelog] == [
        (1, "a", {"left": {"x": 1}, "right": {"y": 1}}),
        (2, "a", None),
    ]
    outer = streams_oracle.compute({**table, "how": "outer"}, history)
    assert outer.result == "table"
    assert outer.table() == {("b", None): {"left": None, "right": {"y": 2}}}
    assert outer.dropped == []

    # A foreign-key join: an order's "user" names the users table's key. A left join emits an
    # order whose user is unknown or missing; an inner join waits for the user.
    orders = [
        right("u1", {"name": "Ann"}, 1),
        left("o1", {"user": "u1"}, 2),
        left("o2", {"user": "u2"}, 3),
        left("o3", {}, 4),
        right("u2", {"name": "Bob"}, 5),
        right("u1", None, 6),
    ]
    fk = {"kind": "join", "type": "table-table", "on": "user"}
    assert streams_oracle.compute({**fk, "how": "left"}, orders).table() == {
        ("o1", None): {"left": {"user": "u1"}, "right": None},
        ("o2", None): {"left": {"user": "u2"}, "right": {"name": "Bob"}},
        ("o3", None): {"left": {}, "right": None},
    }
    fk_inner = streams_oracle.compute({**fk, "how": "inner"}, orders)
    assert [(c.cause, c.key, c.value and c.value["right"]) for c in fk_inner.changelog] == [
        (1, "o1", {"name": "Ann"}),
        (4, "o2", {"name": "Bob"}),
        (5, "o1", None),
    ]


def test_a_stream_stream_join_within_a_time_difference(streams_oracle: StreamsOracle) -> None:
    """Records join when their timestamps differ by 10 ms at most. A left join emits an unjoined
    left record only once its window has closed (stream time past its ts + 10 + 5 of grace), and
    the record that moved stream time is its cause; a null key it emits at once (KIP-962)."""
    table = {"kind": "join", "type": "stream-stream", "on": None, "within": 10, "grace": 5}
    history = [
        left("a", {"l": 1}, 100),
        right("a", {"r": 1}, 105),
        right("a", {"r": 2}, 120),
        left("b", {"l": 2}, 130),
        left("c", {"l": 3}, 131),
        left(None, {"l": 4}, 140),
        left("d", {"l": 5}, 146),  # past 130 + 15, not past 131 + 15
    ]
    inner = streams_oracle.compute({**table, "how": "inner"}, history)
    assert inner.result == "stream"
    assert [(c.cause, c.key, c.value) for c in inner.changelog] == [
        (1, "a", {"left": {"l": 1}, "right": {"r": 1}}),
    ]
    left_join = streams_oracle.compute({**table, "how": "left"}, history)
    assert [(c.cause, c.key, c.value, c.ts) for c in left_join.changelog] == [
        (1, "a", {"left": {"l": 1}, "right": {"r": 1}}, 105),
        (5, None, {"left": {"l": 4}, "right": None}, 140),
        (6, "b", {"left": {"l": 2}, "right": None}, 130),
    ]


def test_a_bad_request_is_refused_and_the_oracle_serves_the_next(
    streams_oracle: StreamsOracle,
) -> None:
    with pytest.raises(OracleError, match=r"an aggregate of a table supports count, sum and avg"):
        streams_oracle.compute(_aggregate([("low", "min", "x")], source="table"), [])
    with pytest.raises(OracleError, match=r'sum "total" of a value that is not a number: "x"'):
        streams_oracle.compute(_aggregate([("total", "sum", "x")]), [left("a", {"x": "x"}, 1)])
    with pytest.raises(OracleError, match=r'record 0: this table has no "right" input'):
        streams_oracle.compute({"kind": "latest"}, [right("a", {}, 1)])
    assert streams_oracle.compute({"kind": "latest"}, [left("a", {}, 1)]).table() == {
        ("a", None): {}
    }


def test_a_versioned_store_places_records_by_time_and_refuses_what_its_retention_dropped(
    streams_oracle: StreamsOracle,
) -> None:
    """KIP-889's store: a put finds its place among the key's versions whatever its arrival,
    a put at a version's own timestamp replaces it, a tombstone (a put of null) ends the value,
    a null key is skipped. get(key, asOf) answers the value and the version's timestamp (not its
    end: only the multi-version queries of KIP-968 fill validTo). With a history retention the
    store's stream time is the task's (every key's puts move it): a put older than it minus the
    retention is refused, and a get older than that answers nothing."""
    records = [
        left("a", {"x": 1}, 10),
        left("a", {"x": 2}, 30),
        left("a", {"x": 3}, 20),  # splits [10, 30)
        left(None, {"x": 9}, 5),
        left("a", None, 40),
        left("a", {"x": 4}, 25),
        left("a", {"x": 5}, 15),
        left("b", {"x": 6}, 5),
        left("a", {"x": 7}, 30),  # the same time as x=2: replaces it
    ]
    probes = [("a", t) for t in (9, 10, 19, 20, 29, 30, 40)] + [("b", 5)]

    def answers(result: Any) -> list[Any]:
        return [p if p is None else (p["value"]["x"], p["valid_from"]) for p in result.probes]

    kept = streams_oracle.compute({"kind": "history", "retention": None}, records, probes)
    assert _puts(kept) == [False] * 3 + [None] + [False] * 5
    assert answers(kept) == [None, (1, 10), (5, 15), (3, 20), (4, 25), (7, 30), None, (6, 5)]
    assert all(p is None or p["valid_to"] is None for p in kept.probes)

    recent = streams_oracle.compute({"kind": "history", "retention": 10}, records, probes)
    # Stream time 40 after the tombstone: 25, 15 and b's 5 are older than 40 - 10.
    assert _puts(recent) == [False] * 3 + [None, False, True, True, True, False]
    assert answers(recent) == [None, None, None, None, None, (7, 30), None, None]


def _puts(result: Any) -> list[bool | None]:
    """Per record of a history request: whether the store refused it (None: not put at all,
    a null key)."""
    out: list[bool | None] = []
    for i in range(len(result.caused)):
        changes = result.by(i)
        out.append(None if not changes else changes[0].value["not_put"])
    return out
