"""End to end on object storage: the same pipeline on local files and in a bucket, in one run.

    python bench/end_to_end_s3.py [--records 1000000] [--workdir DIR]

The work of ``bench/end_to_end.py``'s throughput figure for ours (its contract: one JSON topic,
12 partitions, ~300-byte values, two gold tables, expectations on every layer, change data feed
on) done twice, each time in a fresh process with its own Spark session on ``local[2]``:

* local: the lakehouse's data under a local folder (``LAKEHOUSE_DATA`` unset);
* S3: ``LAKEHOUSE_DATA=s3://<bucket>/e2e`` on moto's server (``lakehouse.runtime.s3server``, started
  here on a free port and stopped at the end), with the store's settings and credentials in the
  worker's environment before its JVM starts, as a deployment's would be. Landing segments,
  tables, the schema registry and the ledger are in the bucket; the home (locks, validations)
  stays local.

Each worker writes the same ``--records`` (same seed) to its landing, untimed, warms its session
on a 1000-record topic, then times ``runner.run`` (bronze, silver, gold) over the records.
Both must end with the same silver stream and gold tables, nothing quarantined.

Figures: records/s per core of the S3 run against the local one, and the wall seconds of each;
ratio = S3 / local throughput (< 1: what object storage costs). moto is one Python process on the
same 2 cores as Spark: the figure is this platform on a local S3 API, not on AWS S3 (no network
latency, but an S3 server competing for the CPU). The context says how many requests moto served
during the timed run (its log has one line per request), by method, and the CPU seconds moto
used meanwhile.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from common import Figure, report, run_worker, tree_peak_rss_mib
from end_to_end import CORES, TOPIC, WARM, _names, _quiet, _session, _settings, _size, prepare
from lakehouse.runtime.s3server import S3Server, S3ServerError, Status

WARM_RECORDS = 1000
BUCKET = "bench-lakehouse"
REGION = "us-east-1"
LOCAL = "local files"
CAVEAT = (
    "S3 here is moto's server, one Python process on the same 2 cores as Spark: this platform "
    "on a local S3 API, not AWS S3"
)
# A request's line in moto's log (werkzeug's): '... "GET /bucket/key HTTP/1.1" 200 -', the
# method sometimes behind terminal colour codes.
_REQUEST = re.compile(rb'"(?:\x1b\[[0-9;]*m)*([A-Z]+) [^"]*" (\d{3}) ')


def store_env(endpoint: str) -> dict[str, str]:
    """What a lakehouse process needs in its environment to keep its data in the bench's bucket."""
    return {
        "LAKEHOUSE_DATA": f"s3://{BUCKET}/e2e",
        "LAKEHOUSE_S3_ENDPOINT": endpoint,
        "LAKEHOUSE_S3_PATH_STYLE": "true",
        "LAKEHOUSE_S3_REGION": REGION,
        # moto checks no credentials; S3 clients still sign every request with some.
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
    }


# -- the worker (one per storage, each in its own process) -------------------------------------


def _moto_usage(pid: int, log: Path) -> tuple[float, int]:
    """moto's CPU seconds so far and the length of its log (one line per request)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime
    return cpu, log.stat().st_size


def _facts(spark: Any, settings: Any) -> dict[str, int]:
    """What both runs must agree on, read back through the run's own session."""
    from pyspark.sql import functions as F

    from lakehouse.runtime import objectstore

    n = _names(TOPIC)

    def agg(path: Any, *columns: Any) -> list[int]:
        row = spark.read.format("delta").load(str(path)).agg(*columns).first()
        return [int(v or 0) for v in row]

    rows, tombstones, visits = agg(
        settings.silver_path(n["stream"]),
        F.count("*"),
        F.sum(F.col("tombstone").cast("int")),
        F.sum("visits"),
    )
    totals = agg(settings.gold_path(n["totals"]), F.count("*"), F.sum("n"), F.sum("visits_total"))
    latest = agg(settings.gold_path(n["latest"]), F.count("*"), F.sum("visits"))
    quarantine = settings.quarantine_path("silver", n["stream"])
    kept = objectstore.exists(quarantine / "_delta_log")
    quarantined = agg(quarantine, F.count("*"))[0] if kept else 0
    return {
        "silver_rows": rows,
        "tombstones": tombstones,
        "silver_visits": visits,
        "totals_rows": totals[0],
        "totals_n": totals[1],
        "totals_visits": totals[2],
        "latest_rows": latest[0],
        "latest_visits": latest[1],
        "quarantined": quarantined,
    }


def worker(root: Path, records: int, moto: tuple[int, Path] | None) -> dict[str, Any]:
    """Landing, a warm session, then the timed run; ``moto``: the S3 server's pid and log."""
    from lakehouse.contracts.catalog import Catalog
    from lakehouse.pipeline import runner

    started = time.perf_counter()
    prepare(root, {TOPIC: records, WARM: WARM_RECORDS})
    generated = time.perf_counter() - started
    settings = _settings(root)
    catalog = Catalog.load(settings.contracts_dir)
    spark = _session()
    started = time.perf_counter()
    runner.run(spark, settings, catalog, topics=[WARM], echo=_quiet)
    warmup = time.perf_counter() - started
    before = _moto_usage(*moto) if moto else None
    started = time.perf_counter()
    runner.run(spark, settings, catalog, topics=[TOPIC], echo=_quiet)
    elapsed = time.perf_counter() - started
    out: dict[str, Any] = {
        "data": str(settings.data_root),
        "seconds": elapsed,
        "warmup": warmup,
        "generated": generated,
        "peak_mib": tree_peak_rss_mib(),
    }
    if moto and before:
        cpu, end = _moto_usage(*moto)
        with moto[1].open("rb") as log:
            log.seek(before[1])
            lines = log.read(end - before[1])
        requests = _REQUEST.findall(lines)
        out["moto_cpu_s"] = cpu - before[0]
        out["s3_requests"] = dict(Counter(m.decode() for m, _ in requests).most_common())
        out["s3_statuses"] = dict(Counter(s.decode() for _, s in requests).most_common())
    out["facts"] = _facts(spark, settings)
    spark.stop()
    return out


# -- the driver ----------------------------------------------------------------------------------


def start_moto(server: S3Server) -> Status:
    """Start moto's server on a free port and make the bench's bucket in it."""
    import boto3

    for attempt in range(3):
        # A free port can be taken again before moto binds it.
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        try:
            status = server.start(port)
            break
        except S3ServerError:
            if attempt == 2:
                raise
    assert status.endpoint is not None
    env = store_env(status.endpoint)
    boto3.client(
        "s3",
        endpoint_url=status.endpoint,
        region_name=REGION,
        aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
    ).create_bucket(Bucket=BUCKET)
    return status


def measure(work: Path, records: int) -> tuple[list[Figure], dict[str, Any]]:
    me = Path(__file__)
    n = str(records)
    local = run_worker(me, "--worker", str(work / "local"), n)
    server = S3Server(work / "s3")
    try:
        status = start_moto(server)
        assert status.endpoint is not None and status.pid is not None
        remote = run_worker(
            me,
            *("--worker", str(work / "remote"), n, str(status.pid), str(server.log)),
            env=os.environ | store_env(status.endpoint),
        )
        moto_peak = tree_peak_rss_mib(status.pid)
    finally:
        server.stop()
    if local["facts"] != remote["facts"] or local["facts"]["silver_rows"] != records:
        raise RuntimeError(
            f"the runs disagree or lost records:\n local {local['facts']}\n S3 {remote['facts']}"
        )
    if local["facts"]["quarantined"]:
        raise RuntimeError(f"{local['facts']['quarantined']} records were quarantined")
    rate = {k: records / v["seconds"] / CORES for k, v in (("local", local), ("s3", remote))}
    tag = f"e2e_s3.{_size(records)}"
    figures = [
        Figure(f"{tag}.records_per_s_per_core", rate["s3"], "records/s/core", LOCAL, rate["local"]),
        Figure(f"{tag}.wall", remote["seconds"], "s", LOCAL, local["seconds"], higher_is_better=False),
    ]  # fmt: skip
    context = {
        "records": records,
        "cores": CORES,
        "s3": CAVEAT,
        "local_s": round(local["seconds"], 2),
        "s3_s": round(remote["seconds"], 2),
        "s3_over_local_throughput": round(rate["s3"] / rate["local"], 3),
        "local_warmup_s": round(local["warmup"], 1),
        "s3_warmup_s": round(remote["warmup"], 1),
        "local_generate_s": round(local["generated"], 1),
        "s3_generate_s": round(remote["generated"], 1),
        "s3_requests": remote["s3_requests"],
        "s3_statuses": remote["s3_statuses"],
        "moto_cpu_s": round(remote["moto_cpu_s"], 1),
        "moto_peak_mib": round(moto_peak),
        "driver_peak_mib": {"local": round(local["peak_mib"]), "s3": round(remote["peak_mib"])},
        "data": {"local": local["data"], "s3": remote["data"]},
        "facts": local["facts"],
    }
    return figures, context


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--records", type=int, default=1_000_000, help="records of each run")
    parser.add_argument("--workdir", type=Path, help="work here (and keep it)")
    parser.add_argument("--worker", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        root, records, *moto = args.worker
        on = (int(moto[0]), Path(moto[1])) if moto else None
        print(json.dumps(worker(Path(root), int(records), on)))
        return
    work = args.workdir or Path(tempfile.mkdtemp(prefix="bench-e2e-s3-"))
    try:
        figures, context = measure(work, args.records)
        print(
            f"({CAVEAT}; {context['s3_s']} s on S3 against {context['local_s']} s on local files; "
            f"moto served {sum(context['s3_requests'].values())} requests and used "
            f"{context['moto_cpu_s']} CPU s meanwhile)"
        )
        report(figures, "end_to_end_s3", context)
    finally:
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
