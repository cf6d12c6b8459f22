"""Delta tables under Spark, through delta-rs: the one small interface every layer uses.

No JVM Delta connector is available (its jars come from a Maven repository we cannot reach), so
tables are read and written with delta-rs (``deltalake``) and exchanged with Spark as Arrow. The
tables stay ordinary Delta tables that a Spark cluster with delta-spark can read too.

Every write may carry a :class:`Txn` (application id + monotonically increasing version). It is
stored in the same commit as the data (Delta app transactions), together with commit metadata
such as the source offsets or version consumed, so "write" and "remember where I am" cannot come
apart; a write whose version is not newer than the table's recorded one is skipped.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lakehouse.errors import TableNotFoundError

if TYPE_CHECKING:
    import pyarrow as pa
    from deltalake import DeltaTable
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

CDF_PROPERTIES = {"delta.enableChangeDataFeed": "true"}
CHANGE_COLUMNS = ("_change_type", "_commit_version", "_commit_timestamp")


@dataclass(frozen=True)
class Txn:
    """An exactly-once marker: ``version`` must grow for every new batch of ``app_id``."""

    app_id: str
    version: int


@dataclass(frozen=True)
class WriteResult:
    committed: bool  # False when the Txn version was already applied
    table_version: int | None


def _delta_table(path: Path, version: int | None = None) -> DeltaTable:
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError as DeltaMissing

    try:
        return DeltaTable(str(path), version=version)
    except DeltaMissing:
        raise TableNotFoundError(str(path)) from None


def _commit_properties(txn: Txn | None, metadata: Mapping[str, Any] | None) -> Any:
    from deltalake import CommitProperties, Transaction

    custom = {k: v if isinstance(v, str) else json.dumps(v) for k, v in (metadata or {}).items()}
    return CommitProperties(
        app_transactions=[Transaction(app_id=txn.app_id, version=txn.version)] if txn else None,
        custom_metadata=custom or None,
    )


class DeltaStore:
    """Read, write and merge Delta tables for a SparkSession."""

    def __init__(self, spark: SparkSession) -> None:
        self.spark = spark

    # -- inspection ---------------------------------------------------------------------------
    @staticmethod
    def exists(path: Path) -> bool:
        return (path / "_delta_log").is_dir()

    def version(self, path: Path) -> int | None:
        """Latest committed version, or ``None`` when the table does not exist yet."""
        if not self.exists(path):
            return None
        return int(_delta_table(path).version())

    def transaction_version(self, path: Path, app_id: str) -> int | None:
        """The last version committed by ``app_id`` (its position), or ``None``."""
        if not self.exists(path):
            return None
        v = _delta_table(path).transaction_version(app_id)
        return None if v is None else int(v)

    def latest_metadata(self, path: Path, key: str) -> Any:
        """The newest commit's value for a custom commit-metadata ``key``, JSON-decoded."""
        if not self.exists(path):
            return None
        for commit in _delta_table(path).history():
            if key in commit:
                raw = commit[key]
                return json.loads(raw) if isinstance(raw, str) else raw
        return None

    def spark_schema(self, path: Path, version: int | None = None) -> StructType:
        import pyarrow as pa
        from pyspark.sql.pandas.types import from_arrow_schema

        schema = pa.schema(_delta_table(path, version).schema().to_arrow())
        return from_arrow_schema(schema)

    # -- reads --------------------------------------------------------------------------------
    def read(self, path: Path, version: int | None = None) -> DataFrame:
        """The table's snapshot (latest, or at ``version``) read by Spark's Parquet reader."""
        dt = _delta_table(path, version)
        schema = self.spark_schema(path, version)
        files = dt.file_uris()
        if not files:
            return self.spark.createDataFrame([], schema)
        return self.spark.read.schema(schema).parquet(*files)

    def changes(self, path: Path, start_version: int, end_version: int | None = None) -> DataFrame:
        """Change data feed rows of versions ``start_version..end_version`` (inclusive)."""
        import pyarrow as pa

        dt = _delta_table(path)
        end = dt.version() if end_version is None else end_version
        if start_version > end:
            return self._empty_changes(path)
        reader = dt.load_cdf(starting_version=start_version, ending_version=end)
        table = pa.table(reader.read_all())
        if table.num_rows == 0:
            return self._empty_changes(path)
        return self.spark.createDataFrame(_normalize(table))

    def _empty_changes(self, path: Path) -> DataFrame:
        from pyspark.sql.types import LongType, StringType, StructField, TimestampType

        schema = self.spark_schema(path)
        for name, dtype in zip(
            CHANGE_COLUMNS, (StringType(), LongType(), TimestampType()), strict=True
        ):
            schema = schema.add(StructField(name, dtype, True))
        return self.spark.createDataFrame([], schema)

    # -- writes -------------------------------------------------------------------------------
    def create(self, path: Path, schema: StructType, *, properties: Mapping[str, str]) -> None:
        """Create an empty table (no-op if it exists) with the given table properties."""
        if self.exists(path):
            return
        from deltalake import DeltaTable
        from pyspark.sql.pandas.types import to_arrow_schema

        path.mkdir(parents=True, exist_ok=True)
        DeltaTable.create(
            str(path),
            schema=to_arrow_schema(schema, timezone="UTC"),
            mode="ignore",
            configuration=dict(properties),
        )

    def append(
        self,
        df: DataFrame,
        path: Path,
        *,
        txn: Txn | None = None,
        metadata: Mapping[str, Any] | None = None,
        properties: Mapping[str, str] = CDF_PROPERTIES,
    ) -> WriteResult:
        """Append ``df``; with ``txn``, at most once per (app id, version)."""
        from deltalake import write_deltalake

        if self._already_applied(path, txn):
            return WriteResult(False, self.version(path))
        self.create(path, df.schema, properties=properties)
        data = df.toArrow()
        write_deltalake(
            str(path),
            data,
            mode="append",
            commit_properties=_commit_properties(txn, metadata),
        )
        return WriteResult(True, self.version(path))

    def merge(
        self,
        source: DataFrame,
        path: Path,
        *,
        on: list[str],
        update: Mapping[str, str],
        insert: Mapping[str, str],
        delete_when: str | None = None,
        insert_when: str | None = None,
        txn: Txn | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> WriteResult:
        """Upsert ``source`` (one row per key) into the table as one commit.

        ``update`` and ``insert`` map target columns to SQL expressions over ``s`` (source) and
        ``t`` (target); ``delete_when`` deletes matched rows where it holds (tombstones), and
        ``insert_when`` restricts which unmatched source rows are inserted.
        """
        if self._already_applied(path, txn):
            return WriteResult(False, self.version(path))
        if not self.exists(path):
            raise TableNotFoundError(str(path))
        data = source.toArrow()
        dt = _delta_table(path)
        predicate = " AND ".join(f"t.{k} = s.{k}" for k in on)
        builder = dt.merge(
            data,
            predicate,
            source_alias="s",
            target_alias="t",
            commit_properties=_commit_properties(txn, metadata),
        )
        if delete_when:
            builder = builder.when_matched_delete(delete_when)
        builder = builder.when_matched_update(dict(update))
        builder = builder.when_not_matched_insert(dict(insert), predicate=insert_when)
        builder.execute()
        return WriteResult(True, self.version(path))

    def _already_applied(self, path: Path, txn: Txn | None) -> bool:
        # delta-rs records app transactions but does not refuse a repeated version itself.
        if txn is None:
            return False
        current = self.transaction_version(path, txn.app_id)
        return current is not None and current >= txn.version


def _plain_type(t: pa.DataType) -> pa.DataType:
    """delta-rs hands out view, large and unsigned types that Spark's Arrow bridge refuses."""
    import pyarrow as pa

    if pa.types.is_string_view(t) or pa.types.is_large_string(t):
        return pa.string()
    if pa.types.is_binary_view(t) or pa.types.is_large_binary(t):
        return pa.binary()
    if pa.types.is_unsigned_integer(t):
        return pa.int64()
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_list_view(t):
        return pa.list_(
            pa.field(t.value_field.name, _plain_type(t.value_type), t.value_field.nullable)
        )
    if pa.types.is_struct(t):
        return pa.struct([pa.field(f.name, _plain_type(f.type), f.nullable) for f in t])
    if pa.types.is_map(t):
        return pa.map_(_plain_type(t.key_type), _plain_type(t.item_type))
    return t


def _normalize(table: pa.Table) -> pa.Table:
    """Make delta-rs Arrow output acceptable to Spark, with the change feed's time in UTC."""
    import pyarrow as pa

    fields = []
    for f in table.schema:
        t = _plain_type(f.type)
        if f.name == "_commit_timestamp" and pa.types.is_timestamp(t) and t.tz is None:
            t = pa.timestamp(t.unit, tz="UTC")
        fields.append(pa.field(f.name, t, f.nullable))
    schema = pa.schema(fields)
    return table if schema.equals(table.schema) else table.cast(schema)


# -- light reads without Spark (command-line pull queries) -------------------------------------


def read_arrow(path: Path, version: int | None = None) -> pa.Table:
    """A snapshot as an Arrow table, read by delta-rs on this process (small tables, the CLI)."""
    import pyarrow as pa

    dt = _delta_table(path, version)
    return _normalize(pa.table(dt.to_pyarrow_table()))


def changes_arrow(path: Path, start_version: int = 0, end_version: int | None = None) -> pa.Table:
    """Change data feed of versions ``start_version..end_version`` as an Arrow table."""
    import pyarrow as pa

    dt = _delta_table(path)
    end = dt.version() if end_version is None else end_version
    reader = dt.load_cdf(starting_version=start_version, ending_version=end)
    return _normalize(pa.table(reader.read_all()))
