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
