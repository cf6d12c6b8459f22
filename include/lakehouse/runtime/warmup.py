"""The warm-up of a Spark server that has just started: what starts it, where it is recorded, how
it ends. The work itself is the pipeline's (:mod:`lakehouse.pipeline.warmup`, run as a process of
its own so that this layer imports nothing above it).

A server's first batches cost twice what later ones do (its JVM compiles the code paths of Delta,
Catalyst and Parquet as they run, and loads their classes on first use): on this repository's
benchmark machine, the shipped topic's 20-record batch took 86 s right after a start, 55 s next,
then 42 s. So ``lakehouse spark start`` runs batches of the shipped contracts on a scratch lake
of the server's own (``<home>/spark/warmup``, never the lake's tables, the ledger or the
metastore's names) before the first real one comes. ``LAKEHOUSE_SPARK_WARMUP``:

* ``background`` (the default): the start returns once the server answers; the warm-up runs
  beside it, and ``lakehouse spark status`` says how far it is. A batch that comes meanwhile
  runs at once, sharing the cores.
* ``wait``: the start returns once the warm-up has ended too.
* ``off``: no warm-up.

The record, ``<home>/spark/warmup.json``, is the warm-up's: its pid and start, then how it ended
(``warm`` after how long, or ``failed`` and why); its log is ``<home>/spark/warmup.log``. A
warm-up that fails leaves the server as it is: the first batches are then slower, nothing else.
Stopping the server ends a warm-up that still runs.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from lakehouse.errors import ConfigError
from lakehouse.runtime.config import Settings
from lakehouse.runtime.process import alive, now, read_record, stop_group, write_record

WARMUP_ENV = "LAKEHOUSE_SPARK_WARMUP"
MODES = ("background", "wait", "off")
MODULE = "lakehouse.pipeline.warmup"  # run with python -m


def mode() -> str:
    """``LAKEHOUSE_SPARK_WARMUP``: background (default), wait or off; anything else is a
    ConfigError naming the variable."""
    value = os.environ.get(WARMUP_ENV, "background").strip().lower() or "background"
    if value not in MODES:
        raise ConfigError(f"{WARMUP_ENV}={value!r}: expected one of {', '.join(MODES)}")
    return value


def folder(settings: Settings) -> Path:
    """The warm-up's scratch lake, beside the server's state (never the lake's data)."""
    return settings.home / "spark" / "warmup"


def record_path(settings: Settings) -> Path:
    return settings.home / "spark" / "warmup.json"


def log_path(settings: Settings) -> Path:
    return settings.home / "spark" / "warmup.log"


@dataclass(frozen=True)
class State:
    """What ``warmup.json`` says: ``warming`` (while its process lives), ``warm``, ``failed`` or
    ``ended`` (its process is gone without saying how: killed, or the server stopped)."""

    state: str
    started_at: str | None = None
    seconds: float | None = None
    error: str | None = None

    def describe(self, settings: Settings) -> str:
        if self.state == "warming":
            return f"warm-up: running since {self.started_at} (log: {log_path(settings)})"
        if self.state == "warm":
            return f"warm-up: done in {self.seconds:.0f} s"
        if self.state == "failed":
            return f"warm-up: failed ({self.error}; log: {log_path(settings)})"
        return f"warm-up: ended before it finished (log: {log_path(settings)})"


def state(settings: Settings) -> State | None:
    """The last warm-up's state, or None when this server has none (``off``, or never)."""
    rec = read_record(record_path(settings))
    if not rec:
        return None
    said = str(rec.get("state", "ended"))
    if said == "warming" and not _ours(rec.get("pid")):
        said = "ended"
    seconds = rec.get("seconds")
    return State(
        said,
        started_at=str(rec.get("started_at")) if rec.get("started_at") else None,
        seconds=float(seconds) if isinstance(seconds, (int, float)) else None,
        error=str(rec["error"]) if rec.get("error") else None,
    )


def start(settings: Settings) -> State | None:
    """Start the warm-up of the server that has just started (as ``LAKEHOUSE_SPARK_WARMUP``
    says); with ``wait``, return once it has ended. None with ``off``."""
    chosen = mode()
    record_path(settings).unlink(missing_ok=True)
    if chosen == "off":
        return None
    log = log_path(settings)
    log.parent.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "LAKEHOUSE_HOME": str(settings.home),
        "LAKEHOUSE_DATA": str(settings.data_root),
    }
    with log.open("ab") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", MODULE],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own group: stop() ends it with what it forked
        )
    write_record(
        record_path(settings),
        {"pid": process.pid, "state": "warming", "started_at": now()},
    )
    if chosen == "wait":
        process.wait()
    else:
        # Nothing waits for it: a thread reaps it, so it leaves no zombie while this process lives.
        import threading

        threading.Thread(target=process.wait, daemon=True).start()
    return state(settings)


def finish(settings: Settings, began: float, error: str | None = None) -> None:
    """The warm-up's own last word in its record: warm after how long, or failed and why."""
    rec = read_record(record_path(settings))
    write_record(
        record_path(settings),
        {
            **rec,
            "state": "failed" if error else "warm",
            "seconds": round(time.monotonic() - began, 1),
            **({"error": error} if error else {}),
        },
    )


def stop(settings: Settings) -> bool:
    """End a warm-up that still runs (with the server); True if one did."""
    rec = read_record(record_path(settings))
    pid = rec.get("pid")
    if rec.get("state") != "warming" or not _ours(pid):
        return False
    return stop_group(pid, 10.0)


def _ours(pid: object) -> bool:
    """Whether ``pid`` is a running warm-up (a recorded pid may since be another process's)."""
    if not isinstance(pid, int) or not alive(pid):
        return False
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return MODULE.encode() in command
