"""A contract's expectations compiled three ways from one declaration: Great Expectations
(1.x) suites, the judge of every batch; Spark predicates, which rows a ``quarantine`` expectation
routes; and Delta CHECK constraints for ``fail`` row checks, which hold every Delta writer to the
contract.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from lakehouse.contracts.model import Expectation
from lakehouse.errors import ConfigError
from lakehouse.runtime.config import Layer, whole_number_setting
from lakehouse.runtime.objectstore import Location

if TYPE_CHECKING:
    from pyspark.sql import Column, SparkSession


# Expectations judged per row: they can quarantine rows and become Delta CHECK constraints.
ROW_LEVEL = ("not_null", "between", "in_set", "match_regex", "length_between")


# On a gold table these judge the whole table as it would be after the batch.
TABLE_LEVEL = ("unique", "row_count_between")


SAMPLE_SIZE = 10


REASON_PREFIX = "expectation "


def pandas_max_rows() -> int:
    """Batches up to this many rows are judged by GX's pandas engine, bigger ones by Spark's."""
    return whole_number_setting("LAKEHOUSE_GX_PANDAS_MAX_ROWS", 2_000_000, "rows")


def suite_name(layer: Layer, table: str) -> str:
    return f"{layer}.{table}"


# -- compiling -------------------------------------------------------------------------------
def import_gx() -> Any:
    """Great Expectations, imported without its analytics and without its chatter: it logs a
    line at INFO for each function its API decorator registers (hundreds, at import) and more
    while it builds Data Docs. Its errors still show; its verdicts are the platform's to say."""
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "False")
    logging.getLogger("great_expectations").setLevel(logging.ERROR)
    import great_expectations as gx

    return gx


def gx_expectation(e: Expectation) -> Any:
    """The Great Expectations expectation of one contract expectation (its name, kind and
    severity ride in ``meta``, so results map back to the contract)."""
    import_gx()
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
    gx = import_gx()
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
