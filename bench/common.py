"""Shared helpers of the benchmarks: figure lines, peak memory, running a worker in a process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


@dataclass
class Figure:
    """One measured figure with its peer's, printed as ``name value unit peer=value ratio=r``.

    ``higher_is_better`` decides the ratio's direction so that ratio > 1 always means "ours is
    better than the peer".
    """

    name: str
    value: float
    unit: str
    peer_name: str
    peer_value: float
    higher_is_better: bool = True

    @property
    def ratio(self) -> float:
        if self.higher_is_better:
            return self.value / self.peer_value if self.peer_value else float("inf")
        return self.peer_value / self.value if self.value else float("inf")

    def line(self) -> str:
        return (
            f"{self.name} {self.value:.6g} {self.unit} "
            f"peer={self.peer_value:.6g} ({self.peer_name}) ratio={self.ratio:.2f}"
        )


def save(figures: list[Figure], name: str, context: dict[str, Any]) -> Path:
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"{name}.json"
    payload = {"context": context, "figures": [asdict(f) | {"ratio": f.ratio} for f in figures]}
    out.write_text(json.dumps(payload, indent=2))
    return out


def report(figures: list[Figure], name: str, context: dict[str, Any]) -> None:
    """Print one line per figure and keep them in ``bench/results/<name>.json``."""
    for f in figures:
        print(f.line())
    print(f"(written to {save(figures, name, context)})")


def _children(pid: int) -> list[int]:
    kids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            kids.append(int(entry.name))
    return kids


def tree_peak_rss_mib(pid: int | None = None) -> float:
    """Sum of the peak resident sets (VmHWM) of a process and its living descendants, in MiB.

    For a PySpark driver that is the Python process plus its JVM (and any Python workers alive
    at the time of the call).
    """
    root = pid or os.getpid()
    total_kib = 0
    todo = [root]
    while todo:
        p = todo.pop()
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    total_kib += int(line.split()[1])
        except OSError:
            continue
        todo.extend(_children(p))
    return total_kib / 1024


def pin_cores(n: int) -> None:
    """Keep this process, and the processes it starts, on ``n`` of the CPUs it may use: engines
    that size their thread pools by the CPUs they see (DuckDB, polars, Spark's JVM) then use
    ``n``, as per-core figures assume. Nothing changes on a machine with ``n`` CPUs or fewer."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) > n:
        os.sched_setaffinity(0, cpus[:n])


def run_worker(
    script: Path, *args: str, timeout: int = 3600, env: dict[str, str] | None = None
) -> dict[str, Any]:
    """Run ``script --worker ...`` in a fresh interpreter (with ``env`` as its environment if
    given, else this one's); it prints one JSON line last."""
    proc = subprocess.run(
        [sys.executable, str(script), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{script.name} {' '.join(args)} failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def lakehouse_command(env: dict[str, str], log: Path, *args: str, who: str = "") -> float:
    """Run ``lakehouse ARGS`` in a fresh interpreter with ``env``, its output appended to ``log``;
    its wall time in seconds. A failure raises, naming the command (and ``who`` ran it)."""
    started = time.perf_counter()
    with log.open("a") as out:
        out.write(f"\n$ lakehouse {' '.join(args)}\n")
        out.flush()
        proc = subprocess.run(
            [sys.executable, "-m", "lakehouse.cli", *args],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            check=False,
        )
    took = time.perf_counter() - started
    if proc.returncode != 0:
        raise RuntimeError(
            f"{who}{': ' if who else ''}lakehouse {' '.join(args)} failed: see {log}"
        )
    return took
