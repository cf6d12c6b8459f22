"""The Delta commit of files already written into a table directory, through delta-rs.

Both ways of writing a batch end here: Spark's tasks through the data source
(:mod:`lakehouse.storage.datasource`), and files staged by the driver or by tasks and
committed by :meth:`lakehouse.storage.DeltaStore.commit_staged`. This module does not import
Spark: a micro-batch done in the driver commits without loading it.
"""

from __future__ import annotations

import base64
import json
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import pyarrow as pa

from lakehouse.storage.files import DataFile

CONFLICT_MARKER = "LAKEHOUSE_CONCURRENT_WRITE"


@dataclass(frozen=True)
class RemovedFile:
    path: str  # as in the log
    size: int | None
    partition_values: dict[str, str | None]


@dataclass
class WritePlan:
    """Everything the tasks and the commit need, planned on the driver."""

    table_root: str
    schema_b64: str  # the table's Arrow schema (IPC), partition columns included
    partition_by: list[str]
    mode: Literal["append", "overwrite"]
    read_version: int
    removes: list[RemovedFile] = field(default_factory=list)
    txns: list[tuple[str, int]] = field(default_factory=list)  # (app id, version) per source
    metadata: dict[str, str] = field(default_factory=dict)
    max_rows_per_file: int = 5_000_000

    @staticmethod
    def encode_schema(schema: pa.Schema) -> str:
        return base64.b64encode(schema.serialize().to_pybytes()).decode("ascii")

    @property
    def schema(self) -> pa.Schema:
        return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(self.schema_b64)))

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> WritePlan:
        raw = json.loads(text)
        raw["removes"] = [RemovedFile(**r) for r in raw["removes"]]
        raw["txns"] = [tuple(t) for t in raw["txns"]]
        return cls(**raw)


def commit_files(plan: WritePlan, files: list[DataFile]) -> None:
    """Add ``files`` (and remove ``plan.removes``) in one Delta commit on ``plan.read_version``.

    A concurrent commit that conflicts (the same app transaction, or files this write removes
    and someone else removed or rewrote) fails the commit with a message carrying
    :data:`CONFLICT_MARKER`, which the driver turns into :class:`ConcurrentWriteError`.
    """
    from deltalake import CommitProperties, DeltaTable, Transaction
    from deltalake.exceptions import CommitFailedError
    from deltalake.transaction import AddAction, RemoveAction

    from lakehouse.storage import snapshots

    now = int(time.time() * 1000)
    actions: list[Any] = [
        AddAction(f.path, f.size, f.partition_values, f.modification_time, True, f.stats)
        for f in files
    ]
    actions += [RemoveAction(r.path, True, now, r.size, r.partition_values) for r in plan.removes]
    props = CommitProperties(
        app_transactions=[Transaction(app, version) for app, version in plan.txns] or None,
        custom_metadata=plan.metadata or None,
    )
    table = snapshots.latest(plan.table_root)
    if table.version() != plan.read_version:
        table = DeltaTable(plan.table_root, version=plan.read_version)
    try:
        table.create_write_transaction(
            actions,
            plan.mode,
            plan.schema,
            partition_by=plan.partition_by or None,
            commit_properties=props,
        )
    except CommitFailedError as exc:
        raise RuntimeError(
            f"{CONFLICT_MARKER}: {plan.table_root}: a concurrent commit conflicts with this "
            f"write planned on version {plan.read_version}: {exc}"
        ) from None
