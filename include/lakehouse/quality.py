"""Data-quality gates: the contract's expectations, run by Great Expectations on each batch a
job is about to publish.

A contract declares expectations per layer with a severity:

* ``warn`` records the failure and publishes;
* ``quarantine`` (row-level kinds, silver) routes the failing rows to the stream's quarantine
  table, with the expectation's name as the reason, and publishes the rest;
* ``fail`` stops before anything is published: the table's version does not move and the job
  raises :class:`~lakehouse.errors.QualityGateError` naming the table, the expectation and the
  observed value.

Each expectation compiles three ways from the one declaration: a Great Expectations (1.x)
expectation (the judge of every batch), a Spark predicate (which rows a ``quarantine``
expectation routes), and, for ``fail`` row checks, a Delta CHECK constraint on the table (so other
Delta writers are held to the contract too). Every validation goes to the results ledger (a
Delta table) and its full GX result to ``quality/validations`` for Data Docs.

Batches up to ``LAKEHOUSE_GX_PANDAS_MAX_ROWS`` rows (default 2,000,000) are validated by GX's
pandas engine on an Arrow copy of the columns the expectations read; bigger ones by GX's Spark
engine where they are. On a million rows the pandas engine took 0.4-0.5 s where the Spark engine
took 1.7-2.0 s, and a few narrow columns of two million rows fit in the driver. Where the
lakehouse's Spark server runs, the pandas engine runs in its validation service
(:mod:`lakehouse.gx_service`), which imported GX once: a job then never imports GX for a
pandas-sized batch. GX is imported only when a gate runs, never when DAGs are parsed.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import os
import re
import statistics
import sys
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lakehouse.config import Layer, Settings
from lakehouse.contracts import Contract, Expectation
from lakehouse.errors import ConfigError, QualityGateError
from lakehouse.objectstore import Location
from lakehouse.storage import gates, is_table
from lakehouse.storage.delta_spark import commit_metadata

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import Column, DataFrame, SparkSession

# Expectations judged per row: they can quarantine rows and become Delta CHECK constraints.
ROW_LEVEL = ("not_null", "between", "in_set", "match_regex", "length_between")
# On a gold table these judge the whole table as it would be after the batch.
TABLE_LEVEL = ("unique", "row_count_between")
SAMPLE_SIZE = 10
_SAMPLE_TEXT = 200
REASON_PREFIX = "expectation "


def pandas_max_rows() -> int:
    """Batches up to this many rows are judged by GX's pandas engine, bigger ones by Spark's."""
    raw = os.environ.get("LAKEHOUSE_GX_PANDAS_MAX_ROWS", "2000000")
    if not raw.strip().isdigit():
        raise ConfigError(
            f"LAKEHOUSE_GX_PANDAS_MAX_ROWS must be a whole number of rows, not {raw!r}"
        )
    return int(raw)


def suite_name(layer: Layer, table: str) -> str:
    return f"{layer}.{table}"


# -- compiling -------------------------------------------------------------------------------
def _gx() -> Any:
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "False")
    import great_expectations as gx

    return gx


def gx_expectation(e: Expectation) -> Any:
    """The Great Expectations expectation of one contract expectation (its name, kind and
    severity ride in ``meta``, so results map back to the contract)."""
    _gx()
    import great_expectations.expectations as gxe

    meta = {"name": e.name, "kind": e.expect, "severity": e.severity}
    severity = "warning" if e.severity == "warn" else "critical"
    lo, hi = e.param("min"), e.param("max")
    common: dict[str, Any] = {"meta": meta, "severity": severity}
    if e.expect == "row_count_between":
        return gxe.ExpectTableRowCountToBeBetween(min_value=lo, max_value=hi, **common)
    common["column"] = e.column
    if e.expect == "not_null":
        return gxe.ExpectColumnValuesToNotBeNull(**common)
    if e.expect == "unique":
        return gxe.ExpectColumnValuesToBeUnique(**common)
    if e.expect == "between":
        return gxe.ExpectColumnValuesToBeBetween(min_value=lo, max_value=hi, **common)
    if e.expect == "in_set":
        return gxe.ExpectColumnValuesToBeInSet(value_set=list(e.param("values")), **common)
    if e.expect == "match_regex":
        return gxe.ExpectColumnValuesToMatchRegex(regex=e.param("pattern"), **common)
    if e.expect == "length_between":
        return gxe.ExpectColumnValueLengthsToBeBetween(min_value=lo, max_value=hi, **common)
    raise ValueError(f"unknown expectation kind {e.expect!r}")


def suite(name: str, expectations: Sequence[Expectation]) -> Any:
    gx = _gx()
    return gx.ExpectationSuite(name=name, expectations=[gx_expectation(e) for e in expectations])


def spark_passes(e: Expectation) -> Column:
    """Whether a row passes a row-level expectation, as GX judges it (nulls pass every check
    but not_null)."""
    from pyspark.sql import functions as F

    c = F.col(e.column or "")
    lo, hi = e.param("min"), e.param("max")
    if e.expect == "not_null":
        return c.isNotNull()
    if e.expect == "between":
        cond = F.lit(True)
        if lo is not None:
            cond = cond & (c >= F.lit(lo))
        if hi is not None:
            cond = cond & (c <= F.lit(hi))
    elif e.expect == "in_set":
        cond = c.isin(list(e.param("values")))
    elif e.expect == "match_regex":
        cond = c.rlike(e.param("pattern"))
    elif e.expect == "length_between":
        n = F.length(c)
        cond = F.lit(True)
        if lo is not None:
            cond = cond & (n >= F.lit(lo))
        if hi is not None:
            cond = cond & (n <= F.lit(hi))
    else:
        raise ValueError(f"{e.expect} is not a row-level expectation")
    return c.isNull() | F.coalesce(cond, F.lit(False))


def _sql_literal(v: Any) -> str:
    """A SQL literal of a contract's value; anything but a string, boolean or finite number is
    refused rather than written into the constraint as Python's text of it."""
    if isinstance(v, str):
        return _string_literal(v)
    if isinstance(v, bool):
        return "TRUE" if v else "FALSE"
    if isinstance(v, int) or (isinstance(v, float) and math.isfinite(v)):
        return repr(v)
    raise ConfigError(f"{v!r} cannot be a SQL literal: use a string, a boolean or a finite number")


def _string_literal(v: str) -> str:
    """A string as SQL that Spark, delta-rs and Delta's own constraint text all read back as
    that string. A quote or a backslash has no such spelling inside a literal (Spark reads a
    backslash as an escape, delta-rs does not; Delta rewrites ``'it''s'`` as ``'it' 's'``, which
    Spark reads as ``its``), so those characters are written as ``chr(39)`` and ``chr(92)``,
    joined to the rest with ``concat``."""
    if "'" not in v and "\\" not in v:
        return f"'{v}'"
    pieces = [
        {"'": "chr(39)", "\\": "chr(92)"}.get(part, f"'{part}'")
        for part in re.split(r"(['\\\\])", v)
        if part
    ]
    return "concat(" + ", ".join(pieces) + ")"


def check_constraint(e: Expectation) -> str | None:
    """The Delta CHECK constraint of a ``fail`` row expectation, where SQL says the same thing
    in every engine (regular expressions differ between engines, so they stay GX-only)."""
    if e.severity != "fail" or e.expect not in ROW_LEVEL or e.expect == "match_regex":
        return None
    col = e.column
    lo, hi = e.param("min"), e.param("max")
    if e.expect == "not_null":
        return f"{col} IS NOT NULL"
    if e.expect == "in_set":
        values = ", ".join(_sql_literal(v) for v in e.param("values"))
        return f"{col} IS NULL OR {col} IN ({values})"
    measure = col if e.expect == "between" else f"character_length({col})"
    bounds = [
        f"{measure} >= {_sql_literal(lo)}" if lo is not None else "",
        f"{measure} <= {_sql_literal(hi)}" if hi is not None else "",
    ]
    return f"{col} IS NULL OR (" + " AND ".join(b for b in bounds if b) + ")"


def constraint_name(e: Expectation, sql: str) -> str:
    """``dq_<expectation>_<hash of the SQL>``: a changed expectation is recognised by its name,
    not by comparing the text an engine stored (delta-rs rewrites a constraint in its own
    words)."""
    digest = hashlib.sha256(sql.encode()).hexdigest()[:8]
    return f"dq_{e.name}_{digest}"


def sync_constraints(
    spark: SparkSession, path: Location, expectations: Sequence[Expectation]
) -> list[str]:
    """Add the CHECK constraints the contract's ``fail`` row expectations imply, and drop the
    ``dq_*`` ones it no longer does, with delta-spark's ``ALTER TABLE``. A constraint that the
    table's existing rows break is not added (Delta refuses it); the gate still holds new
    batches to it. Returns notes."""
    from lakehouse.storage import snapshots

    have = {
        k.removeprefix("delta.constraints.")
        for k in snapshots.latest(path).metadata().configuration
        if k.startswith("delta.constraints.dq_")
    }
    want = {constraint_name(e, sql): sql for e in expectations if (sql := check_constraint(e))}
    table = f"delta.`{path}`"
    notes = []
    for name in sorted(have - set(want)):
        spark.sql(f"ALTER TABLE {table} DROP CONSTRAINT IF EXISTS {name}")
        notes.append(f"dropped constraint {name}")
    for name, sql in sorted(want.items()):
        if name in have:
            continue
        try:
            spark.sql(f"ALTER TABLE {table} ADD CONSTRAINT {name} CHECK ({sql})")
            notes.append(f"added constraint {name}: {sql}")
        except Exception as exc:
            if "DELTA_NEW_CHECK_CONSTRAINT_VIOLATION" not in str(exc):
                raise
            notes.append(f"constraint {name} not added (existing rows break it)")
    return notes


# -- results ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Outcome:
    """One expectation's verdict on one batch."""

    expectation: str
    kind: str
    severity: str
    success: bool
    column: str | None = None
    observed: Any = None
    element_count: int | None = None
    unexpected_count: int | None = None
    sample: tuple[Any, ...] = ()

    def describe(self) -> str:
        what = f"{self.expectation} ({self.kind}{'' if self.column is None else ' ' + self.column})"
        if self.unexpected_count is not None and self.kind != "row_count_between":
            seen = f"{self.unexpected_count} of {self.element_count} rows unexpected"
            if self.sample:
                seen += ", e.g. " + ", ".join(_short(v) for v in self.sample[:3])
        else:
            seen = f"observed {_short(self.observed)}"
        return f"{what}: {seen}"


def _short(v: Any) -> str:
    text = v if isinstance(v, str) else json.dumps(_jsonable(v))
    text = text if isinstance(text, str) else str(text)
    return text if len(text) <= 60 else text[:57] + "..."


def _jsonable(v: Any) -> Any:
    if isinstance(v, bytes):
        return v.decode("utf-8", "backslashreplace")
    if isinstance(v, float) and v != v:  # NaN: pandas' null
        return None
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_jsonable(x) for x in v]
    if isinstance(v, str | int | float | bool) or v is None:
        return v[:_SAMPLE_TEXT] if isinstance(v, str) else v
    return str(v)[:_SAMPLE_TEXT]


@dataclass
class Verdict:
    """What a gate decided about one batch."""

    layer: Layer
    table: str
    outcomes: list[Outcome]
    rows: int
    engine: str
    result: dict[str, Any] | None = None  # the GX result, for Data Docs
    validated_at: datetime = field(default_factory=lambda: datetime.now(UTC))
    published_version: int | None = None  # the table version that published the batch

    @property
    def failed(self) -> list[Outcome]:
        return [o for o in self.outcomes if not o.success and o.severity == "fail"]

    @property
    def to_quarantine(self) -> list[str]:
        return [
            o.expectation for o in self.outcomes if not o.success and o.severity == "quarantine"
        ]

    def summary(self) -> list[str]:
        ok = sum(o.success for o in self.outcomes)
        if self.engine == "none" and all(o.kind == "freshness" for o in self.outcomes):
            head = f"quality {self.layer}.{self.table}: freshness " + (
                "ok" if ok == len(self.outcomes) else "STALE"
            )
        else:
            judge = "" if self.engine == "none" else f", Great Expectations ({self.engine})"
            head = (
                f"quality {self.layer}.{self.table}: {ok}/{len(self.outcomes)} checks met on "
                f"{self.rows} rows{judge}"
            )
        return [
            head,
            *(f"  {o.severity.upper():10} {o.describe()}" for o in self.outcomes if not o.success),
        ]


def _outcomes(result: Any, by_name: Mapping[str, Expectation]) -> list[Outcome]:
    out = []
    for r in result.results:
        name = r.expectation_config.meta["name"]
        e = by_name[name]
        res = r.result or {}
        if r.exception_info and r.exception_info.get("raised_exception"):
            observed: Any = r.exception_info.get("exception_message")
        else:
            observed = res.get("observed_value")
        out.append(
            Outcome(
                expectation=name,
                kind=e.expect,
                severity=e.severity,
                success=bool(r.success),
                column=e.column,
                observed=_jsonable(observed),
                element_count=res.get("element_count"),
                unexpected_count=res.get("unexpected_count"),
                sample=tuple(_jsonable(res.get("partial_unexpected_list") or [])[:SAMPLE_SIZE]),
            )
        )
    order = {e: i for i, e in enumerate(by_name)}
    return sorted(out, key=lambda o: order[o.expectation])


_CONTEXT: dict[Any, Any] = {}
_LABELS = itertools.count(1)


def _validation(name: str, expectations: Sequence[Expectation], engine: str) -> Any:
    """The GX validation definition of a suite on an engine, made once per process: one
    ephemeral context, one data source per engine, one asset per suite."""
    gx = _gx()
    key = (name, tuple(expectations), engine)
    if key in _CONTEXT:
        return _CONTEXT[key]
    if "context" not in _CONTEXT:
        from great_expectations.data_context.types.base import ProgressBarsConfig

        context = gx.get_context(mode="ephemeral")
        context.variables.progress_bars = ProgressBarsConfig(
            globally=False, metric_calculations=False
        )
        _CONTEXT["context"] = context
    context = _CONTEXT["context"]
    source_name = f"lakehouse-{engine}"
    try:
        source = context.data_sources.get(source_name)
    except (KeyError, ValueError):
        source = (
            context.data_sources.add_pandas(source_name)
            if engine == "pandas"
            else context.data_sources.add_spark(source_name, persist=False)
        )
    # A fresh label each time (a suite that failed to compile must not leave its name taken).
    label = f"{name}-{next(_LABELS)}"
    compiled_suite = suite(label, expectations)  # first: an unknown kind adds nothing
    asset = source.add_dataframe_asset(label)
    definition = asset.add_batch_definition_whole_dataframe("batch")
    compiled = context.suites.add(compiled_suite)
    validation = context.validation_definitions.add(
        gx.ValidationDefinition(name=label, data=definition, suite=compiled)
    )
    _CONTEXT[key] = validation
    return validation


def run_suite(
    name: str,
    expectations: Sequence[Expectation],
    batch: DataFrame | pa.Table,
    rows: int,
    *,
    service: Path | None = None,
) -> tuple[list[Outcome], str, dict[str, Any]]:
    """Run the expectations on a batch with GX; return the outcomes, the engine used and the
    GX result as JSON. A batch for the pandas engine goes to the validation service listening
    at ``service`` (:mod:`lakehouse.gx_service`), if given and it answers: then this process
    does not import GX."""
    import pyarrow as pa

    # GX reads only the columns the expectations name (any one keeps the row count).
    names = batch.column_names if isinstance(batch, pa.Table) else batch.columns
    used = [c for c in names if c in {e.column for e in expectations}] or names[:1]
    if isinstance(batch, pa.Table) or rows <= pandas_max_rows():
        engine = "pandas"
        table = batch.select(used) if isinstance(batch, pa.Table) else batch.select(*used).toArrow()
        if service is not None:
            from lakehouse import gx_service

            try:
                return gx_service.validate(service, name, expectations, table)
            except gx_service.ServiceUnavailable as exc:
                print(f"quality: {exc}; validating in this process", file=sys.stderr, flush=True)
        data: Any = pandas_frame(table)
    else:
        # GX's Spark engine runs a job or more per expectation. Each would compute the batch
        # again, or read the job's whole cached batch (from disk, once it is larger than memory):
        # the few columns the expectations read are kept apart for it instead, once.
        engine, data = "spark", batch.select(*used).persist()
    validation = _validation(name, expectations, engine)
    try:
        result = validation.run(
            batch_parameters={"dataframe": data},
            result_format={"result_format": "SUMMARY", "partial_unexpected_count": SAMPLE_SIZE},
        )
    finally:
        if engine == "spark":
            data.unpersist()
    by_name = {e.name: e for e in expectations}
    document = result.to_json_dict()
    document["suite_name"] = name  # the context's suite carries a per-process label
    return _outcomes(result, by_name), engine, document


def pandas_frame(table: pa.Table) -> Any:
    """The batch as GX's pandas engine gets it, with narrow integers and floats widened to 64
    bits (values unchanged). GX's ``between`` compares 64-bit columns with pandas' vectorized
    operators but calls a Python function per row on any other dtype: ``between`` on a million int32
    partitions took the whole suite 0.47 s that way, and 0.09 s as int64."""
    import pyarrow as pa

    wide = []
    for f in table.schema:
        t = f.type
        if pa.types.is_integer(t) and t.bit_width < 64:
            t = pa.int64()  # holds every narrower signed or unsigned value
        elif pa.types.is_floating(t) and t.bit_width < 64:
            t = pa.float64()
        wide.append(f.with_type(t))
    return table.cast(pa.schema(wide)).to_pandas()


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
        ]
    )


def ledger_rows(
    run: RunInfo,
    verdict: Verdict,
    *,
    table_version: int | None,
    published: bool,
    source: Mapping[str, Any] | None,
) -> list[dict[str, Any]]:
    """The ledger's rows for one verdict: one per check."""
    base = {
        "run_id": run.run_id,
        "dag_id": run.dag_id,
        "dag_run_id": run.dag_run_id,
        "validated_at": verdict.validated_at,
        "layer": verdict.layer,
        "table": verdict.table,
        "table_version": table_version,
        "published": published,
        "source": None if source is None else json.dumps(source, sort_keys=True),
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
    with delta_spark.table_lock(ledger):
        delta_spark.append(
            data,
            ledger,
            txn=[Txn(app, version, rewind=True) for app, version in sorted(held.items())],
            create=schema,
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


def read_ledger(
    settings: Settings,
    table: str | None = None,
    *,
    dag_run_id: str | None = None,
    layer: str | None = None,
) -> pa.Table:
    """The ledger's rows: those of one table, one DAG run or one layer, if given (filtered by
    delta-rs's query engine, so a run's gate reads its own rows, not the ledger's history)."""
    from lakehouse.storage import snapshots
    from lakehouse.storage.store import snapshot_arrow

    if not is_table(settings.ledger_path):
        return ledger_schema().empty_table()
    wanted = {"table": table, "dag_run_id": dag_run_id, "layer": layer}
    terms = [
        f'"{column}" = \'' + value.replace("'", "''") + "'"
        for column, value in wanted.items()
        if value is not None
    ]
    data = snapshot_arrow(snapshots.latest(settings.ledger_path), " AND ".join(terms) or None)
    return data.cast(ledger_schema())


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
    from lakehouse.storage import delta_spark, snapshots

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
                held = delta_spark.position(settings.ledger_path, app)
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
    source: Mapping[str, Any] | None = None  # the input positions of the batch being judged
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
    def at_commit(self) -> bool:
        # A gold table has several writers (merges, appends): DeltaStore gates each commit.
        return self.layer == "gold"

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
        source: Mapping[str, Any] | None = None,
        at_most: tuple[int | None, int | None] = (None, None),
    ) -> Verdict:
        """Validate a batch before it is published; on a failed ``fail`` expectation, record
        it and raise. ``rows`` is the batch's size if known; a Spark batch small enough for
        GX's pandas engine is brought to Arrow (:func:`collect_if_small`). ``whole`` is what
        table-level gold expectations judge (the table as it would be after the batch).
        ``at_most``: bounds on the sizes of the batch and of ``whole``, if the caller knows
        them (a Spark batch within the bound is collected without being counted first)."""
        if rows is None:
            batch, rows = collect_if_small(batch, self.columns, at_most=at_most[0])
        exps = self.expectations
        name = suite_name(self.layer, self.table)
        outcomes: list[Outcome] = []
        engine, result = "none", None
        batch_level = [e for e in exps if not (self.layer == "gold" and e.expect in TABLE_LEVEL)]
        table_level = [e for e in exps if e not in batch_level]
        service = self.validation_service()
        if batch_level:
            outcomes, engine, result = run_suite(name, batch_level, batch, rows, service=service)
        if table_level:
            assert whole is not None, "table-level expectations need the would-be table"
            table, rows_after = collect_if_small(
                whole,
                sorted({e.column for e in table_level if e.column is not None}) or None,
                at_most=at_most[1],
            )
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
        self.source = source
        if verdict.failed:
            self.record(verdict, table_version=None, published=False)
            raise QualityGateError(self.layer, self.table, [o.describe() for o in verdict.failed])
        return verdict

    def validation_service(self) -> Path | None:
        """The lakehouse's validation service, if its socket is there (it runs with the Spark
        server, :mod:`lakehouse.gx_service`): pandas-sized batches are validated there."""
        from lakehouse import gx_service

        path = gx_service.address(self.settings)
        return path if path.exists() else None

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
            self.run, verdict, table_version=None, published=True, source=self.source
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
            self.run, verdict, table_version=table_version, published=published, source=self.source
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


def _merge_results(a: dict[str, Any] | None, b: dict[str, Any]) -> dict[str, Any]:
    if a is None:
        return b
    merged = dict(a)
    merged["results"] = [*a["results"], *b["results"]]
    merged["success"] = a["success"] and b["success"]
    return merged


def gate_for(path: Location) -> Gate | None:
    """The data-quality gate registered (by :func:`lakehouse.storage.gates.gating`) for a table."""
    gate = gates.gate_for(path)
    return gate if isinstance(gate, Gate) else None
