"""Fault injection on the Spark server (`lakehouse spark start`): kill -9 of its JVM in the middle
of a layer job that runs as its client (`lakehouse run --topic clicks --layer L`, a Spark Connect
client whenever the server runs), then the server restarted and the job rerun to its end.

Each round: a layer's client starts, connects, and the server's JVM is killed at a random moment
of the client's work or right after the client's first data commit (:func:`faults.kill_plan`).
The kill is the JVM's alone, as when it crashes or the kernel's OOM killer picks it: its Python
workers must then end by themselves, since `lakehouse spark stop` no longer finds them (they are
no longer the JVM's descendants). The client must fail soon, saying to run `lakehouse spark
start`, not retry for minutes; the server restarts on its port, and the rerun succeeds. After
each landing batch every table (bronze, silver, both quarantines, gold and the gold state table)
equals a clean run's as a multiset of rows (the comparisons of test_fault_injection.py), and at
the end every version of every Delta table reads.

Size: ``LAKEHOUSE_RELIABILITY_KILLS`` server kills in all, over the three layers in turn
(default 3; ``make reliability`` sets 20); ``LAKEHOUSE_RELIABILITY_SEED`` replays the kill
points. A restart of the server costs 5-40 s here.

A client whose server is down before it starts is told how to start it: tests/integration/
test_spark_server.py::test_a_client_whose_server_is_down_is_told_how_to_start_it.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from faults import (
    BATCHES,
    KILLS,
    LAYER_TABLES,
    LAYERS,
    ON_SERVER,
    SEED,
    Job,
    Kill,
    Lake,
    advanced,
    assert_same_tables,
    commit_versions,
    invariants,
    kill_plan,
    layer_state,
    log_leftovers,
    make_lake,
    orphan_files,
    produce,
    read_every_version,
    run_id,
    run_job,
    start_job,
    versions,
    wait_for_data_commit,
    wait_for_output,
)

from lakehouse.runtime import server
from lakehouse.runtime.config import Settings
from lakehouse.runtime.process import alive, free_port

pytestmark = [
    pytest.mark.reliability,
    pytest.mark.heavy,  # 10-18 minutes at 3 kills here: `make reliability`, not CI's short rounds
    pytest.mark.integration,  # Spark and Java: not part of `make unit`
    pytest.mark.timeout(1200 + KILLS * 400),
]

# A client of a dead server that has not ended after this long is taken to hang (Spark's own
# client retries an unavailable server for 10 minutes and more); a failing one ends in seconds.
CLIENT_BOUND_S = 120.0
# The same for the dead server's Python workers, which end when their pipe to the JVM closes.
WORKERS_BOUND_S = 60.0


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lake]:
    """The faults' lake (:func:`faults.make_lake`), its server running on a free port."""
    lake = make_lake(tmp_path_factory.mktemp("server-faults") / "killed")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(server.PORT_ENV, str(free_port()))
        server.start(lake.settings, only="pipeline")
        try:
            yield lake
        finally:
            server.stop(lake.settings)


def _share_server(lake: Lake, served: Lake) -> Lake:
    """``lake``, its clients made to use ``served``'s server: a client finds its server (pid,
    port and token) under its own ``LAKEHOUSE_HOME``, and the server keeps no data of a lake."""
    home = lake.settings.home
    home.mkdir(parents=True, exist_ok=True)
    server.state_dir(lake.settings).symlink_to(server.state_dir(served.settings))
    return lake


@dataclass
class Clean:
    """The clean run, as clients of the same server before any kill: per landing batch, each
    layer to its end."""

    lake: Lake
    after: list[dict[str, int | None]] = field(default_factory=list)  # versions after a batch
    durations: dict[str, list[float]] = field(default_factory=dict)  # per layer, once connected


def _clean_run(lake: Lake) -> Clean:
    clean = Clean(lake)
    for batch in range(BATCHES):
        produce(lake, batch)
        for layer in LAYERS:
            job = start_job(lake, layer, run_id(batch), client=True)
            assert wait_for_output(job, ON_SERVER), job.tail()
            connected = job.elapsed()
            assert job.wait() == 0, job.tail()
            clean.durations.setdefault(layer, []).append(job.elapsed() - connected)
        clean.after.append(versions(lake))
    return clean


def _crash(settings: Settings) -> list[int]:
    """kill -9 of the server's JVM alone (the pid `lakehouse spark start` recorded), as a crash;
    returns its processes at that moment: the JVM and its descendants (Python workers)."""
    status = server.status(settings)
    assert status.running and status.pid is not None, status.describe()
    family = [status.pid, *server._descendants(status.pid)]
    os.kill(status.pid, signal.SIGKILL)
    return family


def _outliving(pids: list[int], bound: float) -> list[str]:
    """The processes of ``pids`` still alive after ``bound`` seconds (their command lines)."""
    deadline = time.monotonic() + bound
    while (living := [p for p in pids if alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = []
    for pid in living:
        with contextlib.suppress(OSError):
            left.append(f"{pid}: {Path(f'/proc/{pid}/cmdline').read_text().replace(chr(0), ' ')}")
    return left


@dataclass
class Rounds:
    lines: list[str] = field(default_factory=list)
    kills: int = 0  # kills of the server while its client ran
    restarts: list[float] = field(default_factory=list)  # seconds each restart took
    leftovers: list[str] = field(default_factory=list)  # odd files the kills left, per table

    def text(self) -> str:
        return f"seed {SEED}\n" + "\n".join(self.lines)


def _odd_files(lake: Lake) -> set[str]:
    """Per table, the data files no commit adds and the odd files of its log."""
    found = set()
    for name, path in lake.every_delta_table().items():
        found |= {f"{name}: _delta_log/{n}" for n in log_leftovers(path)}
        found |= {f"{name}: {n}" for n in orphan_files(path)}
    return found


def _round(
    lake: Lake, layer: str, batch: int, kill: Kill, measured: dict[str, float], rounds: Rounds
) -> bool:
    """Start the layer's client; once it is connected, kill -9 the server as planned; check how
    the client ends and that the server's processes end; restart the server and rerun the layer
    to its end. True if the server died while the client ran (else the client ended first, and
    nothing was killed)."""
    settings = lake.settings
    tables = [lake.tables()[n] for n in LAYER_TABLES[layer]]
    seen = {p: commit_versions(p) for p in tables}
    before = layer_state(lake, layer)
    odd = _odd_files(lake)
    job: Job = start_job(lake, layer, run_id(batch), client=True)
    context = f"{layer} batch {batch} ({kill}), {{}}\n{rounds.text()}"
    assert wait_for_output(job, ON_SERVER), context.format(f"not on the server:\n{job.tail()}")
    connected = job.elapsed()
    if kill.kind == "commit":
        wait_for_data_commit(job, tables, seen)
    else:
        while job.running() and job.elapsed() - connected < kill.fraction * measured[layer]:
            time.sleep(0.01)
    what = "at its first commit" if kill.kind == "commit" else f"{kill.fraction:.2f} into its work"
    if not job.running():
        code = job.wait()
        measured[layer] = job.elapsed() - connected
        rounds.lines.append(f"        {layer:6} batch {batch} {what}: ended first (exit {code})")
        assert code == 0, context.format(f"failed unkilled:\n{job.tail()}")
        return False
    at = job.elapsed() - connected
    family = _crash(settings)
    try:
        code = job.wait(timeout=CLIENT_BOUND_S)
    except AssertionError as exc:  # Job.wait kills a job that runs over its time
        raise AssertionError(context.format(f"the client hangs on a dead server: {exc}")) from None
    living = _outliving(family, WORKERS_BOUND_S)
    assert not living, context.format(f"processes of the killed server outlive it: {living}")
    killed = layer_state(lake, layer)
    moved = advanced(before, killed)
    if code == 0:  # it needed the server no more: its work is done, the rerun must add nothing
        outcome = "the client ended well"
    else:
        output = job.output()
        assert "lakehouse spark start" in output and "Traceback" not in output, context.format(
            f"the client's error does not say to start the server:\n{job.tail()}"
        )
        outcome = f"the client failed in {job.elapsed() - connected - at:.1f} s"
    left = sorted(_odd_files(lake) - odd)
    rounds.leftovers += left
    started = time.monotonic()
    server.start(settings, only="pipeline")
    rounds.restarts.append(time.monotonic() - started)
    rerun, took = run_job(lake, layer, run_id(batch), client=True)
    assert ON_SERVER in rerun.output(), context.format(f"the rerun is no client:\n{rerun.tail()}")
    if code == 0:
        added = advanced(killed, layer_state(lake, layer))
        assert added == [], context.format(f"the rerun of a finished job committed to {added}")
    rounds.kills += 1
    rounds.lines.append(
        f"kill -9 server under {layer:6} batch {batch} {what} (at {at:4.1f} s): {outcome}; "
        f"committed {', '.join(moved) or 'nothing'}; {len(left)} odd files left; "
        f"restart {rounds.restarts[-1]:.1f} s; rerun exit 0 after {took:.1f} s"
    )
    return True


def another(rng: random.Random) -> Kill:
    """A kill in place of one that found its client ended."""
    return Kill("random", rng.uniform(0, 0.9))


def test_kill_9_of_the_server_under_each_layer_then_restart_and_rerun(
    served: Lake, tmp_path: Path
) -> None:
    """A clean run first, as clients of the server; then, in another lake, landing batches one
    by one, each layer's client with the server killed under it as planned (kills that find the
    client ended are made up for), the server restarted and the layer rerun. After each batch
    the tables equal the clean run's after it; at the end every version of every table reads."""
    lake = served
    clean = _clean_run(_share_server(make_lake(tmp_path / "clean"), served))
    print(f"seed {SEED}: {KILLS} server kills over {BATCHES} landing batches")
    print(f"clean run: each layer's work once connected (s) {_rounded(clean.durations)}")
    rng = random.Random(SEED)
    # The kills in turn under bronze, silver and gold, spread over the batches in order.
    plan = kill_plan(rng, KILLS)
    rng.shuffle(plan)
    slots: dict[tuple[int, str], list[Kill]] = {}
    for i, kill in enumerate(plan):
        slots.setdefault((i * BATCHES // KILLS, LAYERS[i % len(LAYERS)]), []).append(kill)
    # A layer's work on a warm server, as the clean run's last batch measured it (its first ran
    # on a cold JVM, several times slower), then as each run here that ended by itself did.
    measured = {layer: clean.durations[layer][-1] for layer in LAYERS}
    rounds = Rounds()
    owed = 0  # kills that found the client ended: made up for in the next slot
    tries = 0
    for batch in range(BATCHES):
        produce(lake, batch)
        for layer in LAYERS:
            todo = slots.get((batch, layer), []) + [another(rng) for _ in range(owed)]
            owed = 0
            last = (batch, layer) == (BATCHES - 1, LAYERS[-1])
            for kill in todo:  # each round ends with the layer rerun to its end
                tries += 1
                if _round(lake, layer, batch, kill, measured, rounds):
                    continue
                if not last:
                    owed += 1
                elif tries < 4 * KILLS:
                    todo.append(another(rng))
            if not todo:
                run_job(lake, layer, run_id(batch), client=True)
        assert_same_tables(
            clean.lake, lake, clean.after[batch], f"after batch {batch} (seed {SEED})"
        )
        assert (problems := invariants(lake)) == [], f"{problems}\n{rounds.text()}"
    print(rounds.text())
    print(
        f"restarts of the server (s): {[round(t, 1) for t in rounds.restarts]}; "
        f"left by the kills: {rounds.leftovers or 'nothing odd'}"
    )
    readable = read_every_version(lake)
    print(f"versions read per table {readable}")
    assert rounds.kills >= KILLS, f"{rounds.kills} kills, wanted {KILLS}\n{rounds.text()}"


def _rounded(durations: dict[str, list[float]]) -> dict[str, list[float]]:
    return {k: [round(v, 1) for v in vs] for k, vs in durations.items()}
