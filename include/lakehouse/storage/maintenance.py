"""Table maintenance with delta-spark: ``OPTIMIZE``, a consumer-aware ``VACUUM``, a checkpoint and
log cleanup.

A *consumer* is a downstream job that reads a table's change feed, and its position is the last
input version it consumed, recorded in its own output table (see
:func:`~lakehouse.storage.log.position`). A consumer at position ``p`` still reads the
versions after ``p``: the files those versions removed, and their commits.

* ``VACUUM`` deletes a removed file once its removal is older than the retention. Its retention
  is whole hours (Delta rounds it), so vacuum reaches back to an hour before the oldest
  consumer's position commit, rounded up: every file removed after that commit stays.
* Log cleanup (Delta's own, which the platform's tables turn off at checkpoints, see
  :data:`~lakehouse.storage.delta_spark.TABLE_PROPERTIES`) deletes commits older than the table's
  ``delta.logRetentionDuration`` that a checkpoint covers. Maintenance turns it on for its own
  checkpoint only while every commit a consumer still reads, and the commit holding the table's
  own positions, are younger than that retention.

Every step is SQL, so a Spark Connect session runs it as a classic one does (see
:func:`_checkpoint` for the checkpoint), and runs under the table's commit lock: OPTIMIZE,
VACUUM and the checkpoint commit, and one driver commits to a table at a time.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from lakehouse.errors import ConfigError, LakehouseError
from lakehouse.runtime import objectstore
from lakehouse.runtime.objectstore import Location
from lakehouse.storage.delta_spark import session_settings, table_lock
from lakehouse.storage.log import position, positions_commit

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from lakehouse.runtime.config import Settings

DEFAULT_RETENTION_HOURS = 168  # Delta's default deletedFileRetentionDuration: 7 days
# Vacuum also deletes files no commit references (left by crashed writers); a write still in
# flight has such files too, so the window must outlast the longest write.
MIN_SAFE_RETENTION_HOURS = 1
# Delta's default delta.logRetentionDuration.
DEFAULT_LOG_RETENTION = "interval 30 days"
# The table properties by which Delta checkpoints a commit and cleans the log after it (see
# :func:`_checkpoint`).
CHECKPOINT_INTERVAL = "delta.checkpointInterval"
LOG_CLEANUP = "delta.enableExpiredLogCleanup"
# While a checkpoint has changed the two above: the table's own values (JSON, null for unset).
RESTORE = "lakehouse.maintenance.restore"
_UNIT_SECONDS = {
    "microsecond": 1e-6,
    "millisecond": 1e-3,
    "second": 1,
    "minute": 60,
    "hour": 3600,
    "day": 86400,
    "week": 7 * 86400,
}


@dataclass(frozen=True)
class Consumer:
    """A job that reads a table incrementally, recording its position in its own ``table`` as
    app transaction ``app_id``."""

    name: str
    table: Location
    app_id: str

    def position(self) -> int | None:
        return position(self.table, self.app_id)


@dataclass
class MaintenanceReport:
    table: str
    version_before: int
    version_after: int = -1
    files_compacted: int = 0
    files_written: int = 0
    vacuumed: list[str] = field(default_factory=list)
    kept_from_version: int | None = None
    retain_hours: int | None = None
    checkpoint: int | None = None
    log_cleanup: str = "skipped"

    def summary(self) -> str:
        keep = (
            f"consumers need versions >= {self.kept_from_version}"
            if self.kept_from_version is not None
            else "no consumers"
        )
        return (
            f"{self.table}: compacted {self.files_compacted} file(s) into {self.files_written}; "
            f"vacuumed {len(self.vacuumed)} file(s) ({keep}; retained {self.retain_hours} h); "
            f"checkpoint at {self.checkpoint}; log cleanup {self.log_cleanup}"
        )


def maintain(
    spark: SparkSession,
    settings: Settings,
    path: Location,
    consumers: Sequence[Consumer] = (),
    *,
    retention_hours: float = DEFAULT_RETENTION_HOURS,
    compact: bool = True,
    vacuum: bool = True,
    checkpoint: bool = True,
    dry_run: bool = False,
    allow_unsafe_retention: bool = False,
) -> MaintenanceReport:
    """Maintain one table. ``dry_run`` reports what vacuum would delete and changes nothing."""
    if retention_hours < MIN_SAFE_RETENTION_HOURS and not allow_unsafe_retention:
        raise ConfigError(
            f"retention of {retention_hours} h is below {MIN_SAFE_RETENTION_HOURS} h: vacuum "
            "could delete the files of a write still in flight"
        )
    table = f"delta.`{path}`"
    with table_lock(settings, path):
        report = MaintenanceReport(table=str(path), version_before=_version(path))
        if compact and not dry_run:
            metrics = spark.sql(f"OPTIMIZE {table}").collect()[0]["metrics"]
            report.files_compacted = int(metrics["numFilesRemoved"])
            report.files_written = int(metrics["numFilesAdded"])
        latest = _version(path)
        positions = [c.position() for c in consumers]
        # The oldest consumer's position: it reads the versions after it (one without a
        # position reads them all).
        oldest: int | None = None
        if consumers:
            oldest = 0 if None in positions else min(p for p in positions if p is not None)
            report.kept_from_version = oldest
        if vacuum:
            report.retain_hours = _retain_hours(path, retention_hours, oldest, latest)
            report.vacuumed = _vacuum(spark, path, report.retain_hours, dry_run)
        if checkpoint and not dry_run:
            report.checkpoint, report.log_cleanup = _checkpoint(spark, path, oldest)
        report.version_after = _version(path)
    return report


def _version(path: Location) -> int:
    from lakehouse.storage.log import load

    return int(load(path).version())


def _commit_time(path: Location, version: int) -> float:
    """When ``version`` was committed, as Delta's log cleanup sees it: its log file's mtime (or
    the oldest commit's, if cleanup has deleted it)."""
    log = path / "_delta_log"
    commit = objectstore.stat(log / f"{version:020d}.json")
    if commit is not None:
        return commit.mtime_ns / 1e9
    return min(e.mtime_ns for e in objectstore.listdir(log) if e.name.endswith(".json")) / 1e9


def _retain_hours(path: Location, retention_hours: float, oldest: int | None, latest: int) -> int:
    """VACUUM's retention in whole hours: ``retention_hours``, or longer, reaching an hour past
    the commit of the oldest consumer's position when a later commit removed files (every file
    removed after it stays)."""
    hours = math.ceil(retention_hours)
    if oldest is not None and _removes_files(path, oldest + 1, latest):
        since = time.time() - _commit_time(path, oldest)
        hours = max(hours, math.ceil(since / 3600) + 1)
    return hours


def _removes_files(path: Location, start: int, end: int) -> bool:
    """Whether a commit from ``start`` to ``end`` removed a data file (one whose commit file is
    gone counts as one that did). Maintenance's own metadata commits (its checkpoint's, vacuum's)
    remove none: a consumer up to date but for them needs no file kept."""
    log = path / "_delta_log"
    for version in range(start, end + 1):
        try:
            lines = objectstore.read_bytes(log / f"{version:020d}.json").decode().splitlines()
        except FileNotFoundError:
            return True
        if any("remove" in json.loads(line) for line in lines if line.strip()):
            return True
    return False


def _vacuum(spark: SparkSession, path: Location, hours: int, dry_run: bool) -> list[str]:
    """The files VACUUM deletes with ``hours`` of retention, deleted unless ``dry_run``.

    Delta's defaults would override ``hours``: it refuses less than the table's
    ``delta.deletedFileRetentionDuration`` (the platform checks the retention itself, see
    :data:`MIN_SAFE_RETENTION_HOURS`), and it ignores a retention other than 0 in favour of that
    property. Both are turned off for this command. The property also bounds how long a
    snapshot keeps removed files' tombstones (an older removed file looks unreferenced to
    VACUUM), so it is raised, never lowered, to cover ``hours``."""
    table = f"delta.`{path}`"
    raise_to = {
        key: f"interval {hours} hours"
        for key, default in (
            ("delta.deletedFileRetentionDuration", "interval 1 week"),
            # Delta wants the log kept at least as long (cleanup waits for consumers anyway).
            ("delta.logRetentionDuration", DEFAULT_LOG_RETENTION),
        )
        if hours * 3600 > _interval_seconds(path, key, default)
    }
    if not dry_run and "delta.deletedFileRetentionDuration" in raise_to:
        pairs = ", ".join(f"'{k}' = '{v}'" for k, v in raise_to.items())
        spark.sql(f"ALTER TABLE {table} SET TBLPROPERTIES ({pairs})")
    honour = {
        "spark.databricks.delta.retentionDurationCheck.enabled": "false",
        "spark.databricks.delta.vacuum.retentionWindowIgnore.enabled": "false",
        # VACUUM lists and deletes files in as many tasks as this (10,000 by default: minutes
        # of tasks on a small table); the session's shuffle partitions instead.
        "spark.sql.sources.parallelPartitionDiscovery.parallelism": str(
            spark.conf.get("spark.sql.shuffle.partitions")
        ),
    }
    with session_settings(spark, honour):
        listed = spark.sql(f"VACUUM {table} RETAIN {hours} HOURS DRY RUN").collect()
        if not dry_run and listed:
            spark.sql(f"VACUUM {table} RETAIN {hours} HOURS")
    return [str(row["path"]) for row in listed]


def _checkpoint(spark: SparkSession, path: Location, oldest: int | None) -> tuple[int, str]:
    """Write a checkpoint of the table; clean its log then, unless a commit that cleanup could
    delete is still needed (by a consumer, or as the one holding the table's positions) and
    older than the log retention. Returns the checkpoint's version and what happened to the log.

    delta-spark has no command for a checkpoint, and Spark Connect no JVM to call ``DeltaLog``
    on, so Delta is led to write one itself: after a commit whose version is a multiple of the
    ``delta.checkpointInterval`` in its metadata, Delta checkpoints that version, then cleans the
    log if ``delta.enableExpiredLogCleanup`` holds in the table's newest metadata (Delta 4.4's
    ``CheckpointHook`` and ``MetadataCleanup.doLogCleanup``). So one ``ALTER TABLE`` commit sets
    the interval to 1 and the cleanup switch as decided above, and records the table's own values
    (:data:`RESTORE`); it is checkpointed. One or two more put the table's own values back (a
    first one that sets a value the table had is checkpointed too, with cleanup as the table
    has it), and drop the record last: a run killed before that leaves the record, and the next
    run restores from it first. They run under the table's commit lock the caller holds, so no
    other commit comes between."""
    from lakehouse.storage.log import load

    table = f"delta.`{path}`"
    own = dict(load(path).metadata().configuration)
    if RESTORE in own:  # a maintain run died before it put the table's values back
        _restore(spark, table, json.loads(own[RESTORE]))
        own = dict(load(path).metadata().configuration)
    held = _held_back(path, oldest)
    wanted = {CHECKPOINT_INTERVAL: "1", LOG_CLEANUP: "false" if held is not None else "true"}
    changed = [k for k, v in wanted.items() if own.get(k) != v]
    # The table's own values ride in the same commit, so a run killed before it put them back
    # leaves them for the next run to restore (above).
    saved = {k: own.get(k) for k in changed}
    spark.sql(
        f"ALTER TABLE {table} SET TBLPROPERTIES ({_pairs({**wanted, RESTORE: json.dumps(saved)})})"
    )
    try:
        version = _version(path)  # the commit Delta checkpointed
        if not _checkpointed(path, version):
            raise LakehouseError(
                f"{path}: Delta wrote no checkpoint at version {version} (see the Spark log)"
            )
    finally:
        _restore(spark, table, saved)
    if held is not None:
        return (
            version,
            f"postponed: version {held} is still needed and older than the log retention",
        )
    return version, "done"


def _restore(spark: SparkSession, table: str, saved: Mapping[str, str | None]) -> None:
    """Put back the table's own values of the properties a checkpoint changed (``None``: the
    table had none), and drop the record of them last: the values the table had are set first,
    then the ones it did not have are unset with the record, so a run killed in between leaves
    the record for the next one."""
    reset = {k: v for k, v in saved.items() if v is not None}
    if reset:
        spark.sql(f"ALTER TABLE {table} SET TBLPROPERTIES ({_pairs(reset)})")
    keys = ", ".join(f"'{k}'" for k in [*(k for k, v in saved.items() if v is None), RESTORE])
    spark.sql(f"ALTER TABLE {table} UNSET TBLPROPERTIES ({keys})")


def _held_back(path: Location, oldest: int | None) -> int | None:
    """The oldest commit that log cleanup must not delete (the oldest consumer's position, or
    the commit holding the table's positions) when it is older than the table's log retention,
    and cleanup would delete it; None when cleanup may run."""
    keep = [v for v in (oldest, positions_commit(path)) if v is not None]
    if not keep:
        return None
    first = min(keep)
    retention = _interval_seconds(path, "delta.logRetentionDuration", DEFAULT_LOG_RETENTION)
    return first if _commit_time(path, first) < time.time() - retention else None


def _checkpointed(path: Location, version: int) -> bool:
    """Whether the log holds a checkpoint of ``version`` (one file, or every part of one)."""
    prefix = f"{version:020d}.checkpoint."
    return any(name.startswith(prefix) for name in objectstore.names(path / "_delta_log"))


def _pairs(properties: Mapping[str, str]) -> str:
    return ", ".join(f"'{k}' = '{v}'" for k, v in properties.items())


def _interval_seconds(path: Location, key: str, default: str) -> float:
    """The table property ``key`` (an interval in Delta's syntax, ``default`` if unset) in
    seconds, read from the table's log."""
    from lakehouse.storage.log import load

    raw = load(path).metadata().configuration.get(key, default)
    words = raw.strip().lower().split()
    words = words[1:] if words[:1] == ["interval"] else words
    seconds = 0.0
    for number, unit in zip(words[::2], words[1::2], strict=False):
        unit = unit.removesuffix("s")
        if not number.isdigit() or unit not in _UNIT_SECONDS:
            break
        seconds += int(number) * _UNIT_SECONDS[unit]
    else:
        if words and len(words) % 2 == 0:
            return seconds
    raise ConfigError(f"{path}: {key} {raw!r} is not an interval of weeks to microseconds")
