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
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lakehouse.errors import ConcurrentWriteError

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

    from lakehouse.storage.store import Txn, WriteResult

WRITE_ID_KEY = "lakehouse.write_id"


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


def _sql_type(field: pa.Field) -> str:
    from pyspark.sql.pandas.types import from_arrow_type

    return str(from_arrow_type(field.type).simpleString())


def create_table(
    spark: SparkSession,
    path: Path,
    schema: pa.Schema,
    *,
    properties: Mapping[str, str],
) -> None:
    """Create an empty table with ``schema`` (its non-nullable fields NOT NULL) and table
    ``properties``, unless one is there."""
    if is_table(path):
        return
    if (path / "_delta_log").is_dir():
        # A creation killed before its first commit: start again.
        shutil.rmtree(path / "_delta_log")
    columns = ", ".join(
        f"`{f.name}` {_sql_type(f)}{'' if f.nullable else ' NOT NULL'}" for f in schema
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
    txn: Txn,
    metadata: Mapping[str, Any] | None = None,
) -> WriteResult:
    """Append ``df`` to the table in one commit that records ``txn`` and ``metadata``; at most
    once per (app id, version). The caller holds :func:`table_lock`."""
    from lakehouse.storage.store import WriteResult, _applied, _load

    dt = _load(path, own=True)
    if _applied(dt, txn):
        return WriteResult(False, dt.version())
    before = int(dt.version())
    write_id = uuid.uuid4().hex
    user = {**(metadata or {}), WRITE_ID_KEY: write_id}
    try:
        (
            df.write.format("delta")
            .mode("append")
            .option("txnAppId", txn.app_id)
            .option("txnVersion", txn.version)
            .option("userMetadata", json.dumps(user, separators=(",", ":")))
            .save(str(path))
        )
    except Exception as exc:
        if type(exc).__name__ == "ConcurrentTransactionException" or (
            "ConcurrentTransactionException" in str(exc)
        ):
            raise ConcurrentWriteError(str(path), str(exc).splitlines()[0]) from None
        raise
    after = _load(path, own=True)
    ours = [
        c
        for c in after.history(int(after.version()) - before)
        if _user_metadata(c).get(WRITE_ID_KEY) == write_id
    ]
    if not ours:
        return WriteResult(False, int(after.version()))
    return WriteResult(True, int(ours[0]["version"]))


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
