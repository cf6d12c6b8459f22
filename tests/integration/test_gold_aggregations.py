"""Grouped aggregations over a stream and over a table (Kafka Streams' KGroupedStream and
KGroupedTable), re-keying by a value field, and averages, built incrementally in micro-batches."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from lakehouse.contracts.model import Catalog
from lakehouse.pipeline.runner import run
from lakehouse.runtime.config import Settings
from lakehouse.storage import read_arrow
from lakehouse.topics.landing import Producer, Record
from lakes import histories, lake_with

pytestmark = pytest.mark.integration

CONTRACT = """\
topic: moves
partitions: 2
key: {format: string, name: user}
value:
  format: json
  fields:
    - {name: amount, type: long}
    - {name: city, type: string}
stream: {name: moves_stream}
tables:
  - name: stream_totals
    kind: aggregate
    aggregations:
      - {name: n, fn: count}
      - {name: total, fn: sum, field: amount}
      - {name: mean, fn: avg, field: amount}
  - name: table_totals
    kind: aggregate
    source: table
    aggregations:
      - {name: n, fn: count}
      - {name: total, fn: sum, field: amount}
      - {name: mean, fn: avg, field: amount}
  - name: city_stream
    kind: aggregate
    group_by: city
    aggregations:
      - {name: n, fn: count}
      - {name: total, fn: sum, field: amount}
  - name: city_table
    kind: aggregate
    group_by: city
    source: table
    aggregations:
      - {name: n, fn: count}
      - {name: total, fn: sum, field: amount}
      - {name: mean, fn: avg, field: amount}
"""


def _lake(root: Path) -> Settings:
    return lake_with(root, {"moves": CONTRACT})


Event = tuple[str | None, dict[str, Any] | None]


def _produce(lake: Settings, events: list[Event]) -> None:
    Producer(lake, "moves", 2).send_batch(
        Record(
            None if k is None else k.encode(),
            None if v is None else json.dumps(v).encode(),
            partition=0,  # one partition: offset order is the order of the history
        )
        for k, v in events
    )


def _run(spark: Any, lake: Settings) -> None:
    run(spark, lake, Catalog.load(lake.contracts_dir), echo=lambda _line: None)


def _table(lake: Settings, name: str, key: str) -> dict[Any, dict[str, Any]]:
    rows = read_arrow(lake.gold_path(name)).to_pylist()
    return {
        r[key]: {c: v for c, v in r.items() if c != key and not c.startswith("__")} for r in rows
    }


def test_seed_example_stream_sum_7_table_sum_5(spark: Any, tmp_path: Path) -> None:
    lake = _lake(tmp_path)
    _produce(lake, [("k1", {"amount": 2, "city": "Oslo"})])
    _run(spark, lake)
    _produce(lake, [("k1", {"amount": 5, "city": "Oslo"})])
    _run(spark, lake)
    assert _table(lake, "stream_totals", "user") == {"k1": {"n": 2, "total": 7, "mean": 3.5}}
    assert _table(lake, "table_totals", "user") == {"k1": {"n": 1, "total": 5, "mean": 5.0}}


def test_rekeyed_table_moves_a_key_between_groups_and_tombstones_take_back(
    spark: Any, tmp_path: Path
) -> None:
    lake = _lake(tmp_path)
    _produce(
        lake,
        [
            ("ann", {"amount": 10, "city": "Oslo"}),
            ("bob", {"amount": 1, "city": "Oslo"}),
            ("cy", {"amount": 4, "city": "Rome"}),
        ],
    )
    _run(spark, lake)
    assert _table(lake, "city_table", "city") == {
        "Oslo": {"n": 2, "total": 11, "mean": 5.5},
        "Rome": {"n": 1, "total": 4, "mean": 4.0},
    }
    # ann moves to Rome; cy's account is deleted; a record without a city counts nowhere.
    _produce(lake, [("ann", {"amount": 20, "city": "Rome"}), ("cy", None), ("dee", {"amount": 3})])
    _run(spark, lake)
    assert _table(lake, "city_table", "city") == {
        "Oslo": {"n": 1, "total": 1, "mean": 1.0},
        "Rome": {"n": 1, "total": 20, "mean": 20.0},
    }
    # The same events read as a stream only ever add.
    assert _table(lake, "city_stream", "city") == {
        "Oslo": {"n": 2, "total": 11},
        "Rome": {"n": 2, "total": 24},
    }
    # The changelog of the table aggregation shows Oslo's update (a key moved away).
    from lakehouse.storage import changes_arrow

    feed = changes_arrow(lake.gold_path("city_table"), 2).to_pylist()
    assert sorted((r["_change_type"], r["city"], r["n"]) for r in feed if r["city"] == "Oslo") == [
        ("update_postimage", "Oslo", 1),
        ("update_preimage", "Oslo", 2),
    ]


# -- property: incremental == full recompute == a plain-Python model ---------------------------

KEYS = st.sampled_from(["a", "b", "c", None])
VALUES = st.one_of(
    st.none(),  # a tombstone
    st.fixed_dictionaries(
        {
            "amount": st.one_of(st.none(), st.integers(-5, 50)),
            "city": st.one_of(st.none(), st.sampled_from(["Oslo", "Rome"])),
        }
    ),
)
HISTORIES = st.lists(st.tuples(KEYS, VALUES), min_size=1, max_size=10)


def _model(history: list[Event]) -> dict[str, dict[Any, dict[str, Any]]]:
    """Kafka Streams' semantics written plainly: the stream aggregates every event; the table
    aggregates each key's latest value (a tombstone removes the key)."""
    latest: dict[str, dict[str, Any]] = {}
    stream: dict[str, list[dict[str, Any]]] = {}
    for key, value in history:
        if key is None:
            continue  # null keys are ignored by tables and aggregations
        if value is None:
            latest.pop(key, None)
            continue
        latest[key] = value
        stream.setdefault(key, []).append(value)

    def agg(
        groups: dict[Any, list[dict[str, Any]]], mean: bool = True
    ) -> dict[Any, dict[str, Any]]:
        out = {}
        for g, values in groups.items():
            amounts = [v["amount"] for v in values if v["amount"] is not None]
            row: dict[str, Any] = {"n": len(values), "total": sum(amounts) if amounts else None}
            if mean:
                row["mean"] = sum(amounts) / len(amounts) if amounts else None
            out[g] = row
        return out

    by_city: dict[Any, list[dict[str, Any]]] = {}
    for v in latest.values():
        if v["city"] is not None:
            by_city.setdefault(v["city"], []).append(v)
    stream_city: dict[Any, list[dict[str, Any]]] = {}
    for values in stream.values():
        for v in values:
            if v["city"] is not None:
                stream_city.setdefault(v["city"], []).append(v)
    return {
        "stream_totals": agg(stream),
        "table_totals": agg({k: [v] for k, v in latest.items()}),
        "city_stream": agg(stream_city, mean=False),
        "city_table": agg(by_city),
    }


KEY_OF = {
    "stream_totals": "user",
    "table_totals": "user",
    "city_stream": "city",
    "city_table": "city",
}


def _approx(rows: dict[Any, dict[str, Any]]) -> dict[Any, dict[str, Any]]:
    return {
        k: {c: (round(x, 9) if isinstance(x, float) else x) for c, x in v.items()}
        for k, v in rows.items()
    }


# A key moves, is deleted and comes back, across and within batches.
MOVES: list[Event] = [
    ("a", {"amount": 1, "city": "Oslo"}),
    ("b", {"amount": None, "city": "Oslo"}),
    ("a", {"amount": 2, "city": "Rome"}),
    ("a", None),
    ("a", {"amount": 3, "city": "Oslo"}),
    (None, {"amount": 9, "city": "Rome"}),
    ("b", {"amount": 4, "city": None}),
]


@pytest.mark.property
@histories()
@given(history=HISTORIES, cuts=st.lists(st.integers(1, 9), max_size=2, unique=True))
@example(history=MOVES, cuts=[3, 5])
@example(history=MOVES, cuts=[])  # one batch: a full recompute
@example(  # a key's only non-null amount is replaced by a null: its table sum is null, not 0
    history=[
        ("c", {"amount": 38, "city": None}),
        ("c", {"amount": None, "city": None}),
    ],
    cuts=[1],
)
def test_every_batching_of_a_history_equals_the_model(
    spark: Any, tmp_path_factory: pytest.TempPathFactory, history: list[Event], cuts: list[int]
) -> None:
    """Micro-batches cut anywhere (no cut: the whole history in one batch, a full recompute)
    end in the tables the model computes from the history."""
    lake = _lake(tmp_path_factory.mktemp("prop"))
    bounds = [0, *sorted(c for c in cuts if c < len(history)), len(history)]
    for lo, hi in itertools.pairwise(bounds):
        _produce(lake, history[lo:hi])
        _run(spark, lake)
    expected = _model(history)
    for name, key in KEY_OF.items():
        # Exactly: a table aggregation deletes a group its last key left.
        assert _approx(_table(lake, name, key)) == _approx(expected[name]), (name, history, bounds)
