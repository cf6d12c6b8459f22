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
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from deltalake import DeltaTable

# Tables kept per thread: a job touches a handful; a long test or benchmark process touches
# thousands, which must not all stay in memory.
CACHE_SIZE = 64

_Identity = tuple[int, int, int]  # a commit file's inode, size and modification time (ns)


class _Cache(threading.local):
    def __init__(self) -> None:
        # root -> (the table, the version it was last handed out at, that commit's file)
        self.tables: OrderedDict[str, tuple[DeltaTable, int, _Identity]] = OrderedDict()


_cache = _Cache()


def _commit_file(root: str, version: int) -> _Identity | None:
    try:
        st = os.stat(os.path.join(root, "_delta_log", f"{version:020d}.json"))
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def latest(path: Path | str) -> DeltaTable:
    """The table's newest snapshot (``deltalake`` errors as a fresh load raises them)."""
    from deltalake import DeltaTable

    root = os.path.abspath(str(path))
    tables = _cache.tables
    entry = tables.pop(root, None)
    if entry is not None and _commit_file(root, entry[1]) == entry[2]:
        # The same history (a commit made through the object since has moved it on already).
        dt = entry[0]
        dt.update_incremental()
    else:
        dt = DeltaTable(root)
    version = int(dt.version())
    identity = _commit_file(root, version)
    if identity is None:  # its commit file was cleaned up: nothing to recognise it by later
        return dt
    tables[root] = (dt, version, identity)  # (re-)inserted last: the most recently used
    while len(tables) > CACHE_SIZE:
        tables.popitem(last=False)
    return dt
