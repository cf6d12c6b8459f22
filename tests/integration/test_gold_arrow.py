"""Gold's Arrow path (lakehouse.tables_arrow) against Spark's: the same histories, cut into the
same micro-batches, must give the same tables whichever folds them."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from lakehouse.config import Settings
from lakehouse.contracts import Catalog
from lakehouse.errors import ConfigError
from lakehouse.landing import Producer, Record
from lakehouse.pipeline import run
from lakehouse.storage import read_arrow

pytestmark = pytest.mark.integration

PARTITIONS = 3
CONTRACT = f"""\
topic: trips
partitions: {PARTITIONS}
key: {{format: string, name: rider}}
value:
  format: json
  fields:
    - {{name: fare, type: long}}
    - {{name: seats, type: int}}
    - {{name: tip, type: double}}
    - {{name: city, type: string}}
    - {{name: at, type: timestamp}}
    - {{name: paid, type: boolean}}
stream: {{name: trips_stream}}
tables:
  - name: last_trip
    kind: latest
  - name: per_rider
    kind: aggregate
    aggregations:
      - {{name: n, fn: count}}
      - {{name: fares, fn: count, field: fare}}
      - {{name: fare_sum, fn: sum, field: fare}}
      - {{name: seat_sum, fn: sum, field: seats}}
      - {{name: tip_sum, fn: sum, field: tip}}
      - {{name: fare_avg, fn: avg, field: fare}}
      - {{name: tip_avg, fn: avg, field: tip}}
      - {{name: fare_min, fn: min, field: fare}}
      - {{name: seats_max, fn: max, field: seats}}
      - {{name: tip_max, fn: max, field: tip}}
      - {{name: city_min, fn: min, field: city}}
      - {{name: at_max, fn: max, field: at}}
      - {{name: paid_max, fn: max, field: paid}}
      - {{name: first_city, fn: earliest, field: city}}
      - {{name: last_city, fn: latest, field: city}}
      - {{name: last_tip, fn: latest, field: tip}}
  - name: per_city
    kind: aggregate
    group_by: city
    aggregations:
      - {{name: n, fn: count}}
      - {{name: fare_sum, fn: sum, field: fare}}
      - {{name: first_rider_fare, fn: earliest, field: fare}}
  - name: per_rider_table
    kind: aggregate
    source: table
    aggregations:
      - {{name: fare_sum, fn: sum, field: fare}}
"""
TABLES = {
    "last_trip": "rider",
    "per_rider": "rider",
    "per_city": "city",
    "per_rider_table": "rider",
}
ARROW_TABLES = {"last_trip", "per_rider", "per_city"}


def _lake(root: Path) -> Settings:
    contracts = root / "contracts"
    contracts.mkdir(parents=True, exist_ok=True)
    (contracts / "trips.yaml").write_text(CONTRACT)
    return Settings.from_env(root / "home", contracts)


Event = tuple[str | None, dict[str, Any] | None, int, int]  # key, value, partition, timestamp


def _produce(lake: Settings, events: list[Event]) -> None:
    Producer(lake, "trips", PARTITIONS).send_batch(
        Record(
            None if k is None else k.encode(),
            None if v is None else json.dumps(v).encode(),
            timestamp_ms=1_700_000_000_000 + ts,
            partition=p,
        )
        for k, v, p, ts in events
    )


def _run(spark: Any, lake: Settings, monkeypatch: pytest.MonkeyPatch, driver_mb: str) -> list[str]:
    lines: list[str] = []
    with monkeypatch.context() as m:
        m.setenv("LAKEHOUSE_GOLD_DRIVER_MB", driver_mb)
        run(spark, lake, Catalog.load(lake.contracts_dir), echo=lines.append)
    return lines


def _rows(lake: Settings, name: str) -> list[tuple[Any, ...]]:
    table = read_arrow(lake.gold_path(name))
    rows = []
    for r in table.to_pylist():
        rows.append(tuple((c, _plain(v)) for c, v in sorted(r.items())))
    return sorted(rows, key=repr)


def _plain(v: Any) -> Any:
    """Doubles to 9 places (Spark and polars may add in another order); NaN comparable."""
    if isinstance(v, float):
        return "NaN" if math.isnan(v) else round(v, 9)
    return v


def _folded_by(lines: list[str]) -> dict[str, str]:
    """Per gold table of a run's summary lines: "spark" when it says why Spark folded it."""
    out = {}
    for line in lines:
        if line.startswith("gold ") and "stream versions" in line:
            name = line.split()[1].rstrip(":")
            out[name] = "spark" if "(folded by Spark:" in line else "arrow"
    return out


VALUES = st.one_of(
    st.none(),  # a tombstone
    st.fixed_dictionaries(
        {
            "fare": st.one_of(st.none(), st.integers(-(2**40), 2**40)),
            "seats": st.one_of(st.none(), st.integers(-(2**31), 2**31 - 1)),
            "tip": st.one_of(st.none(), st.floats(-1e6, 1e6, allow_nan=False)),
            "city": st.one_of(st.none(), st.sampled_from(["Oslo", "Rome", "Åre", "oslo"])),
            "at": st.one_of(
                st.none(),
                st.sampled_from(["2026-01-01T00:00:00Z", "2026-03-01T12:30:00.5+02:00"]),
            ),
            "paid": st.one_of(st.none(), st.booleans()),
        }
    ),
)
EVENTS = st.tuples(
    st.one_of(st.none(), st.sampled_from(["a", "b", "c"])),
    VALUES,
    st.integers(0, PARTITIONS - 1),
    st.integers(0, 3),  # few timestamps: ties between partitions happen
)


@hsettings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    history=st.lists(EVENTS, min_size=1, max_size=14),
    cuts=st.lists(st.integers(1, 13), max_size=2, unique=True),
)
@example(  # one key in two partitions: the later-timestamped partition's latest wins
    history=[
        ("a", {"fare": 1, "seats": 1, "tip": 0.5, "city": "Rome", "at": None, "paid": True}, 0, 3),
        (
            "a",
            {"fare": 2, "seats": 2, "tip": None, "city": "Oslo", "at": None, "paid": False},
            1,
            1,
        ),
        ("a", None, 0, 0),
        (
            "b",
            {"fare": None, "seats": None, "tip": None, "city": None, "at": None, "paid": None},
            2,
            0,
        ),
    ],
    cuts=[2],
)
def test_arrow_and_spark_fold_the_same_tables(
    spark: Any,
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
    history: list[Event],
    cuts: list[int],
) -> None:
    root = tmp_path_factory.mktemp("gold-arrow")
    by_spark, by_arrow = _lake(root / "spark"), _lake(root / "arrow")
    bounds = [0, *sorted(c for c in cuts if c < len(history)), len(history)]
    for lo, hi in itertools.pairwise(bounds):
        for lake, mb in ((by_spark, "0"), (by_arrow, "512")):
            _produce(lake, history[lo:hi])
            folded = _folded_by(_run(spark, lake, monkeypatch, mb))
            expected = {
                t: "spark" if mb == "0" or t not in ARROW_TABLES else "arrow" for t in TABLES
            }
            assert folded == expected, (mb, history, bounds)
    for name in TABLES:
        assert _rows(by_arrow, name) == _rows(by_spark, name), (name, history, bounds)


def _trip(**fields: Any) -> dict[str, Any]:
    base = {"fare": None, "seats": None, "tip": None, "city": None, "at": None, "paid": None}
    return {**base, **fields}


def test_a_sum_that_might_overflow_goes_to_spark(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lake = _lake(tmp_path)
    big = 2**61
    _produce(lake, [("a", _trip(fare=big), 0, 0), ("a", _trip(fare=big), 0, 1)])
    lines = _run(spark, lake, monkeypatch, "512")
    per_rider = next(line for line in lines if line.startswith("gold per_rider:"))
    assert "(folded by Spark: the sum of 'fare' might overflow)" in per_rider
    row = read_arrow(lake.gold_path("per_rider")).to_pylist()[0]
    assert row["fare_sum"] == 2 * big


def test_a_nan_whose_max_is_taken_goes_to_spark(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # JSON has no NaN, so write the stream directly, as silver would leave it.
    lake = _lake(tmp_path)
    _produce(lake, [("a", _trip(tip=1.0), 0, 0)])
    _run(spark, lake, monkeypatch, "512")
    from deltalake import DeltaTable, write_deltalake

    silver = lake.silver_path("trips_stream")
    current = DeltaTable(str(silver)).to_pyarrow_table()
    row = {**current.to_pylist()[0], "tip": float("nan"), "offset": 1}
    write_deltalake(str(silver), current.from_pylist([row], current.schema), mode="append")
    lines = _run(spark, lake, monkeypatch, "512")
    per_rider = next(line for line in lines if line.startswith("gold per_rider:"))
    assert "(folded by Spark: NaN in 'tip', whose max is taken)" in per_rider
    got = read_arrow(lake.gold_path("per_rider")).to_pylist()[0]
    assert math.isnan(got["tip_max"]) and math.isnan(got["tip_sum"])


def test_driver_fold_size_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    from lakehouse.tables import driver_fold_bytes

    monkeypatch.delenv("LAKEHOUSE_GOLD_DRIVER_MB", raising=False)
    assert driver_fold_bytes() == 512 << 20
    monkeypatch.setenv("LAKEHOUSE_GOLD_DRIVER_MB", "0")
    assert driver_fold_bytes() == 0
    monkeypatch.setenv("LAKEHOUSE_GOLD_DRIVER_MB", "1.5")
    with pytest.raises(ConfigError, match="LAKEHOUSE_GOLD_DRIVER_MB must be a whole number"):
        driver_fold_bytes()


def test_sums_proven_safe_by_parquet_statistics(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from lakehouse.contracts import Aggregation, TableSpec
    from lakehouse.tables_arrow import sums_that_cannot_overflow

    source = Catalog.load(_lake(tmp_path).contracts_dir).topic("trips")

    def sums(*fields: str) -> TableSpec:
        aggs = tuple(Aggregation(name=f"s_{f}", fn="sum", field=f) for f in fields)
        return TableSpec(name="sums", kind="aggregate", aggregations=aggs)

    small = pa.table({"fare": pa.array([5, -7, None], pa.int64()), "seats": [1, 2**61, 3]})
    pq.write_table(small, tmp_path / "small.parquet")
    pq.write_table(small, tmp_path / "bare.parquet", write_statistics=False)
    pq.write_table(pa.table({"other": [1]}), tmp_path / "old.parquet")
    paths = [str(tmp_path / "small.parquet")]
    # seats: 2**61 times 3 rows is above 2**62; fare: 7 times 3 is not.
    assert sums_that_cannot_overflow(paths, source, sums("fare", "seats")) == {"fare"}
    # Without statistics nothing is proven; a field the file lacks holds only nulls.
    assert (
        sums_that_cannot_overflow([str(tmp_path / "bare.parquet")], source, sums("fare")) == set()
    )
    assert sums_that_cannot_overflow([str(tmp_path / "old.parquet")], source, sums("fare")) == {
        "fare"
    }
