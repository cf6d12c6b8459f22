"""What one warm micro-batch of the shipped topic makes Spark do, per layer and per gold table:
Spark jobs, SQL executions, time in jobs and Delta commits, against a plain delta-spark MERGE of
the same number of rows on the same server.

    python bench/batch_jobs.py [--records 20] [--warmup 1] [--adaptive auto|on|off] [--workdir DIR]

A home of its own with the shipped contracts and samples, and a Spark server of its own started
with ``LAKEHOUSE_SPARK_EVENT_LOG`` (Spark's event log) and without its background warm-up, then
``lakehouse run`` of both topics (it makes every table; not counted) and ``--warmup`` batches of
``user-locations`` (not counted). ``--adaptive`` is ``LAKEHOUSE_SPARK_ADAPTIVE`` for the server
and the runs (``auto``, the shipped default: small batches are planned without adaptive
execution).
The counted batch is ``lakehouse sample --topic user-locations --records N`` then ``lakehouse
run --topic user-locations``, as a user runs it: bronze, silver and the topic's ten gold tables.
Each job carries the tag of its layer or gold table (``lakehouse:gold:<table>``); jobs with no
tag are the run's own (the ledger, lag, the schema registry). Commits are the versions each
table's log gained.

**Peer**: what a Spark user writes for one table, on the same warm server: read N rows of the
silver table and ``MERGE INTO`` a scratch Delta table (the latest value per key) in one
statement, with no gate and no position; its second MERGE is counted (the first meets a table
just made). The ratio is the peer's jobs over the median gold
table's (> 1: ours is leaner).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import Figure, lakehouse_command, report

REPO = Path(__file__).resolve().parents[1]
TOPIC = "user-locations"

PEER = """
import json, sys
from lakehouse.runtime import server
from lakehouse.runtime.config import Settings
from lakehouse.runtime.spark import tagged
settings = Settings.from_env()
spark = server.connect(settings)
silver, scratch = sys.argv[1], sys.argv[2]
spark.sql(
    f"CREATE TABLE IF NOT EXISTS delta.`{scratch}` (username STRING, location STRING) USING delta"
)


def merge():
    rows = spark.read.format("delta").load(silver).limit(%d)
    rows.select("username", "location").dropDuplicates(["username"]).createOrReplaceTempView("s")
    spark.sql(f"MERGE INTO delta.`{scratch}` t USING s ON t.username = s.username "
              "WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *")


merge()  # the first, on a table just made (not counted)
with tagged(spark, "peer", "merge"):
    merge()
"""


def lakehouse(env: dict[str, str], log: Path, *args: str) -> float:
    return lakehouse_command(env, log, *args)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--adaptive", choices=("auto", "on", "off"), default="auto")
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args()

    from lakehouse.runtime import eventlog
    from lakehouse.runtime.process import free_port

    work = args.workdir or Path(tempfile.mkdtemp(prefix="batch-jobs-"))
    work.mkdir(parents=True, exist_ok=True)
    events, home, log = work / "events", work / "home", work / "run.log"
    base = {k: v for k, v in os.environ.items() if not k.startswith(("LAKEHOUSE_", "AIRFLOW"))}
    env = base | {
        "PYTHONPATH": str(REPO / "include"),
        "LAKEHOUSE_HOME": str(home),
        "LAKEHOUSE_CONTRACTS": str(REPO / "contracts"),
        "LAKEHOUSE_SPARK_PORT": str(free_port()),
        "LAKEHOUSE_SPARK_EVENT_LOG": str(events),
        # The server's own warm-up (its scratch tables carry the same job tags) would run in
        # the background beside the counted batch; the warm-up batches below warm it instead.
        "LAKEHOUSE_SPARK_WARMUP": "off",
        "LAKEHOUSE_SPARK_ADAPTIVE": args.adaptive,
    }
    print(f"work folder {work}; commands in {log}", flush=True)
    try:
        lakehouse(env, log, "sample")
        lakehouse(env, log, "spark", "start")
        lakehouse(env, log, "run")
        for n in range(args.warmup):
            lakehouse(
                env,
                log,
                "sample",
                "--topic",
                TOPIC,
                "--records",
                str(args.records),
                "--seed",
                str(100 + n),
            )
            lakehouse(env, log, "run", "--topic", TOPIC)
        lakehouse(
            env, log, "sample", "--topic", TOPIC, "--records", str(args.records), "--seed", "1"
        )
        since, before = eventlog.mark(events), eventlog.table_versions(home)
        took = lakehouse(env, log, "run", "--topic", TOPIC)
        used = eventlog.usage(events, since)
        made = eventlog.commits(before, eventlog.table_versions(home))
        since = eventlog.mark(events)
        peer = subprocess.run(
            [
                sys.executable,
                "-c",
                PEER % args.records,
                str(home / "tables" / "silver" / "user_locations"),
                str(work / "peer"),
            ],
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        if peer.returncode != 0:
            raise RuntimeError(f"the peer failed: {peer.stderr[-2000:]}")
        peer_jobs = eventlog.usage(events, since)["lakehouse:peer:merge"].jobs
    finally:
        subprocess.run(
            [sys.executable, "-m", "lakehouse.cli", "spark", "stop"],
            env=env,
            capture_output=True,
            check=False,
        )

    print(f"\n{'what':46s} {'jobs':>5s} {'SQL':>5s} {'in jobs (s)':>12s} {'commits':>8s}")
    for tag in sorted(used, key=lambda t: (t == eventlog.UNTAGGED, t)):
        u = used[tag]
        name = tag.split(":", 1)[-1]
        layer, _, table = name.partition(":")
        folder = {"bronze": "bronze/user-locations", "silver": "silver/user_locations"}.get(
            layer, f"gold/{table}"
        )
        made_here = made.get(f"tables/{folder}", 0) if tag != eventlog.UNTAGGED else 0
        print(f"{name:46s} {u.jobs:5d} {len(u.sql):5d} {u.seconds:12.1f} {made_here:8d}")
    total = sum(u.jobs for u in used.values())
    print(f"{'all':46s} {total:5d} {sum(len(u.sql) for u in used.values()):5d}")
    print(f"the counted batch took {took:.1f} s (lakehouse run, wall time)")
    print("commits by table:", ", ".join(f"{t} {n}" for t, n in made.items()))
    gold = [u.jobs for t, u in used.items() if t.startswith("lakehouse:gold:")]
    figures = [
        Figure(
            f"Spark jobs per gold table, {args.records}-record batch (median)",
            statistics.median(gold),
            "jobs",
            "a plain delta-spark MERGE",
            peer_jobs,
            higher_is_better=False,
        ),
        Figure(
            f"Spark jobs per gold table, {args.records}-record batch (most)",
            max(gold),
            "jobs",
            "a plain delta-spark MERGE",
            peer_jobs,
            higher_is_better=False,
        ),
        Figure(
            f"Spark jobs of the whole {args.records}-record batch",
            total,
            "jobs",
            "one plain MERGE per table written",
            peer_jobs * (len(gold) + 2),
            higher_is_better=False,
        ),
        Figure(
            f"Delta commits of the whole {args.records}-record batch",
            sum(made.values()),
            "commits",
            "one per table written",
            len(made),
            higher_is_better=False,
        ),
    ]
    report(
        figures,
        "batch_jobs",
        {
            "records": args.records,
            "seconds": round(took, 1),
            "by_tag": {
                t: {"jobs": u.jobs, "sql": len(u.sql), "seconds": round(u.seconds, 2)}
                for t, u in used.items()
            },
            "commits": made,
        },
    )
    if args.workdir is None:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
