"""The ledger's batch rows and the history `lakehouse dq` and the data-quality page read from it."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa

from lakehouse.quality.history import history
from lakehouse.quality.ledger import (
    BLOCKED,
    PUBLISHED,
    BatchOutcome,
    RunInfo,
    count_reasons,
    ledger_rows,
    ledger_schema,
    write_ledger,
)
from lakehouse.quality.verdict import Outcome, Verdict
from lakehouse.runtime.config import Settings
from lakehouse.storage import delta_spark


def test_quarantine_reasons_count_by_kind_without_the_records_own_details() -> None:
    reasons = [
        ("field 'amount' is not a valid decimal: 'abc'", 2),
        ("field 'amount' is not a valid decimal: '1e999'", 1),
        ("invalid UTF-8 at byte 7 of the line", 1),
        ("invalid UTF-8 at byte 12 of the line", 1),
        ("expectation amount_positive (between)", 3),
    ]
    assert count_reasons(reasons) == {
        "expectation amount_positive (between)": 3,
        "field 'amount' is not a valid decimal": 3,
        "invalid UTF-8 at byte N of the line": 2,
    }


def _verdict(layer: str, table: str, at: datetime, *outcomes: Outcome) -> Verdict:
    verdict = Verdict(layer, table, list(outcomes), 10, "pandas")
    verdict.validated_at = at
    return verdict


def test_history_gathers_each_runs_batch_and_checks(spark: Any, tmp_path: Path) -> None:
    settings = Settings.from_env(tmp_path / "home", tmp_path)
    t0 = datetime(2026, 11, 20, 12, tzinfo=UTC)
    first, second, old = (RunInfo(dag_id="pipeline__orders", dag_run_id=f"r{i}") for i in range(3))
    met = Outcome("amount_positive", "between", "warn", True, observed=0)
    broken = Outcome("id_unique", "unique", "fail", False, observed=2)
    fresh = Outcome("freshness", "freshness", "warn", True, observed=12.5, sample=("limit 3600 s",))
    rows = [
        *ledger_rows(
            first,
            _verdict("silver", "orders", t0, met, fresh),
            table_version=3,
            published=True,
            lineage=None,
        ),
        BatchOutcome(
            "silver",
            "orders",
            PUBLISHED,
            8,
            3,
            reasons={"field 'amount' is not a valid decimal": 2},
            lag=0,
            lag_unit="versions",
        ).row(first, t0),
        *ledger_rows(
            second,
            _verdict("silver", "orders", t0 + timedelta(minutes=5), met, broken),
            table_version=None,
            published=False,
            lineage=None,
        ),
        BatchOutcome("silver", "orders", BLOCKED, 10, lag=1, lag_unit="versions").row(
            second, t0 + timedelta(minutes=5)
        ),
        BatchOutcome(
            "gold", "checkins_5m", PUBLISHED, 4, 7, late=2, late_table="late.checkins_5m"
        ).row(second, t0 + timedelta(minutes=6)),
        # Outside the window: not read.
        BatchOutcome("silver", "orders", PUBLISHED, 1, 1).row(old, t0 - timedelta(days=30)),
    ]
    write_ledger(spark, settings, rows)

    found = history(settings, now=t0 + timedelta(hours=1))

    assert found.tables() == ["gold.checkins_5m", "silver.orders"]
    one, two = found.of("silver.orders")
    assert (one.dag_run_id, one.outcome, one.rows, one.table_version) == ("r0", PUBLISHED, 8, 3)
    assert (one.quarantined, one.reasons) == (2, {"field 'amount' is not a valid decimal": 2})
    assert (one.checks, one.met, one.failed, one.pass_rate) == (2, 2, (), 1.0)
    assert (one.freshness_age_s, one.freshness_limit_s) == (12.5, 3600.0)
    assert (one.lag, one.lag_unit) == (0, "versions")
    assert (two.outcome, two.rows, two.checks, two.met) == (BLOCKED, 10, 2, 1)
    assert two.failed == ("fail id_unique",)
    (late,) = found.of("gold.checkins_5m")
    assert (late.late, late.late_table, late.checks, late.pass_rate) == (
        2,
        "late.checkins_5m",
        0,
        None,
    )
    latest = {c.expectation: c for c in found.checks_of(found.latest("silver.orders"))}
    assert set(latest) == {"amount_positive", "id_unique"}
    assert latest["id_unique"].severity == "fail" and not latest["id_unique"].success
    assert found.checks_of(found.latest("gold.checkins_5m")) == []  # a run without checks


def test_history_reads_a_ledger_written_before_batch_rows(spark: Any, tmp_path: Path) -> None:
    settings = Settings.from_env(tmp_path / "home", tmp_path)
    at = datetime(2026, 11, 20, 12, tzinfo=UTC)
    older = pa.schema([f for f in ledger_schema() if f.name not in {"outcome", "late", "lag"}])
    run = RunInfo(dag_run_id="r0")
    met = Outcome("amount_positive", "between", "warn", True, observed=0)
    rows = ledger_rows(
        run, _verdict("silver", "orders", at, met), table_version=2, published=True, lineage=None
    )
    data = delta_spark.arrow_frame(
        spark, pa.Table.from_pylist([{n: r[n] for n in older.names} for r in rows], older)
    )
    delta_spark.append(data, settings.ledger_path, create=older)

    (run_seen,) = history(settings, now=at).runs

    assert (run_seen.outcome, run_seen.late, run_seen.lag) == (None, None, None)
    assert (run_seen.checks, run_seen.met, run_seen.table_version) == (1, 1, 2)
    # The next write adds the columns to that ledger.
    write_ledger(spark, settings, [BatchOutcome("silver", "orders", PUBLISHED, 5, 3).row(run, at)])
    (seen,) = history(settings, now=at).runs
    assert (seen.outcome, seen.rows, seen.checks) == (PUBLISHED, 5, 1)
    assert json.loads(json.dumps(seen.reasons)) == {}


def test_a_topics_name_stands_for_every_table_of_the_topic() -> None:
    """`lakehouse dq --table orders` and the page's ?table=orders: the topic's bronze table, its
    stream and its gold tables; a stream or gold table's name, that table; layer.name, that."""
    from lakehouse.contracts.catalog import Catalog, parse_contract
    from lakehouse.quality.history import tables_named

    orders = parse_contract(
        {
            "topic": "orders",
            "key": {"format": "string", "name": "id"},
            "value": {"format": "json", "fields": [{"name": "amount", "type": "long"}]},
            "stream": {"name": "orders_stream"},
            "tables": [
                {"name": "order_latest", "kind": "latest"},
                {"name": "order_totals", "kind": "aggregate",
                 "aggregations": [{"name": "total", "fn": "sum", "field": "amount"}]},
            ],
        }
    )  # fmt: skip
    catalog = Catalog.of([orders])
    assert tables_named("orders", catalog) == [
        ("bronze", "orders"),
        ("silver", "orders_stream"),
        ("gold", "order_latest"),
        ("gold", "order_totals"),
    ]
    assert tables_named("orders_stream", catalog) == [("silver", "orders_stream")]
    assert tables_named("order_totals", catalog) == [("gold", "order_totals")]
    assert tables_named("gold.order_latest", catalog) == [("gold", "order_latest")]
    # A name no contract gives (a table of a contract since removed): any layer's of that name.
    assert tables_named("refunds", catalog) == [
        ("bronze", "refunds"),
        ("silver", "refunds"),
        ("gold", "refunds"),
    ]
