"""The results ledger: every validation as rows of a Delta table, its full GX result as JSON
under ``quality/validations`` for Data Docs, and the ledger restored from the tables' commits.
"""

from __future__ import annotations

import json
import os
import re
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lakehouse.runtime.config import Settings
from lakehouse.runtime.objectstore import Location
from lakehouse.storage import is_table, log
from lakehouse.storage.log import commit_metadata

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import SparkSession
from lakehouse.quality.expectations import suite_name
from lakehouse.quality.verdict import Verdict


# -- run identity and the ledger ---------------------------------------------------------------
@dataclass(frozen=True)
class RunInfo:
    """Who is validating: one job run, and the Airflow DAG run that started it, if any."""

    run_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    dag_id: str | None = None
    dag_run_id: str | None = None

    @classmethod
    def from_env(cls, dag_run_id: str | None = None) -> RunInfo:
        return cls(
            dag_id=os.environ.get("AIRFLOW_CTX_DAG_ID"),
            dag_run_id=dag_run_id or os.environ.get("AIRFLOW_CTX_DAG_RUN_ID"),
        )


def ledger_schema() -> pa.Schema:
    import pyarrow as pa

    return pa.schema(
        [
            ("run_id", pa.string()),
            ("dag_id", pa.string()),
            ("dag_run_id", pa.string()),
            ("validated_at", pa.timestamp("us", tz="UTC")),
            ("layer", pa.string()),
            ("table", pa.string()),
            ("table_version", pa.int64()),
            ("published", pa.bool_()),
            ("source", pa.string()),
            ("rows", pa.int64()),
            ("engine", pa.string()),
            ("expectation", pa.string()),
            ("kind", pa.string()),
            ("column", pa.string()),
            ("severity", pa.string()),
            ("success", pa.bool_()),
            ("observed_value", pa.string()),
            ("element_count", pa.int64()),
            ("unexpected_count", pa.int64()),
            ("unexpected_sample", pa.string()),
            # A batch's own row (kind "batch", no expectation): what became of its records.
            ("outcome", pa.string()),
            ("quarantined", pa.int64()),
            ("quarantine_reasons", pa.string()),
            ("late", pa.int64()),
            ("late_table", pa.string()),
            ("gaps", pa.int64()),
            ("lag", pa.int64()),
            ("lag_unit", pa.string()),
        ]
    )


# The kind of a batch's row in the ledger, beside one row per check: the outcome of the batch.
BATCH = "batch"
PUBLISHED, BLOCKED = "published", "blocked"
_BATCH_COLUMNS = (
    "outcome",
    "quarantined",
    "quarantine_reasons",
    "late",
    "late_table",
    "gaps",
    "lag",
    "lag_unit",
)


def reason_kind(reason: str) -> str:
    """What a quarantine reason says without the record's own details: the text before its
    first ``": "`` (what follows names the value found), with its numbers (the words that are one) as ``N`` ("invalid
    UTF-8 at byte N of the line"), so that a batch's reasons count by kind."""
    return re.sub(r"(?<!\S)\d+(?!\S)", "N", reason.split(": ", 1)[0])


def count_reasons(reasons: Iterable[tuple[str, int]]) -> dict[str, int]:
    """Quarantine counts by :func:`reason_kind`, from (reason, count) pairs."""
    out: dict[str, int] = {}
    for reason, n in reasons:
        kind = reason_kind(reason)
        out[kind] = out.get(kind, 0) + n
    return dict(sorted(out.items()))


@dataclass(frozen=True)
class BatchOutcome:
    """What became of one batch of one table: ``rows`` published (or, blocked, held back) at
    ``table_version``; records quarantined, by reason kind; records sent to the late table;
    offsets missing on the topic (bronze); and, set when the layer is done, how far the table
    is still behind its input (``lag``, in ``lag_unit``: records for bronze, versions else)."""

    layer: str
    table: str
    outcome: str
    rows: int
    table_version: int | None = None
    reasons: Mapping[str, int] = field(default_factory=dict)
    late: int | None = None
    late_table: str | None = None
    gaps: int | None = None
    lag: int | None = None
    lag_unit: str | None = None
    # The input positions the batch was read from: the ledger's "source" column.
    lineage: Mapping[str, Any] | None = None

    @property
    def quarantined(self) -> int:
        return sum(self.reasons.values())

    def row(self, run: RunInfo, validated_at: datetime) -> dict[str, Any]:
        """The batch's row of the ledger."""
        return {
            **_run_columns(run),
            "validated_at": validated_at,
            "layer": self.layer,
            "table": self.table,
            "table_version": self.table_version,
            "published": self.outcome == PUBLISHED,
            "source": None if self.lineage is None else json.dumps(self.lineage, sort_keys=True),
            "rows": self.rows,
            "engine": None,
            "expectation": None,
            "kind": BATCH,
            "column": None,
            "severity": None,
            "success": None,
            "observed_value": None,
            "element_count": None,
            "unexpected_count": None,
            "unexpected_sample": None,
            "outcome": self.outcome,
            "quarantined": self.quarantined,
            "quarantine_reasons": json.dumps(dict(self.reasons), sort_keys=True),
            "late": self.late,
            "late_table": self.late_table,
            "gaps": self.gaps,
            "lag": self.lag,
            "lag_unit": self.lag_unit,
        }


def _run_columns(run: RunInfo) -> dict[str, Any]:
    return {"run_id": run.run_id, "dag_id": run.dag_id, "dag_run_id": run.dag_run_id}


def ledger_rows(
    run: RunInfo,
    verdict: Verdict,
    *,
    table_version: int | None,
    published: bool,
    lineage: Mapping[str, Any] | None,
) -> list[dict[str, Any]]:
    """The ledger's rows for one verdict: one per check."""
    base = {
        **_run_columns(run),
        **dict.fromkeys(_BATCH_COLUMNS),
        "validated_at": verdict.validated_at,
        "layer": verdict.layer,
        "table": verdict.table,
        "table_version": table_version,
        "published": published,
        "source": None if lineage is None else json.dumps(lineage, sort_keys=True),
        "rows": verdict.rows,
        "engine": verdict.engine,
    }
    return [
        {
            **base,
            "expectation": o.expectation,
            "kind": o.kind,
            "column": o.column,
            "severity": o.severity,
            "success": o.success,
            "observed_value": None if o.observed is None else json.dumps(o.observed),
            "element_count": o.element_count,
            "unexpected_count": o.unexpected_count,
            "unexpected_sample": json.dumps(list(o.sample)) if o.sample else None,
        }
        for o in verdict.outcomes
    ]


def write_ledger(
    spark: SparkSession, settings: Settings, rows: Sequence[Mapping[str, Any]]
) -> None:
    """Append rows to the ledger in one commit, written by delta-spark. The commit also records,
    per gated table, the newest table version whose published verdict it holds (a position of
    the ledger, see :func:`restore_ledger`). Those positions are set, not only moved forward: a
    table that was dropped and created again starts its versions over, and its verdicts are
    still written."""
    if not rows:
        return
    import pyarrow as pa

    from lakehouse.storage import Txn, delta_spark

    held: dict[str, int] = {}
    for row in rows:
        if row["published"] and row["table_version"] is not None:
            app = _ledger_app(row["layer"], row["table"])
            held[app] = max(held.get(app, -1), int(row["table_version"]))
    schema = ledger_schema()
    # A job's verdicts are a few rows: one file per commit.
    data = delta_spark.arrow_frame(spark, pa.Table.from_pylist(list(rows), schema=schema))
    data = data.coalesce(1)
    ledger = settings.ledger_path
    with delta_spark.table_lock(settings, ledger):
        delta_spark.append(
            data,
            ledger,
            txn=[Txn(app, version, rewind=True) for app, version in sorted(held.items())],
            create=schema,
            # A ledger written before the batch rows' columns existed takes them on.
            schema_mode="add_columns",
        )


@dataclass
class LedgerBuffer:
    """The ledger rows of one job, written in one commit when the job's layer is done (or has
    failed): a commit per check would leave the ledger a heap of tiny files."""

    spark: SparkSession
    settings: Settings
    rows: list[dict[str, Any]] = field(default_factory=list)

    def flush(self) -> None:
        rows, self.rows = self.rows, []
        write_ledger(self.spark, self.settings, rows)


def sql_text(value: str) -> str:
    """``value`` as an SQL string literal (for the ledger's queries through delta-rs)."""
    return "'" + value.replace("'", "''") + "'"


def read_ledger(
    settings: Settings,
    table: str | None = None,
    *,
    dag_run_id: str | None = None,
    layer: str | None = None,
) -> pa.Table:
    """The ledger's rows: those of one table, one DAG run or one layer, if given (filtered by
    delta-rs's query engine, so a run's gate reads its own rows, not the ledger's history)."""
    import pyarrow as pa

    from lakehouse.storage import snapshots
    from lakehouse.storage.store import snapshot_arrow

    if not is_table(settings.ledger_path):
        return ledger_schema().empty_table()
    wanted = {"table": table, "dag_run_id": dag_run_id, "layer": layer}
    terms = [
        f'"{column}" = {sql_text(value)}' for column, value in wanted.items() if value is not None
    ]
    data = snapshot_arrow(snapshots.latest(settings.ledger_path), " AND ".join(terms) or None)
    schema = ledger_schema()
    for name in schema.names:  # a ledger older than a column reads it as nulls
        if name not in data.column_names:
            data = data.append_column(name, pa.nulls(data.num_rows, schema.field(name).type))
    return data.select(schema.names).cast(schema)


def save_result(settings: Settings, verdict: Verdict, run: RunInfo) -> Path | None:
    """Keep the full GX result for Data Docs (written whole, then renamed into place)."""
    if verdict.result is None:
        return None
    folder = settings.validations_root / suite_name(verdict.layer, verdict.table)
    folder.mkdir(parents=True, exist_ok=True)
    stamp = verdict.validated_at.strftime("%Y%m%dT%H%M%S.%fZ")
    document = {
        "run_id": run.run_id,
        "dag_run_id": run.dag_run_id,
        "validated_at": verdict.validated_at.isoformat(),
        "result": verdict.result,
    }
    path = folder / f"{stamp}-{run.run_id[:12]}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(document, default=str), encoding="utf-8")
    tmp.replace(path)
    return path


# A gated commit also carries its verdict's ledger rows: the job writes them to the ledger after
# the commit, and a job killed in between leaves them to the next (see restore_ledger).
LEDGER_KEY = "lakehouse.ledger"


def _ledger_app(layer: str, table: str) -> str:
    """The ledger's app transaction for one gated table: its version is the newest version of
    that table whose verdict the ledger holds."""
    return f"{LEDGER_KEY}:{layer}.{table}"


def restore_ledger(settings: Settings, paths: Sequence[Location]) -> list[dict[str, Any]]:
    """The ledger rows that the newest gated commit among each table's last 16 commits carries,
    if the ledger lacks them (its job died between the two commits: they cannot be one
    transaction), with the version of the commit they judged. Every job runs this before it
    commits, so only a table's newest gated commit can lack them. Whether the ledger has them
    is the ledger's position for the table (:func:`write_ledger`), read from the ledger's log:
    the ledger's rows are not scanned."""
    from lakehouse.storage import snapshots

    restored: list[dict[str, Any]] = []
    for path in paths:
        if not is_table(path):
            continue
        for commit in snapshots.latest(path).history(16):  # newest first
            rows = commit_metadata(commit, LEDGER_KEY)
            if rows is None:
                continue
            version = int(commit["version"])
            if rows:
                app = _ledger_app(rows[0]["layer"], rows[0]["table"])
                held = log.position(settings.ledger_path, app)
                if held is None or held < version:
                    restored += [
                        {
                            **row,
                            "validated_at": datetime.fromisoformat(row["validated_at"]),
                            "table_version": version,
                        }
                        for row in rows
                    ]
            break
    return restored
