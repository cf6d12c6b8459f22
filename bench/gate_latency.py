"""What one gate costs a job: GX's verdict on a 10K-record batch, in a fresh process (a thin
client's task) and in a warm one.

    python bench/gate_latency.py [--rows 10000] [--runs 5] [--modes in-process,service]

No Spark: the batch is the Arrow table a gate validates (bench/quality.py's silver columns
and expectations: ``user`` not_null and match_regex, ``amount`` between, ``city`` in_set and
length_between, row_count_between). Modes, each run in a new interpreter ``--runs`` times:

* ``in-process``: the job imports GX and validates (a job without a Spark server);
* ``service``: the job sends the batch to the validation service (``lakehouse.quality.gx_service``),
  started once by this script for a scratch home, as the Spark server does.

Figures: the median of the gate's wall time (``run_suite``, from the call to the verdict) and
of the whole process (``python -c`` start to exit), then the warm figure: five more
validations in the same process after the first (in-process: GX imported and its context
made; service: every request is a fresh child of the warm service).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

CHILD = """
import json, os, sys, time
t_start = float(sys.argv[1])
import pyarrow as pa
from lakehouse.contracts.model import Expectation
from lakehouse.quality.verdict import run_suite

def e(name, expect, column=None, **params):
    return Expectation(layer="silver", name=name, expect=expect, severity="warn",
                       column=column, params=tuple(sorted(params.items())))

EXPS = [
    e("rows", "row_count_between", min=1, max=10_000_000),
    e("user_present", "not_null", "user"),
    e("user_shape", "match_regex", "user", pattern="^u[0-9]+$"),
    e("amount_range", "between", "amount", min=0, max=1_000_000),
    e("city_known", "in_set", "city", values=("Oslo", "Lima", "Rome", "Kyiv")),
    e("city_length", "length_between", "city", min=2, max=10),
]
n = int(os.environ["BENCH_ROWS"])
cities = ["Oslo", "Lima", "Rome", "Kyiv"]
batch = pa.table({
    "user": [f"u{i % 997}" for i in range(n)],
    "amount": pa.array([i * 7 % 100_000 for i in range(n)], pa.int32()),
    "city": [cities[i % 4] for i in range(n)],
})
mode = os.environ["BENCH_MODE"]
kw = {}
if mode == "service":
    from pathlib import Path
    from lakehouse.quality import gx_service
    kw["service"] = gx_service.client(Path(os.environ["BENCH_SOCKET"]))
times = []
for i in range(6):
    t = time.perf_counter()
    outcomes, engine, doc = run_suite(f"silver.bench{i}", EXPS, batch, n, **kw)
    times.append(time.perf_counter() - t)
    assert all(o.success for o in outcomes) and engine == "pandas", outcomes
    if i == 0:
        first_done = time.time()
print(json.dumps({"gate": times[0], "warm": sorted(times[1:])[2], "to_verdict": first_done - t_start,
                  "gx_imported": "great_expectations" in sys.modules}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--modes", default="in-process,service")
    args = parser.parse_args()
    modes = args.modes.split(",")
    with tempfile.TemporaryDirectory(prefix="bench-gate-") as scratch:
        env = os.environ | {"BENCH_ROWS": str(args.rows), "LAKEHOUSE_HOME": scratch}
        service = None
        if "service" in modes:
            from lakehouse.runtime import server
            from lakehouse.runtime.config import Settings
            from lakehouse.runtime.process import socket_answers

            settings = Settings.from_env(Path(scratch))
            service = server.spawn_validation_service(settings)
            env["BENCH_SOCKET"] = str(server.validation_socket(settings))
            while not socket_answers(server.validation_socket(settings)):
                assert service.poll() is None, "the validation service did not start"
                time.sleep(0.1)
        try:
            for mode in modes:
                rows = []
                for _ in range(args.runs):
                    start = time.time()
                    done = subprocess.run(
                        [sys.executable, "-c", textwrap.dedent(CHILD), str(start)],
                        env=env | {"BENCH_MODE": mode},
                        capture_output=True,
                        text=True,
                        check=True,
                    )
                    row = json.loads(done.stdout.splitlines()[-1])
                    row["process"] = time.time() - start
                    rows.append(row)
                med = {
                    k: statistics.median(r[k] for r in rows) for k in ("gate", "warm", "process")
                }
                print(
                    f"{mode:10} gate {med['gate']:.3f} s (runs: "
                    + ", ".join(f"{r['gate']:.2f}" for r in rows)
                    + f")  process {med['process']:.2f} s  warm gate {med['warm']:.3f} s  "
                    f"GX imported by the job: {rows[0]['gx_imported']}",
                    flush=True,
                )
        finally:
            if service is not None:
                os.killpg(service.pid, signal.SIGTERM)
                service.wait()


if __name__ == "__main__":
    main()
