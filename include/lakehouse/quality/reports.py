"""Data-quality reports: Great Expectations Data Docs, and the ledger's latest results and trends.

The gates keep each validation's full GX result as JSON under ``quality/validations``; Data Docs
are rebuilt from those files by ``lakehouse report`` (the pipeline DAG's last task), into
``reports/data_docs``, which the Airflow UI links to. Jobs never touch GX's project folder, so
two jobs validating at once cannot race on it: this module is its only writer. The site serves
every style, font and script its pages load (:mod:`lakehouse.quality.web_assets`): it renders on
a closed network.
"""

from __future__ import annotations

import html
import json
import shutil
from collections import defaultdict
from collections.abc import Callable, Collection, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from lakehouse.contracts.catalog import Catalog
from lakehouse.quality.expectations import import_gx, suite, suite_name
from lakehouse.quality.history import Run
from lakehouse.quality.ledger import BATCH, BLOCKED
from lakehouse.quality.verdict import Outcome, observed_text
from lakehouse.quality.web_assets import check_installed, make_offline
from lakehouse.runtime.config import LAYERS, Settings

SITE = "lakehouse"
KEEP_PER_SUITE = 30


def _saved_results(settings: Settings, keep: int) -> dict[str, list[dict[str, Any]]]:
    """The newest ``keep`` saved results of each suite (file names sort by time)."""
    out: dict[str, list[dict[str, Any]]] = {}
    root = settings.validations_root
    if not root.is_dir():
        return out
    for folder in sorted(p for p in root.iterdir() if p.is_dir()):
        files = sorted(folder.glob("*.json"))[-keep:]
        out[folder.name] = [json.loads(f.read_text(encoding="utf-8")) for f in files]
    return out


def build_data_docs(
    settings: Settings, catalog: Catalog | None = None, *, keep: int = KEEP_PER_SUITE
) -> Path:
    """Rebuild Data Docs from the saved validation results; return the site's index page.

    The GX project under ``quality/gx`` is rebuilt each time from the contracts (suites) and the
    newest ``keep`` results per suite, so the site shows what the contracts say now and its
    build time does not grow with history (the ledger keeps all of it). The pages load nothing
    from other hosts (:func:`~lakehouse.quality.web_assets.make_offline`); a page that would
    fails the build with :class:`~lakehouse.errors.OfflineDocsError`, and missing web assets
    with :class:`~lakehouse.errors.WebAssetsError`, leaving the previous site in place."""
    gx = import_gx()
    from great_expectations.core.expectation_validation_result import (
        ExpectationSuiteValidationResultSchema,
    )
    from great_expectations.core.run_identifier import RunIdentifier
    from great_expectations.data_context.types.resource_identifiers import (
        ExpectationSuiteIdentifier,
        ValidationResultIdentifier,
    )

    # Before anything is removed: without its styles and scripts a new site would be worse than
    # the one there.
    check_installed()
    project = settings.quality_root / "gx"
    shutil.rmtree(project, ignore_errors=True)
    site = settings.data_docs_root
    # Built beside the site and swapped in whole once every page is served offline: a build that
    # fails leaves the previous site, and readers never see a half-built one.
    staging = site.with_name(site.name + ".building")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    context = gx.get_context(mode="file", project_root_dir=str(project))
    for name in list(context.get_config().data_docs_sites or {}):
        context.delete_data_docs_site(name)
    context.add_data_docs_site(
        SITE,
        {
            "class_name": "SiteBuilder",
            "show_how_to_buttons": False,
            "store_backend": {
                "class_name": "TupleFilesystemStoreBackend",
                "base_directory": str(staging),
            },
            "site_index_builder": {"class_name": "DefaultSiteIndexBuilder"},
        },
    )
    catalog = catalog or Catalog.load_each(settings.contracts_dir).catalog
    for contract in catalog:
        for layer in LAYERS:
            for table in contract.published_tables(layer):
                if exps := contract.expectations_for(layer, table):
                    context.suites.add_or_update(suite(suite_name(layer, table), exps))
    loader = ExpectationSuiteValidationResultSchema()
    for name, documents in _saved_results(settings, keep).items():
        for doc in documents:
            result = loader.load(doc["result"])
            key = ValidationResultIdentifier(
                expectation_suite_identifier=ExpectationSuiteIdentifier(name=name),
                run_id=RunIdentifier(
                    run_name=doc.get("dag_run_id") or doc["run_id"],
                    run_time=doc["validated_at"],
                ),
                batch_identifier=doc["run_id"][:12],
            )
            context.validation_results_store.set(key, result)
    context.build_data_docs(site_names=[SITE])
    (staging / "index.html").replace(staging / GX_INDEX)
    overview = _overview(staging, _saved_results(settings, keep))
    (staging / "index.html").write_text(overview, encoding="utf-8")
    make_offline(staging)
    shutil.rmtree(site, ignore_errors=True)
    staging.rename(site)
    return site / "index.html"


GX_INDEX = "gx-index.html"


_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2rem; color: #222; }
table { border-collapse: collapse; margin: 0.5rem 0 1.5rem; }
th, td { border: 1px solid #ccc; padding: 0.3rem 0.6rem; text-align: left; vertical-align: top; }
th { background: #f4f4f4; }
.ok { color: #176f2c; font-weight: 600; } .failed { color: #b00020; font-weight: 600; }
.muted { color: #666; }
"""


def _overview(site: Path, results: dict[str, list[dict[str, Any]]]) -> str:
    """The site's front page, plain HTML without scripts, readable without any: each suite's
    validations, newest first, with their verdict and a link to GX's page of each (GX's own
    index, which builds its tables with scripts, is linked from it)."""
    esc = html.escape
    parts = [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
        f"<title>Data quality</title><style>{_STYLE}</style></head><body>",
        "<h1>Data quality</h1>",
        f"<p class='muted'>Built {datetime.now(UTC):%Y-%m-%d %H:%M:%S} UTC from the newest "
        f"validations of each table; each links to its page in the Great Expectations Data "
        f"Docs (<a href='{GX_INDEX}'>their own index</a>).</p>",
    ]
    if not results:
        parts.append("<p>No validation has been recorded yet.</p>")
    for name, documents in sorted(results.items()):
        layer, _, table = name.partition(".")
        suite_page = f"expectations/{layer}/{table}.html"
        parts.append(f"<h2 id='{esc(name)}'>{esc(name)}</h2>")
        if (site / suite_page).is_file():
            parts.append(f"<p><a href='{esc(suite_page)}'>Expectation suite</a></p>")
        parts.append(
            "<table><tr><th>validated at (UTC)</th><th>DAG run</th><th>verdict</th>"
            "<th>expectations met</th><th>failed</th></tr>"
        )
        for doc in reversed(documents):
            result = doc["result"]
            stats = result.get("statistics", {})
            failed = [
                r["expectation_config"].get("meta", {}).get("name", r["expectation_config"]["type"])
                for r in result.get("results", [])
                if not r.get("success")
            ]
            page = next(
                iter(
                    sorted(
                        (site / "validations" / layer / table).rglob(f"{doc['run_id'][:12]}.html")
                    )
                ),
                None,
            )
            when = esc(doc["validated_at"][:19].replace("T", " "))
            if page is not None:
                when = f"<a href='{esc(page.relative_to(site).as_posix())}'>{when}</a>"
            verdict = (
                "<span class='ok'>passed</span>"
                if result.get("success")
                else "<span class='failed'>failed</span>"
            )
            parts.append(
                f"<tr><td>{when}</td><td>{esc(doc.get('dag_run_id') or '-')}</td>"
                f"<td>{verdict}</td><td>{stats.get('successful_expectations', '?')}/"
                f"{stats.get('evaluated_expectations', '?')}</td>"
                f"<td>{esc(', '.join(failed)) or '-'}</td></tr>"
            )
        parts.append("</table>")
    parts.append("</body></html>")
    return "\n".join(parts)


def _observed(row: Mapping[str, Any]) -> str:
    """What a ledger row's check saw, with its unit (:func:`observed_text`)."""
    observed = None if row["observed_value"] is None else json.loads(row["observed_value"])
    sample = json.loads(row["unexpected_sample"]) if row["unexpected_sample"] else []
    return observed_text(
        row["kind"], observed, row["element_count"], row["unexpected_count"], sample
    )


def check_text(row: Mapping[str, Any]) -> str:
    """A ledger row's check in the job's own words (:meth:`Outcome.describe`): the expectation,
    its kind and column, and what it saw, with some of the unexpected values."""
    observed = None if row["observed_value"] is None else json.loads(row["observed_value"])
    sample = json.loads(row["unexpected_sample"]) if row["unexpected_sample"] else []
    return Outcome(
        expectation=row["expectation"],
        kind=row["kind"],
        severity=row["severity"],
        success=row["success"],
        column=row["column"],
        observed=observed,
        element_count=row["element_count"],
        unexpected_count=row["unexpected_count"],
        sample=tuple(sample),
    ).describe()


def failed_checks(
    settings: Settings,
    dag_run_id: str,
    layer: str,
    tables: Sequence[str],
    severities: Collection[str],
) -> dict[str, list[dict[str, Any]]]:
    """The ledger rows of the checks of ``severities`` that failed in a DAG run's last validation
    of each of a layer's ``tables`` (a task's retry validates again: the last job run's verdict
    is the one that stands), by table in the order of ``tables``; a table with none is left
    out."""
    from lakehouse.quality.ledger import read_ledger

    rows = read_ledger(settings, dag_run_id=dag_run_id, layer=layer).to_pylist()
    found: dict[str, list[dict[str, Any]]] = {}
    for name in tables:
        checks = [r for r in rows if r["table"] == name and r["kind"] != BATCH]
        if not checks:
            continue
        last = max(checks, key=lambda r: r["validated_at"])["run_id"]
        failed = [
            r
            for r in checks
            if r["run_id"] == last and not r["success"] and r["severity"] in severities
        ]
        if failed:
            found[name] = failed
    return found


def counted(n: int, thing: str, things: str | None = None) -> str:
    """``1 run``, ``2 runs``: a count with its noun, singular or plural."""
    return f"{n} {thing if n == 1 else (things or thing + 's')}"


def ledger_report(
    settings: Settings, *, table: str | None = None, last: int = 10, days: float | None = None
) -> list[str]:
    """Each table's latest run and its last batch that carried data, each with its checks, and
    the trend over its last ``last`` runs within the ledger's newest ``days``: what became of
    its batches (published or blocked, rows, quarantined by reason, late, offset gaps, lag) and
    how its checks went, from the same history the data-quality page draws
    (:mod:`lakehouse.quality.history`). ``table``: a topic (all its tables), a stream, a gold
    table or ``layer.name``."""
    from lakehouse.quality.history import DAYS, history

    found = history(settings, table=table, days=DAYS if days is None else days)
    if not found.runs:
        return ["no validations recorded" + ("" if table is None else f" for {table}")]
    lines: list[str] = []
    for name in found.tables():
        runs = found.of(name)[-last:]
        checked = [r for r in runs if r.checks]
        failures: dict[str, int] = defaultdict(int)
        for r in checked:
            for failed in r.failed:
                failures[failed.split(" ", 1)[1]] += 1

        def checks_of(
            run: Run, failures: Mapping[str, int] = failures, n: int = len(checked)
        ) -> list[str]:
            out = []
            for c in found.checks_of(run):
                mark = "ok  " if c.success else "FAIL"
                seen = f"failed in {failures[c.expectation]} of {counted(n, 'checked run')}"
                out.append(f"    {mark} {c.severity:10} {c.expectation:28} {c.observed}  ({seen})")
            return out

        latest, batch = found.latest(name), found.last_batch(name)
        lines.append(name)
        if batch is latest:
            lines.append(f"  latest run, with data: {when(latest)}, {describe_run(latest)}")
            lines += checks_of(latest)
        else:
            lines.append(f"  latest run: {when(latest)}, {describe_run(latest)}")
            lines += checks_of(latest)
            if batch is None:
                lines.append("  last batch with data: none in this window")
            else:
                lines.append(f"  last batch with data: {when(batch)}, {describe_run(batch)}")
                lines += checks_of(batch)
        batches = [r for r in runs if r.outcome is not None]
        trend = [
            f"{'last run' if len(runs) == 1 else f'last {len(runs)} runs'}: "
            f"{counted(len(batches), 'batch', 'batches')}"
        ]
        if batches:
            blocked = sum(r.outcome == BLOCKED for r in batches)
            trend.append(f"{len(batches) - blocked} published, {blocked} blocked")
            trend.append(f"{sum(r.quarantined or 0 for r in batches)} quarantined")
            if any(r.late is not None for r in batches):
                trend.append(f"{sum(r.late or 0 for r in batches)} late")
        if checked:
            clean = sum(r.met == r.checks for r in checked)
            trend.append(f"{clean} of {counted(len(checked), 'checked run')} met every check")
        lines.append("  " + ", ".join(trend))
    return lines


def when(run: Run) -> str:
    return f"{run.at:%Y-%m-%d %H:%M:%S} UTC"


def describe_run(run: Run) -> str:
    """One run of a table in words: its batch's outcome and counts, its checks, its lag."""
    parts = []
    if run.outcome is None:
        parts.append("no new data")
    else:
        version = "" if run.table_version is None else f" as version {run.table_version}"
        parts.append(f"{run.rows} rows {run.outcome}{version}")
    if run.quarantined:
        by = ", ".join(f"{n} {reason}" for reason, n in run.reasons.items())
        parts.append(f"{run.quarantined} quarantined ({by})")
    if run.late is not None:
        parts.append(f"{run.late} late" + (f" (to {run.late_table})" if run.late else ""))
    if run.gaps:
        parts.append(f"{run.gaps} offsets missing")
    if run.checks:
        parts.append(f"{run.met}/{run.checks} checks met")
    if run.freshness_age_s is not None and run.freshness_limit_s is not None:
        parts.append(
            f"last data {run.freshness_age_s:.0f} s ago (limit {run.freshness_limit_s:g} s)"
        )
    if run.lag is not None:
        parts.append(f"lag {run.lag} {run.lag_unit}")
    return ", ".join(parts)


def run_summary(settings: Settings, dag_run_id: str) -> list[str]:
    """One DAG run's validations: each table's verdict, and every expectation that failed."""
    from lakehouse.quality.ledger import read_ledger

    rows = read_ledger(settings, dag_run_id=dag_run_id).to_pylist()
    if not rows:
        return [f"no validations recorded for run {dag_run_id}"]
    by_table: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        by_table[(r["layer"], r["table"])].append(r)
    lines = [f"data quality of run {dag_run_id}:"]
    for (layer, name), found in sorted(by_table.items()):
        checks = [r for r in found if r["kind"] != BATCH]
        met = sum(r["success"] for r in checks)
        published = any(r["published"] for r in found)
        lines.append(
            f"  {layer}.{name}: "
            + "; ".join(_batch_words(r) for r in found if r["kind"] == BATCH)
            + (f"; {met}/{len(checks)} checks met" if checks else "")
            + ("" if published else " (not published)")
        )
        for r in checks:
            if not r["success"]:
                lines.append(f"    {r['severity'].upper()} {r['expectation']}: {_observed(r)}")
    return lines


def layer_verdict(
    settings: Settings, dag_run_id: str, layer: str, tables: Sequence[str]
) -> tuple[list[str], list[str]]:
    """The verdicts one layer's job recorded in a DAG run, for the DAG's gate task: the lines to
    print, and the failed ``fail`` checks (which must stop the run's next layer)."""
    from lakehouse.quality.ledger import read_ledger

    rows = [
        r
        for r in read_ledger(settings, dag_run_id=dag_run_id, layer=layer).to_pylist()
        if r["table"] in tables
    ]
    lines, failed = [], []
    for name in tables:
        found = [r for r in rows if r["table"] == name]
        checks = [r for r in found if r["kind"] != BATCH]
        batches = [_batch_words(r) for r in found if r["kind"] == BATCH]
        if not found:
            lines.append(f"{layer}.{name}: no batch validated in this run (no new data)")
            continue
        met = sum(r["success"] for r in checks)
        published = sorted({r["table_version"] for r in found if r["published"]})
        lines.append(
            f"{layer}.{name}: "
            + "; ".join([*batches, *([f"{met}/{len(checks)} checks met"] if checks else [])])
            + "; "
            + (f"published version(s) {published}" if published else "nothing published")
        )
        for r in checks:
            if r["success"]:
                continue
            text = (
                f"{r['severity'].upper()} {r['expectation']} ({r['kind']}): observed {_observed(r)}"
            )
            lines.append(f"  {text}")
            if r["severity"] == "fail":
                failed.append(f"{layer}.{name}: {text}")
    return lines, failed


def _batch_words(row: Mapping[str, Any]) -> str:
    """A ledger's batch row in words: what became of the batch."""
    words = f"batch of {row['rows']} rows {row['outcome']}"
    if row["quarantined"]:
        reasons = json.loads(row["quarantine_reasons"] or "{}")
        words += (
            f", {row['quarantined']} quarantined ("
            + ", ".join(f"{n} {reason}" for reason, n in reasons.items())
            + ")"
        )
    if row["late"]:
        words += f", {row['late']} late to {row['late_table']}"
    if row["gaps"]:
        words += f", {row['gaps']} offsets missing"
    return words


def print_report(settings: Settings, echo: Callable[[str], None] = print, **kwargs: Any) -> None:
    for line in ledger_report(settings, **kwargs):
        echo(line)
