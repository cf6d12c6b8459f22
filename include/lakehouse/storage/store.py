"""Reading Delta tables: Spark's own Delta reader for the jobs, delta-rs for the log and the
command line.

* **jobs** read a snapshot with ``spark.read.format("delta")`` (``versionAsOf`` /
  ``timestampAsOf`` for time travel) and a change feed with ``readChangeFeed``
  (``startingVersion`` / ``endingVersion``), through :class:`DeltaStore`;
* **the log** (versions, positions, commit metadata, schemas) is read by delta-rs, which needs no
  JVM and keeps a process's snapshots warm (:mod:`lakehouse.storage.snapshots`);
* **the command line** (``lakehouse show`` / ``changes``) reads small tables with delta-rs
  (:func:`read_arrow`, :func:`changes_arrow`), where starting a JVM would be the wrong price,
  dating commits as delta-spark does (:func:`commit_times`), so that it prints what Spark reads.

Every write goes through :mod:`lakehouse.storage.delta_spark`.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from lakehouse.errors import LakehouseError, TableNotFoundError
from lakehouse.runtime import objectstore
from lakehouse.runtime.objectstore import Location
from lakehouse.storage.arrow import normalize_table, plain_schema
from lakehouse.storage.log import commit_metadata, is_table, load, position

if TYPE_CHECKING:
    import pyarrow as pa
    from deltalake import DeltaTable
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType


# Spark makes commit times increase over this many commits before the first it reports (Delta's
# DeltaHistoryManager.POTENTIALLY_UNMONOTONIZED_TIMESTAMPS).
_MONOTONIZED_BEFORE = 100


def commit_times(path: Location, start: int = 0, end: int | None = None) -> dict[int, int]:
    """The time (epoch ms) of each commit ``start..end`` (default: the latest) as delta-spark
    dates it in ``DESCRIBE HISTORY``, a change feed's ``_commit_timestamp`` and
    ``timestampAsOf``: the modification time of the commit's file, raised to 1 ms after the
    commit before it where it is not later, counted from 100 commits before ``start`` as
    Delta's ``CDCReader.getTimestampsByVersion`` does. delta-rs gives the ``timestamp`` of the
    commit's ``commitInfo`` instead, taken before the file is written: tens of milliseconds
    earlier. (A table with in-commit timestamps would be dated by those; the platform's tables
    do not enable them.)"""
    first = max(start - _MONOTONIZED_BEFORE, 0)
    commits = sorted(
        (int(f.name[:20]), f)
        for f in objectstore.listdir(path / "_delta_log")
        if len(f.name) == 25 and f.name.endswith(".json") and f.name[:20].isdigit()
    )
    times: dict[int, int] = {}
    previous: int | None = None
    for v, f in commits:
        if v < first or (end is not None and v > end):
            continue
        ms = f.mtime_ns // 1_000_000
        if previous is not None and ms <= previous:
            ms = previous + 1
        times[v] = previous = ms
    return {v: ms for v, ms in times.items() if v >= start}


def _version_at(path: Location, as_of: datetime) -> int:
    """The version a read ``timestampAsOf`` ``as_of`` gets from delta-spark: the last commit at
    or before it (by :func:`commit_times`). A time before the table's first commit is an error
    that says so; one after its last commit gets the latest version (Spark refuses it, since a
    commit could still come dated before it)."""
    if as_of.tzinfo is None:
        raise ValueError("as_of must carry a time zone")
    wanted = (as_of - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(milliseconds=1)
    before = [v for v, ms in commit_times(path).items() if ms <= wanted]
    if not before:
        raise LakehouseError(f"{path}: the table did not exist yet at {as_of.isoformat()}")
    return max(before)


def _check_existed(path: Location, as_of: datetime) -> None:
    """A time before the table's first commit is an error that says so."""
    _version_at(path, as_of)


def table_arrow_schema(dt: DeltaTable) -> pa.Schema:
    import pyarrow as pa

    return plain_schema(pa.schema(dt.schema().to_arrow()))


class DeltaStore:
    """Read Delta tables for a SparkSession."""

    def __init__(self, spark: SparkSession) -> None:
        self.spark = spark

    # -- inspection ---------------------------------------------------------------------------
    @staticmethod
    def exists(path: Location) -> bool:
        return is_table(path)

    def version(self, path: Location) -> int | None:
        """Latest committed version, or ``None`` when the table does not exist yet."""
        return table_version(path)

    def transaction_version(self, path: Location, app_id: str) -> int | None:
        """The last version committed by ``app_id`` (its position), or ``None``: see
        :func:`lakehouse.storage.log.position`."""

        return position(path, app_id)

    def latest_metadata(self, path: Location, key: str) -> Any:
        """The newest commit's value for a custom commit-metadata ``key``, JSON-decoded."""
        return latest_metadata(path, key)

    def spark_schema(self, path: Location, version: int | None = None) -> StructType:
        from pyspark.sql.pandas.types import from_arrow_schema

        return from_arrow_schema(table_arrow_schema(load(path, version)))

    # -- reads --------------------------------------------------------------------------------
    def read(
        self, path: Location, *, version: int | None = None, as_of: datetime | None = None
    ) -> DataFrame:
        """The snapshot: the latest, at ``version``, or as of a time."""
        if not is_table(path):
            raise TableNotFoundError(str(path))
        reader = self.spark.read.format("delta")
        if version is not None:
            reader = reader.option("versionAsOf", version)
        if as_of is not None:
            _check_existed(path, as_of)
            reader = reader.option("timestampAsOf", as_of.isoformat())
        return reader.load(str(path))

    def changes(
        self, path: Location, start_version: int, end_version: int | None = None
    ) -> DataFrame:
        """Change data feed of versions ``start_version..end_version`` (inclusive, default the
        latest), with ``_change_type``, ``_commit_version`` and ``_commit_timestamp``."""
        from pyspark.sql import types as T

        end = table_version(path) if end_version is None else end_version
        if end is None:
            raise TableNotFoundError(str(path))
        if start_version > end:
            schema = self.spark_schema(path, end)
            for name, kind in (
                ("_change_type", T.StringType()),
                ("_commit_version", T.LongType()),
                ("_commit_timestamp", T.TimestampType()),
            ):
                schema = schema.add(name, kind)
            return self.spark.createDataFrame([], schema)
        return (
            self.spark.read.format("delta")
            .option("readChangeFeed", "true")
            .option("startingVersion", start_version)
            .option("endingVersion", end)
            .load(str(path))
        )


# -- light reads without Spark (the log, command-line pull queries) ------------------------------


def snapshot_arrow(dt: DeltaTable, where: str | None = None) -> pa.Table:
    """A loaded snapshot's rows (those matching the SQL ``where``, if given) as plain Arrow,
    read by delta-rs's own query engine. Reading a table of many small files with
    ``DeltaTable.to_pyarrow_table`` (pyarrow over delta-rs's Python filesystem handler) was seen
    to abort the process at exit ("terminate called without an active exception")."""
    import pyarrow as pa
    from deltalake import QueryBuilder

    query = "SELECT * FROM snapshot" + ("" if where is None else f" WHERE {where}")
    reader = QueryBuilder().register("snapshot", dt).execute(query)
    return normalize_table(pa.table(reader.read_all())).select(table_arrow_schema(dt).names)


def table_version(path: Location) -> int | None:
    """The table's latest version, or None if there is no table."""
    if not is_table(path):
        return None
    return int(load(path).version())


def last_commit_time(path: Location) -> datetime | None:
    """When the table's latest commit was made, or None if there is no table."""
    if not is_table(path):
        return None
    (commit,) = load(path).history(1)
    return datetime.fromtimestamp(commit["timestamp"] / 1000, UTC)


def latest_metadata(path: Location, key: str) -> Any:
    """The newest commit's value for a custom commit-metadata ``key``, JSON-decoded.

    Jobs call this every micro-batch to find their position, which is nearly always in one of
    the last few commits: look there first, and read the whole history only if it is not.
    """
    if not is_table(path):
        return None

    dt = load(path)
    for limit in (16, None):
        for commit in dt.history(limit):
            value = commit_metadata(commit, key)
            if value is not None:
                return value
    return None


def read_arrow(
    path: Location, version: int | None = None, as_of: datetime | None = None
) -> pa.Table:
    """A snapshot as an Arrow table, read by delta-rs on this process (small tables, the CLI),
    through its query engine (see :func:`snapshot_arrow`); ``as_of`` a time, the version
    delta-spark would read then (:func:`_version_at`)."""
    if as_of is not None:
        version = _version_at(path, as_of)
    return snapshot_arrow(load(path, version))


def changes_arrow(
    path: Location, start_version: int = 0, end_version: int | None = None
) -> pa.Table:
    """Change data feed of versions ``start_version..end_version`` as an Arrow table, as
    delta-spark's ``readChangeFeed`` reads it: each commit dated by :func:`commit_times`."""
    import pyarrow as pa
    import pyarrow.compute as pc

    dt = load(path)
    end = dt.version() if end_version is None else end_version
    reader = dt.load_cdf(starting_version=start_version, ending_version=end)
    feed = normalize_table(pa.table(reader.read_all()))
    times = commit_times(path, start_version, end)
    ms = pa.timestamp("ms", tz="UTC")
    given = pc.cast(feed.column("_commit_timestamp"), ms, safe=False).cast(pa.int64())
    versions = feed.column("_commit_version").to_pylist()
    # (delta-rs's date for a commit whose file went meanwhile)
    dated = [times.get(v, t) for v, t in zip(versions, given.to_pylist(), strict=True)]
    column = feed.column_names.index("_commit_timestamp")
    return feed.set_column(column, "_commit_timestamp", pa.array(dated, ms))
