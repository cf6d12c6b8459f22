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

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import date, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from lakehouse.errors import (
    ConcurrentWriteError,
    LakehouseError,
    SchemaMismatchError,
    TableNotFoundError,
)
from lakehouse.storage.arrow import normalize_table, plain_schema
from lakehouse.storage.delta_spark import CDF_PROPERTIES, is_table
from lakehouse.storage.files import DataFile, delete_data_files, fs_path
from lakehouse.storage.gates import gate_for

if TYPE_CHECKING:
    import pyarrow as pa
    from deltalake import DeltaTable
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

    from lakehouse.storage.log import ChangeFile

CHANGE_COLUMNS = ("_change_type", "_commit_version", "_commit_timestamp")
# An append this small (its size known) is written by the driver (see DeltaStore.write).
LOCAL_WRITE_ROWS = 100_000
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
    history = dt.history()
    first_ms = min(int(c["timestamp"]) for c in history) if history else None
    if as_of.tzinfo is None:
        raise ValueError("as_of must carry a time zone")
    if first_ms is None or as_of.timestamp() * 1000 < first_ms:
        raise LakehouseError(f"{path}: the table did not exist yet at {as_of.isoformat()}")
    dt.load_as_version(as_of)


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
        return is_table(path)

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
        """The snapshot (latest, at ``version`` or as of a time) read by Spark's Parquet reader.

        ``with_file_name`` adds ``__file``, the name of the data file each row comes from.
        """
        import pyarrow as pa

        dt = _load(path, version, own=as_of is not None)
        if as_of is not None:
            _travel(dt, path, as_of)
        _check_readable(dt, path)
        partition_by = list(dt.metadata().partition_columns)
        adds = pa.table(dt.get_add_actions(flatten=False)).select(
            ["path", *(["partition"] if partition_by else [])]
        )
        entries: list[tuple[Path, Mapping[str, str | None], Mapping[str, Any]]] = [
            (fs_path(path, row["path"]), row.get("partition") or {}, {}) for row in adds.to_pylist()
        ]
        schema = self.spark_schema(path, dt.version())
        return self._scan(entries, schema, partition_by, {}, with_file_name=with_file_name)

    def changes(self, path: Path, start_version: int, end_version: int | None = None) -> DataFrame:
        """Change data feed of versions ``start_version..end_version`` (inclusive), with
        ``_change_type``, ``_commit_version`` and ``_commit_timestamp``."""
        from pyspark.sql import types as T

        from lakehouse.storage.log import changes_between

        dt = _load(path)
        _check_readable(dt, path)
        end = dt.version() if end_version is None else end_version
        schema = self.spark_schema(path, end)
        partition_by = list(dt.metadata().partition_columns)
        files: list[ChangeFile] = (
            changes_between(path, start_version, end) if start_version <= end else []
        )
        extras = {
            "_change_type": T.StringType(),
            "_commit_version": T.LongType(),
            "_commit_timestamp": T.TimestampType(),
        }
        entries = [
            (
                f.path,
                f.partition_values,
                {
                    "_change_type": None if f.kind == "cdc" else f.kind,
                    "_commit_version": f.version,
                    "_commit_timestamp": datetime.fromtimestamp(f.timestamp_ms / 1000).astimezone(),
                },
            )
            for f in files
        ]
        return self._scan(entries, schema, partition_by, extras, in_file=("_change_type",))

    def _scan(
        self,
        entries: Sequence[tuple[Path, Mapping[str, str | None], Mapping[str, Any]]],
        schema: StructType,
        partition_by: list[str],
        extras: Mapping[str, Any],
        in_file: Sequence[str] = (),
        with_file_name: bool = False,
    ) -> DataFrame:
        """Read data files with Spark; restore partition columns and per-file ``extras``.

        Columns named in ``in_file`` may also be stored inside the files (the ``_change_type``
        of ``cdc`` files); the per-file value is used where the file has none.
        """
        import pyarrow as pa
        from pyspark.sql import functions as F
        from pyspark.sql import types as T
        from pyspark.sql.pandas.types import to_arrow_schema

        out_schema = T.StructType(
            [*schema.fields, *(T.StructField(k, v) for k, v in extras.items())]
        )
        if with_file_name:
            out_schema = out_schema.add(T.StructField("__file", T.StringType()))
        if not entries:
            return self.spark.createDataFrame([], out_schema)
        data = [f for f in schema.fields if f.name not in partition_by]
        data += [T.StructField(c, extras[c]) for c in in_file]
        df = self.spark.read.schema(T.StructType(data)).parquet(*(str(e[0]) for e in entries))
        df = df.withColumn("__file", F.col("_metadata.file_name"))
        if not partition_by and not extras:
            return df if with_file_name else df.drop("__file")
        names = [e[0].name for e in entries]
        if len(set(names)) != len(names):
            raise LakehouseError("data files with the same name in one table: cannot map them")
        mapping_schema = T.StructType(
            [
                T.StructField("__file", T.StringType()),
                *(T.StructField(f"__p_{c}", T.StringType()) for c in partition_by),
                *(T.StructField(f"__x_{k}", v) for k, v in extras.items()),
            ]
        )
        by_file: dict[str, list[Any]] = {
            "__file": [e[0].name for e in entries],
            **{f"__p_{c}": [_partition_text(e[1].get(c)) for e in entries] for c in partition_by},
            **{f"__x_{k}": [e[2][k] for e in entries] for k in extras},
        }
        # From Arrow the mapping is a local relation, which the driver broadcasts as it is; from
        # Python rows it was an RDD, which took a Spark job of its own first (about 0.07 s of
        # each change feed read of a small batch).
        table = pa.Table.from_pydict(by_file, to_arrow_schema(mapping_schema, timezone="UTC"))
        mapping = self.spark.createDataFrame(table, mapping_schema)
        joined = df.join(F.broadcast(mapping), "__file")
        columns = []
        for f in out_schema.fields:
            if f.name in partition_by:
                columns.append(F.col(f"__p_{f.name}").cast(f.dataType).alias(f.name))
            elif f.name in extras and f.name in in_file:
                columns.append(F.coalesce(F.col(f.name), F.col(f"__x_{f.name}")).alias(f.name))
            elif f.name in extras:
                columns.append(F.col(f"__x_{f.name}").alias(f.name))
            elif f.name == "__file":
                columns.append(F.col("__file"))
            else:
                columns.append(F.col(f.name))
        return joined.select(*columns)

    # -- writes -------------------------------------------------------------------------------
    def create(
        self,
        path: Path,
        schema: StructType,
        *,
        properties: Mapping[str, str] = CDF_PROPERTIES,
        partition_by: Sequence[str] = (),
    ) -> None:
        """Create an empty table (no-op if it exists) with the given table properties."""
        from pyspark.sql.pandas.types import to_arrow_schema

        arrow = to_arrow_schema(schema, timezone="UTC")
        self.create_arrow(path, arrow, properties=properties, partition_by=partition_by)

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

        ``rows``: how many rows ``df`` has, if the caller knows. An append of at most
        :data:`LOCAL_WRITE_ROWS` rows is collected to the driver as Arrow and written there, by
        the same file writer and commit as the tasks': for a micro-batch, the data source's
        Python processes cost more to start than the write itself.
        """
        from lakehouse.storage.commits import WritePlan
        from lakehouse.storage.datasource import FORMAT

        if (mode == "replace_where") != (replace_where is not None):
            raise ValueError("replace_where needs mode='replace_where', and that mode needs it")
        self.create(path, df.schema, properties=properties, partition_by=partition_by)
        dt = _load(path, own=True)
        _check_readable(dt, path)
        if _applied(dt, txn):
            return WriteResult(False, dt.version())
        table_partitions = list(dt.metadata().partition_columns)
        if partition_by and list(partition_by) != table_partitions:
            raise SchemaMismatchError(
                f"{path}: partitioned by {table_partitions}, not {list(partition_by)}"
            )
        dt = self._conform_schema(dt, path, df.schema, schema_mode)
        removes: list[Any] = []
        if mode == "replace_where":
            assert replace_where is not None
            df, removes = self._plan_replace_where(df, dt, path, replace_where)
        gate, verdict = gate_for(path, at_commit=True), None
        if gate is not None:
            whole = None
            if gate.needs_whole_table:
                kept = self.read(path) if mode == "append" else None
                whole = df if kept is None else kept.unionByName(df, allowMissingColumns=True)
            source = (metadata or {}).get("lakehouse.source")
            verdict = gate.check(df, whole=whole, source=source)
            metadata = {**(metadata or {}), **gate.commit_metadata(verdict)}
        if mode == "append" and rows is not None and rows <= LOCAL_WRITE_ROWS:
            # One Spark job collects the small batch as Arrow; the driver writes it.
            result = self._write_local(df.toArrow(), path, dt, txn, metadata, max_rows_per_file)
            if gate is not None:
                gate.record(verdict, table_version=result.table_version, published=True)
            return result
        plan = WritePlan(
            table_root=str(path),
            schema_b64=WritePlan.encode_schema(table_arrow_schema(dt)),
            partition_by=table_partitions,
            mode="overwrite" if mode == "overwrite" else "append",
            read_version=int(dt.version()),
            removes=removes,
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
        version = self.version(path)
        if gate is not None:
            gate.record(verdict, table_version=version, published=True)
        return WriteResult(True, version)

    def _write_local(
        self,
        data: pa.Table,
        path: Path,
        dt: DeltaTable,
        txn: Txn | Sequence[Txn] | None,
        metadata: Mapping[str, Any] | None,
        max_rows_per_file: int = 5_000_000,
    ) -> WriteResult:
        """An append written by the driver, by the same file writer and commit as the tasks'."""
        from lakehouse.storage.files import TableFileWriter

        writer = TableFileWriter(
            str(path),
            table_arrow_schema(dt),
            list(dt.metadata().partition_columns),
            max_rows_per_file=max_rows_per_file,
        )
        files = writer.write_batches([data])
        return self.commit_staged(
            path, files, read_version=int(dt.version()), txn=txn, metadata=metadata
        )

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
        import pyarrow as pa

        dt = _load(path, own=True)
        _check_readable(dt, path)
        if _applied(dt, txn):
            return WriteResult(False, dt.version())
        schema = table_arrow_schema(dt)
        gate, verdict = gate_for(path, at_commit=True), None
        if gate is not None:
            whole = None
            if gate.needs_whole_table:
                whole = pa.concat_tables([snapshot_arrow(dt).cast(schema), data.cast(schema)])
            source = (metadata or {}).get("lakehouse.source")
            verdict = gate.check(data, data.num_rows, whole=whole, source=source)
            metadata = {**(metadata or {}), **gate.commit_metadata(verdict)}
        result = self._write_local(data, path, dt, txn, metadata)
        if gate is not None:
            gate.record(verdict, table_version=result.table_version, published=True)
        version = self.record_positions(path, txn, metadata)
        return WriteResult(result.committed, version, data.num_rows)

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
        if self.exists(path):
            return
        from deltalake import DeltaTable

        path.mkdir(parents=True, exist_ok=True)
        DeltaTable.create(
            str(path),
            schema=schema,
            mode="ignore",
            partition_by=list(partition_by) or None,
            configuration=dict(properties),
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
    ) -> DeltaTable:
        """Refuse incompatible data; add new nullable columns when asked. Returns a fresh table."""
        from deltalake import Field
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
        if new:
            dt.alter.add_columns([Field(f.name, f.type, nullable=True) for f in new])
            dt = _load(path, own=True)
        return dt

    def _plan_replace_where(
        self, df: DataFrame, dt: DeltaTable, path: Path, predicate: str
    ) -> tuple[DataFrame, list[Any]]:
        """Rows to write (new + kept rows of touched files) and the files to remove."""
        import pyarrow as pa
        from pyspark.sql import functions as F

        from lakehouse.storage.commits import RemovedFile

        cond = F.coalesce(F.expr(predicate), F.lit(False))
        outside = df.filter(~cond).count()
        if outside:
            raise ReplaceWhereError(
                f"{path}: {outside} row(s) of the new data do not match the replace-where "
                f"predicate {predicate!r}; nothing was written"
            )
        current = self.read(path, version=dt.version(), with_file_name=True)
        touched = {r["__file"] for r in current.filter(cond).select("__file").distinct().collect()}
        if not touched:
            return df, []
        adds = pa.table(dt.get_add_actions(flatten=False)).to_pylist()
        removes = [
            RemovedFile(a["path"], a["size_bytes"], dict(a.get("partition") or {}))
            for a in adds
            if fs_path(path, a["path"]).name in touched
        ]
        kept = current.filter(F.col("__file").isin(list(touched)) & ~cond).drop("__file")
        return df.unionByName(kept, allowMissingColumns=True), removes

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
        from deltalake.exceptions import CommitFailedError

        dt = _load(path, own=True)
        _check_readable(dt, path)
        if _applied(dt, txn):
            return WriteResult(False, dt.version())
        if isinstance(source, pa.Table):
            data = source
            if insert_when:
                flags = data.column(INSERTABLE)
                data = _keep_insertable_or_matched(data.drop_columns([INSERTABLE]), flags, dt, on)
        elif insert_when:
            data = _drop_unmatched_non_inserts(source, dt, on, insert_when)
        else:
            data = source.toArrow()
        predicate = " AND ".join(f"t.{k} = s.{k}" for k in on)

        def clauses(builder: Any) -> Any:
            if delete_when:
                builder = builder.when_matched_delete(delete_when)
            builder = builder.when_matched_update(dict(update), predicate=update_when)
            builder = builder.when_not_matched_insert(dict(insert), predicate=insert_when)
            if delete_unmatched:
                builder = builder.when_not_matched_by_source_delete()
            return builder

        gate, verdict = gate_for(path, at_commit=True), None
        if gate is not None:
            post, gone = _merge_outcome(dt, data, on, predicate, clauses)
            whole = _table_after(dt, on, post, gone) if gate.needs_whole_table else None
            position = (metadata or {}).get("lakehouse.source")
            verdict = gate.check(post, post.num_rows, whole=whole, source=position)
            metadata = {**(metadata or {}), **gate.commit_metadata(verdict)}
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
        # delta-rs brought ``dt`` to the merge's own commit, if it made one.
        version = self.record_positions(path, txn, metadata, table=dt)
        if gate is not None:
            gate.record(verdict, table_version=version, published=True)
        return WriteResult(True, version, data.num_rows)

    def delete_matching(
        self,
        keys: DataFrame,
        path: Path,
        *,
        on: list[str],
        metadata: Mapping[str, Any] | None = None,
    ) -> int:
        """Delete the rows of ``path`` whose ``on`` columns match a row of ``keys`` (distinct
        key rows, collected to the driver), in one commit; return how many went. No commit
        when none match."""
        from deltalake.exceptions import CommitFailedError

        data = keys.select(*on).toArrow()
        if data.num_rows == 0:
            return 0
        dt = _load(path, own=True)
        _check_readable(dt, path)
        predicate = " AND ".join(f"t.{k} = s.{k}" for k in on)
        try:
            metrics = (
                dt.merge(
                    data,
                    predicate,
                    source_alias="s",
                    target_alias="t",
                    commit_properties=_commit_properties(None, metadata),
                )
                .when_matched_delete()
                .execute()
            )
        except CommitFailedError as exc:
            raise ConcurrentWriteError(str(path), str(exc)) from None
        return int(metrics.get("num_target_rows_deleted", 0))

    def record_positions(
        self,
        path: Path,
        txn: Txn | Sequence[Txn] | None,
        metadata: Mapping[str, Any] | None,
        *,
        table: DeltaTable | None = None,
    ) -> int:
        """Commit ``txn`` with no rows unless the table already holds exactly these positions;
        return the table's version after.

        delta-rs makes no commit for a merge that changes nothing (an empty batch, or one whose
        rows all equal the stored ones). The consumer's position must still advance, or the same
        input versions would be read again every run. ``table``: the table as the caller's own
        commit left it (delta-rs brings a loaded table to the commit it makes); when that commit
        carried the positions, the log is not loaded again."""
        from deltalake import write_deltalake

        def holds(dt: DeltaTable) -> bool:
            return all(dt.transaction_version(t.app_id) == t.version for t in _txns(txn))

        if table is not None and holds(table):
            return int(table.version())
        dt = _load(path)
        if not holds(dt):
            empty = table_arrow_schema(dt).empty_table()
            write_deltalake(
                dt, empty, mode="append", commit_properties=_commit_properties(txn, metadata)
            )
        return int(dt.version())


def _partition_text(value: Any) -> str | None:
    """A partition value as the text Spark casts back to the column's type (the log stores
    text; delta-rs's add actions give typed values)."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, date):  # datetime too
        return value.isoformat()
    return str(value)


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


def _raise_if_conflict(exc: BaseException, path: Path) -> None:
    """Turn the data source's conflict report (raised in a Python worker, so it reaches us as
    text) into :class:`ConcurrentWriteError`; other errors are left to the caller."""
    from lakehouse.storage.commits import CONFLICT_MARKER

    text = str(exc)
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
    if not is_table(path):
        return None
    return int(_load(path).version())


def last_commit_time(path: Path) -> datetime | None:
    """When the table's latest commit was made, or None if there is no table."""
    from datetime import UTC

    if not is_table(path):
        return None
    (commit,) = _load(path).history(1)
    return datetime.fromtimestamp(commit["timestamp"] / 1000, UTC)


def latest_metadata(path: Path, key: str) -> Any:
    """The newest commit's value for a custom commit-metadata ``key``, JSON-decoded.

    Jobs call this every micro-batch to find their position, which is nearly always in one of
    the last few commits: look there first, and read the whole history only if it is not.
    """
    if not is_table(path):
        return None
    from lakehouse.storage.delta_spark import commit_metadata

    dt = _load(path)
    for limit in (16, None):
        for commit in dt.history(limit):
            value = commit_metadata(commit, key)
            if value is not None:
                return value
    return None


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
