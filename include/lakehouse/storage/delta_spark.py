"""Delta tables written by delta-spark, Delta Lake's own Spark connector.

The layers move onto this module one by one (bronze first); :class:`~lakehouse.storage.DeltaStore`
keeps the delta-rs writes of the layers that have not moved yet, and reads every table, whoever
wrote it: both engines write the same Delta protocol.

Exactly once: a write carries a :class:`~lakehouse.storage.Txn` as Delta's idempotent-write
options (``txnAppId`` / ``txnVersion``) and its commit metadata (the consumer's position) as the
commit's ``userMetadata``, a JSON object, so the data and the position land in one commit.
delta-spark silently skips a write whose ``txnVersion`` is not newer than the one it recorded;
each write therefore also carries a write id, and the write is reported committed only if a
commit with that id is in the log.

One committing driver per table: Delta's log store excludes concurrent commits only inside one
JVM on a local filesystem (and assumes one driver on S3), so a job holds :func:`table_lock` on the
table from reading its position to committing, and a second process (a retried task running
beside the first) waits for it, then finds the work done.
"""

from __future__ import annotations

import fcntl
import json
import shutil
import threading
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from lakehouse.errors import ConcurrentWriteError

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

    from lakehouse.storage.store import Txn, WriteResult

WRITE_ID_KEY = "lakehouse.write_id"
CDF_PROPERTIES: Mapping[str, str] = {"delta.enableChangeDataFeed": "true"}
# The platform's tables: the change data feed on, and Delta's own cleanup of expired commits off
# (it runs at every checkpoint, and would delete commits a lagging consumer still reads for the
# change feed); `lakehouse maintain` cleans the log once every consumer is past it.
TABLE_PROPERTIES: Mapping[str, str] = {**CDF_PROPERTIES, "delta.enableExpiredLogCleanup": "false"}


def is_table(path: Path) -> bool:
    """Whether ``path`` holds a Delta table: a log with at least one commit or checkpoint.

    delta-spark makes ``_delta_log`` before it writes commit 0; a creator killed in between
    leaves a log folder that is no table yet."""
    log = path / "_delta_log"
    if not log.is_dir():
        return False
    return any(
        p.name.endswith(".json") or ".checkpoint." in p.name
        for p in log.iterdir()
        if p.name[:20].isdigit()
    )


@contextmanager
def table_lock(path: Path) -> Iterator[None]:
    """Hold the table's commit lock (an exclusive ``flock`` on a file beside the table) for
    the ``with`` block; threads and processes of this machine take turns."""
    lock = path.parent / f".{path.name}.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    with lock.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def create_table(
    spark: SparkSession,
    path: Path,
    schema: StructType | pa.Schema,
    *,
    properties: Mapping[str, str] = TABLE_PROPERTIES,
) -> None:
    """Create an empty table with ``schema`` (its non-nullable fields NOT NULL) and table
    ``properties`` (by default :data:`TABLE_PROPERTIES`), unless one is there."""
    from pyspark.sql.pandas.types import from_arrow_schema
    from pyspark.sql.types import StructType

    if is_table(path):
        return
    if not isinstance(schema, StructType):
        schema = from_arrow_schema(schema)
    if (path / "_delta_log").is_dir():
        # A creation killed before its first commit: start again.
        shutil.rmtree(path / "_delta_log")
    columns = ", ".join(
        f"`{f.name}` {f.dataType.simpleString()}{'' if f.nullable else ' NOT NULL'}"
        for f in schema.fields
    )
    props = ", ".join(f"'{k}' = '{v}'" for k, v in properties.items())
    spark.sql(
        f"CREATE TABLE IF NOT EXISTS delta.`{path}` ({columns}) USING delta"
        + (f" TBLPROPERTIES ({props})" if props else "")
    )


def append(
    df: DataFrame,
    path: Path,
    *,
    txn: Txn | None = None,
    metadata: Mapping[str, Any] | None = None,
    schema_mode: Literal["strict", "add_columns"] = "strict",
    create: StructType | pa.Schema | None = None,
) -> WriteResult:
    """Append ``df`` to the table in one commit that records ``txn`` and ``metadata``; with
    ``txn``, at most once per (app id, version). ``schema_mode="add_columns"`` lets new columns
    of ``df`` into the table (Delta's ``mergeSchema``); otherwise a schema that differs from the
    table's is refused. ``create``: the schema to create the table with (see
    :func:`create_table`) if there is none yet. The caller holds :func:`table_lock`."""
    from lakehouse.storage.store import WriteResult, _applied, _load

    if create is not None:
        create_table(df.sparkSession, path, create)
    dt = _load(path, own=True)
    if _applied(dt, txn):
        return WriteResult(False, dt.version())
    before = int(dt.version())
    write_id = uuid.uuid4().hex
    user = {**(metadata or {}), WRITE_ID_KEY: write_id}
    writer = df.write.format("delta").mode("append")
    if txn is not None:
        writer = writer.option("txnAppId", txn.app_id).option("txnVersion", txn.version)
    if schema_mode == "add_columns":
        writer = writer.option("mergeSchema", "true")
    try:
        writer.option("userMetadata", _json(user)).save(str(path))
    except Exception as exc:
        if "ConcurrentTransactionException" in f"{type(exc).__name__} {exc}":
            raise ConcurrentWriteError(str(path), str(exc).splitlines()[0]) from None
        raise
    return _outcome(path, before, write_id)


def delete_matching(
    keys: DataFrame,
    path: Path,
    *,
    on: list[str],
    metadata: Mapping[str, Any] | None = None,
) -> int:
    """Delete the rows of ``path`` whose ``on`` columns equal those of a row of ``keys``, in one
    commit (a MERGE) carrying ``metadata``; return how many went. No commit when none match.
    The caller holds :func:`table_lock`."""
    from delta.tables import DeltaTable

    keys = keys.select(*on).distinct()
    if keys.isEmpty():
        return 0
    spark = keys.sparkSession
    user = {**(metadata or {}), WRITE_ID_KEY: uuid.uuid4().hex}
    match = " AND ".join(f"t.`{k}` = s.`{k}`" for k in on)
    with session_settings(spark, {"spark.databricks.delta.commitInfo.userMetadata": _json(user)}):
        merge = DeltaTable.forPath(spark, str(path)).alias("t").merge(keys.alias("s"), match)
        metrics = merge.whenMatchedDelete().execute().first()
    return 0 if metrics is None else int(metrics["num_deleted_rows"])


# MERGE, UPDATE and DELETE take their commit's metadata and app transaction only from session
# settings, which every thread sharing the session sees: one such command at a time.
_SESSION_SETTINGS = threading.Lock()


@contextmanager
def session_settings(spark: SparkSession, settings: Mapping[str, str]) -> Iterator[None]:
    """Set ``settings`` on the session for the ``with`` block, alone among this process's
    threads, and remove them after."""
    with _SESSION_SETTINGS:
        for key, value in settings.items():
            spark.conf.set(key, value)
        try:
            yield
        finally:
            for key in settings:
                spark.conf.unset(key)


def _outcome(path: Path, before: int, write_id: str) -> WriteResult:
    """Whether the log holds the commit of ``write_id`` after version ``before``, and which."""
    from lakehouse.storage.store import WriteResult, _load

    after = _load(path, own=True)
    newer = int(after.version()) - before
    commits = after.history(newer) if newer > 0 else []
    ours = [c for c in commits if _user_metadata(c).get(WRITE_ID_KEY) == write_id]
    if not ours:
        return WriteResult(False, int(after.version()))
    return WriteResult(True, int(ours[0]["version"]))


def _json(value: Mapping[str, Any]) -> str:
    return json.dumps(value, separators=(",", ":"))


def arrow_frame(spark: SparkSession, data: pa.Table) -> DataFrame:
    """An Arrow table computed in the driver as a DataFrame of the same schema."""
    from pyspark.sql.pandas.types import from_arrow_schema

    return spark.createDataFrame(data, schema=from_arrow_schema(data.schema))


def _user_metadata(commit: Mapping[str, Any]) -> dict[str, Any]:
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
    user = _user_metadata(commit)
    if key in user:
        return user[key]
    if key in commit:
        raw = commit[key]
        return json.loads(raw) if isinstance(raw, str) else raw
    return None
