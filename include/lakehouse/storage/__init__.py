"""Delta tables under Spark: the storage layer every layer reads and writes through.

Import from here. :mod:`lakehouse.storage.delta_spark` writes every table with Delta Lake's own
connector; :class:`DeltaStore` reads them (Spark's Delta reader for jobs, delta-rs for the log).
"""

from lakehouse.storage.delta_spark import CDF_PROPERTIES
from lakehouse.storage.log import Txn, WriteResult, is_table
from lakehouse.storage.store import DeltaStore, changes_arrow, read_arrow

__all__ = [
    "CDF_PROPERTIES",
    "DeltaStore",
    "Txn",
    "WriteResult",
    "changes_arrow",
    "is_table",
    "read_arrow",
]
