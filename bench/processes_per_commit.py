"""Processes the JVM starts per Delta commit on local files, with the platform's settings and
with Hadoop's and Delta's defaults (the peer), in the same run.

Hadoop's local file system starts a process for some of its calls when no native Hadoop library
is on the class path (`chmod` for every file it creates, `readlink` for each rename through its
FileContext); the platform's settings (``lakehouse.runtime.spark.LOCAL_FILES_CONF``) are meant to
start none. Each count runs ``bench/delta_floor.py``'s workload (two Delta tables created, then
per batch an append and a MERGE, each recording its position, then a read) in a process of its
own under ``strace -f -e trace=execve``, and counts what Java started: every process it starts
runs Java's ``jspawnhelper`` first. Counted once with one batch and once with ``--batches`` more;
the difference over the commits between them is the figure, so the JVM's start and stop (which
start processes of their own: Spark copies each jar with a `chmod`) and the tables' creation do
not count.

    python bench/processes_per_commit.py [--batches 3]

Needs strace (Debian: apt-get install strace).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from common import Figure, report

HERE = Path(__file__).resolve().parent
SPAWN_HELPER = "jspawnhelper"


def started(batches: int, *, peer: bool, folder: Path) -> int:
    """Processes Java started in a run of the workload with ``batches`` batches (two commits
    each), with the platform's settings or (``peer``) without its settings for local files."""
    trace = folder / f"trace-{batches}-{'peer' if peer else 'ours'}"
    command = [
        "strace", "-f", "-qq", "-o", str(trace), "-e", "trace=execve", "-e", "status=successful",
        sys.executable, str(Path(__file__).resolve()), "--worker", str(batches),
    ]  # fmt: skip
    if peer:
        command.append("--peer")
    done = subprocess.run(command, capture_output=True, text=True, timeout=900, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"the workload failed ({done.returncode}): {done.stderr[-3000:]}")
    with trace.open() as lines:
        return sum(f'/{SPAWN_HELPER}"' in line for line in lines)


def per_commit(batches: int, *, peer: bool, folder: Path) -> float:
    """Processes Java starts per commit: the difference between a run with ``1 + batches``
    batches and one with one, over the ``2 * batches`` commits between them."""
    more = started(1 + batches, peer=peer, folder=folder)
    return (more - started(1, peer=peer, folder=folder)) / (2 * batches)


def _worker(batches: int, peer: bool) -> None:
    sys.path.insert(0, str(HERE))
    from delta_floor import measure
    from lakehouse.runtime import spark

    if peer:
        spark.LOCAL_FILES_CONF = {}
    root = Path(tempfile.mkdtemp(prefix="bench-processes-"))
    try:
        measure(root, 100, batches)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=3, help="an append and a MERGE each")
    parser.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--peer", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker is not None:
        _worker(args.worker, args.peer)
        return
    if args.batches < 1:
        parser.error("--batches must be positive")
    if shutil.which("strace") is None:
        sys.exit("strace not found: apt-get install strace")
    folder = Path(tempfile.mkdtemp(prefix="bench-processes-traces-"))
    try:
        ours = per_commit(args.batches, peer=False, folder=folder)
        theirs = per_commit(args.batches, peer=True, folder=folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    report(
        [
            Figure(
                "processes started per commit (local files)",
                ours,
                "processes",
                "Hadoop's and Delta's defaults",
                theirs,
                higher_is_better=False,
            )
        ],
        "processes_per_commit",
        {"batches": args.batches, "cpus": os.cpu_count()},
    )


if __name__ == "__main__":
    main()
