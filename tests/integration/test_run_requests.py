"""What a triggered run's Params ask the layer jobs to do (lakehouse.pipeline.request): a silver reprocess
from offsets or from a bronze version, a gold reprocess from a silver version, a full refresh,
the gold step restricted to some tables, and a dry run that changes nothing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from lakehouse.contracts.catalog import Catalog
from lakehouse.errors import ConfigError
from lakehouse.pipeline.request import LayerRequest
from lakehouse.pipeline.runner import run_layer
from lakehouse.quality.ledger import RunInfo, read_ledger
from lakehouse.runtime.config import Settings
from lakehouse.storage import read_arrow
from lakehouse.storage.store import table_version
from lakehouse.topics.landing import Producer, Record
from lakes import lake_with, records

pytestmark = pytest.mark.integration

CONTRACT = """\
topic: orders
partitions: 2
key: {format: string, name: order_id}
value:
  format: json
  fields:
    - {name: city, type: string}
    - {name: amount, type: long}
stream: {name: orders_stream}
tables:
  - {name: order_latest, kind: latest}
  - name: order_totals
    kind: aggregate
    aggregations:
      - {name: n, fn: count}
      - {name: total, fn: sum, field: amount}
  - name: order_moves
    kind: aggregate
    changelog: order_latest
    aggregations:
      - {name: moves, fn: count}
"""
STRICT = """\
expectations:
  silver:
    - {name: amount_not_negative, expect: between, column: amount, min: 0, severity: quarantine}
"""


def _lake(root: Path, expectations: str = STRICT) -> Settings:
    return lake_with(root, {"orders": CONTRACT + expectations})


def _send(lake: Settings, rows: list[tuple[str, Any]], partition: int = 0) -> None:
    """JSON values (a str is sent as it is: a record that does not decode)."""
    Producer(lake, "orders", 2).send_batch(
        Record(
            k.encode(), (v if isinstance(v, str) else json.dumps(v)).encode(), partition=partition
        )
        for k, v in rows
    )


def _run(
    spark: Any, lake: Settings, *layers: str, request: LayerRequest | None = None
) -> list[str]:
    contract = Catalog.load(lake.contracts_dir).topic("orders")
    lines: list[str] = []
    for layer in layers:
        lines += run_layer(
            spark,
            lake,
            contract,
            layer,  # type: ignore[arg-type]
            run=RunInfo(dag_run_id="manual__requests"),
            echo=lines.append,
            request=request,
        )
    return lines


def _versions(lake: Settings) -> dict[str, int | None]:
    paths = [
        lake.bronze_path("orders"),
        lake.silver_path("orders_stream"),
        lake.quarantine_path("bronze", "orders"),
        lake.quarantine_path("silver", "orders_stream"),
        lake.ledger_path,
        *(lake.gold_path(t) for t in ("order_latest", "order_totals", "order_moves")),
    ]
    return {str(p): table_version(p) for p in paths}


FIRST = [
    ("o1", {"city": "Berlin", "amount": 10}),  # offset 0
    ("o2", {"city": "Lima", "amount": -5}),  # offset 1: quarantined by the expectation
    ("o3", "{not json"),  # offset 2: does not decode
    ("o4", {"city": "Oslo", "amount": 20}),  # offset 3
]


def test_silver_reprocess_from_offsets_recovers_quarantined_records(
    spark: Any, tmp_path: Path
) -> None:
    lake = _lake(tmp_path)
    _send(lake, FIRST)
    _run(spark, lake, "bronze", "silver", "gold")
    silver, quarantine = (
        lake.silver_path("orders_stream"),
        lake.quarantine_path("silver", "orders_stream"),
    )
    assert [r["order_id"] for r in records(silver, by=["offset"])] == ["o1", "o4"]
    assert [r["offset"] for r in records(quarantine, by=["offset"])] == [1, 2]
    totals = {
        r["order_id"]: r["total"] for r in read_arrow(lake.gold_path("order_totals")).to_pylist()
    }
    assert "o2" not in totals

    # The contract is relaxed: negative amounts are refunds, not errors.
    lake = _lake(tmp_path, expectations="")
    before = _versions(lake)
    (dry,) = _run(spark, lake, "silver", request=LayerRequest(dry_run=True, from_offsets={0: 1}))[
        1:
    ]
    assert "would decode again 2 record(s) not in the stream, 2 of them in quarantine now" in dry
    assert _versions(lake) == before

    lines = _run(spark, lake, "silver", request=LayerRequest(from_offsets={0: 1}))
    assert lines[0] == "silver orders_stream: bronze has no new versions"
    assert lines[1] == (
        "silver orders_stream: reprocess of bronze.orders versions 0..1 from offsets 0:1: "
        "2 record(s) not in the stream decoded again: 1 joined the stream, 0 newly "
        "quarantined, 1 released from quarantine"
    )
    assert [r["order_id"] for r in records(silver, by=["offset"])] == ["o1", "o2", "o4"]
    # Every bronze record is in exactly one of the stream and its quarantine.
    in_stream = {(r["partition"], r["offset"]) for r in records(silver, by=["offset"])}
    held = {(r["partition"], r["offset"]) for r in records(quarantine, by=["offset"])}
    assert held == {(0, 2)} and not in_stream & held
    assert len(in_stream) + len(held) == len(FIRST)

    # A rerun finds nothing new to do and commits nothing.
    versions = _versions(lake)
    again = _run(spark, lake, "silver", request=LayerRequest(from_offsets={0: 1}))
    assert "1 record(s) not in the stream decoded again: 0 joined the stream, 0 newly " in again[1]
    assert _versions(lake) == versions

    # The layer above takes the recovered record as a new arrival.
    gold = _run(spark, lake, "gold")
    assert any(line.startswith("gold order_totals: stream versions") for line in gold)
    totals = {
        r["order_id"]: r["total"] for r in read_arrow(lake.gold_path("order_totals")).to_pylist()
    }
    assert totals == {"o1": 10, "o2": -5, "o4": 20}


def test_silver_reprocess_from_a_bronze_version_only_reads_from_there(
    spark: Any, tmp_path: Path
) -> None:
    lake = _lake(tmp_path)
    _send(lake, [("a", {"city": "X", "amount": -1})])
    _run(spark, lake, "bronze", "silver")
    first_batch = table_version(lake.bronze_path("orders"))
    _send(lake, [("b", {"city": "Y", "amount": -2})], partition=1)
    _run(spark, lake, "bronze", "silver")
    assert table_version(lake.bronze_path("orders")) == (first_batch or 0) + 1
    lake = _lake(tmp_path, expectations="")
    assert first_batch is not None
    lines = _run(spark, lake, "silver", request=LayerRequest(from_version=first_batch + 1))
    assert "1 joined the stream" in lines[1] and "1 released from quarantine" in lines[1]
    silver = records(lake.silver_path("orders_stream"), by=["order_id"])
    assert [r["order_id"] for r in silver] == ["b"]  # "a" came before that version
    held = records(lake.quarantine_path("silver", "orders_stream"), by=["offset"])
    assert [(r["partition"], r["offset"]) for r in held] == [(0, 0)]


def test_gold_reprocess_from_a_silver_version_and_full_refresh(spark: Any, tmp_path: Path) -> None:
    lake = _lake(tmp_path, expectations="")
    _send(lake, [("k1", {"city": "A", "amount": 1}), ("k2", {"city": "B", "amount": 2})])
    _run(spark, lake, "bronze", "silver", "gold")
    _send(lake, [("k1", {"city": "C", "amount": 3}), ("k3", {"city": "D", "amount": 4})])
    _run(spark, lake, "bronze", "silver", "gold")
    names = ("order_latest", "order_totals", "order_moves")
    keys = {"order_latest": "order_id", "order_totals": "order_id", "order_moves": "order_id"}
    expected = {n: records(lake.gold_path(n), by=[keys[n]]) for n in names}
    silver_head = table_version(lake.silver_path("orders_stream"))
    assert silver_head is not None

    lines = _run(spark, lake, "gold", request=LayerRequest(from_version=silver_head))
    # The tables reading the stream are put back and read again; the changelog reader is not
    # put back but takes their (here: no) corrections.
    assert [x.split(":")[0] for x in lines if "rebuilt from" in x] == [
        "gold order_latest",
        "gold order_totals",
    ]
    assert {n: records(lake.gold_path(n), by=[keys[n]]) for n in names} == expected
    ledger = [r for r in read_ledger(lake).to_pylist() if r["layer"] == "gold"]
    assert ledger == [] or all(r["dag_run_id"] == "manual__requests" for r in ledger)

    # Damage one table; a full refresh publishes exactly the missing row.
    from deltalake import DeltaTable

    DeltaTable(str(lake.gold_path("order_totals"))).delete("order_id = 'k2'")
    damaged = table_version(lake.gold_path("order_totals"))
    lines = _run(spark, lake, "gold", request=LayerRequest(full_refresh=("order_totals",)))
    assert any(x.startswith("gold order_totals: rebuilt from input versions 0..") for x in lines)
    assert records(lake.gold_path("order_totals"), by=["order_id"]) == expected["order_totals"]
    assert damaged is not None
    feed = pa.table(
        DeltaTable(str(lake.gold_path("order_totals")))
        .load_cdf(starting_version=damaged + 1)
        .read_all()
    ).to_pylist()
    assert [(r["_change_type"], r["order_id"]) for r in feed] == [("insert", "k2")]


def test_gold_step_limited_to_some_tables(spark: Any, tmp_path: Path) -> None:
    lake = _lake(tmp_path, expectations="")
    _send(lake, [("k1", {"city": "A", "amount": 1})])
    _run(spark, lake, "bronze", "silver")
    lines = _run(spark, lake, "gold", request=LayerRequest(tables=("order_totals",)))
    assert [x.split(":")[0] for x in lines] == ["gold order_totals"]
    assert table_version(lake.gold_path("order_latest")) is None
    with pytest.raises(ConfigError, match="has no gold table 'nope'"):
        _run(spark, lake, "gold", request=LayerRequest(full_refresh=("nope",)))


def test_dry_run_of_every_layer_changes_nothing(spark: Any, tmp_path: Path) -> None:
    lake = _lake(tmp_path)
    _send(lake, FIRST)
    _run(spark, lake, "bronze", "silver", "gold")
    _send(lake, [("o5", {"city": "Rome", "amount": 5})], partition=1)
    before = _versions(lake)
    request = LayerRequest(dry_run=True)
    lines = _run(spark, lake, "bronze", "silver", "gold", request=request)
    assert _versions(lake) == before
    assert lines[0] == (
        "bronze orders (dry run): would read 1 segment(s) into bronze.orders as one batch: "
        "partition 1: 1 file(s), offsets 0..0"
    )
    # Silver and gold have nothing new (bronze did not run); what they would read is said.
    assert lines[1] == "silver orders_stream (dry run): bronze has no new versions"
    assert lines[2:] == [
        "gold order_latest (dry run): silver.orders_stream has no new versions",
        "gold order_totals (dry run): silver.orders_stream has no new versions",
        "gold order_moves (dry run): gold.order_latest has no new versions",
    ]
    _run(spark, lake, "bronze")
    head = table_version(lake.bronze_path("orders"))
    (line,) = _run(spark, lake, "silver", request=request)
    assert line == (
        f"silver orders_stream (dry run): would decode bronze versions {head}..{head} "
        "(1 records) into silver.orders_stream and its quarantine"
    )
    lines = _run(
        spark,
        lake,
        "gold",
        request=LayerRequest(dry_run=True, full_refresh=("order_latest",)),
    )
    assert lines[0].startswith("gold order_latest (dry run): would rebuild from the whole of")
    assert lines[2] == (
        "gold order_moves (dry run): gold.order_latest has no new versions; then the "
        "corrections of order_latest"
    )


def test_lakehouse_run_takes_the_same_requests(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`lakehouse run` without Airflow: a full refresh and a dry run asked for with its flags."""
    from deltalake import DeltaTable

    from lakehouse import cli

    lake = _lake(tmp_path, expectations="")
    monkeypatch.setenv("LAKEHOUSE_HOME", str(lake.home))
    monkeypatch.setenv("LAKEHOUSE_CONTRACTS", str(lake.contracts_dir))
    _send(lake, [("k1", {"city": "A", "amount": 1}), ("k2", {"city": "B", "amount": 2})])
    assert cli.main(["run", "--topic", "orders"]) == 0
    expected = records(lake.gold_path("order_totals"), by=["order_id"])
    assert [r["order_id"] for r in expected] == ["k1", "k2"]

    DeltaTable(str(lake.gold_path("order_totals"))).delete("order_id = 'k2'")
    capsys.readouterr()
    argv = ["run", "--topic", "orders", "--layer", "gold", "--full-refresh", "order_totals"]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "gold order_totals: full refresh from the whole silver stream" in out
    assert "gold order_totals: rebuilt from input versions 0.." in out
    assert records(lake.gold_path("order_totals"), by=["order_id"]) == expected

    _send(lake, [("k3", {"city": "C", "amount": 3})], partition=1)
    before = _versions(lake)
    assert cli.main(["run", "--dry-run"]) == 0
    assert _versions(lake) == before
    out = capsys.readouterr().out
    assert "dry run: every layer prints what it would read and write; no table changes" in out
    assert (
        "bronze orders (dry run): would read 1 segment(s) into bronze.orders as one batch: "
        "partition 1: 1 file(s), offsets 0..0"
    ) in out
