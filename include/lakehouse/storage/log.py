"""Reading a Delta table's commit log directly: the files each version added or removed.

delta-rs gives snapshots; the change data feed needs per-version file actions, which this module
reads from ``_delta_log/<version>.json`` so Spark can then read the files themselves, spread over
its tasks. The rules are the Delta protocol's: a version with ``cdc`` files is described by them
alone; otherwise its data-changing ``add`` files are inserts and its ``remove`` files deletes;
actions with ``dataChange=false`` (compaction) change nothing.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from lakehouse.errors import LakehouseError
from lakehouse.storage.files import HIVE_NULL, fs_path

ChangeKind = Literal["cdc", "insert", "delete"]


class LogUnavailableError(LakehouseError):
    """A version's commit file is gone (log cleanup) or the table has no such version."""


@dataclass(frozen=True)
class ChangeFile:
    path: Path
    kind: ChangeKind
    version: int
    timestamp_ms: int
    partition_values: dict[str, str | None]


def commit_file(table_root: Path, version: int) -> Path:
    return table_root / "_delta_log" / f"{version:020d}.json"


def _partition_values_from_path(relative: str) -> dict[str, str | None]:
    values: dict[str, str | None] = {}
    for part in relative.split("/")[:-1]:
        if "=" in part:
            k, v = part.split("=", 1)
            values[k] = None if v == HIVE_NULL else v
    return values


def version_changes(table_root: Path, version: int) -> list[ChangeFile]:
    """The change-feed files of one version."""
    path = commit_file(table_root, version)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise LogUnavailableError(
            f"{table_root}: the commit of version {version} is not in the log "
            "(cleaned up, or not written yet); the change feed cannot be read from there"
        ) from None
    timestamp = int(path.stat().st_mtime * 1000)
    cdc: list[tuple[str, dict[str, str | None]]] = []
    adds: list[tuple[str, dict[str, str | None]]] = []
    removes: list[tuple[str, dict[str, str | None]]] = []
    for line in lines:
        if not line.strip():
            continue
        action = json.loads(line)
        if "commitInfo" in action and "timestamp" in action["commitInfo"]:
            timestamp = int(action["commitInfo"]["timestamp"])
        for key, bucket in (("cdc", cdc), ("add", adds), ("remove", removes)):
            if key in action:
                a = action[key]
                if key != "cdc" and not a.get("dataChange", True):
                    continue
                values = a.get("partitionValues")
                if values is None:
                    values = _partition_values_from_path(a["path"])
                bucket.append((a["path"], values))
    if cdc:
        chosen: list[tuple[ChangeKind, str, dict[str, str | None]]] = [
            ("cdc", p, v) for p, v in cdc
        ]
    else:
        chosen = [("insert", p, v) for p, v in adds] + [("delete", p, v) for p, v in removes]
    return [
        ChangeFile(fs_path(table_root, p), kind, version, timestamp, dict(v))
        for kind, p, v in chosen
    ]


def changes_between(table_root: Path, start: int, end: int) -> list[ChangeFile]:
    """The change-feed files of versions ``start..end`` inclusive."""
    out: list[ChangeFile] = []
    for v in range(start, end + 1):
        out.extend(version_changes(table_root, v))
    return out
