"""A Spark Python data source that writes Delta tables through delta-rs.

Spark's tasks write Parquet files straight into the table directory (in parallel, on the
executors, with pyarrow); the driver-side ``commit`` then adds them to the Delta log in one
transaction, against the table version the write was planned on, with the app transaction and
commit metadata of the write. If any task fails, ``abort`` deletes the files: nothing a failed
write produced is ever visible, and a crash leaves only unreferenced files for vacuum.

Use it through :class:`lakehouse.storage.DeltaStore`, which plans the write (schema checks,
exactly-once check, replace-where) and passes the plan as the ``plan`` option. The plan and the
commit are in :mod:`lakehouse.storage.commits`, which the driver also uses without Spark.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceArrowWriter, WriterCommitMessage

from lakehouse.storage.commits import WritePlan, commit_files
from lakehouse.storage.files import DataFile, TableFileWriter, delete_data_files

if TYPE_CHECKING:
    from pyspark.sql.types import StructType

FORMAT = "lakehouse_delta"


@dataclass
class FilesWritten(WriterCommitMessage):
    files: list[DataFile]


class DeltaDataSource(DataSource):
    """``df.write.format("lakehouse_delta").option("plan", plan.to_json()).mode("append").save()``"""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def writer(self, schema: StructType, overwrite: bool) -> DeltaArrowWriter:
        return DeltaArrowWriter(WritePlan.from_json(self.options["plan"]))


class DeltaArrowWriter(DataSourceArrowWriter):
    def __init__(self, plan: WritePlan) -> None:
        self.plan = plan

    def write(self, iterator: Iterator[pa.RecordBatch]) -> FilesWritten:
        writer = TableFileWriter(
            table_root=self.plan.table_root,
            schema=self.plan.schema,
            partition_by=list(self.plan.partition_by),
            max_rows_per_file=self.plan.max_rows_per_file,
        )
        return FilesWritten(writer.write_batches(iterator))

    def commit(self, messages: Sequence[WriterCommitMessage | None]) -> None:
        files = _files(messages)
        try:
            commit_files(self.plan, files)
        except BaseException:
            delete_data_files(self.plan.table_root, files)
            raise

    def abort(self, messages: Sequence[WriterCommitMessage | None]) -> None:
        delete_data_files(self.plan.table_root, _files(messages))


def _files(messages: Sequence[WriterCommitMessage | None]) -> list[DataFile]:
    return [f for m in messages if isinstance(m, FilesWritten) for f in m.files]
