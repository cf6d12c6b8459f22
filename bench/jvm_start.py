"""Job start-up benchmark: a 10K-record micro-batch through the three layer jobs, each a fresh
``spark-submit`` as the DAG's operator runs it, with the driver JVM options the platform sets
(the C1 compiler only, and Spark's class archive) against Spark's default JVM.

    python bench/jvm_start.py [--records 10000] [--repeats 3] [--workdir DIR]

Setup as in bench/airflow_trigger.py: the same topic and contract (JSON values, 3 partitions,
two gold tables, a silver ``warn`` and a gold ``fail`` expectation), a first batch through
``lakehouse run`` so every measured batch is an incremental micro-batch. Each round writes a
fresh batch of ``--records`` records to landing per variant and runs bronze, silver and gold
with ``spark-submit`` (master ``local[2]``), one after another, with
``spark.driver.extraJavaOptions`` set to the variant's options:

* ``platform``: what `lakehouse.spark.driver_java_options` gives a layer job on this machine
  (``-XX:TieredStopAtLevel=1`` and, if `make` wrote it, ``-XX:SharedArchiveFile=<archive>``);
* ``c2+archive``: the archive with the JIT's default tiers (``LAKEHOUSE_JVM_COMPILER=c2``);
* ``c1``: the C1 compiler only, no archive;
* peer, ``spark default``: no options at all.

Rounds alternate the order of the variants. Figures: each variant's p50 wall time of the three
jobs against the peer's, and the per-layer p50s in the JSON. Without an archive (``lakehouse
spark-archive`` has not run) the ``platform`` variant equals ``c1`` and the benchmark says so.
bench/end_to_end.py measures what the options do to a long run (1M records).
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "e2e"))


from airflow_trigger import (
    LAYER_TASKS,
    _p50,
    _produce,
    _setup,
    batch_command_line,
    run_jobs,
)
from common import Figure, report
from lakehouse.spark import class_archive, driver_java_options, submit_conf

PEER = "spark default"


def variants() -> dict[str, str]:
    archive = class_archive()
    options = {
        "platform": driver_java_options(short_lived=True),
        "c1": "-XX:TieredStopAtLevel=1",
        PEER: "",
    }
    if archive.is_file():
        options["c2+archive"] = f"-XX:SharedArchiveFile={archive}"
    return options


def run_batch(settings: Any, options: str, logs: Path, name: str) -> dict[str, float]:
    """The three layer jobs with ``options`` as the driver JVM's options (the operator's
    settings otherwise): the seconds each took, and their total."""
    conf = submit_conf(jvm_options=False)
    if options:
        conf["spark.driver.extraJavaOptions"] = options
    times = run_jobs(settings, logs, name.replace(" ", "_"), conf)
    times["total"] = sum(times.values())
    return times


def main() -> None:
    args, work, logs = batch_command_line(__doc__, "batches per variant", "bench-jvm-start-")
    options = variants()
    if "c2+archive" not in options:
        print(f"(no class archive at {class_archive()}: run `lakehouse spark-archive` first)")
    try:
        settings = _setup(work, args.records)
        load_before = os.getloadavg()
        runs: dict[str, list[dict[str, float]]] = {name: [] for name in options}
        seed = 1
        names = list(options)
        for round_ in range(args.repeats):
            order = names[round_ % len(names) :] + names[: round_ % len(names)]
            for name in order:
                _produce(settings, args.records, seed=seed)
                seed += 1
                runs[name].append(run_batch(settings, options[name], logs, name))
                r = runs[name][-1]
                per_layer = ", ".join(f"{k} {r[k]:.1f}" for k in LAYER_TASKS)
                print(f"(round {round_ + 1} {name}: {r['total']:.1f} s; {per_layer})", flush=True)
        load_after = os.getloadavg()
        p50 = {
            name: {key: _p50([r[key] for r in rs]) for key in (*LAYER_TASKS, "total")}
            for name, rs in runs.items()
        }
        figures = [
            Figure(
                f"jvm_start.{name.replace('+', '_')}.three_jobs.p50",
                p50[name]["total"],
                "s",
                PEER,
                p50[PEER]["total"],
                higher_is_better=False,
            )
            for name in options
            if name != PEER
        ]
        context = {
            "records": args.records,
            "repeats": args.repeats,
            "cores": os.cpu_count(),
            "options": options,
            "p50_s": {n: {k: round(v, 2) for k, v in d.items()} for n, d in p50.items()},
            "runs": runs,
            "load_average_1_5_15": {
                "before": [round(x, 2) for x in load_before],
                "after": [round(x, 2) for x in load_after],
            },
        }
        report(figures, "jvm_start", context)
    finally:
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
