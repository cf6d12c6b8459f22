"""Delta tables under Spark, through delta-rs: the one small interface every layer uses.

No JVM Delta connector is available (its jars come from a Maven repository we cannot reach), so:

* **writes** go through a Spark Python data source (:mod:`lakehouse.storage.datasource`): the
  executors write Parquet files into the table directory, the driver commits them in one Delta
  transaction with delta-rs;
* **reads** take the snapshot's file list from delta-rs and read it with Spark's own Parquet
  reader (distributed, vectorised), partition columns restored from the log;
* the **change data feed** is read from the commit log version by version, and its files by
  Spark, spread over its tasks;
* **upserts** use delta-rs ``merge`` with a source reduced to one row per key.

Every write may carry a :class:`Txn` (application id + monotonically increasing version). It is
stored in the same commit as the data (Delta app transactions), with commit metadata such as the
source offsets or version consumed, so "write" and "remember where I am" cannot come apart. A
write whose version is not newer than the table's recorded one is skipped; one that races another
commit of the same app id fails with :class:`ConcurrentWriteError` (delta-rs' conflict checker).

The tables stay ordinary Delta tables that a Spark cluster with delta-spark can read too.
"""

from __future__ import annotations

import contextlib
import json
import re
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from lakehouse.errors import (
    ConcurrentWriteError,
    LakehouseError,
    SchemaMismatchError,
    TableNotFoundError,
)
from lakehouse.storage.arrow import normalize_table, plain_schema
from lakehouse.storage.files import DataFile, delete_data_files
from lakehouse.storage.gates import gate_for

if TYPE_CHECKING:
    import pyarrow as pa
    from deltalake import DeltaTable
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

    from lakehouse.storage.tasks import Staged, TaskFn

CDF_PROPERTIES: Mapping[str, str] = {"delta.enableChangeDataFeed": "true"}
CHANGE_COLUMNS = ("_change_type", "_commit_version", "_commit_timestamp")
_CHANGE_TYPES = ("StringType", "LongType", "TimestampType")
# An Arrow merge source's column saying where the merge's insert_when holds (see merge).
INSERTABLE = "__lakehouse_insertable"
WriteMode = Literal["append", "overwrite", "replace_where"]
SchemaMode = Literal["strict", "add_columns"]
_UNSUPPORTED_FEATURES = {"deletionVectors", "columnMapping", "typeWidening"}


class UnsupportedTableError(LakehouseError):
    """The table uses a Delta feature this storage layer cannot read correctly."""


class ReplaceWhereError(LakehouseError):
    """Data given to a replace-where write does not all satisfy its predicate."""


@dataclass(frozen=True)
class Txn:
    """An exactly-once marker: ``version`` must grow for every new batch of ``app_id``."""

    app_id: str
    version: int
    # Set the app's position even when ``version`` is not newer: a reprocess that moves a
    # consumer back to an earlier source version. Never treated as already applied.
    rewind: bool = False


@dataclass(frozen=True)
class WriteResult:
    committed: bool  # False when the Txn version was already applied
    table_version: int | None
    source_rows: int | None = None  # merge: the rows of the source (known without a Spark job)


def _load(path: Path, version: int | None = None, *, own: bool = False) -> DeltaTable:
    """The table at ``version``, or its newest snapshot: the thread's shared one
    (:mod:`lakehouse.storage.snapshots`) for what is read from it at once. ``own``: a snapshot
    nobody else holds, for a caller that time-travels it, or that plans a commit on it and runs
    other code (a gate, a schema change) before committing: a shared snapshot could be brought
    forward under it by that code, and the commit would no longer be checked against the
    version it was planned on."""
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError as DeltaMissing

    from lakehouse.storage import snapshots

    try:
        if version is None and not own:
            return snapshots.latest(path)
        return DeltaTable(str(path), version=version)
    except DeltaMissing:
        raise TableNotFoundError(str(path)) from None


def _travel(dt: DeltaTable, path: Path, as_of: datetime) -> None:
    """Load the version current at ``as_of``; a time before the table existed is an error."""
    _check_existed(path, as_of, dt)
    dt.load_as_version(as_of)


def _check_existed(path: Path, as_of: datetime, dt: DeltaTable | None = None) -> None:
    """A time before the table's first commit is an error, not an empty table."""
    if as_of.tzinfo is None:
        raise ValueError("as_of must carry a time zone")
    history = (dt or _load(path)).history()
    first_ms = min(int(c["timestamp"]) for c in history) if history else None
    if first_ms is None or as_of.timestamp() * 1000 < first_ms:
        raise LakehouseError(f"{path}: the table did not exist yet at {as_of.isoformat()}")


def _spark_timestamp(as_of: datetime) -> str:
    """``as_of`` as delta-spark's ``timestampAsOf`` takes it: text in the session's time zone,
    which the platform sets to UTC (:func:`lakehouse.spark.spark_conf`)."""
    from datetime import UTC

    return as_of.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")


def _check_readable(dt: DeltaTable, path: Path) -> None:
    protocol = dt.protocol()
    features = set(protocol.reader_features or []) | set(protocol.writer_features or [])
    used = features & _UNSUPPORTED_FEATURES
    if used:
        raise UnsupportedTableError(
            f"{path}: uses Delta feature(s) {sorted(used)}, which the delta-rs storage layer "
            "does not read through Spark; rewrite the table without them"
        )


def _txns(txn: Txn | Sequence[Txn] | None) -> list[Txn]:
    if txn is None:
        return []
    return [txn] if isinstance(txn, Txn) else list(txn)


def _applied(dt: DeltaTable, txn: Txn | Sequence[Txn] | None) -> bool:
    """Whether ``txn`` (or a later version of its app) is already in the table; with several
    (a job consuming several sources), whether every one of them is.

    delta-rs records app transactions but does not refuse a repeated version by itself.
    """
    txns = _txns(txn)
    if not txns or any(t.rewind for t in txns):
        return False
    for t in txns:
        done = dt.transaction_version(t.app_id)
        if done is None or done < t.version:
            return False
    return True


def _commit_properties(txn: Txn | Sequence[Txn] | None, metadata: Mapping[str, Any] | None) -> Any:
    from deltalake import CommitProperties, Transaction

    txns = [Transaction(app_id=t.app_id, version=t.version) for t in _txns(txn)]
    return CommitProperties(
        app_transactions=txns or None,
        custom_metadata=_metadata_strings(metadata) or None,
    )


def _metadata_strings(metadata: Mapping[str, Any] | None) -> dict[str, str]:
    return {k: v if isinstance(v, str) else json.dumps(v) for k, v in (metadata or {}).items()}


def table_arrow_schema(dt: DeltaTable) -> pa.Schema:
    import pyarrow as pa

    return plain_schema(pa.schema(dt.schema().to_arrow()))


class DeltaStore:
    """Read, write and merge Delta tables for a SparkSession."""

    def __init__(self, spark: SparkSession) -> None:
        self._session = spark

    @property
    def spark(self) -> SparkSession:
        """The session, with the Delta data source registered on first use: the store's work
        that needs no Spark (the driver's paths, the log's reads) leaves a
        :class:`lakehouse.spark.LazySession` unstarted."""
        spark = self._session
        # Registered once per session (registering again replaces it, with a warning).
        if not getattr(spark, "_lakehouse_delta_registered", False):
            from lakehouse.storage.datasource import DeltaDataSource

            spark.dataSource.register(DeltaDataSource)
            spark._lakehouse_delta_registered = True  # type: ignore[attr-defined]
        return spark

    # -- inspection ---------------------------------------------------------------------------
    @staticmethod
    def exists(path: Path) -> bool:
        return (path / "_delta_log").is_dir()

    def version(self, path: Path) -> int | None:
        """Latest committed version, or ``None`` when the table does not exist yet."""
        if not self.exists(path):
            return None
        return int(_load(path).version())

    def transaction_version(self, path: Path, app_id: str) -> int | None:
        """The last version committed by ``app_id`` (its position), or ``None``."""
        if not self.exists(path):
            return None
        v = _load(path).transaction_version(app_id)
        return None if v is None else int(v)

    def latest_metadata(self, path: Path, key: str) -> Any:
        """The newest commit's value for a custom commit-metadata ``key``, JSON-decoded."""
        return latest_metadata(path, key)

    def spark_schema(self, path: Path, version: int | None = None) -> StructType:
        from pyspark.sql.pandas.types import from_arrow_schema

        return from_arrow_schema(table_arrow_schema(_load(path, version)))

    # -- reads --------------------------------------------------------------------------------
    def read(
        self,
        path: Path,
        *,
        version: int | None = None,
        as_of: datetime | None = None,
        with_file_name: bool = False,
    ) -> DataFrame:
        """The snapshot (latest, at ``version`` or as of a time), read by delta-spark.

        ``with_file_name`` adds ``__file``, the name of the data file each row comes from.
        """
        from pyspark.sql import functions as F

        if not self.exists(path):
            raise TableNotFoundError(str(path))
        reader = self.spark.read.format("delta")
        if version is not None:
            reader = reader.option("versionAsOf", version)
        if as_of is not None:
            _check_existed(path, as_of)
            last = last_commit_time(path)
            # delta-spark refuses a time after the newest commit; that time sees the newest.
            if last is None or as_of < last:
                reader = reader.option("timestampAsOf", _spark_timestamp(as_of))
        df = reader.load(str(path))
        return df.withColumn("__file", F.col("_metadata.file_name")) if with_file_name else df

    def changes(self, path: Path, start_version: int, end_version: int | None = None) -> DataFrame:
        """Change data feed of versions ``start_version..end_version`` (inclusive), with
        ``_change_type``, ``_commit_version`` and ``_commit_timestamp``: delta-spark's
        ``readChangeFeed``."""
        if not self.exists(path):
            raise TableNotFoundError(str(path))
        end = self.version(path) if end_version is None else end_version
        assert end is not None
        if start_version > end:
            from pyspark.sql import types as T

            schema = self.read(path, version=end).schema
            for name, kind in zip(CHANGE_COLUMNS, _CHANGE_TYPES, strict=True):
                schema = schema.add(T.StructField(name, getattr(T, kind)()))
            return self.spark.createDataFrame([], schema)
        return (
            self.spark.read.format("delta")
            .option("readChangeFeed", "true")
            .option("startingVersion", start_version)
            .option("endingVersion", end)
            .load(str(path))
        )

    # -- writes -------------------------------------------------------------------------------
    def create(
        self,
        path: Path,
        schema: StructType,
        *,
        properties: Mapping[str, str] = CDF_PROPERTIES,
        partition_by: Sequence[str] = (),
    ) -> None:
        """Create an empty table (no-op if it exists) with the given table properties, by
        delta-spark's ``CREATE TABLE``; non-nullable columns become ``NOT NULL`` constraints."""
        if self.exists(path):
            return
        columns = ", ".join(
            f"`{f.name}` {f.dataType.simpleString()}{'' if f.nullable else ' NOT NULL'}"
            for f in schema.fields
        )
        statement = f"CREATE TABLE IF NOT EXISTS {_sql_table(path)} ({columns}) USING delta"
        if partition_by:
            statement += " PARTITIONED BY (" + ", ".join(f"`{c}`" for c in partition_by) + ")"
        if properties:
            pairs = ", ".join(f"'{k}' = '{v}'" for k, v in properties.items())
            statement += f" TBLPROPERTIES ({pairs})"
        if path.is_dir() and any(path.iterdir()):
            # Files staged before the table exists (silver's driver path): delta-spark takes a
            # non-empty folder for an existing table, so the log is made beside it, moved in.
            self._create_beside(path, statement)
            return
        try:
            self.spark.sql(statement)
        except Exception:
            if not self.exists(path):
                raise
            # Another writer created it at the same moment: its creation stands.

    def _create_beside(self, path: Path, statement: str) -> None:
        import shutil
        import tempfile

        with tempfile.TemporaryDirectory(prefix=".create-", dir=path.parent) as tmp:
            beside = Path(tmp) / "table"
            self.spark.sql(statement.replace(_sql_table(path), _sql_table(beside), 1))
            try:
                (beside / "_delta_log").rename(path / "_delta_log")
            except OSError:
                if not self.exists(path):
                    raise
            shutil.rmtree(beside, ignore_errors=True)

    def write(
        self,
        df: DataFrame,
        path: Path,
        *,
        mode: WriteMode = "append",
        replace_where: str | None = None,
        partition_by: Sequence[str] = (),
        txn: Txn | Sequence[Txn] | None = None,
        metadata: Mapping[str, Any] | None = None,
        schema_mode: SchemaMode = "strict",
        properties: Mapping[str, str] = CDF_PROPERTIES,
        max_rows_per_file: int = 5_000_000,
        rows: int | None = None,
    ) -> WriteResult:
        """Write ``df`` in one Delta commit, distributed over Spark's tasks.

        ``mode``: ``append``; ``overwrite`` (replace every row); ``replace_where`` (replace the
        rows matching the SQL predicate ``replace_where``; every new row must match it).
        ``schema_mode="add_columns"`` lets new nullable columns into the table; any other schema
        difference is refused. With ``txn`` (one per source consumed), the write happens at most
        once per (app, version).

        ``rows``: how many rows ``df`` has, if the caller knows (unused by delta-spark).

        Written by delta-spark's DataFrame writer, with the position as its ``txnAppId`` /
        ``txnVersion`` and the metadata as the commit's ``userMetadata``. A write that carries
        several positions, or moves one back (a rebuild), still commits through the delta-rs
        data source: delta-spark records one app transaction per commit and never a smaller
        version (see the README's *Storage*).
        """
        if (mode == "replace_where") != (replace_where is not None):
            raise ValueError("replace_where needs mode='replace_where', and that mode needs it")
        self.create(path, df.schema, properties=properties, partition_by=partition_by)
        dt = _load(path, own=True)
        if _applied(dt, txn):
            return WriteResult(False, dt.version())
        table_partitions = list(dt.metadata().partition_columns)
        if partition_by and list(partition_by) != table_partitions:
            raise SchemaMismatchError(
                f"{path}: partitioned by {table_partitions}, not {list(partition_by)}"
            )
        add_columns = self._conform_schema(dt, path, df.schema, schema_mode)
        if mode == "replace_where":
            assert replace_where is not None
            self._check_replace_where(df, path, replace_where)
        gate, verdict = gate_for(path, at_commit=True), None
        if gate is not None:
            whole = None
            if gate.needs_whole_table:
                if mode == "append":
                    whole = self.read(path).unionByName(df, allowMissingColumns=True)
                elif replace_where is not None:
                    kept = self.read(path).filter(~_holds(replace_where))
                    whole = kept.unionByName(df, allowMissingColumns=True)
                else:
                    whole = df
            source = (metadata or {}).get("lakehouse.source")
            verdict = gate.check(df, whole=whole, source=source)
            metadata = {**(metadata or {}), **gate.commit_metadata(verdict)}
        if _legacy(txn):
            self._write_data_source(df, path, dt, mode, txn, metadata, max_rows_per_file)
        else:
            writer = df.write.format("delta").option("maxRecordsPerFile", max_rows_per_file)
            if mode == "overwrite":
                # Replace every row, whatever the session's partitionOverwriteMode says.
                writer = writer.mode("overwrite").option("partitionOverwriteMode", "static")
            elif mode == "replace_where":
                assert replace_where is not None
                writer = writer.mode("overwrite").option("replaceWhere", replace_where)
            else:
                writer = writer.mode("append")
            if add_columns:
                writer = writer.option("mergeSchema", "true")
            metadata, write_id = _tagged(txn, metadata)
            for key, value in _writer_options(txn, metadata).items():
                writer = writer.option(key, value)
            try:
                writer.save(str(path))
            except Exception as exc:
                _raise_if_conflict(exc, path)
                raise
            if not _committed(path, dt.version(), write_id):
                return WriteResult(False, self.version(path))
        version = self.version(path)
        if gate is not None:
            gate.record(verdict, table_version=version, published=True)
        return WriteResult(True, version)

    def _write_data_source(
        self,
        df: DataFrame,
        path: Path,
        dt: DeltaTable,
        mode: WriteMode,
        txn: Txn | Sequence[Txn] | None,
        metadata: Mapping[str, Any] | None,
        max_rows_per_file: int,
    ) -> None:
        """The delta-rs commit of a write delta-spark cannot express (see :meth:`write`)."""
        from lakehouse.storage.commits import WritePlan
        from lakehouse.storage.datasource import FORMAT

        if mode == "replace_where":
            raise ValueError("a replace-where write takes one position")
        plan = WritePlan(
            table_root=str(path),
            schema_b64=WritePlan.encode_schema(table_arrow_schema(dt)),
            partition_by=list(dt.metadata().partition_columns),
            mode="overwrite" if mode == "overwrite" else "append",
            read_version=int(dt.version()),
            txns=[(t.app_id, t.version) for t in _txns(txn)],
            metadata=_metadata_strings(metadata),
            max_rows_per_file=max_rows_per_file,
        )
        _activate(self.spark)
        try:
            df.write.format(FORMAT).option("plan", plan.to_json()).mode("append").save()
        except Exception as exc:
            _raise_if_conflict(exc, path)
            raise

    def append_arrow(
        self,
        data: pa.Table,
        path: Path,
        *,
        txn: Txn | Sequence[Txn] | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> WriteResult:
        """Append an Arrow table computed in the driver, in one commit, under the table's gate
        like every other write; with ``txn``, at most once per (app, version)."""
        schema = table_arrow_schema(_load(path))
        df = self.spark.createDataFrame(data.select(schema.names).cast(schema))
        result = self.write(df, path, txn=txn, metadata=metadata)
        if not result.committed:
            return result
        version = self.record_positions(path, txn, metadata)
        return WriteResult(True, version, data.num_rows)

    @staticmethod
    def is_empty(path: Path) -> bool:
        """Whether the table holds no rows (no data files) at its latest version."""
        return not _load(path).file_uris()

    def create_arrow(
        self,
        path: Path,
        schema: pa.Schema,
        *,
        properties: Mapping[str, str] = CDF_PROPERTIES,
        partition_by: Sequence[str] = (),
    ) -> None:
        """Create an empty table from an Arrow schema (no-op if it exists)."""
        from pyspark.sql.pandas.types import from_arrow_schema

        self.create(
            path, from_arrow_schema(schema), properties=properties, partition_by=partition_by
        )

    def stage(
        self,
        items: Sequence[Mapping[str, Any]],
        fn: TaskFn,
        path: Path,
        *,
        in_driver: bool = False,
        new_table_schema: pa.Schema | None = None,
    ) -> Staged:
        """Run ``fn`` over ``items`` in Spark tasks that write the table's data files themselves
        (see :mod:`lakehouse.storage.tasks`), or here with ``in_driver`` (small work); nothing
        is visible until :meth:`commit_staged`. A table that does not exist yet is staged for
        with ``new_table_schema`` (unpartitioned); create it before the commit."""
        from lakehouse.storage.tasks import stage_in_driver, stage_with_tasks

        if new_table_schema is not None and not self.exists(path):
            schema, partition_by = new_table_schema, []
        else:
            dt = _load(path)
            _check_readable(dt, path)
            schema = table_arrow_schema(dt)
            partition_by = list(dt.metadata().partition_columns)
        if in_driver:
            return stage_in_driver(
                items, fn, table_root=path, schema=schema, partition_by=partition_by
            )
        return stage_with_tasks(
            self.spark, items, fn, table_root=path, schema=schema, partition_by=partition_by
        )

    def commit_staged(
        self,
        path: Path,
        files: Sequence[DataFile],
        *,
        read_version: int | None,
        txn: Txn | Sequence[Txn] | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> WriteResult:
        """Commit staged files in one append, against ``read_version`` (the version the work was
        planned on): a concurrent commit of the same app transaction conflicts instead of
        doubling the data. If the transaction is already applied, the files are deleted."""
        from lakehouse.storage.commits import WritePlan, commit_files

        dt = _load(path)
        if _applied(dt, txn):
            delete_data_files(path, files)
            return WriteResult(False, dt.version())
        plan = WritePlan(
            table_root=str(path),
            schema_b64=WritePlan.encode_schema(table_arrow_schema(dt)),
            partition_by=list(dt.metadata().partition_columns),
            mode="append",
            read_version=int(dt.version() if read_version is None else read_version),
            txns=[(t.app_id, t.version) for t in _txns(txn)],
            metadata=_metadata_strings(metadata),
        )
        try:
            commit_files(plan, list(files))
        except RuntimeError as exc:
            delete_data_files(path, files)
            _raise_if_conflict(exc, path)
            raise
        return WriteResult(True, self.version(path))

    def append(
        self,
        df: DataFrame,
        path: Path,
        *,
        txn: Txn | Sequence[Txn] | None = None,
        metadata: Mapping[str, Any] | None = None,
        properties: Mapping[str, str] = CDF_PROPERTIES,
        rows: int | None = None,
    ) -> WriteResult:
        """Append ``df``; with ``txn`` (one or several), at most once per (app id, version).
        ``rows``: its size, if known (see :meth:`write`)."""
        return self.write(df, path, txn=txn, metadata=metadata, properties=properties, rows=rows)

    def _conform_schema(
        self, dt: DeltaTable, path: Path, incoming: StructType, schema_mode: SchemaMode
    ) -> bool:
        """Refuse incompatible data; whether it brings new nullable columns (allowed only when
        asked: the write then merges them into the table's schema)."""
        from deltalake import Schema as DeltaSchema
        from pyspark.sql.pandas.types import to_arrow_schema

        table_fields = {f.name: f for f in dt.schema().fields}
        data_schema = DeltaSchema.from_arrow(to_arrow_schema(incoming, timezone="UTC"))
        new: list[Any] = []
        problems: list[str] = []
        for f in data_schema.fields:
            have = table_fields.get(f.name)
            if have is None:
                new.append(f)
            elif have.type != f.type:
                problems.append(
                    f"column {f.name!r} is {f.type} in the data but {have.type} in the table"
                )
        incoming_names = {f.name for f in data_schema.fields}
        for name, f in table_fields.items():
            if name not in incoming_names and not f.nullable:
                problems.append(f"required column {name!r} is missing from the data")
        if new and schema_mode != "add_columns":
            problems.append(
                f"new column(s) {[f.name for f in new]}: pass schema_mode='add_columns' to add them"
            )
        if problems:
            raise SchemaMismatchError(f"{path}: " + "; ".join(problems))
        return bool(new)

    @staticmethod
    def _check_replace_where(df: DataFrame, path: Path, predicate: str) -> None:
        """Refuse, before anything is written, new rows the predicate does not select."""
        outside = df.filter(~_holds(predicate)).count()
        if outside:
            raise ReplaceWhereError(
                f"{path}: {outside} row(s) of the new data do not match the replace-where "
                f"predicate {predicate!r}; nothing was written"
            )

    def merge(
        self,
        source: DataFrame | pa.Table,
        path: Path,
        *,
        on: list[str],
        update: Mapping[str, str],
        insert: Mapping[str, str],
        delete_when: str | None = None,
        insert_when: str | None = None,
        delete_unmatched: bool = False,
        update_when: str | None = None,
        txn: Txn | Sequence[Txn] | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> WriteResult:
        """Upsert ``source`` (one row per key) into the table as one commit.

        ``update`` and ``insert`` map target columns to SQL expressions over ``s`` (source) and
        ``t`` (target); ``delete_when`` deletes matched rows where it holds (tombstones), and
        ``insert_when`` restricts which unmatched source rows are inserted; ``delete_unmatched``
        deletes every target row the source does not have (the source is then the whole table,
        as in a full refresh); ``update_when`` restricts which matched rows are updated. Several
        ``txn`` may be given, one per source consumed; they are committed even when the merge
        changes no row. The change feed gets ``update_preimage``/``update_postimage`` pairs and
        ``delete`` rows.

        ``source`` may also be an Arrow table computed in the driver; with ``insert_when`` it
        then carries ``insertable``, a boolean column saying where ``insert_when`` holds.
        """
        import pyarrow as pa

        dt = _load(path, own=True)
        if _applied(dt, txn):
            return WriteResult(False, dt.version())
        arrow = isinstance(source, pa.Table)
        predicate = " AND ".join(f"t.{k} = s.{k}" for k in on)

        def clauses(builder: Any) -> Any:
            if delete_when:
                builder = builder.when_matched_delete(delete_when)
            builder = builder.when_matched_update(dict(update), predicate=update_when)
            builder = builder.when_not_matched_insert(dict(insert), predicate=insert_when)
            if delete_unmatched:
                builder = builder.when_not_matched_by_source_delete()
            return builder

        data: pa.Table | None = None  # the source in the driver, for the gate or delta-rs
        gate, verdict = gate_for(path, at_commit=True), None
        if gate is not None:
            data = _driver_source(source, dt, on, insert_when)
            post, gone = _merge_outcome(dt, data, on, predicate, clauses)
            whole = _table_after(dt, on, post, gone) if gate.needs_whole_table else None
            position = (metadata or {}).get("lakehouse.source")
            verdict = gate.check(post, post.num_rows, whole=whole, source=position)
            metadata = {**(metadata or {}), **gate.commit_metadata(verdict)}
        source_rows: int | None
        if _legacy(txn):
            data = _driver_source(source, dt, on, insert_when) if data is None else data
            _merge_delta_rs(dt, path, data, predicate, clauses, txn, metadata)
            source_rows = data.num_rows
        else:
            df = self.spark.createDataFrame(source) if arrow else source
            when = f"s.{INSERTABLE}" if arrow and insert_when else insert_when
            metadata, write_id = _tagged(txn, metadata)
            merged = self._merge_spark(
                df,
                path,
                on=on,
                clauses=_merge_clauses(
                    update, insert, delete_when, when, delete_unmatched, update_when
                ),
                txn=txn,
                metadata=metadata,
            )
            source_rows = source.num_rows if isinstance(source, pa.Table) else merged
            if not _committed(path, dt.version(), write_id):
                return WriteResult(False, self.version(path))
        version = self.record_positions(path, txn, metadata)
        if gate is not None:
            gate.record(verdict, table_version=version, published=True)
        return WriteResult(True, version, source_rows)

    def _merge_spark(
        self,
        source: DataFrame,
        path: Path,
        *,
        on: Sequence[str],
        clauses: str,
        txn: Txn | Sequence[Txn] | None,
        metadata: Mapping[str, Any] | None,
    ) -> int | None:
        """``MERGE INTO`` the table from ``source`` (aliases ``t`` and ``s``) with delta-spark, the
        position and metadata in its commit; returns how many source rows it read.

        A MERGE takes its app transaction and user metadata from session settings, which every
        statement of the session would see: they are set, used and cleared under one lock, so
        two writers sharing the session in this process cannot pick up each other's."""
        import uuid

        view = f"lakehouse_merge_{uuid.uuid4().hex}"
        condition = " AND ".join(f"t.`{k}` = s.`{k}`" for k in on)
        statement = f"MERGE INTO {_sql_table(path)} AS t USING {view} AS s ON {condition} {clauses}"
        settings = _session_settings(txn, metadata)
        with _SESSION_SETTINGS_LOCK:
            source.createOrReplaceTempView(view)
            try:
                for key, value in settings.items():
                    self.spark.conf.set(key, value)
                self.spark.sql(statement).collect()
            except Exception as exc:
                _raise_if_conflict(exc, path)
                raise
            finally:
                for key in settings:
                    self.spark.conf.unset(key)
                self.spark.catalog.dropTempView(view)
        (commit,) = _load(path).history(1)
        rows = (commit.get("operationMetrics") or {}).get("numSourceRows")
        return None if rows is None else int(rows)

    def delete_matching(
        self,
        keys: DataFrame,
        path: Path,
        *,
        on: list[str],
        metadata: Mapping[str, Any] | None = None,
    ) -> int:
        """Delete the rows of ``path`` whose ``on`` columns match a row of ``keys`` (distinct
        key rows), in one commit; return how many went. No commit when ``keys`` is empty."""
        keys = keys.select(*on)
        if keys.isEmpty():
            return 0
        before = self.version(path)
        self._merge_spark(
            keys,
            path,
            on=on,
            clauses="WHEN MATCHED THEN DELETE",
            txn=None,
            metadata=metadata,
        )
        if self.version(path) == before:
            return 0
        (commit,) = _load(path).history(1)
        return int((commit.get("operationMetrics") or {}).get("numTargetRowsDeleted", 0))

    def record_positions(
        self,
        path: Path,
        txn: Txn | Sequence[Txn] | None,
        metadata: Mapping[str, Any] | None,
    ) -> int:
        """Commit ``txn`` with no rows unless the table already holds exactly these positions;
        return the table's version after.

        A merge may make no commit (an empty batch, or rows that all equal the stored ones),
        yet the consumer's position must still advance, or the same input versions would be
        read again every run."""

        def holds(dt: DeltaTable) -> bool:
            return all(dt.transaction_version(t.app_id) == t.version for t in _txns(txn))

        dt = _load(path)
        if holds(dt):
            return int(dt.version())
        if _legacy(txn):
            from deltalake import write_deltalake

            empty = table_arrow_schema(dt).empty_table()
            write_deltalake(
                dt, empty, mode="append", commit_properties=_commit_properties(txn, metadata)
            )
            return int(dt.version())
        writer = self.read(path).limit(0).write.format("delta").mode("append")
        for key, value in _writer_options(txn, metadata).items():
            writer = writer.option(key, value)
        writer.save(str(path))
        return int(_load(path).version())


def _legacy(txn: Txn | Sequence[Txn] | None) -> bool:
    """Whether a write needs the delta-rs commit: several positions in one commit, or a position
    moved back. delta-spark records one app transaction per commit and skips a write whose
    version is not newer than the recorded one."""
    txns = _txns(txn)
    return len(txns) > 1 or any(t.rewind for t in txns)


WRITE_ID_KEY = "lakehouse.write"


def _tagged(
    txn: Txn | Sequence[Txn] | None, metadata: Mapping[str, Any] | None
) -> tuple[Mapping[str, Any] | None, str | None]:
    """A write with a position gets an id in its commit metadata: delta-spark skips, without a
    word, a write whose version its app already recorded (a racing retry committed first), and
    the id tells afterwards whether the commit is this write's."""
    import uuid

    if not _txns(txn):
        return metadata, None
    write_id = uuid.uuid4().hex
    return {**(metadata or {}), WRITE_ID_KEY: write_id}, write_id


def _committed(path: Path, planned_on: int, write_id: str | None) -> bool:
    """Whether the write tagged ``write_id`` made a commit after version ``planned_on``."""
    if write_id is None:
        return True
    dt = _load(path)
    newer = int(dt.version()) - planned_on
    if newer <= 0:
        return False
    return any(commit_metadata(c).get(WRITE_ID_KEY) == write_id for c in dt.history(newer))


def _holds(predicate: str) -> Any:
    """A SQL predicate as a column that is false, not null, where it cannot be evaluated."""
    from pyspark.sql import functions as F

    return F.coalesce(F.expr(predicate), F.lit(False))


def _sql_table(path: Path) -> str:
    """The table at ``path`` as delta-spark's SQL names it."""
    return "delta.`" + str(path).replace("`", "``") + "`"


def _user_metadata(metadata: Mapping[str, Any] | None) -> str | None:
    """The commit metadata as the commit's ``userMetadata``: one JSON object of strings (see
    :func:`commit_metadata` for the way back)."""
    return json.dumps(_metadata_strings(metadata), sort_keys=True) if metadata else None


def _writer_options(
    txn: Txn | Sequence[Txn] | None, metadata: Mapping[str, Any] | None
) -> dict[str, str]:
    """delta-spark's DataFrame writer options for a write's position and metadata."""
    options: dict[str, str] = {}
    for t in _txns(txn):  # at most one here (see _legacy)
        options |= {"txnAppId": t.app_id, "txnVersion": str(t.version)}
    user = _user_metadata(metadata)
    if user is not None:
        options["userMetadata"] = user
    return options


# The session settings a MERGE takes its position and metadata from (delta-io/delta#1999).
_TXN_APP = "spark.databricks.delta.write.txnAppId"
_TXN_VERSION = "spark.databricks.delta.write.txnVersion"
_USER_METADATA = "spark.databricks.delta.commitInfo.userMetadata"
_SESSION_SETTINGS_LOCK = threading.Lock()


def _session_settings(
    txn: Txn | Sequence[Txn] | None, metadata: Mapping[str, Any] | None
) -> dict[str, str]:
    options = _writer_options(txn, metadata)
    names = {"txnAppId": _TXN_APP, "txnVersion": _TXN_VERSION, "userMetadata": _USER_METADATA}
    return {names[k]: v for k, v in options.items()}


def _merge_clauses(
    update: Mapping[str, str],
    insert: Mapping[str, str],
    delete_when: str | None,
    insert_when: str | None,
    delete_unmatched: bool,
    update_when: str | None,
) -> str:
    """The WHEN clauses of a MERGE statement (see :meth:`DeltaStore.merge`)."""
    parts = []
    if delete_when:
        parts.append(f"WHEN MATCHED AND ({delete_when}) THEN DELETE")
    sets = ", ".join(f"`{c}` = {e}" for c, e in update.items())
    parts.append(
        f"WHEN MATCHED{f' AND ({update_when})' if update_when else ''} THEN UPDATE SET {sets}"
    )
    columns = ", ".join(f"`{c}`" for c in insert)
    values = ", ".join(insert.values())
    parts.append(
        f"WHEN NOT MATCHED{f' AND ({insert_when})' if insert_when else ''} "
        f"THEN INSERT ({columns}) VALUES ({values})"
    )
    if delete_unmatched:
        parts.append("WHEN NOT MATCHED BY SOURCE THEN DELETE")
    return " ".join(parts)


def _driver_source(
    source: DataFrame | pa.Table, dt: DeltaTable, on: list[str], insert_when: str | None
) -> pa.Table:
    """A merge's source as Arrow in the driver, for the gate's dry run and delta-rs merges."""
    import pyarrow as pa

    if isinstance(source, pa.Table):
        if not insert_when:
            return source
        flags = source.column(INSERTABLE)
        return _keep_insertable_or_matched(source.drop_columns([INSERTABLE]), flags, dt, on)
    if insert_when:
        return _drop_unmatched_non_inserts(source, dt, on, insert_when)
    return source.toArrow()


def _merge_delta_rs(
    dt: DeltaTable,
    path: Path,
    data: pa.Table,
    predicate: str,
    clauses: Any,
    txn: Txn | Sequence[Txn] | None,
    metadata: Mapping[str, Any] | None,
) -> None:
    """The delta-rs merge of a write that carries several positions (see :func:`_legacy`)."""
    from deltalake.exceptions import CommitFailedError

    _check_readable(dt, path)
    builder = clauses(
        dt.merge(
            data,
            predicate,
            source_alias="s",
            target_alias="t",
            commit_properties=_commit_properties(txn, metadata),
        )
    )
    try:
        builder.execute()
    except CommitFailedError as exc:
        raise ConcurrentWriteError(str(path), str(exc)) from None


def _merge_outcome(
    dt: DeltaTable, data: pa.Table, on: list[str], predicate: str, clauses: Any
) -> tuple[pa.Table, pa.Table]:
    """What a merge would publish, without publishing it: the same merge, run by delta-rs on a
    scratch copy of just the target rows the source's keys touch. Returns the rows it would
    insert or update (post-images) and the keys of the rows it would delete."""
    import tempfile

    import polars as pl
    import pyarrow as pa
    import pyarrow.compute as pc
    from deltalake import DeltaTable as Table
    from deltalake import write_deltalake

    schema = table_arrow_schema(dt)
    # polars reads the snapshot's files with the key filter pushed down to their statistics
    # (pyarrow's dataset filter cannot compare delta-rs's string_view files with string ones).
    touched = pl.all_horizontal(
        [pl.col(k).is_in(pl.Series(pc.unique(data[k])).implode()) for k in on]
    )
    scan = pl.scan_delta(dt.table_uri, version=dt.version()).filter(touched).collect()
    matched = normalize_table(scan.to_arrow()).select(schema.names)
    with tempfile.TemporaryDirectory(prefix="lakehouse-dry-merge-") as tmp:
        write_deltalake(tmp, matched.cast(schema), configuration=dict(CDF_PROPERTIES))
        scratch = Table(tmp)
        clauses(scratch.merge(data, predicate, source_alias="s", target_alias="t")).execute()
        if scratch.version() == 0:  # the merge changed nothing
            return schema.empty_table(), matched.select(on).slice(0, 0)
        changes = normalize_table(
            pa.table(scratch.load_cdf(starting_version=1, ending_version=1).read_all())
        )
    kind = changes["_change_type"]
    post = pc.filter(changes, pc.is_in(kind, value_set=pa.array(["insert", "update_postimage"])))
    gone = pc.filter(changes, pc.equal(kind, "delete")).select(on)
    return post.select(schema.names).cast(schema), gone


def _table_after(dt: DeltaTable, on: list[str], post: pa.Table, gone: pa.Table) -> pa.Table:
    """The whole table as it would be after a merge: the rows it leaves alone, then the
    post-images (for table-level checks such as key uniqueness)."""
    import pyarrow as pa

    current = snapshot_arrow(dt).cast(post.schema)
    keys = post.select(on)
    replaced = pa.concat_tables([keys, gone.select(on).cast(keys.schema)])
    kept = current.join(replaced, keys=on, join_type="left anti") if replaced.num_rows else current
    return pa.concat_tables([kept.select(post.schema.names), post], promote_options="permissive")


def _drop_unmatched_non_inserts(
    source: DataFrame, dt: DeltaTable, on: list[str], insert_when: str
) -> pa.Table:
    """The source as Arrow, without rows that fail ``insert_when`` and match no target row: they
    would change nothing. delta-rs 1.6 (change feed on) mishandles them when the batch matches no
    target row but inserts others: it writes an all-null row, which then fails the key's NOT NULL
    check. Filtering them first keeps the merge's result and avoids the bug."""
    from pyspark.sql import functions as F

    data = source.alias("s").withColumn(INSERTABLE, F.expr(insert_when)).toArrow()
    flags = data.column(INSERTABLE)
    return _keep_insertable_or_matched(data.drop_columns([INSERTABLE]), flags, dt, on)


def _keep_insertable_or_matched(
    data: pa.Table, insertable: pa.ChunkedArray, dt: DeltaTable, on: list[str]
) -> pa.Table:
    """``data`` without the rows that are not ``insertable`` and match no target row (see
    :func:`_drop_unmatched_non_inserts`)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    insertable = pc.fill_null(insertable, False)
    if pc.all(insertable).as_py():
        return data
    row = "__lakehouse_row"
    data = data.append_column(row, pa.array(range(data.num_rows), pa.int64()))
    target = dt.to_pyarrow_table(columns=on)
    matched = data.select([*on, row]).join(target, keys=on, join_type="left semi").column(row)
    keep = pc.or_(insertable, pc.is_in(data.column(row), value_set=matched.combine_chunks()))
    return data.filter(keep).drop_columns([row])


def _activate(spark: SparkSession) -> None:
    """Make ``spark`` the JVM's active session on this thread.

    Python data sources are looked up in the *active* session, which is per JVM thread; a write
    from another Python thread would not find ``lakehouse_delta`` otherwise. pyspark's own
    ``createDataFrame`` does the same call.
    """
    from pyspark.sql import SparkSession

    jvm = spark.sparkContext._jvm
    assert jvm is not None
    SparkSession._get_j_spark_session_class(jvm).setActiveSession(spark._jsparkSession)


# delta-spark's error classes for a commit that lost to a concurrent one.
_SPARK_CONFLICT = re.compile(
    r"DELTA_(CONCURRENT_[A-Z_]+|METADATA_CHANGED|PROTOCOL_CHANGED)|io\.delta\.exceptions\.Concurrent"
)


def _raise_if_conflict(exc: BaseException, path: Path) -> None:
    """Turn a lost commit race into :class:`ConcurrentWriteError`: delta-spark's conflict
    exceptions, or the data source's report (raised in a Python worker, so it reaches us as
    text); other errors are left to the caller."""
    from lakehouse.storage.commits import CONFLICT_MARKER

    text = str(exc)
    found = _SPARK_CONFLICT.search(text)
    if found is not None:
        line = text[found.start() :].splitlines()[0]
        raise ConcurrentWriteError(str(path), line) from None
    if CONFLICT_MARKER not in text:
        return
    tail = text[text.index(CONFLICT_MARKER) + len(CONFLICT_MARKER) :].lstrip(": ")
    raise ConcurrentWriteError(str(path), tail.splitlines()[0] if tail else text) from None


# -- light reads without Spark (command-line pull queries) -------------------------------------


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


def table_version(path: Path) -> int | None:
    """The table's latest version, or None if there is no table."""
    if not (path / "_delta_log").is_dir():
        return None
    return int(_load(path).version())


def last_commit_time(path: Path) -> datetime | None:
    """When the table's latest commit was made, or None if there is no table."""
    from datetime import UTC

    if not (path / "_delta_log").is_dir():
        return None
    (commit,) = _load(path).history(1)
    return datetime.fromtimestamp(commit["timestamp"] / 1000, UTC)


def latest_metadata(path: Path, key: str) -> Any:
    """The newest commit's value for a custom commit-metadata ``key``, JSON-decoded.

    Jobs call this every micro-batch to find their position, which is nearly always in one of
    the last few commits: look there first, and read the whole history only if it is not.
    """
    if not (path / "_delta_log").is_dir():
        return None
    dt = _load(path)
    for limit in (16, None):
        for commit in dt.history(limit):
            values = commit_metadata(commit)
            if key in values:
                raw = values[key]
                return json.loads(raw) if isinstance(raw, str) else raw
    return None


def commit_metadata(commit: Mapping[str, Any]) -> dict[str, Any]:
    """A commit's metadata (an entry of delta-rs's ``history()``): delta-spark's commits carry
    it as one JSON object in ``userMetadata`` (see :func:`_user_metadata`), delta-rs's as
    keys of the commit info itself."""
    values = dict(commit)
    user = commit.get("userMetadata")
    if isinstance(user, str) and user.startswith("{"):
        with contextlib.suppress(ValueError):  # else a user's own text, not ours
            values |= json.loads(user)
    return values


def read_arrow(path: Path, version: int | None = None, as_of: datetime | None = None) -> pa.Table:
    """A snapshot as an Arrow table, read by delta-rs on this process (small tables, the CLI),
    through its query engine (see :func:`snapshot_arrow`)."""
    dt = _load(path, version, own=as_of is not None)
    if as_of is not None:
        _travel(dt, path, as_of)
    return snapshot_arrow(dt)


def changes_arrow(path: Path, start_version: int = 0, end_version: int | None = None) -> pa.Table:
    """Change data feed of versions ``start_version..end_version`` as an Arrow table."""
    import pyarrow as pa

    dt = _load(path)
    end = dt.version() if end_version is None else end_version
    reader = dt.load_cdf(starting_version=start_version, ending_version=end)
    return normalize_table(pa.table(reader.read_all()))
