"""Delta tables under Spark: the storage layer every layer reads and writes through.

Import from here. :mod:`lakehouse.storage.delta_spark` writes with Delta Lake's own connector
(bronze so far); :class:`DeltaStore` writes the other layers' tables with delta-rs until they move,
and reads every table.
"""

from lakehouse.storage.delta_spark import is_table
from lakehouse.storage.store import (
    CDF_PROPERTIES,
    CHANGE_COLUMNS,
    DeltaStore,
    ReplaceWhereError,
    Txn,
    UnsupportedTableError,
    WriteResult,
    changes_arrow,
    read_arrow,
)

__all__ = [
    "CDF_PROPERTIES",
    "CHANGE_COLUMNS",
    "DeltaStore",
    "ReplaceWhereError",
    "Txn",
    "UnsupportedTableError",
    "WriteResult",
    "changes_arrow",
    "is_table",
    "read_arrow",
]
