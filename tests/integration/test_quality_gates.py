"""Data-quality gates end to end: each severity on each layer it applies to, the Delta CHECK
constraints, the results ledger, volume and freshness checks, the `dq` report and Data Docs."""

from __future__ import annotations

import io
import json
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from deltalake.exceptions import DeltaError
from py4j.protocol import Py4JJavaError

from lakehouse import cli
from lakehouse.contracts.catalog import Catalog
from lakehouse.errors import InputFailedError, QualityGateError, TablesFailedError
from lakehouse.pipeline.runner import maintain_topics, run, run_layer
from lakehouse.quality.ledger import RunInfo, read_ledger
from lakehouse.quality.reports import build_data_docs, layer_verdict
from lakehouse.runtime.config import Settings
from lakehouse.storage import read_arrow
from lakehouse.storage.store import table_version
from lakes import ORDERS, lake_with, produce, run_layers

pytestmark = pytest.mark.integration

HEAD = (
    ORDERS
    + """\
tables:
  - {name: order_latest, kind: latest}
  - name: order_counts
    kind: aggregate
    aggregations:
      - {name: n, fn: count}
"""
)


def _orders(expectations: str, quality: str = "") -> str:
    """The orders topic's contract with its tables, these ``expectations`` and ``quality``."""
    return HEAD + "expectations:\n" + expectations + quality


def _ledger(lake: Settings, layer: str) -> list[dict[str, Any]]:
    rows = sorted(read_ledger(lake).to_pylist(), key=lambda r: r["validated_at"])
    return [r for r in rows if r["layer"] == layer]


GOOD = [("o1", {"city": "Berlin", "amount": 10}), ("o2", {"city": "Lima", "amount": 20})]
# A silver `warn` expectation: amounts from 0 to 100.
AMOUNT_WARN = (
    "  silver:\n"
    "    - {name: amount_range, expect: between, column: amount, min: 0, max: 100, "
    "severity: warn}\n"
)


def test_warn_records_the_failure_and_publishes_everything(spark: Any, tmp_path: Path) -> None:
    lake = lake_with(tmp_path, _orders(AMOUNT_WARN))
    produce(lake, "orders", [*GOOD, ("o3", {"city": "Paris", "amount": 500})])
    lines = run_layers(spark, lake, "orders", "bronze", "silver")

    assert read_arrow(lake.silver_path("orders_stream")).num_rows == 3
    (row,) = [r for r in _ledger(lake, "silver") if r["expectation"] == "amount_range"]
    assert row["success"] is False and row["severity"] == "warn"
    assert (row["element_count"], row["unexpected_count"]) == (3, 1)
    assert json.loads(row["unexpected_sample"]) == [500]
    assert row["published"] is True
    assert row["table_version"] == table_version(lake.silver_path("orders_stream"))
    assert row["dag_run_id"] == "manual__test"
    assert json.loads(row["source"]) == {"table": "bronze.orders", "versions": [0, 1]}
    assert any(
        "WARN       amount_range (between amount): 1 of 3 rows unexpected" in x for x in lines
    )
    assert "silver orders_stream: bronze versions 0..1 committed: 3 records, 0 quarantined" in lines


def test_a_verdict_lost_with_its_job_is_written_by_the_next_run(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job that dies after publishing a gated batch and before writing the ledger (found by
    tests/reliability's kill -9): the layer's next run writes that verdict, once, as the first
    run's, with the version it judged."""

    lake = lake_with(tmp_path, _orders(AMOUNT_WARN))
    produce(lake, "orders", [*GOOD, ("o3", {"city": "Paris", "amount": 500})])
    run_layers(spark, lake, "orders", "bronze")

    def killed(spark: Any, settings: Settings, rows: Any) -> None:
        raise RuntimeError("killed")

    monkeypatch.setattr("lakehouse.quality.ledger.write_ledger", killed)
    with pytest.raises(RuntimeError, match="killed"):
        run_layers(spark, lake, "orders", "silver", run_id="manual__first")
    monkeypatch.undo()
    silver = lake.silver_path("orders_stream")
    published = table_version(silver)
    assert read_arrow(silver).num_rows == 3 and _ledger(lake, "silver") == []

    run_layers(spark, lake, "orders", "silver", run_id="manual__retry")
    run_layers(spark, lake, "orders", "silver", run_id="manual__retry")
    (row,) = _ledger(lake, "silver")
    assert (row["dag_run_id"], row["published"], row["table_version"]) == (
        "manual__first",
        True,
        published,
    )
    assert (row["expectation"], row["element_count"], row["unexpected_count"]) == (
        "amount_range",
        3,
        1,
    )
    assert table_version(silver) == published


def test_a_run_of_every_layer_writes_their_verdicts_once_even_if_it_dies_before(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run of all three layers writes their verdicts to the ledger in one commit at its end.
    One that dies before that commit has published three gated tables: the next run writes
    each of their verdicts, once, with the version it judged, beside its own."""

    lake = lake_with(
        tmp_path,
        _orders(
            "  bronze:\n"
            "    - {name: few, expect: row_count_between, max: 10, severity: warn}\n"
            + AMOUNT_WARN
            + "  gold:\n"
            "    - {name: one_row_per_order, table: order_latest, expect: unique, column: order_id, "
            "severity: fail}\n"
        ),
    )
    catalog = Catalog.load(lake.contracts_dir)
    tables = {
        "bronze": lake.bronze_path("orders"),
        "silver": lake.silver_path("orders_stream"),
        "gold": lake.gold_path("order_latest"),
    }
    produce(lake, "orders", GOOD)
    ledger_versions = []

    def killed(spark: Any, settings: Settings, rows: Any) -> None:
        raise RuntimeError("killed")

    monkeypatch.setattr("lakehouse.quality.ledger.write_ledger", killed)
    with pytest.raises(RuntimeError, match="killed"):
        run(spark, lake, catalog, echo=lambda _: None)
    monkeypatch.undo()
    first = {layer: table_version(path) for layer, path in tables.items()}
    assert read_ledger(lake).num_rows == 0

    produce(lake, "orders", [("o3", {"city": "Oslo", "amount": 500})])
    for _ in range(2):  # the second run has nothing new: it writes no verdict again
        run(spark, lake, catalog, echo=lambda _: None)
        ledger_versions.append(table_version(lake.ledger_path))
    second = {layer: table_version(path) for layer, path in tables.items()}
    ledger = read_ledger(lake).to_pylist()
    published = sorted(
        (r["layer"], r["table_version"], r["expectation"], r["rows"])
        for r in ledger
        if r["published"] and r["kind"] != "batch"
    )
    # The second run's batches have rows of their own (the killed run's went with it).
    batches = {
        (r["layer"], r["table"]): (r["outcome"], r["table_version"], r["rows"])
        for r in ledger
        if r["kind"] == "batch"
    }
    assert batches[("bronze", "orders")] == ("published", second["bronze"], 1)
    assert batches[("silver", "orders_stream")] == ("published", second["silver"], 1)
    assert batches[("gold", "order_latest")] == ("published", second["gold"], 1)
    assert published == sorted(
        [
            ("bronze", first["bronze"], "few", 2),
            ("bronze", second["bronze"], "few", 1),
            ("silver", first["silver"], "amount_range", 2),
            ("silver", second["silver"], "amount_range", 1),
            ("gold", first["gold"], "one_row_per_order", 2),
            ("gold", second["gold"], "one_row_per_order", 1),
        ]
    )
    assert second["bronze"] > first["bronze"] and second["gold"] > first["gold"]
    assert ledger_versions[1] == ledger_versions[0]


@pytest.mark.parametrize("engine", ["pandas", "spark"])
def test_quarantine_routes_failing_rows_with_the_expectation_as_reason(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, engine: str
) -> None:
    if engine == "spark":  # every batch is "big": GX judges it with its Spark engine
        monkeypatch.setenv("LAKEHOUSE_GX_PANDAS_MAX_ROWS", "0")
    lake = lake_with(
        tmp_path,
        _orders(
            "  silver:\n"
            "    - {name: city_known, expect: in_set, column: city, values: [Berlin, Lima], "
            "severity: quarantine}\n"
            "    - {name: amount_present, expect: not_null, column: amount, severity: quarantine}\n"
        ),
    )
    produce(
        lake,
        "orders",
        [
            *GOOD,
            ("o3", {"city": "Atlantis", "amount": 5}),
            ("o4", {"city": "Lima", "amount": None}),
            ("o5", {"city": "Atlantis", "amount": None}),  # fails both: the first one names it
            ("o1", None),  # a tombstone carries no value: it passes through
        ],
    )
    lines = run_layers(spark, lake, "orders", "bronze", "silver")
    # Every record decoded cleanly, but the gate routes some; no file outside the commit.
    assert any("3 records, 3 quarantined" in line for line in lines)
    silver = lake.silver_path("orders_stream")
    committed = {Path(u).name for u in DeltaTable(str(silver)).file_uris()}
    assert {p.name for p in silver.glob("*.parquet")} == committed

    stream = read_arrow(silver).to_pylist()
    assert sorted((r["order_id"], r["tombstone"]) for r in stream) == [
        ("o1", False),
        ("o1", True),
        ("o2", False),
    ]
    bad = read_arrow(lake.quarantine_path("silver", "orders_stream")).to_pylist()
    assert sorted((r["offset"], r["reason"]) for r in bad) == [
        (2, "expectation city_known (in_set)"),
        (3, "expectation amount_present (not_null)"),
        (4, "expectation city_known (in_set)"),
    ]
    # The origin and the raw record are kept: nothing is lost.
    assert all(r["topic"] == "orders" and r["partition"] == 0 for r in bad)
    assert json.loads(next(r for r in bad if r["offset"] == 2)["value"]) == {
        "city": "Atlantis",
        "amount": 5,
    }
    # GX's verdict and the Spark predicate that routed the rows agree.
    ledger = {r["expectation"]: r for r in _ledger(lake, "silver")}
    assert ledger["city_known"]["unexpected_count"] == 2
    assert ledger["amount_present"]["unexpected_count"] == 2
    assert ledger["city_known"]["engine"] == engine
    assert sorted(json.loads(ledger["city_known"]["unexpected_sample"])) == ["Atlantis"] * 2

    # The gold layer sees only the published stream.
    run_layers(spark, lake, "orders", "gold")
    counts = read_arrow(lake.gold_path("order_counts")).to_pylist()
    assert sorted((r["order_id"], r["n"]) for r in counts) == [("o1", 1), ("o2", 1)]


def test_quarantine_expectations_that_pass_leave_the_batch_to_the_arrow_decoder(
    spark: Any, tmp_path: Path
) -> None:
    lake = lake_with(
        tmp_path,
        _orders(
            "  silver:\n"
            "    - {name: city_known, expect: in_set, column: city, values: [Berlin, Lima], "
            "severity: quarantine}\n"
        ),
    )
    produce(lake, "orders", [*GOOD, ("o1", None)])
    lines = run_layers(spark, lake, "orders", "bronze", "silver")
    assert "silver orders_stream: bronze versions 0..1 committed: 3 records, 0 quarantined" in lines
    (row,) = [r for r in _ledger(lake, "silver") if r["expectation"] == "city_known"]
    assert row["success"] is True and row["published"] is True
    assert row["element_count"] == 2  # the tombstone is not judged


def test_fail_on_silver_publishes_nothing_and_stops_the_run(spark: Any, tmp_path: Path) -> None:
    lake = lake_with(
        tmp_path,
        _orders(
            "  silver:\n"
            "    - {name: amount_range, expect: between, column: amount, min: 0, max: 100, "
            "severity: fail}\n"
        ),
    )
    produce(lake, "orders", GOOD)
    run(spark, lake, Catalog.load(lake.contracts_dir), echo=lambda _: None)
    silver = lake.silver_path("orders_stream")
    versions = {p: table_version(p) for p in (silver, lake.gold_path("order_counts"))}
    constraint = [
        v
        for k, v in _table_config(silver).items()
        if k.startswith("delta.constraints.dq_amount_range_")
    ]
    assert constraint == ["amount IS NULL OR ( amount >= 0 AND amount <= 100 )"]

    produce(
        lake,
        "orders",
        [("o3", {"city": "Paris", "amount": 500}), ("o4", {"city": "Rome", "amount": 1})],
    )
    with pytest.raises(QualityGateError) as failed:
        run(spark, lake, Catalog.load(lake.contracts_dir), echo=lambda _: None)
    message = str(failed.value)
    assert message.startswith("silver table orders_stream: quality gate failed, nothing published")
    assert "amount_range (between amount): 1 of 2 rows unexpected, e.g. 500" in message

    # Nothing moved downstream of bronze: not silver, not its quarantine, not gold.
    assert {p: table_version(p) for p in versions} == versions
    assert not (lake.quarantine_path("silver", "orders_stream") / "_delta_log").exists()
    (row,) = [r for r in _ledger(lake, "silver") if not r["published"] and r["kind"] == "between"]
    assert row["success"] is False and row["table_version"] is None
    # The DAG's gate task reads the same verdict back and holds the next layer to it.
    lines, failed = layer_verdict(lake, row["dag_run_id"], "silver", ["orders_stream"])
    assert len(failed) == 1, failed
    assert failed[0].startswith("silver.orders_stream: FAIL amount_range (between): observed")
    assert lines[0].startswith("silver.orders_stream: ") and "checks met" in lines[0]
    assert layer_verdict(lake, "another_run", "silver", ["orders_stream"]) == (
        ["silver.orders_stream: no batch validated in this run (no new data)"],
        [],
    )

    # The constraint holds other Delta writers to the contract as well.
    from deltalake import write_deltalake

    bad = read_arrow(silver).slice(0, 1).set_column(2, "amount", pa.array([999], pa.int64()))
    with pytest.raises(DeltaError, match="failed validation check"):
        write_deltalake(str(silver), bad, mode="append")

    # Relaxing the expectation lets the held-back batch through: our own writer commits to the
    # constrained table, and the constraint follows the contract.
    contract_file = lake.contracts_dir / "orders.yaml"
    contract_file.write_text(contract_file.read_text().replace("max: 100", "max: 1000"))
    run(spark, lake, Catalog.load(lake.contracts_dir), echo=lambda _: None)
    assert read_arrow(silver).num_rows == 4
    assert [
        v
        for k, v in _table_config(silver).items()
        if k.startswith("delta.constraints.dq_amount_range_")
    ] == ["amount IS NULL OR ( amount >= 0 AND amount <= 1000 )"]


def test_fail_on_gold_judges_the_rows_after_the_merge(spark: Any, tmp_path: Path) -> None:
    """A count is an aggregate: the gate judges the row the merge would publish (the count
    after adding the batch), not the batch's partial count; the table does not move."""
    lake = lake_with(
        tmp_path,
        _orders(
            "  gold:\n"
            "    - {name: once_per_order, table: order_counts, expect: between, column: n, max: 2, "
            "severity: fail}\n"
            "    - {name: one_row_per_order, table: order_latest, expect: unique, column: order_id, "
            "severity: fail}\n"
        ),
    )
    produce(lake, "orders", [*GOOD, ("o1", {"city": "Berlin", "amount": 11})])
    run_layers(spark, lake, "orders", "bronze", "silver", "gold")
    gold = lake.gold_path("order_counts")
    before = table_version(gold)
    assert sorted((r["order_id"], r["n"]) for r in read_arrow(gold).to_pylist()) == [
        ("o1", 2),
        ("o2", 1),
    ]
    # One more o1 makes its count 3, though this batch alone counts 1.
    produce(
        lake,
        "orders",
        [("o1", {"city": "Berlin", "amount": 12}), ("o2", {"city": "Lima", "amount": 1})],
    )
    with pytest.raises(
        QualityGateError,
        match=r"gold table order_counts: .*once_per_order "
        r"\(between n\): 1 of 2 rows unexpected, e\.g\. 3",
    ):
        run_layers(spark, lake, "orders", "bronze", "silver", "gold")
    assert table_version(gold) == before
    # order_latest is built first and passed: its table-level check judged the whole table.
    latest = {r["expectation"]: r for r in _ledger(lake, "gold") if r["table"] == "order_latest"}
    assert latest["one_row_per_order"]["success"] is True
    assert latest["one_row_per_order"]["element_count"] == 2


def test_gold_tables_fail_alone_when_built_side_by_side(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Four tables built at once: two stopped by their `fail` gates leave nothing, the table
    reading one's changelog is not built, and the fourth commits with its position; the error
    names every one that failed and why."""
    monkeypatch.setenv("LAKEHOUSE_GOLD_PARALLELISM", "4")
    lake = lake_with(
        tmp_path,
        HEAD + "  - name: order_totals\n"
        "    kind: aggregate\n"
        "    aggregations:\n"
        "      - {name: total, fn: sum, field: amount}\n"
        "  - name: count_changes\n"
        "    kind: aggregate\n"
        "    changelog: order_counts\n"
        "    aggregations:\n"
        "      - {name: changes, fn: count}\n"
        "expectations:\n"
        "  gold:\n"
        "    - {name: one_each, table: order_counts, expect: between, column: n, max: 1, "
        "severity: fail}\n"
        "    - {name: small_totals, table: order_totals, expect: between, column: total, "
        "max: 15, severity: fail}\n",
    )
    produce(lake, "orders", [*GOOD, ("o1", {"city": "Berlin", "amount": 11})])
    run_layers(spark, lake, "orders", "bronze", "silver")
    lines: list[str] = []
    contract = Catalog.load(lake.contracts_dir).topic("orders")
    with pytest.raises(TablesFailedError) as failed:
        run_layer(spark, lake, contract, "gold", run=RunInfo(dag_run_id="t"), echo=lines.append)
    error = failed.value
    assert set(error.failures) == {"order_counts", "order_totals", "count_changes"}
    assert isinstance(error.failures["order_counts"], QualityGateError)
    assert "one_each (between n): 1 of 2 rows unexpected" in str(error.failures["order_counts"])
    assert isinstance(error.failures["order_totals"], QualityGateError)
    held = error.failures["count_changes"]
    assert isinstance(held, InputFailedError)
    assert held.upstream == "order_counts"
    assert error.built == ["order_latest"]
    assert error.quality_only
    for table in ("order_counts", "order_totals", "count_changes"):
        assert any(line.startswith(f"gold {table}: failed: ") for line in lines), table
    # The one that passed committed its rows and the stream version it read.
    latest = lake.gold_path("order_latest")
    assert sorted((r["order_id"], r["amount"]) for r in read_arrow(latest).to_pylist()) == [
        ("o1", 11),
        ("o2", 20),
    ]
    assert DeltaTable(str(latest)).transaction_version("silver.orders_stream") is not None
    # The failed ones published nothing and recorded no position.
    for table in ("order_counts", "order_totals"):
        assert read_arrow(lake.gold_path(table)).num_rows == 0
        tx = DeltaTable(str(lake.gold_path(table))).transaction_version("silver.orders_stream")
        assert tx is None
    # The ledger holds each gate's verdict.
    verdicts = {(r["table"], r["expectation"]): r["success"] for r in _ledger(lake, "gold")}
    assert verdicts[("order_counts", "one_each")] is False
    assert verdicts[("order_totals", "small_totals")] is False


def test_fail_on_bronze_leaves_no_version_and_no_files(spark: Any, tmp_path: Path) -> None:
    lake = lake_with(
        tmp_path,
        _orders(
            "  bronze:\n"
            "    - {name: small_batches, expect: row_count_between, max: 2, severity: fail}\n"
        ),
    )
    produce(lake, "orders", GOOD)
    run_layers(spark, lake, "orders", "bronze")
    bronze = lake.bronze_path("orders")
    before = table_version(bronze)
    files_before = sorted(p.name for p in bronze.glob("*.parquet"))
    produce(lake, "orders", [*GOOD, *GOOD])
    with pytest.raises(QualityGateError, match=r"small_batches \(row_count_between\): observed 4"):
        run_layers(spark, lake, "orders", "bronze")
    assert table_version(bronze) == before
    assert sorted(p.name for p in bronze.rglob("*.parquet")) == files_before


def test_volume_and_freshness_warn_and_the_dq_report_shows_trends(
    spark: Any, tmp_path: Path
) -> None:
    lake = lake_with(
        tmp_path,
        _orders(
            "  silver: []\n",
            "quality:\n  freshness: 1h\n  volume: {factor: 3, history: 5, min_history: 2}\n",
        ),
    )
    for size in (10, 12, 60):
        produce(lake, "orders", [(f"o{i}", {"city": "Lima", "amount": i}) for i in range(size)])
        run_layers(spark, lake, "orders", "bronze")
    volume = [r for r in _ledger(lake, "bronze") if r["expectation"] == "volume"]
    assert [(json.loads(r["observed_value"]), r["success"]) for r in volume] == [
        (10, True),
        (12, True),
        (60, False),  # more than 3x the median of 10 and 12
    ]
    fresh = [r for r in _ledger(lake, "bronze") if r["expectation"] == "freshness"]
    assert len(fresh) == 3 and all(r["success"] for r in fresh)

    # One ledger commit per job; maintenance compacts them (the rows stay the same).
    before = sorted(map(str, read_ledger(lake).to_pylist()))
    (report,) = maintain_topics(
        spark, lake, Catalog.load(lake.contracts_dir), retention_hours=168, ledger=True, echo=print
    )
    assert report.files_compacted == 3 and report.files_written == 1
    assert sorted(map(str, read_ledger(lake).to_pylist())) == before

    out = io.StringIO()
    with redirect_stdout(out):
        assert (
            cli.main(["--home", str(lake.home), "--contracts", str(lake.contracts_dir), "dq"]) == 0
        )
    text = out.getvalue()
    assert "bronze.orders\n  latest run, with data:" in text and "60 rows" in text
    assert "FAIL warn       volume" in text and "(failed in 1 of 3 checked runs)" in text
    assert "last 3 runs: 3 batches, 3 published, 0 blocked, 0 quarantined" in text


def test_data_docs_are_built_from_the_validations(spark: Any, tmp_path: Path) -> None:
    lake = lake_with(
        tmp_path,
        _orders(
            "  silver:\n"
            "    - {name: city_known, expect: in_set, column: city, values: [Berlin], "
            "severity: warn}\n"
        ),
    )
    produce(lake, "orders", GOOD)
    run_layers(spark, lake, "orders", "bronze", "silver")
    index = build_data_docs(lake)
    assert index == lake.data_docs_root / "index.html"
    pages = list((lake.data_docs_root / "validations" / "silver" / "orders_stream").rglob("*.html"))
    assert len(pages) == 1
    html = pages[0].read_text()
    assert "city_known" in html or "Berlin" in html
    assert "orders_stream" in index.read_text()


def _table_config(path: Path) -> dict[str, str]:
    from deltalake import DeltaTable

    return dict(DeltaTable(str(path)).metadata().configuration)


# Delta's refusal of a row that breaks a CHECK constraint, as a classic session raises it:
# PySpark gives Delta's DeltaInvariantViolationException no Python class of its own.
VIOLATED = (
    r"DeltaInvariantViolationException: \[DELTA_VIOLATE_CONSTRAINT\w*\] CHECK constraint dq_e_"
)


def test_a_constraint_holds_hostile_strings_as_literals_in_both_engines(
    spark: Any, tmp_path: Path
) -> None:
    """``in_set`` values are quoted: delta-spark adds the constraint and enforces it as values,
    not as SQL, and so does delta-rs (gold's writer, until it moves) on the same table."""
    from deltalake import write_deltalake

    from lakehouse.contracts.model import Expectation
    from lakehouse.quality.expectations import sync_constraints

    sneaky = ["a') OR (1=1", "b' OR 'x'='x", "c\\' OR 1=1 --", 'd"; DROP TABLE t; --', "it''s"]
    e = Expectation("silver", "e", "in_set", "fail", "city", params=(("values", tuple(sneaky)),))
    path = tmp_path / "t"
    write_deltalake(str(path), pa.table({"city": pa.array(sneaky, pa.string())}))
    assert sync_constraints(spark, path, [e])[0].startswith("added constraint dq_e_")
    spark.createDataFrame([("b' OR 'x'='x",)], "city string").write.format("delta").mode(
        "append"
    ).save(str(path))
    # Near misses too: a value with its quote or backslash lost is not in the set.
    for outsider in ("zzz", "its", "it's", "c' OR 1=1 --"):
        with pytest.raises(Py4JJavaError, match=VIOLATED):
            spark.createDataFrame([(outsider,)], "city string").write.format("delta").mode(
                "append"
            ).save(str(path))
        with pytest.raises(DeltaError, match="failed validation check"):
            write_deltalake(str(path), pa.table({"city": [outsider]}), mode="append")
    write_deltalake(str(path), pa.table({"city": ["b' OR 'x'='x"]}), mode="append")
    assert sorted(read_arrow(path).column("city").to_pylist()) == sorted(
        [*sneaky, *sneaky[1:2] * 2]
    )
