"""The asset events a layer task emits: one per table its batch changed, saying what happened,
and none for a table it left alone (what is scheduled on it does not run for nothing)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from lakehouse.contracts.catalog import Catalog
from lakehouse.contracts.model import Contract
from lakehouse.orchestration.assets import changed, table_asset
from lakehouse.quality.ledger import BLOCKED, PUBLISHED, BatchOutcome, RunInfo, ledger_rows
from lakehouse.quality.verdict import Outcome, Verdict
from lakehouse.runtime.config import REPO_ROOT, Settings

AT = datetime(2026, 11, 20, 12, tzinfo=UTC)
RUN = RunInfo(dag_id="pipeline__user-locations", dag_run_id="scheduled__1")


def _settings(tmp_path: Path) -> Settings:
    return Settings.from_env(tmp_path / "home", tmp_path)


def _contract() -> Contract:
    return Catalog.load(REPO_ROOT / "contracts").topic("user-locations")


def test_each_changed_table_gets_one_event_with_what_happened(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    contract = _contract()
    names = ["user_latest_location", "user_location_counts", "checkins_5m", "user_moves"]
    unique = Outcome("one_row_per_user", "unique", "fail", True, observed=0)
    warned = Outcome("counts_positive", "between", "warn", False, observed=1)
    rows = [
        *ledger_rows(
            RUN,
            Verdict("gold", "user_latest_location", [unique], 3, "pandas"),
            table_version=4,
            published=True,
            lineage=None,
        ),
        BatchOutcome("gold", "user_latest_location", PUBLISHED, 3, 4).row(RUN, AT),
        # Blocked by a fail expectation: nothing changed.
        BatchOutcome("gold", "user_location_counts", BLOCKED, 3).row(RUN, AT),
        *ledger_rows(
            RUN,
            Verdict("gold", "user_location_counts", [warned], 3, "pandas"),
            table_version=None,
            published=False,
            lineage=None,
        ),
        # Two batches in one DAG run (it was cleared and ran again): the newer counts.
        BatchOutcome(
            "gold", "checkins_5m", PUBLISHED, 2, 7, late=0, late_table="late.checkins_5m"
        ).row(RUN, AT),
        BatchOutcome(
            "gold", "checkins_5m", PUBLISHED, 5, 8, late=2, late_table="late.checkins_5m"
        ).row(RUN, AT + timedelta(minutes=1)),
        # user_moves had no new input: no batch row, no event.
    ]

    events = {a.name: (a, extra) for a, extra in changed(settings, contract, "gold", names, rows)}

    assert sorted(events) == ["gold.checkins_5m", "gold.user_latest_location", "late.checkins_5m"]
    asset, extra = events["gold.user_latest_location"]
    assert asset == table_asset(settings, "gold", "user_latest_location")
    assert extra == {
        "table_version": 4,
        "rows": 3,
        "quarantined": 0,
        "late": 0,
        "verdict": {"outcome": "published", "checks": 1, "met": 1, "failed": []},
        "dag_run_id": "scheduled__1",
    }
    _, windowed = events["gold.checkins_5m"]
    assert (windowed["table_version"], windowed["rows"], windowed["late"]) == (8, 5, 2)
    _, late = events["late.checkins_5m"]
    assert late == {"rows": 2, "table_version": 8, "of": "gold.checkins_5m"}


def test_quarantined_records_are_an_event_of_the_quarantine_and_a_failed_warn_is_told(
    tmp_path: Path,
) -> None:
    settings = _settings(tmp_path)
    contract = _contract()
    warned = Outcome("location_length", "length_between", "warn", False, observed=1)
    rows = [
        BatchOutcome(
            "silver", contract.stream, PUBLISHED, 18, 2, reasons={"value is not valid UTF-8": 2}
        ).row(RUN, AT),
        *ledger_rows(
            RUN,
            Verdict("silver", contract.stream, [warned], 18, "pandas"),
            table_version=2,
            published=True,
            lineage=None,
        ),
    ]

    events = changed(settings, contract, "silver", [contract.stream], rows)

    assert [(a.name, e["rows"]) for a, e in events] == [
        (f"silver.{contract.stream}", 18),
        (f"quarantine.silver.{contract.stream}", 2),
    ]
    assert events[0][1]["quarantined"] == 2
    assert events[0][1]["verdict"]["failed"] == ["warn location_length"]


def test_a_run_that_changed_nothing_emits_nothing(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    contract = _contract()
    freshness = Outcome("freshness", "freshness", "warn", True, observed=30.0)
    only_checks = ledger_rows(
        RUN,
        Verdict("bronze", contract.topic, [freshness], 0, "none"),
        table_version=3,
        published=False,
        lineage=None,
    )
    assert changed(settings, contract, "bronze", [contract.topic], only_checks) == []
    assert changed(settings, contract, "bronze", [contract.topic], []) == []
