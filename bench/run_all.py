"""Run every benchmark of bench/ and gather their figures: ``make bench``.

    python bench/run_all.py [--size small|large] [--only NAME ...]

``small`` (the default) is sized for about ten minutes; it took 17 on the shared 2-core machine
the README names, under load, with the quality benchmark one batch longer than now, before the
object-storage benchmark (``end_to_end_s3``, about 7 minutes) and the run against the
commit before the small-batch work (``before_after``, 18 minutes) joined. ``large``
runs the sizes the goals are stated at (10M records; 20 cold micro-batches) and takes well over
an hour. Each benchmark runs as its own command, one after the other (they would
otherwise compete for the same cores), prints its own lines as it goes and keeps them in
``bench/results/<name>.json``. At the end every figure is printed again, one line each
(``name value unit peer=value (peer) ratio=r``; ratio > 1: ours is better), and written with
the machine, the versions and the commit to ``bench/results/latest.json``. A benchmark that
fails is reported and the others still run; the exit status is then 1.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import RESULTS, Figure

HERE = Path(__file__).resolve().parent

# name -> (result files it writes, arguments per size)
BENCHES: dict[str, tuple[tuple[str, ...], dict[str, list[list[str]]]]] = {
    "bronze": (
        ("bronze",),
        {"small": [["--records", "1000000"]], "large": [["--records", "10000000"]]},
    ),
    "kafka_bronze": (
        ("kafka_bronze",),
        {"small": [["--records", "1000000"]], "large": [["--records", "10000000"]]},
    ),
    "silver": (
        ("silver",),
        {
            "small": [["--records", "1000000", "--formats", "json"]],
            "large": [["--records", "10000000"]],
        },
    ),
    "gold": (
        ("gold",),
        {
            "small": [["--keys", "100000", "--batches", "20", "--events", "1000000"]],
            "large": [["--keys", "1000000", "--batches", "20", "--events", "10000000"]],
        },
    ),
    "quality": (
        ("quality",),
        {"small": [["--batches", "4", "--warmup", "3"]], "large": [[]]},
    ),
    "end_to_end": (
        ("end_to_end", "end_to_end_10M"),
        {
            "small": [["--records", "1000000", "--batches", "20", "--cold", "3"]],
            "large": [
                ["--records", "1000000", "--skip-latency"],
                ["--records", "10000000", "--batches", "20", "--cold", "20"],
            ],
        },
    ),
    # 1M records at both sizes: moto keeps every object in memory, and the landing producer reads
    # each partition's whole last segment back from the bucket (190 s for 1M records here).
    "end_to_end_s3": (
        ("end_to_end_s3",),
        {"small": [["--records", "1000000"]], "large": [["--records", "1000000"]]},
    ),
    # Against the platform before the small-batch work: a worktree of that commit (both sides
    # run their own Spark server and Airflow); large also times `make test` on clean clones.
    "before_after": (
        ("before_after",),
        {"small": [[]], "large": [["--batches", "5", "--trigger-repeats", "3", "--make-test"]]},
    ),
    # What one warm batch of the shipped topic makes Spark do (its jobs, per layer and table).
    "batch_jobs": (
        ("batch_jobs",),
        {"small": [[]], "large": [["--records", "10000"]]},
    ),
    # The first batch after a server start, with the warm-up and without (about 12 minutes).
    "first_batch": (
        ("first_batch",),
        {"small": [[]], "large": [["--records", "10000"]]},
    ),
    "airflow_trigger": (
        ("airflow_trigger",),
        {"small": [["--repeats", "1"]], "large": [["--repeats", "5"]]},
    ),
}


def machine() -> dict[str, Any]:
    cpu = "unknown"
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    mem_gib = None
    meminfo = Path("/proc/meminfo")
    if meminfo.exists():
        kib = int(meminfo.read_text().split("MemTotal:", 1)[1].split()[0])
        mem_gib = round(kib / 1024 / 1024, 1)
    java = subprocess.run(["java", "-version"], capture_output=True, text=True, check=False)
    versions: dict[str, str | None] = {}
    for dist in (
        "pyspark",
        "deltalake",
        "polars",
        "pyarrow",
        "great_expectations",
        "apache-airflow",
        "confluent-kafka",
    ):
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            versions[dist] = None
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": mem_gib,
        "os": platform.platform(),
        "python": platform.python_version(),
        "java": (java.stderr.splitlines() or ["?"])[0],
        "versions": versions,
    }


def commit() -> str | None:
    proc = subprocess.run(
        ["git", "-C", str(HERE), "describe", "--always", "--dirty"],
        capture_output=True,
        text=True,
        check=False,
    )
    return proc.stdout.strip() or None


def run_bench(name: str, argv: list[str]) -> tuple[float, int]:
    cmd = [sys.executable, str(HERE / f"{name}.py"), *argv]
    print(f"\n=== {name}: {' '.join(cmd[1:])}", flush=True)
    started = time.perf_counter()
    rc = subprocess.run(cmd, check=False).returncode
    return time.perf_counter() - started, rc


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size", choices=("small", "large"), default="small")
    parser.add_argument("--only", nargs="+", choices=sorted(BENCHES), help="run these only")
    args = parser.parse_args()

    started_at = datetime.now(UTC).isoformat(timespec="seconds")
    load_before = os.getloadavg()
    runs: dict[str, Any] = {}
    figures: list[dict[str, Any]] = []
    failed = []
    for name in args.only or list(BENCHES):
        outputs, sizes = BENCHES[name]
        for argv in sizes[args.size]:
            begun = time.time()
            seconds, rc = run_bench(name, argv)
            label = " ".join([name, *argv])
            runs[label] = {"seconds": round(seconds, 1), "exit": rc}
            if rc != 0:
                failed.append(label)
                continue
            fresh = [
                RESULTS / f"{out}.json"
                for out in outputs
                if (RESULTS / f"{out}.json").exists()
                and (RESULTS / f"{out}.json").stat().st_mtime >= begun
            ]
            if not fresh:
                failed.append(label)
                runs[label]["error"] = "wrote no results"
            for path in fresh:
                result = json.loads(path.read_text())
                runs[label]["context"] = result["context"]
                for f in result["figures"]:
                    figures.append(f | {"bench": name})

    print("\n=== figures (ratio > 1: ours is better than the peer)")
    for f in figures:
        fig = Figure(
            f["name"], f["value"], f["unit"], f["peer_name"], f["peer_value"], f["higher_is_better"]
        )
        print(fig.line())
    payload = {
        "started": started_at,
        "size": args.size,
        "commit": commit(),
        "machine": machine(),
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "runs": runs,
        "figures": figures,
        "failed": failed,
    }
    out = RESULTS / "latest.json"
    out.write_text(json.dumps(payload, indent=2))
    total = sum(r["seconds"] for r in runs.values())
    print(f"(written to {out}; {total / 60:.1f} min in all)")
    if failed:
        print(f"failed: {', '.join(failed)}")
        sys.exit(1)


if __name__ == "__main__":
    main()
