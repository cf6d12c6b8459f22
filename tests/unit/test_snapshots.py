"""The shared newest snapshot of a Delta table (lakehouse.storage.snapshots), without Spark."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from lakehouse.errors import TableNotFoundError
from lakehouse.storage import snapshots
from lakehouse.storage.store import commit_times, read_arrow, table_version

SCHEMA = pa.schema([("k", pa.string()), ("n", pa.int64())])


def _rows(*pairs: tuple[str, int]) -> pa.Table:
    return pa.Table.from_pylist([{"k": k, "n": n} for k, n in pairs], schema=SCHEMA)


def _values(dt: DeltaTable) -> list[tuple[str, int]]:
    table = dt.to_pyarrow_table()
    return sorted(zip(table["k"].to_pylist(), table["n"].to_pylist(), strict=True))


@pytest.fixture(autouse=True)
def _empty_cache() -> None:
    snapshots._cache.tables.clear()


def test_brought_forward_to_commits_made_elsewhere(tmp_path: Path) -> None:
    path = tmp_path / "t"
    write_deltalake(str(path), _rows(("a", 1)))
    first = snapshots.latest(path)
    assert first.version() == 0
    write_deltalake(str(path), _rows(("b", 2)), mode="append")  # through another object
    code = (
        "import sys, pyarrow as pa; from deltalake import write_deltalake; "
        "write_deltalake(sys.argv[1], pa.table({'k': ['c'], 'n': pa.array([3], pa.int64())}), "
        "mode='append')"
    )
    subprocess.run([sys.executable, "-c", code, str(path)], check=True)  # another process
    again = snapshots.latest(path)
    assert again is first  # the same object, brought forward
    assert again.version() == 2
    assert _values(again) == [("a", 1), ("b", 2), ("c", 3)]


def test_a_commit_through_it_keeps_it(tmp_path: Path) -> None:
    path = tmp_path / "t"
    write_deltalake(str(path), _rows(("a", 1)))
    dt = snapshots.latest(path)
    write_deltalake(dt, _rows(("b", 2)), mode="append")
    assert dt.version() == 1
    assert snapshots.latest(path) is dt
    assert _values(snapshots.latest(path)) == [("a", 1), ("b", 2)]


def test_a_table_made_again_at_the_same_path_is_loaded_afresh(tmp_path: Path) -> None:
    path = tmp_path / "t"
    write_deltalake(str(path), _rows(("a", 1)))
    write_deltalake(str(path), _rows(("b", 2)), mode="append")
    old = snapshots.latest(path)
    assert old.version() == 1
    # Same path, same number of commits, another history: update_incremental alone would keep
    # the old snapshot (it looks for version 2 only).
    shutil.rmtree(path)
    write_deltalake(str(path), _rows(("x", 10)))
    write_deltalake(str(path), _rows(("y", 20)), mode="append")
    new = snapshots.latest(path)
    assert new is not old
    assert new.version() == 1
    assert _values(new) == [("x", 10), ("y", 20)]
    # Shorter than before: the old commit file is gone.
    shutil.rmtree(path)
    write_deltalake(str(path), _rows(("z", 7)))
    assert _values(snapshots.latest(path)) == [("z", 7)]


def test_a_removed_table_is_reported_missing(tmp_path: Path) -> None:
    path = tmp_path / "t"
    write_deltalake(str(path), _rows(("a", 1)))
    assert table_version(path) == 0
    shutil.rmtree(path)
    (path / "_delta_log").mkdir(parents=True)  # the store's existence check passes
    with pytest.raises(TableNotFoundError):
        read_arrow(path)


def test_without_its_commit_file_a_snapshot_is_not_kept(tmp_path: Path) -> None:
    path = tmp_path / "t"
    write_deltalake(str(path), _rows(("a", 1)))
    write_deltalake(str(path), _rows(("b", 2)), mode="append")
    DeltaTable(str(path)).create_checkpoint()
    (path / "_delta_log" / f"{1:020d}.json").unlink()  # as a log cleanup may do
    first = snapshots.latest(path)
    assert first.version() == 1
    assert os.path.abspath(path) not in snapshots._cache.tables
    assert snapshots.latest(path) is not first


def test_time_travel_does_not_move_the_shared_snapshot(tmp_path: Path) -> None:
    path = tmp_path / "t"
    write_deltalake(str(path), _rows(("a", 1)))
    time.sleep(0.01)
    write_deltalake(str(path), _rows(("b", 2)), mode="append")
    shared = snapshots.latest(path)
    as_of = datetime.fromtimestamp(commit_times(path)[0] / 1000, UTC)  # the first commit's time
    assert read_arrow(path, as_of=as_of).num_rows == 1
    assert read_arrow(path, version=0).num_rows == 1
    assert shared.version() == 1
    assert table_version(path) == 1


def test_the_oldest_table_is_let_go(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(snapshots, "CACHE_SIZE", 3)
    paths = [tmp_path / f"t{i}" for i in range(4)]
    for p in paths:
        write_deltalake(str(p), _rows(("a", 1)))
    kept = {p: snapshots.latest(p) for p in paths[:3]}
    snapshots.latest(paths[0])  # used again: now the newest
    snapshots.latest(paths[3])
    assert list(snapshots._cache.tables) == [
        os.path.abspath(p) for p in (paths[2], paths[0], paths[3])
    ]
    assert snapshots.latest(paths[0]) is kept[paths[0]]
    assert snapshots.latest(paths[1]) is not kept[paths[1]]


def test_each_thread_has_its_own(tmp_path: Path) -> None:
    path = tmp_path / "t"
    write_deltalake(str(path), _rows(("a", 1)))
    mine = snapshots.latest(path)
    theirs: list[DeltaTable] = []
    thread = threading.Thread(target=lambda: theirs.append(snapshots.latest(path)))
    thread.start()
    thread.join()
    assert theirs[0] is not mine
    assert theirs[0].version() == mine.version() == 0
