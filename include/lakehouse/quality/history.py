"""The ledger's history per table, as `lakehouse dq` and the data-quality page show it: for each
run of each table, what became of its batch (published or blocked, rows, quarantined by reason,
late, offset gaps, lag) and how its checks went (met of evaluated, which failed, freshness age
against its limit); and, for each table, the checks of its latest run and of its last batch that
carried data (after runs that found nothing new, the latest run has a freshness check alone).

A table may be asked for by a topic's name (every table of the topic: bronze, silver, gold), a
stream's, a gold table's, or ``layer.name`` (:func:`tables_named`).

Read in one query over a bounded window of the ledger (the newest ``days``, at most ``limit``
runs), aggregated by delta-rs's query engine (DataFusion): the page stays as fast on a ledger of
years as on one of a day.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from lakehouse.contracts.catalog import Catalog
from lakehouse.quality.ledger import BATCH, ledger_schema, sql_text
from lakehouse.runtime.config import LAYERS, Settings
from lakehouse.storage import is_table

DAYS = 14.0  # the window the page and `lakehouse dq` read by default
LIMIT = 5000  # runs of tables at most, newest first


@dataclass(frozen=True)
class Run:
    """One job run of one table: its batch (if it had one) and its checks."""

    layer: str
    table: str
    run_id: str
    dag_id: str | None
    dag_run_id: str | None
    at: datetime  # its first row's validation time
    table_version: int | None
    outcome: str | None  # "published", "blocked", or None (no new data: checks only)
    rows: int | None
    quarantined: int | None
    reasons: dict[str, int]
    late: int | None
    late_table: str | None
    gaps: int | None
    lag: int | None
    lag_unit: str | None
    checks: int  # checks evaluated (freshness and volume included)
    met: int
    failed: tuple[str, ...]  # "severity expectation" of each failed check
    freshness_age_s: float | None
    freshness_limit_s: float | None

    @property
    def name(self) -> str:
        return f"{self.layer}.{self.table}"

    @property
    def pass_rate(self) -> float | None:
        """The share of its checks that held, or None without checks."""
        return None if self.checks == 0 else self.met / self.checks

    @property
    def carried_data(self) -> bool:
        """Whether the run had a batch with records in it (published, quarantined, late or
        blocked), not only checks of a table that had nothing new."""
        return self.outcome is not None and bool(self.rows or self.quarantined or self.late)


@dataclass
class Check:
    """One check of a run, as the page's latest verdicts list it."""

    expectation: str
    kind: str
    column: str | None
    severity: str
    success: bool
    observed: str


@dataclass
class History:
    """Every run in the window, oldest first, and the checks of each table's latest run and of
    its last batch that carried data."""

    runs: list[Run] = field(default_factory=list)
    # By run id and table (Run.name): one job run validates several tables.
    checks: dict[tuple[str, str], list[Check]] = field(default_factory=dict)
    since: datetime | None = None

    def tables(self) -> list[str]:
        return sorted({r.name for r in self.runs})

    def of(self, name: str) -> list[Run]:
        return [r for r in self.runs if r.name == name]

    def latest(self, name: str) -> Run:
        """The table's newest run in the window."""
        return self.of(name)[-1]

    def last_batch(self, name: str) -> Run | None:
        """The table's newest run in the window whose batch carried data, if any."""
        return next((r for r in reversed(self.of(name)) if r.carried_data), None)

    def checks_of(self, run: Run) -> list[Check]:
        return self.checks.get((run.run_id, run.name), [])


def tables_named(name: str, catalog: Catalog | None) -> list[tuple[str, str]]:
    """The ``(layer, table)`` pairs a name stands for: a topic's every table (its bronze table,
    its stream, its gold tables), a stream, a gold table, or ``layer.name``; a name the
    contracts do not know, the tables of that name in any layer (a table of a contract since
    removed is still in the ledger)."""
    layer, dot, bare = name.partition(".")
    if dot and layer in LAYERS:
        return [(layer, bare)]
    for contract in catalog or ():
        if name == contract.topic:
            return [
                (layer, table) for layer in LAYERS for table in contract.published_tables(layer)
            ]
    for contract in catalog or ():
        if name == contract.stream:
            return [("silver", name)]
        if name in {t.name for t in contract.tables}:
            return [("gold", name)]
    return [(layer, name) for layer in LAYERS]


def _columns(snapshot: Any) -> str:
    """The ledger's columns as this module reads them: a column that a ledger written before
    it existed lacks (the batch rows' own) is read as nulls."""
    import pyarrow as pa

    have = set(snapshot.schema().to_arrow().names)
    sql_type = {pa.string(): "VARCHAR", pa.int64(): "BIGINT", pa.bool_(): "BOOLEAN"}
    return ", ".join(
        f'"{f.name}"' if f.name in have else f'CAST(NULL AS {sql_type[f.type]}) AS "{f.name}"'
        for f in ledger_schema()
    )


def _query(
    columns: str, since: datetime, tables: Sequence[tuple[str, str]] | None, limit: int
) -> str:
    where = f"validated_at >= to_timestamp_micros({int(since.timestamp() * 1_000_000)})"
    if tables is not None:
        chosen = " OR ".join(
            f'(layer = {sql_text(layer)} AND "table" = {sql_text(table)})'
            for layer, table in tables
        )
        where += f" AND ({chosen or 'FALSE'})"
    batch = f"kind = '{BATCH}'"
    check = f"(kind IS NULL OR kind <> '{BATCH}')"
    return f"""
        SELECT layer, "table", run_id,
               max(dag_id) AS dag_id, max(dag_run_id) AS dag_run_id,
               min(validated_at) AS at,
               max(table_version) AS table_version,
               max(CASE WHEN {batch} THEN outcome END) AS outcome,
               max(CASE WHEN {batch} THEN "rows" END) AS "rows",
               max(CASE WHEN {batch} THEN quarantined END) AS quarantined,
               max(CASE WHEN {batch} THEN quarantine_reasons END) AS quarantine_reasons,
               max(CASE WHEN {batch} THEN late END) AS late,
               max(CASE WHEN {batch} THEN late_table END) AS late_table,
               max(CASE WHEN {batch} THEN gaps END) AS gaps,
               max(CASE WHEN {batch} THEN lag END) AS lag,
               max(CASE WHEN {batch} THEN lag_unit END) AS lag_unit,
               sum(CASE WHEN {check} THEN 1 ELSE 0 END) AS checks,
               sum(CASE WHEN {check} AND success THEN 1 ELSE 0 END) AS met,
               string_agg(CASE WHEN {check} AND NOT success
                               THEN severity || ' ' || expectation END, '\n') AS failed,
               max(CASE WHEN kind = 'freshness' THEN observed_value END) AS freshness_age,
               max(CASE WHEN kind = 'freshness' THEN unexpected_sample END) AS freshness_limit
        FROM (SELECT {columns} FROM snapshot) AS ledger WHERE {where}
        GROUP BY layer, "table", run_id
        ORDER BY at DESC
        LIMIT {int(limit)}
    """


_LIMIT_TEXT = re.compile(r"limit ([0-9.]+) s")


def _limit(sample: str | None) -> float | None:
    """The freshness limit its check kept beside the age (``["limit 3600 s"]``)."""
    if not sample:
        return None
    found = _LIMIT_TEXT.search(" ".join(map(str, json.loads(sample))))
    return None if found is None else float(found.group(1))


def _age(observed: str | None) -> float | None:
    value = None if observed is None else json.loads(observed)
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def history(
    settings: Settings,
    *,
    table: str | None = None,
    days: float = DAYS,
    limit: int = LIMIT,
    now: datetime | None = None,
    catalog: Catalog | None = None,
) -> History:
    """The runs of the ledger's newest ``days`` (at most ``limit`` runs of tables), oldest first,
    of the tables ``table`` names if it is given (:func:`tables_named`, with ``catalog``, or
    the contracts of ``settings``); and the checks of each table's latest run and of its last
    batch that carried data."""
    from deltalake import QueryBuilder

    from lakehouse.storage import snapshots

    since = (now or datetime.now(UTC)) - timedelta(days=days)
    out = History(since=since)
    if not is_table(settings.ledger_path):
        return out
    chosen = None
    if table is not None:
        if catalog is None:
            catalog = Catalog.load_each(settings.contracts_dir).catalog
        chosen = tables_named(table, catalog)
    snapshot = snapshots.latest(settings.ledger_path)
    query = _query(_columns(snapshot), since, chosen, limit)
    import pyarrow as pa

    rows = pa.table(
        QueryBuilder().register("snapshot", snapshot).execute(query).read_all()
    ).to_pylist()
    for r in reversed(rows):
        out.runs.append(
            Run(
                layer=r["layer"],
                table=r["table"],
                run_id=r["run_id"],
                dag_id=r["dag_id"],
                dag_run_id=r["dag_run_id"],
                at=_utc(r["at"]),
                table_version=r["table_version"],
                outcome=r["outcome"],
                rows=r["rows"],
                quarantined=r["quarantined"],
                reasons=json.loads(r["quarantine_reasons"] or "{}"),
                late=r["late"],
                late_table=r["late_table"],
                gaps=r["gaps"],
                lag=r["lag"],
                lag_unit=r["lag_unit"],
                checks=int(r["checks"] or 0),
                met=int(r["met"] or 0),
                failed=tuple(sorted((r["failed"] or "").split("\n"))) if r["failed"] else (),
                freshness_age_s=_age(r["freshness_age"]),
                freshness_limit_s=_limit(r["freshness_limit"]),
            )
        )
    out.checks = _checks(settings, out)
    return out


def _utc(value: datetime) -> datetime:
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def _checks(settings: Settings, found: History) -> dict[tuple[str, str], list[Check]]:
    """The checks of each table's latest run and of its last batch that carried data, by run
    id, read in one filtered scan."""
    from lakehouse.quality.verdict import observed_text

    wanted: dict[tuple[str, str], Run] = {}  # (run id, table) -> the run
    for name in found.tables():
        for run in (found.latest(name), found.last_batch(name)):
            if run is not None and run.checks:
                wanted[(run.run_id, name)] = run
    if not wanted:
        return {}
    from lakehouse.storage import snapshots
    from lakehouse.storage.store import snapshot_arrow

    ids = ", ".join(sorted({sql_text(run_id) for run_id, _ in wanted}))
    rows = snapshot_arrow(snapshots.latest(settings.ledger_path), f"run_id IN ({ids})")
    out: dict[tuple[str, str], list[Check]] = {}
    for row in rows.to_pylist():
        name = f"{row['layer']}.{row['table']}"
        if row.get("kind") == BATCH or (row["run_id"], name) not in wanted:
            continue
        observed = None if row["observed_value"] is None else json.loads(row["observed_value"])
        sample = json.loads(row["unexpected_sample"]) if row["unexpected_sample"] else []
        out.setdefault((row["run_id"], name), []).append(
            Check(
                row["expectation"],
                row["kind"],
                row["column"],
                row["severity"],
                bool(row["success"]),
                observed_text(
                    row["kind"], observed, row["element_count"], row["unexpected_count"], sample
                ),
            )
        )
    return out
