"""Table maintenance: compaction, consumer-aware vacuum, checkpoints and log cleanup.

A *consumer* is a downstream job that reads a table's change feed, and its position is the last
source version it consumed, recorded in its own output table as an app transaction. Vacuum never
deletes a file that a consumer still needs to read the versions after its position, nor one
inside the retention window; log cleanup waits until every consumer has moved past the commits
it would delete. Runs on delta-rs alone (no Spark).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from lakehouse.errors import ConfigError
from lakehouse.storage.delta_spark import position, positions_commit

DEFAULT_RETENTION_HOURS = 168  # Delta's default deletedFileRetentionDuration: 7 days
# Vacuum also deletes files no commit references (left by crashed writers); a write still in
# flight has such files too, so the window must outlast the longest write.
MIN_SAFE_RETENTION_HOURS = 1


@dataclass(frozen=True)
class Consumer:
    """A job that reads ``source`` incrementally, recording its position in ``table``."""

    name: str
    table: Path
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
            f"vacuumed {len(self.vacuumed)} file(s) ({keep}); checkpoint at "
            f"{self.checkpoint}; log cleanup {self.log_cleanup}"
        )


def maintain(
    path: Path,
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
    from deltalake import DeltaTable

    if retention_hours < MIN_SAFE_RETENTION_HOURS and not allow_unsafe_retention:
        raise ConfigError(
            f"retention of {retention_hours} h is below {MIN_SAFE_RETENTION_HOURS} h: vacuum "
            "could delete the files of a write still in flight"
        )
    dt = DeltaTable(str(path))
    report = MaintenanceReport(table=str(path), version_before=int(dt.version()))

    if compact and not dry_run:
        metrics = dt.optimize.compact()
        report.files_compacted = int(metrics.get("numFilesRemoved", 0))
        report.files_written = int(metrics.get("numFilesAdded", 0))
        dt = DeltaTable(str(path))

    latest = int(dt.version())
    positions = [c.position() for c in consumers]
    keep: list[int] | None = None
    if consumers:
        # A consumer at position p reads versions p+1.. next: it needs the files added there
        # (in snapshots p+1..) and those removed there (still in snapshot p).
        oldest = (
            0 if any(p is None for p in positions) else min(p for p in positions if p is not None)
        )
        report.kept_from_version = oldest
        keep = list(range(oldest, latest + 1))
    if vacuum:
        report.vacuumed = list(
            dt.vacuum(
                retention_hours=int(retention_hours),
                dry_run=dry_run,
                enforce_retention_duration=False,
                full=True,
                keep_versions=keep,
            )
        )
    if checkpoint and not dry_run:
        dt = DeltaTable(str(path))
        dt.create_checkpoint()
        report.checkpoint = int(dt.version())
        lagging = [
            c.name
            for c, p in zip(consumers, positions, strict=True)
            if p is None or p < report.checkpoint
        ]
        held = positions_commit(path)
        if lagging:
            # Cleanup may delete commits older than the checkpoint: consumers behind it still
            # read those commits for the change feed.
            report.log_cleanup = (
                f"postponed: {', '.join(lagging)} behind version {report.checkpoint}"
            )
        elif held is not None and held < report.checkpoint:
            # Nor the commit holding the table's own readers' positions (in its metadata).
            report.log_cleanup = f"postponed: the table's positions are in version {held}"
        else:
            dt.cleanup_metadata()
            report.log_cleanup = "done"
    report.version_after = int(DeltaTable(str(path)).version())
    return report
