"""What a batch made the Spark server do, read from its event log (``LAKEHOUSE_SPARK_EVENT_LOG``,
:func:`lakehouse.runtime.spark.event_log_conf`): the Spark jobs, SQL executions and the time in
jobs of each layer and gold table, by the job tag each carries
(:func:`lakehouse.runtime.spark.tagged`).

An event log is a folder per application (``eventlog_v2_<app>``, Spark's rolling writer) of
files ``events_<n>_<app>`` holding one JSON listener event per line. :func:`mark` says where the
log ends now; :func:`usage` counts what came after a mark.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

UNTAGGED = "(untagged)"
_TAG = re.compile(r"lakehouse:[^,]*")


@dataclass
class Usage:
    """What the jobs of one tag did: how many, in how many SQL executions, for how long (the
    sum of their run times, in seconds: jobs side by side count twice)."""

    jobs: int = 0
    sql: set[int] = field(default_factory=set)
    seconds: float = 0.0


def _files(folder: Path) -> list[Path]:
    apps = sorted(folder.glob("eventlog_v2_*"), key=lambda p: p.stat().st_mtime)
    if not apps:
        return []
    app = apps[-1]  # the running server's: the newest application
    return sorted(app.glob("events_*"), key=lambda f: int(f.name.split("_")[1]))


def _lines(folder: Path) -> Iterator[str]:
    for f in _files(folder):
        with f.open(errors="replace") as text:
            yield from text


def mark(folder: Path) -> int:
    """How many events the newest application's log holds now."""
    return sum(1 for _ in _lines(folder))


def tag_of(properties: dict[str, Any]) -> str:
    """The platform's tag of a job (``lakehouse:<layer>:<name>``), :data:`UNTAGGED` if none;
    the innermost when a job carries several."""
    found = _TAG.findall(properties.get("spark.job.tags", "") or "")
    return found[-1] if found else UNTAGGED


def usage(folder: Path, since: int = 0) -> dict[str, Usage]:
    """The jobs started after event ``since`` of the newest application's log, by tag."""
    out: dict[str, Usage] = {}
    started: dict[int, tuple[str, int]] = {}
    for n, line in enumerate(_lines(folder)):
        if n < since or not line.strip():
            continue
        event = json.loads(line)
        kind = event.get("Event")
        if kind == "SparkListenerJobStart":
            props = event.get("Properties") or {}
            tag = tag_of(props)
            entry = out.setdefault(tag, Usage())
            entry.jobs += 1
            sql = props.get("spark.sql.execution.id")
            if sql is not None:
                entry.sql.add(int(sql))
            started[event["Job ID"]] = (tag, int(event["Submission Time"]))
        elif kind == "SparkListenerJobEnd" and event["Job ID"] in started:
            tag, at = started.pop(event["Job ID"])
            out[tag].seconds += (int(event["Completion Time"]) - at) / 1000
    return out


def table_versions(root: Path) -> dict[str, int]:
    """The newest version of each Delta table under ``root`` (a local lake's folder), by its path
    relative to ``root``: two of these, before and after a batch, say how many commits it made
    to each table."""
    out = {}
    for log in root.rglob("_delta_log"):
        versions = [int(f.stem) for f in log.glob("*.json") if f.stem.isdigit()]
        if versions:
            out[str(log.parent.relative_to(root))] = max(versions)
    return out


def commits(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    """The commits made to each table between two :func:`table_versions` (the tables that got
    any)."""
    made = {t: v - before.get(t, -1) for t, v in after.items()}
    return {t: n for t, n in sorted(made.items()) if n > 0}


def adaptive_sql(folder: Path, since: int = 0) -> set[int]:
    """The SQL executions started after event ``since`` that Spark planned with adaptive query
    execution (their physical plan is an ``AdaptiveSparkPlan``)."""
    out = set()
    for n, line in enumerate(_lines(folder)):
        if n < since or '"executionId"' not in line:
            continue
        event = json.loads(line)
        if event.get("Event", "").endswith(".SparkListenerSQLExecutionStart") and (
            "AdaptiveSparkPlan" in (event.get("physicalPlanDescription") or "")
        ):
            out.add(int(event["executionId"]))
    return out
