"""What users wait for, against the same platform as it was before the small-batch work
(``make bench``; its peer is a checkout of ``--peer``, by default the commit before it).

    python bench/before_after.py [--peer REV] [--records 20 10000] [--batches 3] [--warmup 1]
                                 [--trigger-repeats 1] [--skip-trigger] [--make-test]
                                 [--workdir DIR]

Both sides run from this machine's virtualenv: "ours" with this checkout's ``include/`` and
``contracts/``, the peer with those of a ``git worktree`` of ``--peer`` (its own code, contracts,
DAGs and benchmark scripts; the JVM jars its lock names, from the same jar folder).

* **warm micro-batch of the shipped topic**: each side has a home of its own and a Spark server
  of its own (``lakehouse spark start``, both left running, on different ports), the shipped
  samples of both topics run once through every layer (``lakehouse run``), then ``--warmup``
  batches not counted. Each measured batch is ``lakehouse sample --topic user-locations
  --records N`` (a seed per batch, the same on both sides) and then the clock runs over
  ``lakehouse run --topic user-locations``: a client process of the warm server running
  bronze, silver and the topic's ten gold tables, as a manual run does. The sides take turns
  batch by batch, so a change in the machine's load falls on both. p50 of ``--batches``.
* **the floor under ours's batch**: after each of ours's batches, ``bench/commit_floor.py`` on
  its server makes the commits that batch made (one per table written, the gold tables four
  at a time as ours builds them) with plain delta-spark, into shallow clones of those tables
  (the same table properties), with nothing else; p50 of the same batches.
* **trigger to gold through Airflow's REST API**: each side's own ``bench/airflow_trigger.py``
  (its 10K-record batch, one Airflow and one Spark server per side, one after the other), run
  with the side's code; its p50 trigger-to-gold is taken from the figures it writes.
* **``make test`` on a clean clone** (``--make-test``, over an hour here): ``git clone`` of each
  side's commit into the work folder and ``make test`` there, one after the other; the wall
  time of each.

Ratios are peer / ours (> 1: ours is faster). Everything it starts is stopped at the end, also
when it fails.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import Figure, lakehouse_command, report
from lakehouse.runtime.eventlog import commits, table_versions

REPO = Path(__file__).resolve().parents[1]
# The last commit before the small-batch work (no process per commit, no empty commits, gold
# tables side by side).
PEER = "414d969"
TOPIC = "user-locations"


@dataclass
class Side:
    """One checkout of the platform, run from this virtualenv."""

    name: str
    code: Path
    home: Path
    port: int
    times: dict[int, list[float]] = field(default_factory=dict)

    def env(self) -> dict[str, str]:
        base = {k: v for k, v in os.environ.items() if not k.startswith(("LAKEHOUSE_", "AIRFLOW"))}
        return base | {
            "PYTHONPATH": str(self.code / "include"),
            "LAKEHOUSE_HOME": str(self.home),
            "LAKEHOUSE_CONTRACTS": str(self.code / "contracts"),
            "LAKEHOUSE_SPARK_PORT": str(self.port),
        }

    def floor(self, tables: list[str], rows: int, logs: Path) -> float:
        """``bench/commit_floor.py`` of ``tables`` (folders under the home) on this side's
        server: the seconds its plain commits of ``rows`` rows took."""
        script = REPO / "bench" / "commit_floor.py"
        with (logs / "floor.log").open("a") as out:
            proc = subprocess.run(
                [
                    sys.executable,
                    str(script),
                    "--home",
                    str(self.home),
                    "--scratch",
                    str(self.home.parent / "floor"),
                    "--rows",
                    str(rows),
                    *tables,
                ],
                env=self.env(),
                stdout=subprocess.PIPE,
                stderr=out,
                text=True,
                check=False,
            )
        if proc.returncode != 0:
            raise RuntimeError(f"{script} failed: see {logs / 'floor.log'}")
        return float(proc.stdout.split()[-1])

    def lakehouse(self, *args: str, log: Path) -> float:
        """Run ``lakehouse ARGS`` with this side's code; its wall time in seconds."""
        return lakehouse_command(self.env(), log, *args, who=self.name)


def checkout(rev: str, where: Path) -> Path:
    """A worktree of ``rev`` at ``where`` (a detached HEAD; removed by :func:`remove`)."""
    subprocess.run(
        ["git", "-C", str(REPO), "worktree", "add", "--detach", "-f", str(where), rev],
        check=True,
        capture_output=True,
    )
    return where


def remove(worktree: Path) -> None:
    subprocess.run(
        ["git", "-C", str(REPO), "worktree", "remove", "--force", str(worktree)],
        check=False,
        capture_output=True,
    )


def warm_batches(
    sides: list[Side], sizes: list[int], batches: int, warmup: int, logs: Path
) -> dict[int, list[float]]:
    """Every side's batches, in turns; the floor of ours's batches (``bench/commit_floor.py``
    on its server after each: the commits it made, made plainly), by size."""
    floors: dict[int, list[float]] = {}
    for side in sides:
        log = logs / f"{side.name}.log"
        side.lakehouse("sample", log=log)
        side.lakehouse("spark", "start", log=log)
        side.lakehouse("run", log=log)  # creates every table; not timed
    seed = 1
    for size in sizes:
        for n in range(warmup + batches):
            # Turns: who goes first alternates, so neither always meets a machine the other
            # has just warmed or loaded.
            for side in sides if n % 2 == 0 else list(reversed(sides)):
                log = logs / f"{side.name}.log"
                side.lakehouse(
                    "sample", "--topic", TOPIC, "--records", str(size), "--seed", str(seed), log=log
                )
                before = table_versions(side.home)
                took = side.lakehouse("run", "--topic", TOPIC, log=log)
                counted = n >= warmup
                print(
                    f"  {side.name}: {size} records, batch {n + 1}"
                    f"{'' if counted else ' (warm-up)'}: {took:.1f} s",
                    flush=True,
                )
                if counted:
                    side.times.setdefault(size, []).append(took)
                if side.name == "ours":
                    written = sorted(commits(before, table_versions(side.home)))
                    least = side.floor(written, size, logs)
                    print(f"  floor of those {len(written)} commits: {least:.1f} s", flush=True)
                    if counted:
                        floors.setdefault(size, []).append(least)
            seed += 1
    return floors


def trigger_to_gold(side: Side, repeats: int, logs: Path) -> float:
    """The side's own trigger-to-gold benchmark; its p50 (s)."""
    script = side.code / "bench" / "airflow_trigger.py"
    log = logs / f"{side.name}-airflow_trigger.log"
    env = side.env()
    del env["LAKEHOUSE_HOME"], env["LAKEHOUSE_SPARK_PORT"]  # it makes its own
    with log.open("w") as out:
        proc = subprocess.run(
            [sys.executable, str(script), "--repeats", str(repeats), "--no-submit"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            check=False,
        )
    if proc.returncode != 0:
        raise RuntimeError(f"{side.name}: {script} failed: see {log}")
    figures = json.loads((side.code / "bench" / "results" / "airflow_trigger.json").read_text())
    for fig in figures["figures"]:
        if fig["name"] == "airflow_trigger.trigger_to_gold.p50":
            return float(fig["value"])
    raise RuntimeError(f"{side.name}: no trigger-to-gold figure in {script}'s results")


def make_test(rev: str, work: Path, logs: Path, name: str) -> float:
    """``make test`` on a fresh clone of ``rev``: its wall time (s)."""
    clone = work / f"clone-{name}"
    shutil.rmtree(clone, ignore_errors=True)
    subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True)
    subprocess.run(["git", "-C", str(clone), "checkout", "-q", rev], check=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LAKEHOUSE_", "AIRFLOW"))}
    started = time.perf_counter()
    with (logs / f"{name}-make-test.log").open("w") as out:
        proc = subprocess.run(
            ["make", "test"], cwd=clone, env=env, stdout=out, stderr=subprocess.STDOUT, check=False
        )
    took = time.perf_counter() - started
    if proc.returncode != 0:
        raise RuntimeError(f"{name}: make test failed: see {logs / f'{name}-make-test.log'}")
    shutil.rmtree(clone, ignore_errors=True)
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--peer", default=PEER)
    parser.add_argument("--records", type=int, nargs="+", default=[20, 10_000])
    parser.add_argument("--batches", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--trigger-repeats", type=int, default=1)
    parser.add_argument("--skip-trigger", action="store_true")
    parser.add_argument("--make-test", action="store_true")
    parser.add_argument("--workdir", type=Path)
    args = parser.parse_args()

    work = Path(args.workdir or tempfile.mkdtemp(prefix="bench-before-after-"))
    work.mkdir(parents=True, exist_ok=True)
    logs = work / "logs"
    logs.mkdir(exist_ok=True)
    peer_rev = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--short", args.peer],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    ours_rev = subprocess.run(
        ["git", "-C", str(REPO), "describe", "--always", "--dirty"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    peer_code = checkout(peer_rev, work / "peer")
    sides = [
        Side("ours", REPO, work / "ours-home", 15112),
        Side("peer", peer_code, work / "peer-home", 15113),
    ]
    print(f"ours: {ours_rev} ({REPO}); peer: {peer_rev} ({peer_code}); logs in {logs}", flush=True)
    figures: list[Figure] = []
    context: dict[str, Any] = {"ours": ours_rev, "peer": peer_rev, "batches": args.batches}
    try:
        try:
            floors = warm_batches(sides, args.records, args.batches, args.warmup, logs)
        finally:
            for side in sides:
                side.lakehouse("spark", "stop", log=logs / f"{side.name}.log")
        ours, peer = sides
        for size in args.records:
            figures.append(
                Figure(
                    f"warm_batch_{size}_records_p50",
                    statistics.median(ours.times[size]),
                    "s",
                    f"{peer_rev}, the same batch",
                    statistics.median(peer.times[size]),
                    higher_is_better=False,
                )
            )
            figures.append(
                Figure(
                    f"warm_batch_{size}_records_against_floor_p50",
                    statistics.median(ours.times[size]),
                    "s",
                    "commit_floor.py: the same commits, plain delta-spark, same server",
                    statistics.median(floors[size]),
                    higher_is_better=False,
                )
            )
            context[f"batches_{size}"] = {s.name: s.times[size] for s in sides}
            context[f"floor_{size}"] = floors[size]
        if not args.skip_trigger:
            mine = trigger_to_gold(ours, args.trigger_repeats, logs)
            theirs = trigger_to_gold(peer, args.trigger_repeats, logs)
            figures.append(
                Figure(
                    "trigger_to_gold_10k_p50",
                    mine,
                    "s",
                    f"{peer_rev}, its own airflow_trigger.py",
                    theirs,
                    higher_is_better=False,
                )
            )
        if args.make_test:
            mine = make_test("HEAD", work, logs, "ours")
            theirs = make_test(peer_rev, work, logs, "peer")
            figures.append(
                Figure(
                    "make_test_clean_clone_wall",
                    mine / 60,
                    "min",
                    f"{peer_rev}",
                    theirs / 60,
                    higher_is_better=False,
                )
            )
    finally:
        remove(peer_code)
    report(figures, "before_after", context)


if __name__ == "__main__":
    main()
