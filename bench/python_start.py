"""Python start-up benchmark: what starting Spark's Python processes costs a job's first Python
work, with pyspark's zip compiled for this interpreter (`lakehouse spark-archive`, which make
runs) against the zip as pyspark ships it (sources only: every process compiles them again).

    python bench/python_start.py [--repeats 5]

Spark puts ``pyspark.zip`` first on the path of every Python process it starts, and it starts
one daemon for tasks (``mapInArrow``: bronze's segment parsing). Each measurement is a fresh
driver process (``local[2]``, the platform's settings) that times the **first task**: a 10-row
``mapInArrow`` (Spark starts the task daemon).

Rounds alternate the two forms of the zip. For the shipped form the bench puts a copy of the
installed zip without its bytecode in its place, and the compiled zip back when the rounds are
done (on failure too). The sources in both are byte for byte the same.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import Figure, report, run_worker

PEER = "pyspark.zip as shipped"


def worker(out: Path) -> dict[str, float]:
    import pyarrow as pa  # noqa: F401  (imported by the job anyway; not part of the figure)

    from lakehouse.spark import get_session

    spark = get_session("local[2]", app_name="bench-python-start")

    def same(batches):  # type: ignore[no-untyped-def]
        yield from batches

    started = time.perf_counter()
    spark.range(10).mapInArrow(same, "id long").collect()
    first_task = time.perf_counter() - started
    spark.stop()
    return {"first_task": first_task}


def _sources_only(compiled: Path, target: Path) -> None:
    with zipfile.ZipFile(compiled) as zin, zipfile.ZipFile(target, "w") as zout:
        for info in zin.infolist():
            if not info.filename.endswith(".pyc"):
                zout.writestr(info, zin.read(info))


def _install(source: Path, installed: Path) -> None:
    swap = installed.with_name(installed.name + ".bench")
    shutil.copyfile(source, swap)
    swap.replace(installed)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker)))
        return

    from lakehouse.spark import compile_python_zip, python_zips

    installed = next(z for z in python_zips() if z.name == "pyspark.zip")
    if compile_python_zip(installed):
        print(f"(the installed zip had no bytecode: compiled it, as make does: {installed})")
    work = Path(tempfile.mkdtemp(prefix="bench-python-start-"))
    compiled, shipped = work / "compiled.zip", work / "shipped.zip"
    shutil.copyfile(installed, compiled)
    _sources_only(compiled, shipped)
    runs: dict[str, list[dict[str, float]]] = {"compiled": [], "shipped": []}
    try:
        for round_ in range(args.repeats):
            for name in ("compiled", "shipped") if round_ % 2 == 0 else ("shipped", "compiled"):
                _install(compiled if name == "compiled" else shipped, installed)
                out = work / f"table-{name}-{round_}"
                runs[name].append(run_worker(Path(__file__), "--worker", str(out)))
                r = runs[name][-1]
                print(
                    f"(round {round_ + 1} {name}: first task {r['first_task']:.2f} s)", flush=True
                )
    finally:
        _install(compiled, installed)
        shutil.rmtree(work, ignore_errors=True)
    p50 = {
        name: {k: statistics.median(r[k] for r in rs) for k in ("first_task",)}
        for name, rs in runs.items()
    }
    figures = [
        Figure(
            f"python_start.{key}.p50",
            p50["compiled"][key],
            "s",
            PEER,
            p50["shipped"][key],
            higher_is_better=False,
        )
        for key in ("first_task",)
    ]
    report(figures, "python_start", {"repeats": args.repeats, "runs": runs})


if __name__ == "__main__":
    main()
