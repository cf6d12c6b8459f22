"""Reading a table's commit files directly (local or in a bucket), to check what the storage
layer committed."""

from __future__ import annotations

import json
from pathlib import PurePosixPath

from lakehouse.runtime import objectstore
from lakehouse.runtime.objectstore import Location


def _commits(table: Location) -> dict[int, Location]:
    return {
        int(e.name[:20]): e.path
        for e in objectstore.listdir(table / "_delta_log")
        if len(e.name) == 25 and e.name.endswith(".json") and e.name[:20].isdigit()
    }


def _actions(commit: Location) -> list[dict[str, object]]:
    lines = objectstore.read_bytes(commit).decode().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def added_files(table: Location, version: int | None = None) -> set[str]:
    """Names of the data files added by one commit, or by any commit when ``version`` is None."""
    names: set[str] = set()
    for v, commit in _commits(table).items():
        if version is not None and v != version:
            continue
        for action in _actions(commit):
            add = action.get("add")
            if isinstance(add, dict):
                names.add(PurePosixPath(str(add["path"])).name)
    return names


def operations(table: Location, start: int = 0) -> dict[int, str]:
    """The operation of each commit from ``start`` on (``WRITE``, ``SET TBLPROPERTIES``, ...)."""
    found = {}
    for version, commit in _commits(table).items():
        if version < start:
            continue
        for action in _actions(commit):
            info = action.get("commitInfo")
            if isinstance(info, dict):
                found[version] = str(info["operation"])
    return dict(sorted(found.items()))


def checkpoints(table: Location) -> list[int]:
    """The versions the log holds a checkpoint of."""
    return sorted(
        {
            int(e.name[:20])
            for e in objectstore.listdir(table / "_delta_log")
            if ".checkpoint." in e.name and e.name.endswith(".parquet")
        }
    )
