"""The newest snapshot of a Delta table, kept between calls and brought forward, not reloaded.

A micro-batch asks the same few tables for their version, their app transactions, their schema
and their files a few dozen times (every layer checks where it is before it writes, then
commits, then records its verdict in the ledger). Loading a ``DeltaTable`` reads the log from
its last checkpoint on each call: 3 to 4 ms for a layer table here and 12 ms for the quality
ledger. A snapshot loaded earlier in the same thread is instead brought forward with
``update_incremental``, which reads only the commits made since (about 0.5 ms), whoever made
them: another process's commits are seen exactly as by a fresh load.

A table deleted and created again at the same path would have a different history under the
same version numbers, which ``update_incremental`` cannot notice. So the cache remembers the
file of the commit it last saw (inode, size, modification time) and loads the table afresh when
that file is gone or is another file.

The returned object is shared by the thread's callers, and any of them brings it forward. So
it is for what is read from it at once (a version, an app transaction, the schema, the file
list, the history), or for a commit made right away (which leaves it at the newest version, as
a reload would). A caller that plans a commit on a snapshot and runs other code before
committing, or that time-travels, loads a ``DeltaTable`` of its own.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from typing import TYPE_CHECKING

from lakehouse.runtime import objectstore
from lakehouse.runtime.objectstore import Location, as_location

if TYPE_CHECKING:
    from deltalake import DeltaTable

# Tables kept per thread: a job touches a handful; a long test or benchmark process touches
# thousands, which must not all stay in memory.
CACHE_SIZE = 64

# A commit file's inode (0 in a bucket), size and modification time (ns).
_Identity = tuple[int, int, int]


class _Cache(threading.local):
    def __init__(self) -> None:
        # root -> (the table, the version it was last handed out at, that commit's file)
        self.tables: OrderedDict[str, tuple[DeltaTable, int, _Identity]] = OrderedDict()


_cache = _Cache()


def commit_file(table_root: Location, version: int) -> Location:
    return table_root / "_delta_log" / f"{version:020d}.json"


def _identity(root: str, version: int) -> _Identity | None:
    """Which file holds the table's commit ``version`` (None: there is none)."""
    commit = commit_file(as_location(root), version)
    if not isinstance(commit, objectstore.ObjectPath):
        try:
            st = os.stat(commit)
        except OSError:
            return None
        return (st.st_ino, st.st_size, st.st_mtime_ns)
    entry = objectstore.stat(commit)
    return None if entry is None else (0, entry.size, entry.mtime_ns)


def latest(path: Location | str) -> DeltaTable:
    """The table's newest snapshot (``deltalake`` errors as a fresh load raises them)."""
    from deltalake import DeltaTable

    root = str(as_location(path))
    tables = _cache.tables
    kept = tables.pop(root, None)
    if kept is not None and _identity(root, kept[1]) != kept[2]:
        kept = None  # another history at this path: the table was made again
    if kept is not None:
        dt = kept[0]  # a commit made through it since has moved it on already
        dt.update_incremental()
    else:
        dt = DeltaTable(root, storage_options=objectstore.storage_options(root))
    version = int(dt.version())
    identity = kept[2] if kept is not None and kept[1] == version else _identity(root, version)
    if identity is None:  # its commit file was cleaned up: nothing to recognise it by later
        return dt
    tables[root] = (dt, version, identity)  # (re-)inserted last: the most recently used
    while len(tables) > CACHE_SIZE:
        tables.popitem(last=False)
    return dt
