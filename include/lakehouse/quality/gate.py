"""The gate a job passes before it publishes: the contract's expectations, its volume and
freshness checks, on the batch it is about to commit; ``warn``, ``quarantine`` or ``fail``.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from lakehouse.contracts.model import Contract, Expectation
from lakehouse.errors import QualityGateError
from lakehouse.runtime.config import Layer, Settings
from lakehouse.runtime.objectstore import Location
from lakehouse.runtime.server import validation_socket
from lakehouse.storage import is_table
from lakehouse.storage.log import commit_metadata

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import Column, DataFrame, SparkSession
from lakehouse.quality.expectations import (
    REASON_PREFIX,
    TABLE_LEVEL,
    pandas_max_rows,
    spark_passes,
    suite_name,
    sync_constraints,
)
from lakehouse.quality.ledger import LEDGER_KEY, LedgerBuffer, RunInfo, ledger_rows, save_result
from lakehouse.quality.verdict import Outcome, Remote, Verdict, run_suite

# -- volume and freshness ----------------------------------------------------------------------
QUALITY_KEY = "lakehouse.quality"  # commit metadata of a gated commit: {"rows": batch size}


def batch_sizes(path: Location, history: int) -> list[int]:
    """The sizes of the last ``history`` gated batches published to a table, oldest first, from
    the table's own commit metadata (no ledger read on the hot path)."""
    if not is_table(path):
        return []
    from lakehouse.storage import snapshots

    sizes = []
    for commit in snapshots.latest(path).history(3 * history + 10):  # newest first
        value = commit_metadata(commit, QUALITY_KEY)
        if value is None:
            continue
        sizes.append(int(value["rows"]))
        if len(sizes) == history:
            break
    return sizes[::-1]


def volume_outcome(contract: Contract, rows: int, past: Sequence[int]) -> Outcome | None:
    """A batch far outside the usual volume: more than ``factor`` times the median of the last
    ``history`` batches' sizes, or less than that median divided by ``factor``."""
    volume = contract.quality.volume
    if volume is None:
        return None
    sizes = list(past)[-volume.history :]
    if len(sizes) < volume.min_history:
        return Outcome("volume", "volume", "warn", True, observed=rows)
    median = statistics.median(sizes)
    lo, hi = median / volume.factor, median * volume.factor
    return Outcome(
        "volume",
        "volume",
        "warn",
        lo <= rows <= hi,
        observed=rows,
        sample=(f"median of the last {len(sizes)} batches: {median:g}",),
    )


def freshness_outcome(contract: Contract, last_commit: datetime | None) -> Outcome | None:
    """No new data for longer than the contract's ``freshness`` interval."""
    limit = contract.quality.freshness_ms
    if limit is None:
        return None
    if last_commit is None:
        return Outcome("freshness", "freshness", "warn", False, observed="no data yet")
    age = (datetime.now(UTC) - last_commit).total_seconds()
    return Outcome(
        "freshness",
        "freshness",
        "warn",
        age * 1000 <= limit,
        observed=round(age, 3),
        sample=(f"limit {limit / 1000:g} s",),
    )


# -- gates -----------------------------------------------------------------------------------
@dataclass
class Gate:
    """The gate of one table of one layer in one job run."""

    settings: Settings
    contract: Contract
    layer: Layer
    table: str
    run: RunInfo
    path: Location
    ledger: LedgerBuffer
    echo: Any = print
    verdicts: list[Verdict] = field(default_factory=list)
    lineage: Mapping[str, Any] | None = None  # the input positions of the batch being judged
    # False for what is not a micro-batch (a reprocess, a refresh): its size says nothing about
    # the usual volume, so the volume check neither judges it nor counts it in its history.
    regular: bool = True

    @property
    def expectations(self) -> tuple[Expectation, ...]:
        return self.contract.expectations_for(self.layer, self.table)

    @property
    def columns(self) -> list[str] | None:
        """The columns the batch-level expectations read (None: any one, for a row count)."""
        named = sorted({e.column for e in self.expectations if e.column is not None})
        return named or None

    @property
    def quarantines(self) -> tuple[Expectation, ...]:
        return tuple(e for e in self.expectations if e.severity == "quarantine")

    @property
    def needs_whole_table(self) -> bool:
        return self.layer == "gold" and any(e.expect in TABLE_LEVEL for e in self.expectations)

    @property
    def active(self) -> bool:
        return bool(self.expectations) or self.contract.quality.volume is not None

    def check(
        self,
        batch: DataFrame | pa.Table,
        rows: int | None = None,
        *,
        whole: DataFrame | pa.Table | None = None,
        lineage: Mapping[str, Any] | None = None,
        at_most: tuple[int | None, int | None] = (None, None),
        marker: str | None = None,
    ) -> Verdict:
        """Validate a batch before it is published; on a failed ``fail`` expectation, record
        it and raise. ``rows`` is the batch's size if known; a Spark batch small enough for
        GX's pandas engine is brought to Arrow (:func:`collect_if_small`). ``whole`` is what
        table-level gold expectations judge (the table as it would be after the batch).
        ``at_most``: bounds on the sizes of the batch and of ``whole``, if the caller knows
        them (a Spark batch within the bound is collected without being counted first).
        ``marker``: a boolean column of ``whole``, true on the batch's rows; a ``whole`` small
        enough is then collected once, and the batch read out of it."""
        exps = self.expectations
        batch_level = [e for e in exps if not (self.layer == "gold" and e.expect in TABLE_LEVEL)]
        table_level = [e for e in exps if e not in batch_level]
        table_columns = sorted({e.column for e in table_level if e.column is not None}) or None
        if whole is not None and marker is not None:
            whole, batch, rows = _split_marked(
                whole, batch, marker, self.columns, table_columns, at_most[1]
            )
        if rows is None:
            batch, rows = collect_if_small(batch, self.columns, at_most=at_most[0])
        name = suite_name(self.layer, self.table)
        outcomes: list[Outcome] = []
        engine, result = "none", None
        service = self.validation_service()
        if batch_level:
            outcomes, engine, result = run_suite(name, batch_level, batch, rows, service=service)
        if table_level:
            assert whole is not None, "table-level expectations need the would-be table"
            table, rows_after = collect_if_small(whole, table_columns, at_most=at_most[1])
            more, engine2, result2 = run_suite(
                name, table_level, table, rows_after, service=service
            )
            outcomes += more
            engine = engine2 if engine == "none" else engine
            result = _merge_results(result, result2)
        volume = None
        if self.contract.quality.volume is not None and self.regular:
            past = batch_sizes(self.path, self.contract.quality.volume.history)
            volume = volume_outcome(self.contract, rows, past)
        if volume is not None:
            outcomes.append(volume)
        verdict = Verdict(self.layer, self.table, outcomes, rows, engine, result)
        self.lineage = lineage
        if verdict.failed:
            self.record(verdict, table_version=None, published=False)
            raise QualityGateError(self.layer, self.table, [o.describe() for o in verdict.failed])
        return verdict

    def validation_service(self) -> Remote | None:
        """The client of the lakehouse's validation service, if its socket is there (it runs
        with the Spark server, :mod:`lakehouse.quality.gx_service`): pandas-sized batches are
        validated there."""
        from lakehouse.quality import gx_service

        path = validation_socket(self.settings)
        return gx_service.client(path) if path.exists() else None

    def quarantine_reason(self, names: Sequence[str]) -> Column:
        """The first of the named quarantine expectations a row fails, or null."""
        from pyspark.sql import functions as F

        chosen = [e for e in self.quarantines if e.name in names]
        return F.coalesce(
            *(
                F.when(~spark_passes(e), F.lit(f"{REASON_PREFIX}{e.name} ({e.expect})"))
                for e in chosen
            ),
            F.lit(None).cast("string"),
        )

    def created(self, spark: SparkSession, path: Location) -> None:
        """The table was just created: add the contract's CHECK constraints now, while it is
        empty (see :func:`sync_constraints`)."""
        for note in sync_constraints(spark, path, self.expectations):
            self.echo(f"quality {self.layer}.{self.table}: {note}")

    def commit_metadata(self, verdict: Verdict) -> dict[str, Any]:
        """What a gated commit carries: the batch's size, the volume check's history; and the
        verdict's ledger rows, as published (:data:`LEDGER_KEY`)."""
        rows = ledger_rows(
            self.run, verdict, table_version=None, published=True, lineage=self.lineage
        )
        meta: dict[str, Any] = {
            LEDGER_KEY: [{**r, "validated_at": r["validated_at"].isoformat()} for r in rows]
        }
        if self.regular:
            meta[QUALITY_KEY] = {"rows": verdict.rows}
        return meta

    def record(self, verdict: Verdict, *, table_version: int | None, published: bool) -> None:
        if published:
            verdict.published_version = table_version
        self.verdicts.append(verdict)
        self.ledger.rows += ledger_rows(
            self.run,
            verdict,
            table_version=table_version,
            published=published,
            lineage=self.lineage,
        )
        save_result(self.settings, verdict, self.run)
        for line in verdict.summary():
            self.echo(line)


def collect_if_small(
    batch: DataFrame | pa.Table, columns: Sequence[str] | None, *, at_most: int | None = None
) -> tuple[DataFrame | pa.Table, int]:
    """A batch and its size: the named columns (or any one) as Arrow if it has at most
    ``pandas_max_rows()`` rows, else the DataFrame. Counted first, unless the caller knows it
    has ``at_most`` rows: a ``limit`` would bring the rows through one partition, and a batch
    too big for the driver is not collected at all."""
    import pyarrow as pa

    if isinstance(batch, pa.Table):
        return batch, batch.num_rows
    if at_most is None or at_most > pandas_max_rows():
        rows = batch.count()
        if rows > pandas_max_rows():
            return batch, rows
    table = batch.select(*(columns or batch.columns[:1])).toArrow()
    return table, table.num_rows


def _split_marked(
    whole: DataFrame | pa.Table,
    batch: DataFrame | pa.Table,
    marker: str,
    batch_columns: Sequence[str] | None,
    table_columns: Sequence[str] | None,
    at_most: int | None,
) -> tuple[DataFrame | pa.Table, DataFrame | pa.Table, int | None]:
    """``whole`` without its ``marker`` column, the batch and its size (None if not known): read
    out of ``whole`` if it is small enough to collect (the columns both levels read, at once),
    else ``batch`` as given."""
    import pyarrow as pa

    wanted = sorted({*(batch_columns or ()), *(table_columns or ())})
    if not wanted:  # row counts only: any one column
        names = whole.column_names if isinstance(whole, pa.Table) else whole.columns
        wanted = [c for c in names if c != marker][:1]
    table, _ = collect_if_small(whole, [*wanted, marker], at_most=at_most)
    if not isinstance(table, pa.Table):
        return table.drop(marker), batch, None
    ours = table.filter(table[marker]).drop_columns([marker])
    return table.drop_columns([marker]), ours, ours.num_rows


def _merge_results(a: dict[str, Any] | None, b: dict[str, Any]) -> dict[str, Any]:
    if a is None:
        return b
    merged = dict(a)
    merged["results"] = [*a["results"], *b["results"]]
    merged["success"] = a["success"] and b["success"]
    return merged
