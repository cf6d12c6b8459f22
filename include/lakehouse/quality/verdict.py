"""Running a suite on a batch: GX's pandas engine on an Arrow copy of the columns the
expectations read for batches up to ``LAKEHOUSE_GX_PANDAS_MAX_ROWS`` (in the validation service,
:mod:`lakehouse.quality.gx_service`, where one runs), GX's Spark engine beyond; the outcomes and
the verdict a gate acts on.
"""

from __future__ import annotations

import itertools
import json
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from lakehouse.contracts.model import Expectation
from lakehouse.runtime.config import Layer

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame
from lakehouse.quality.expectations import SAMPLE_SIZE, import_gx, pandas_max_rows, suite

_SAMPLE_TEXT = 200
_CONTEXT: dict[Any, Any] = {}


class ServiceUnavailable(Exception):
    """A validation service cannot answer this request; the caller validates in its own
    process."""


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
        seen = observed_text(
            self.kind, self.observed, self.element_count, self.unexpected_count, self.sample
        )
        if self.unexpected_count is not None and self.kind != "row_count_between":
            if self.sample:
                seen += ", e.g. " + ", ".join(_short(v) for v in self.sample[:3])
        else:
            seen = f"observed {seen}"
        return f"{what}: {seen}"


def observed_text(
    kind: str,
    observed: Any,
    element_count: int | None,
    unexpected_count: int | None,
    sample: Sequence[Any] = (),
) -> str:
    """What a check saw, with its unit: a freshness check's age in seconds and its limit, a
    count of rows, or the rows a column check found unexpected. The one wording of the run's
    verdicts, the ledger's report (`lakehouse dq`) and the DAG's gate."""
    if unexpected_count is not None and kind != "row_count_between":
        return f"{unexpected_count} of {element_count} rows unexpected"
    if isinstance(observed, bool) or not isinstance(observed, int | float):
        return _short(observed)  # a message (the check could not run, no data yet)
    if kind == "freshness":  # seconds since the table's last commit; the limit in ``sample``
        return f"{observed:.1f} s" + (f" ({sample[0]})" if sample else "")
    if kind == "volume":  # the batch's rows; the usual size in ``sample``
        return f"{observed} rows" + (f" ({sample[0]} rows)" if sample else "")
    if kind == "row_count_between":
        return f"{observed} rows"
    return _short(observed)


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


_LABELS = itertools.count(1)


def _validation(name: str, expectations: Sequence[Expectation], engine: str) -> Any:
    """The GX validation definition of a suite on an engine, made once per process: one
    ephemeral context, one data source per engine, one asset per suite."""
    gx = import_gx()
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


# A validation service's client: a suite's name, its expectations and an Arrow batch to GX's
# outcomes, engine and result (:func:`lakehouse.quality.gx_service.client`).
Remote = Callable[
    [str, Sequence[Expectation], "pa.Table"], tuple[list[Outcome], str, dict[str, Any]]
]


def run_suite(
    name: str,
    expectations: Sequence[Expectation],
    batch: DataFrame | pa.Table,
    rows: int,
    *,
    service: Remote | None = None,
) -> tuple[list[Outcome], str, dict[str, Any]]:
    """Run the expectations on a batch with GX; return the outcomes, the engine used and the
    GX result as JSON. A batch for the pandas engine goes to ``service`` (the validation service's
    client, :func:`lakehouse.quality.gx_service.client`), if given and it answers: then this
    process does not import GX."""
    import pyarrow as pa

    # GX reads only the columns the expectations name (any one keeps the row count).
    names = batch.column_names if isinstance(batch, pa.Table) else batch.columns
    used = [c for c in names if c in {e.column for e in expectations}] or names[:1]
    if isinstance(batch, pa.Table) or rows <= pandas_max_rows():
        engine = "pandas"
        table = batch.select(used) if isinstance(batch, pa.Table) else batch.select(*used).toArrow()
        if service is not None:
            try:
                return service(name, expectations, table)
            except ServiceUnavailable as exc:
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
