"""Reading a table's commit files directly, to check what the storage layer committed."""

from __future__ import annotations

import json
from pathlib import Path


def added_files(table: Path, version: int | None = None) -> set[str]:
    """Names of the data files added by one commit, or by any commit when ``version`` is None."""
    pattern = "*.json" if version is None else f"{version:020d}.json"
    names: set[str] = set()
    for commit in (table / "_delta_log").glob(pattern):
        for line in commit.read_text().splitlines():
            action = json.loads(line)
            if "add" in action:
                names.add(Path(action["add"]["path"]).name)
    return names


def operations(table: Path, start: int = 0) -> dict[int, str]:
    """The operation of each commit from ``start`` on (``WRITE``, ``SET TBLPROPERTIES``, ...)."""
    found = {}
    for commit in (table / "_delta_log").glob("*.json"):
        version = int(commit.name.split(".")[0])
        if version < start:
            continue
        for line in commit.read_text().splitlines():
            action = json.loads(line)
            if "commitInfo" in action:
                found[version] = str(action["commitInfo"]["operation"])
    return dict(sorted(found.items()))


def checkpoints(table: Path) -> list[int]:
    """The versions the log holds a checkpoint of."""
    return sorted({int(p.name[:20]) for p in (table / "_delta_log").glob("*.checkpoint.*parquet")})
