"""Data files of a Delta table: Parquet written with pyarrow, with the statistics Delta keeps.

This module runs on Spark's executors (inside the data source's writer tasks): it imports only
pyarrow, never deltalake, because executors' Python workers are forked processes.
"""

from __future__ import annotations

import hashlib
import json
import math
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"
# Strings longer than this keep a min statistic (a prefix is still a lower bound) but no max.
MAX_STRING_STAT = 64
_SAFE = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-")


@dataclass(frozen=True)
class DataFile:
    """One Parquet file written into a table directory, ready to become a Delta ``add``."""

    path: str  # relative to the table root, URL-encoded as the Delta log stores it
    size: int
    partition_values: dict[str, str | None]
    num_records: int
    stats: str
    modification_time: int


def _folder_value(value: str) -> str:
    """A partition value as a folder name made of ``[A-Za-z0-9._-]`` only.

    Delta readers take partition values from the log, so the folder name only has to be unique
    and readable. Hive's %-escaping is avoided on purpose: Spark's Parquet reader decodes '%'
    in the paths it is given a second time and then cannot find the file; spaces and ':' break
    Hadoop paths too. Values with other characters get a short hash to stay unique.
    """
    if value and len(value) <= 64 and all(c in _SAFE for c in value):
        return value
    readable = "".join(c if c in _SAFE else "_" for c in value[:48])
    digest = hashlib.sha1(value.encode("utf-8")).hexdigest()[:10]
    return f"{readable}-h{digest}"


def partition_dir(partition_by: list[str], values: Mapping[str, str | None]) -> str:
    """Folder of a partition: ``col=value/...`` (null -> Hive's null marker)."""
    parts = []
    for col in partition_by:
        v = values[col]
        parts.append(f"{col}={HIVE_NULL if v is None else _folder_value(v)}")
    return "/".join(parts)


def log_path(relative_fs_path: str) -> str:
    """The Delta log's form of a relative path: URL-encoded (so Hive's '%' becomes '%25')."""
    return quote(relative_fs_path, safe="/=")


def fs_path(table_root: str | Path, log_relative: str) -> Path:
    """Where on disk a path from the Delta log lives."""
    return Path(table_root) / unquote(log_relative)


def partition_string(value: Any) -> str | None:
    """Delta's serialization of a partition value."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, datetime):
        if value.tzinfo is not None:
            value = value.astimezone(UTC).replace(tzinfo=None)
        return value.isoformat(sep=" ", timespec="microseconds")
    if isinstance(value, date):
        return value.isoformat()
    return str(value)


# -- statistics ------------------------------------------------------------------------------


def _stat_value(value: Any, is_max: bool) -> Any:
    """A Parquet statistic as JSON, or ``None`` where it would not be a safe bound."""
    if isinstance(value, bool):
        return None  # Delta keeps no min/max for booleans
    if isinstance(value, float):
        return None if math.isnan(value) or math.isinf(value) else value
    if isinstance(value, int):
        return value
    if isinstance(value, Decimal):
        return float(value)
    if isinstance(value, str):
        if len(value) <= MAX_STRING_STAT:
            return value
        return None if is_max else value[:MAX_STRING_STAT]
    if isinstance(value, datetime):
        # Delta's stats have millisecond precision: round the bound outwards.
        if value.tzinfo is not None:
            value = value.astimezone(UTC).replace(tzinfo=None)
        ms = value.replace(microsecond=value.microsecond // 1000 * 1000)
        if is_max and ms != value:
            ms += timedelta(milliseconds=1)
        return ms.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms.microsecond // 1000:03d}Z"
    if isinstance(value, date):
        return value.isoformat()
    return None


def file_stats(path: Path, schema: pa.Schema) -> tuple[int, str]:
    """``(numRecords, stats JSON)`` from the Parquet footer's row-group statistics.

    Only top-level primitive columns get min/max/nullCount; nested ones are left out, which
    readers treat as "unknown" (no data skipping), never as wrong.
    """
    meta = pq.ParquetFile(path).metadata
    rows = meta.num_rows
    mins: dict[str, Any] = {}
    maxs: dict[str, Any] = {}
    nulls: dict[str, int] = {}
    top_level = {f.name for f in schema if not pa.types.is_nested(f.type)}
    for col in range(meta.num_columns):
        if not meta.num_row_groups:
            break
        name = meta.row_group(0).column(col).path_in_schema
        if name not in top_level:
            continue
        lo: Any = None
        hi: Any = None
        count = 0
        complete = True
        for rg in range(meta.num_row_groups):
            st = meta.row_group(rg).column(col).statistics
            if st is None:
                complete = False
                break
            count += st.null_count or 0
            if not st.has_min_max:
                continue
            lo = st.min if lo is None or st.min < lo else lo
            hi = st.max if hi is None or st.max > hi else hi
        if not complete:
            continue
        nulls[name] = count
        lo_json, hi_json = _stat_value(lo, False), _stat_value(hi, True)
        if lo_json is not None and hi_json is not None:
            mins[name], maxs[name] = lo_json, hi_json
    stats = {"numRecords": rows, "minValues": mins, "maxValues": maxs, "nullCount": nulls}
    return rows, json.dumps(stats, separators=(",", ":"))


# -- writing ---------------------------------------------------------------------------------


@dataclass
class _OpenFile:
    relative: str
    writer: pq.ParquetWriter
    values: dict[str, str | None]
    rows: int = 0
    pending: list[pa.Table] = field(default_factory=list)
    pending_rows: int = 0

    def flush(self) -> None:
        if self.pending:
            self.writer.write_table(
                pa.concat_tables(self.pending), row_group_size=self.pending_rows
            )
            self.pending, self.pending_rows = [], 0


@dataclass
class TableFileWriter:
    """Streams Arrow batches into Parquet files under a table root, one file set per partition.

    Batches are cast to the table's (data) schema; partition columns are taken out of the rows
    and into the folder names, as Delta stores them. Files roll over at ``max_rows_per_file``.
    """

    table_root: str
    schema: pa.Schema  # the table's full schema, partition columns included
    partition_by: list[str] = field(default_factory=list)
    max_rows_per_file: int = 5_000_000
    compression: str = "snappy"
    # Spark hands over small Arrow batches (10K rows); Parquet row groups that small cost CPU
    # and compress worse, so rows are buffered per file up to this many.
    row_group_rows: int = 131_072
    _open: dict[tuple[str | None, ...], _OpenFile] = field(default_factory=dict)
    _done: list[DataFile] = field(default_factory=list)

    @property
    def data_schema(self) -> pa.Schema:
        return pa.schema([f for f in self.schema if f.name not in self.partition_by])

    def write_batches(self, batches: Iterable[pa.RecordBatch | pa.Table]) -> list[DataFile]:
        """Write batches or whole tables (a table is conformed to the schema once, not per
        chunk) and close the files; returns them, ready to commit."""
        try:
            for batch in batches:
                if batch.num_rows:
                    self._write(batch)
            self._close_all()
        except BaseException:
            self.discard()
            raise
        return list(self._done)

    def discard(self) -> None:
        """Delete every file this writer produced (the write is being abandoned)."""
        for f in self._open.values():
            f.writer.close()
            fs_path(self.table_root, f.relative).unlink(missing_ok=True)
        self._open.clear()
        delete_data_files(self.table_root, self._done)
        self._done.clear()

    def _conform(self, batch: pa.RecordBatch | pa.Table) -> pa.Table:
        table = batch if isinstance(batch, pa.Table) else pa.Table.from_batches([batch])
        missing = [f for f in self.schema if f.name not in table.column_names]
        for f in missing:  # columns the table has and this data lacks (schema evolution)
            table = table.append_column(f, pa.nulls(table.num_rows, f.type))
        return table.select(self.schema.names).cast(self.schema)

    def _write(self, batch: pa.RecordBatch | pa.Table) -> None:
        table = self._conform(batch)
        if not self.partition_by:
            self._append((), {}, table)
            return
        keys = table.select(self.partition_by)
        groups = keys.group_by(self.partition_by, use_threads=False).aggregate([])
        for values in groups.to_pylist():
            mask = None
            for col in self.partition_by:
                v = values[col]
                cond = pc.is_null(table[col]) if v is None else pc.equal(table[col], v)
                mask = cond if mask is None else pc.and_(mask, cond)
            part = table.filter(mask)
            strings = {c: partition_string(values[c]) for c in self.partition_by}
            self._append(tuple(strings[c] for c in self.partition_by), strings, part)

    def _append(
        self, key: tuple[str | None, ...], values: dict[str, str | None], rows: pa.Table
    ) -> None:
        data = rows.drop_columns(self.partition_by) if self.partition_by else rows
        offset = 0
        while offset < data.num_rows:
            f = self._open.get(key) or self._start(key, values)
            take = min(data.num_rows - offset, self.max_rows_per_file - f.rows)
            f.pending.append(data.slice(offset, take))
            f.pending_rows += take
            if f.pending_rows >= self.row_group_rows:
                f.flush()
            f.rows += take
            offset += take
            if f.rows >= self.max_rows_per_file:
                self._close(key)

    def _start(self, key: tuple[str | None, ...], values: dict[str, str | None]) -> _OpenFile:
        folder = partition_dir(self.partition_by, values) if self.partition_by else ""
        name = f"part-{uuid.uuid4()}-c000.{self.compression}.parquet"
        relative = f"{folder}/{name}" if folder else name
        target = Path(self.table_root) / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        writer = pq.ParquetWriter(
            target, self.data_schema, compression=self.compression, write_statistics=True
        )
        self._open[key] = _OpenFile(relative, writer, values)
        return self._open[key]

    def _close(self, key: tuple[str | None, ...]) -> None:
        f = self._open.pop(key)
        f.flush()
        f.writer.close()
        target = Path(self.table_root) / f.relative
        rows, stats = file_stats(target, self.data_schema)
        st = target.stat()
        self._done.append(
            DataFile(
                path=log_path(f.relative),
                size=st.st_size,
                partition_values=f.values,
                num_records=rows,
                stats=stats,
                modification_time=int(st.st_mtime * 1000),
            )
        )

    def _close_all(self) -> None:
        for key in list(self._open):
            self._close(key)


def delete_data_files(table_root: str | Path, files: Iterable[DataFile]) -> None:
    """Delete data files that no commit references (a write that is being abandoned)."""
    for f in files:
        fs_path(table_root, f.path).unlink(missing_ok=True)
