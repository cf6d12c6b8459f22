"""Grouped aggregations over a stream and over a table (Kafka Streams' KGroupedStream and
KGroupedTable), re-keying by a value field, and averages, built incrementally in micro-batches."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from lakehouse.contracts.catalog import Catalog
from lakehouse.runtime.config import Settings
from lakehouse.storage import read_arrow
from lakes import lake_with, produce, run_pipeline

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


def _table(lake: Settings, name: str, key: str) -> dict[Any, dict[str, Any]]:
    rows = read_arrow(lake.gold_path(name)).to_pylist()
    return {
        r[key]: {c: v for c, v in r.items() if c != key and not c.startswith("__")} for r in rows
    }


def test_seed_example_stream_sum_7_table_sum_5(spark: Any, tmp_path: Path) -> None:
    lake = lake_with(tmp_path, CONTRACT)
    produce(lake, "moves", [("k1", {"amount": 2, "city": "Oslo"})])
    run_pipeline(spark, lake)
    produce(lake, "moves", [("k1", {"amount": 5, "city": "Oslo"})])
    run_pipeline(spark, lake)
    assert _table(lake, "stream_totals", "user") == {"k1": {"n": 2, "total": 7, "mean": 3.5}}
    assert _table(lake, "table_totals", "user") == {"k1": {"n": 1, "total": 5, "mean": 5.0}}


def test_rekeyed_table_moves_a_key_between_groups_and_tombstones_take_back(
    spark: Any, tmp_path: Path
) -> None:
    lake = lake_with(tmp_path, CONTRACT)
    produce(
        lake,
        "moves",
        [
            ("ann", {"amount": 10, "city": "Oslo"}),
            ("bob", {"amount": 1, "city": "Oslo"}),
            ("cy", {"amount": 4, "city": "Rome"}),
        ],
    )
    run_pipeline(spark, lake)
    assert _table(lake, "city_table", "city") == {
        "Oslo": {"n": 2, "total": 11, "mean": 5.5},
        "Rome": {"n": 1, "total": 4, "mean": 4.0},
    }
    # ann moves to Rome; cy's account is deleted; a record without a city counts nowhere.
    produce(
        lake,
        "moves",
        [("ann", {"amount": 20, "city": "Rome"}), ("cy", None), ("dee", {"amount": 3})],
    )
    run_pipeline(spark, lake)
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


PAYMENTS = """\
topic: payments
partitions: 2
key: {format: string, name: customer}
value:
  format: json
  fields:
    - {name: amount, type: decimal, precision: 12, scale: 2}
    - {name: region, type: string}
stream: {name: payments_stream}
tables:
  - name: customer_totals
    kind: aggregate
    aggregations:
      - {name: n, fn: count}
      - {name: total, fn: sum, field: amount}
      - {name: mean, fn: avg, field: amount}
      - {name: smallest, fn: min, field: amount}
      - {name: largest, fn: max, field: amount}
  - name: region_totals
    kind: aggregate
    source: table
    group_by: region
    aggregations:
      - {name: total, fn: sum, field: amount}
      - {name: mean, fn: avg, field: amount}
"""


def test_decimal_sums_and_averages_are_exact_and_too_fine_a_value_is_quarantined(
    spark: Any, tmp_path: Path
) -> None:
    """1999.13 + 1002.76 + 535.69 is 3537.5800000000004 in binary floating point; a decimal
    field's sum is 3537.58, and its average the exact quotient rounded half up to 6 places."""
    import io

    from lakehouse.topics import produce as producing

    lake = lake_with(tmp_path, PAYMENTS)
    contract = Catalog.load(lake.contracts_dir).topic("payments")

    def produce_lines(*events: tuple[str, str]) -> None:
        """`lakehouse produce` of (customer, the amount as the JSON line writes it)."""
        lines = "".join(
            f'{{"key": "{k}", "value": {{"amount": {a}, "region": "eu"}}}}\n' for k, a in events
        )
        assert producing.produce(lake, contract, io.StringIO(lines), io.StringIO()) == 0

    produce_lines(("ann", "1999.13"), ("bob", '"0.10"'), ("ann", "1002.76"))
    run_pipeline(spark, lake)
    produce_lines(("ann", "535.69"), ("bob", "0.2"))
    # Another producer's value with more digits after the point than the scale (lakehouse
    # produce refuses it): silver quarantines it rather than round it.
    produce(lake, "payments", [("ann", b'{"amount": 12.505, "region": "eu"}')])
    run_pipeline(spark, lake)

    assert _table(lake, "customer_totals", "customer") == {
        "ann": {
            "n": 3,
            "total": Decimal("3537.58"),
            "mean": Decimal("1179.193333"),
            "smallest": Decimal("535.69"),
            "largest": Decimal("1999.13"),
        },
        "bob": {
            "n": 2,
            "total": Decimal("0.30"),
            "mean": Decimal("0.150000"),
            "smallest": Decimal("0.10"),
            "largest": Decimal("0.20"),
        },
    }
    # Each key's latest amount (ann 535.69, bob 0.20), old ones taken back exactly.
    assert _table(lake, "region_totals", "region") == {
        "eu": {"total": Decimal("535.89"), "mean": Decimal("267.945000")}
    }
    schema = read_arrow(lake.gold_path("customer_totals")).schema
    assert [str(schema.field(c).type) for c in ("total", "mean", "smallest")] == [
        "decimal128(22, 2)",
        "decimal128(16, 6)",
        "decimal128(12, 2)",
    ]
    quarantined = read_arrow(lake.quarantine_path("silver", "payments_stream")).to_pylist()
    assert [r["reason"] for r in quarantined] == [
        "field 'amount' has more than 2 digit(s) after the point for a decimal(12,2): 12.505"
    ]
