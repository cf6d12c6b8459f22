"""Delta tables under Spark through delta-rs: the storage layer every layer writes through.

Import from here; :class:`DeltaStore` is the one small interface (a native delta-spark backend
could implement the same methods where the jars exist).
"""

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
    "read_arrow",
]
