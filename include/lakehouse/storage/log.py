"""A Delta table's log, read with delta-rs (no JVM; a process's snapshots stay warm,
:mod:`lakehouse.storage.snapshots`): whether a path is a table, its commits' metadata, and the
positions its readers consumed, with the types a commit is described by.

Both sides of the storage layer read it: :mod:`lakehouse.storage.delta_spark` (writes) and
:mod:`lakehouse.storage.store` (reads).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from lakehouse.errors import LakehouseError, TableNotFoundError
from lakehouse.runtime import objectstore
from lakehouse.runtime.objectstore import Location

if TYPE_CHECKING:
    from deltalake import DeltaTable


@dataclass(frozen=True)
class Txn:
    """A reader's position in one commit: ``version`` (the last input version consumed) must
    grow for every new batch of ``app_id``."""

    app_id: str
    version: int
    # Set the app's position even when ``version`` is not newer: a reprocess that moves a
    # consumer back to an earlier input version. Never treated as already applied.
    rewind: bool = False


@dataclass(frozen=True)
class WriteResult:
    committed: bool  # False when the positions were already recorded (the batch is in)
    table_version: int | None
    source_rows: int | None = None  # merge: the table rows it inserted, updated or deleted
    rows_written: int | None = None  # an append's rows, from its commit's operation metrics


def load(path: Location, version: int | None = None, *, own: bool = False) -> DeltaTable:
    """The table's log at ``version``, or its newest snapshot: the thread's shared one
    (:mod:`lakehouse.storage.snapshots`) for what is read from it at once. ``own``: a snapshot
    nobody else holds, for a caller that time-travels it, or that plans a commit on it and runs
    other code (a gate) before committing."""
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError as DeltaMissing

    from lakehouse.storage import snapshots

    try:
        if version is None and not own:
            return snapshots.latest(path)
        return DeltaTable(
            str(path), version=version, storage_options=objectstore.storage_options(path)
        )
    except DeltaMissing:
        raise TableNotFoundError(str(path)) from None


def as_txns(txn: Txn | Sequence[Txn] | None) -> list[Txn]:
    if txn is None:
        return []
    return [txn] if isinstance(txn, Txn) else list(txn)


def table_rows(dt: DeltaTable) -> int | None:
    """The rows of a table snapshot, from the record counts its log keeps per file (no data is
    read); None if a file was added without them."""
    import pyarrow as pa
    import pyarrow.compute as pc

    counts = pa.table(dt.get_add_actions(flatten=True))
    if counts.num_rows == 0:
        return 0
    if "num_records" not in counts.column_names or counts["num_records"].null_count:
        return None
    return int(pc.sum(counts["num_records"]).as_py())


# Operations that change no rows a change-feed reader sees.
_NO_ROWS = frozenset(
    {
        "CREATE TABLE",
        "SET TBLPROPERTIES",
        "UNSET TBLPROPERTIES",
        "ADD CONSTRAINT",
        "DROP CONSTRAINT",
        "ADD COLUMNS",
        "CHANGE COLUMN",
        "OPTIMIZE",
        "VACUUM START",
        "VACUUM END",
    }
)


def change_rows(commit: Mapping[str, Any]) -> int | None:
    """The rows a commit (one entry of a table's history) hands its change-feed readers, from
    its operation metrics: an append's rows; a MERGE's inserted and deleted rows and two per
    updated row (its pre- and post-image); None when its metrics do not say."""
    operation = commit.get("operation")
    metrics = commit.get("operationMetrics") or {}

    def n(*keys: str) -> int | None:
        if not all(k in metrics for k in keys):
            return None
        return sum(int(metrics[k]) for k in keys)

    if operation == "MERGE":
        changed = n("numTargetRowsInserted", "numTargetRowsDeleted")
        updated = n("numTargetRowsUpdated")
        return None if changed is None or updated is None else changed + 2 * updated
    if operation == "UPDATE":
        updated = n("numUpdatedRows")
        return None if updated is None else 2 * updated
    if operation == "DELETE":
        return n("numDeletedRows")
    if "numOutputRows" in metrics:
        return n("numOutputRows")
    return 0 if operation in _NO_ROWS else None


# The most commits :func:`rows_after` reads to count a reader's rows.
ROWS_AFTER_COMMITS = 50


def rows_after(
    path: Location, consumed: int | None, at_most: int = ROWS_AFTER_COMMITS
) -> int | None:
    """The change rows a reader that consumed ``path`` up to version ``consumed`` has still to
    read, by the operation metrics of the newer commits (:func:`change_rows`); None when it is
    not known: the reader read nothing yet, more than ``at_most`` commits are newer, or one of
    them does not say."""
    if consumed is None or not is_table(path):
        return None
    dt = load(path)
    newer = int(dt.version()) - consumed
    if newer <= 0:
        return 0
    if newer > at_most:
        return None
    total = 0
    for commit in dt.history(newer):
        if int(commit.get("version", -1)) <= consumed:
            continue
        rows = change_rows(commit)
        if rows is None:
            return None
        total += rows
    return total


WRITE_ID_KEY = "lakehouse.write_id"


def is_table(path: Location) -> bool:
    """Whether ``path`` holds a Delta table: a log with at least one commit or checkpoint.

    delta-spark makes ``_delta_log`` before it writes commit 0; a creator killed in between
    leaves a log folder that is no table yet."""
    return any(
        name.endswith(".json") or ".checkpoint." in name
        for name in objectstore.names(path / "_delta_log")
        if name[:20].isdigit()
    )


POSITIONS_KEY = "lakehouse.positions"


# The app transaction of a table that keeps its positions in commit metadata: its version counts
# those commits and fences them (a second writer of the same commit is skipped by Delta).
FENCE_APP = "lakehouse.commit"


def position(path: Location, app_id: str) -> int | None:
    """The last input version ``app_id`` consumed into the table (its position), or None.

    A table keeps its readers' positions as Delta app transactions (``txnAppId`` /
    ``txnVersion``, one per commit) until a commit needs more: several positions at once (a
    join reads two inputs) or one moving back (a rebuild). Delta records one app transaction per
    command and never lowers one, so from then on every commit carries all the table's positions
    as ``lakehouse.positions`` in its metadata, and the app transaction :data:`FENCE_APP`
    counting those commits, which makes each commit happen at most once."""

    if not is_table(path):
        return None
    dt = load(path)
    kept = kept_positions(dt, path)
    if kept is not None:
        return kept.get(app_id)
    v = dt.transaction_version(app_id)
    return None if v is None else int(v)


def positions_commit(path: Location) -> int | None:
    """The version of the commit holding a table's positions, if it keeps them in commit
    metadata (see :func:`position`); log cleanup must not delete it."""

    kept = _kept(load(path), path) if is_table(path) else None
    return None if kept is None else kept[0]


def kept_positions(dt: DeltaTable, path: Location) -> dict[str, int] | None:
    kept = _kept(dt, path)
    return None if kept is None else kept[1]


def _kept(dt: DeltaTable, path: Location) -> tuple[int, dict[str, int]] | None:
    """The newest commit carrying a table's positions, with them; None if the table does not
    keep them in commit metadata."""
    if dt.transaction_version(FENCE_APP) is None:
        return None
    for limit in (16, None):
        for commit in dt.history(limit):  # newest first
            value = commit_metadata(commit, POSITIONS_KEY)
            if value is not None:
                return int(commit["version"]), {str(k): int(v) for k, v in value.items()}
    raise LakehouseError(f"{path}: the commit holding its readers' positions is gone from the log")


def user_metadata(commit: Mapping[str, Any]) -> dict[str, Any]:
    """A commit's ``userMetadata`` as the JSON object the platform writes there ({} if none)."""
    raw = commit.get("userMetadata")
    if not isinstance(raw, str):
        return {}
    try:
        value = json.loads(raw)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def commit_metadata(commit: Mapping[str, Any], key: str) -> Any:
    """A commit's value for the platform's metadata ``key``: in its ``userMetadata`` (written by
    delta-spark) or a top-level commit field (written by delta-rs); ``None`` if neither."""
    user = user_metadata(commit)
    if key in user:
        return user[key]
    if key in commit:
        raw = commit[key]
        return json.loads(raw) if isinstance(raw, str) else raw
    return None
