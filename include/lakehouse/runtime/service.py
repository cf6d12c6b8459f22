"""The one holder of the lakehouse's local servers: the Kafka broker, the S3 API, PostgreSQL, the
Spark server and the readers' server.

Each server is a :class:`LocalServer` kept in a folder of its own under the lakehouse's home: its
record (``<state>``: the running process's pid, ports and start time, written whole), its log, and
whatever files it keeps. The holder does what every one of them needs, once:

* ``status()``: running when the recorded process is alive and the server answers
  (:meth:`LocalServer.answering`; by default, every recorded port accepts connections);
* ``start()``: one start at a time (a lock in the folder), nothing if it already runs, a clear
  error if a port is taken, then the server's own preparation, its process in a process group of
  its own (so ``stop`` ends what it forked too) writing to its log, and a wait until it answers,
  with the end of its log in the error if it exits or does not answer in time;
* ``stop()``: SIGTERM to the process group, SIGKILL after a while, the record removed;
* ``describe()`` of a status and ``main(action)`` for ``lakehouse <command> start | stop |
  status``.

A server says what is its own: its name, its ports (with the variable that sets each), what to
run (:class:`Launch`), how to tell it answers, and what its status holds.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Generic, Protocol, TypeVar

from lakehouse.errors import ConfigError, LakehouseError
from lakehouse.runtime.process import (
    alive,
    answers,
    now,
    port_setting,
    read_record,
    start_lock,
    stop_group,
    tail,
    write_record,
)

LOOPBACK = "127.0.0.1"

S = TypeVar("S", bound="Described")


class ServiceError(LakehouseError):
    """A local server could not be started, stopped or reached."""


@dataclass(frozen=True)
class Port:
    """A port a server listens on: its name in the record, the variable that sets it, its
    default."""

    name: str
    variable: str
    default: int

    def value(self) -> int:
        """The port from its variable (its default when unset); anything but a port number is a
        ConfigError naming the variable."""
        return port_setting(self.variable, self.default)


@dataclass(frozen=True)
class Launch:
    """What to run for a server: its command, its environment (None: this process's), what to
    write to its standard input (then closed), and more fields for its record."""

    argv: list[str]
    env: Mapping[str, str] | None = None
    stdin: str | None = None
    record: Mapping[str, object] = field(default_factory=dict)


class LocalServer(Generic[S]):
    """A local server kept in ``root``; ``S`` is the type of its status."""

    NAME: ClassVar[str]  # as messages name it: "Kafka broker"
    COMMAND: ClassVar[str]  # its command line: lakehouse <COMMAND> start
    PORTS: ClassVar[tuple[Port, ...]] = ()
    RECORD: ClassVar[str] = "server.json"
    LOG: ClassVar[str] = "server.log"
    START_TIMEOUT_S: ClassVar[float] = 60.0
    STOP_TIMEOUT_S: ClassVar[float] = 30.0
    ERROR: ClassVar[type[LakehouseError]] = ServiceError

    def __init__(self, root: Path) -> None:
        self.root = root

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.root})"

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, LocalServer) and type(other) is type(self) and other.root == self.root
        )

    def __hash__(self) -> int:
        return hash((type(self), self.root))

    @property
    def state(self) -> Path:
        return self.root / self.RECORD

    @property
    def log(self) -> Path:
        return self.root / self.LOG

    # -- what each server says ---------------------------------------------------------------
    def prepare(self, ports: Mapping[str, int]) -> None:
        """What must exist before the process starts (settings files, a formatted folder)."""

    def launch(self, ports: Mapping[str, int]) -> Launch:
        """The process that serves on ``ports``."""
        raise NotImplementedError

    def answering(self, record: Mapping[str, object]) -> bool:
        """Whether the server of ``record`` answers: by default, each of its ports."""
        ports = [record.get(p.name) for p in self.PORTS]
        return all(isinstance(at, int) and answers(LOOPBACK, at) for at in ports)

    def make_status(self, record: Mapping[str, object] | None) -> S:
        """The status of the running server of ``record``, or of a stopped one (None)."""
        raise NotImplementedError

    def stopped(self, record: Mapping[str, object]) -> None:
        """What to clean once the process of ``record`` has ended (a helper it had, a socket
        it left)."""

    # -- what the holder does ---------------------------------------------------------------
    def record(self) -> dict[str, object]:
        """The running server's record ({} when there is none)."""
        return read_record(self.state)

    def running_record(self) -> dict[str, object] | None:
        """The record of the running server: its process alive and answering; else None."""
        rec = self.record()
        pid = rec.get("pid")
        if not isinstance(pid, int) or not alive(pid) or not self.answering(rec):
            return None
        return rec

    def status(self) -> S:
        return self.make_status(self.running_record())

    def ports(self) -> dict[str, int]:
        """The ports a start listens on, from their variables."""
        return {p.name: p.value() for p in self.PORTS}

    def start(self, at: int | None = None, *, timeout: float | None = None) -> S:
        """Start the server unless it runs, on its ports (``at`` in place of its first); return
        once it answers. Raises :attr:`ERROR` if a port is taken, or with the end of its log if
        it exits or does not answer in time."""
        self.root.mkdir(parents=True, exist_ok=True)
        with start_lock(self.root):
            current = self.running_record()
            if current is not None:
                return self.make_status(current)
            self.stop()  # what a dead one left
            ports = self.ports()
            if at is not None and self.PORTS:
                ports[self.PORTS[0].name] = at
            variables = {p.name: p.variable for p in self.PORTS}
            for name, at in ports.items():
                if answers(LOOPBACK, at):
                    raise self.ERROR(
                        f"port {at} on {LOOPBACK} is taken by another process: stop it, or "
                        f"choose another port with {variables[name]}"
                    )
            self.prepare(ports)
            return self._run(ports, self.START_TIMEOUT_S if timeout is None else timeout)

    def _run(self, ports: Mapping[str, int], timeout: float) -> S:
        how = self.launch(ports)
        with self.log.open("ab") as log:
            log.write(f"\n--- starting at {now()}\n".encode())
            log.flush()
            proc = subprocess.Popen(
                how.argv,
                env=None if how.env is None else dict(how.env),
                stdin=subprocess.DEVNULL if how.stdin is None else subprocess.PIPE,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: stop() ends it whole
                cwd=self.root,
            )
        if how.stdin is not None:
            assert proc.stdin is not None
            try:
                with proc.stdin:
                    proc.stdin.write(how.stdin.encode())
            except BrokenPipeError:
                pass  # it exited at once: the wait below says so, with its log
        record: dict[str, object] = {"pid": proc.pid, **ports, "started_at": now(), **how.record}
        write_record(self.state, record)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                self.stop()
                raise self.ERROR(
                    f"the {self.NAME} exited with code {proc.returncode} while starting; "
                    + self.log_end()
                )
            if self.answering(record):
                return self.status()
            time.sleep(0.25)
        self.stop()
        raise self.ERROR(
            f"the {self.NAME} did not answer on {LOOPBACK} "
            f"({', '.join(f'{k} {v}' for k, v in ports.items())}) within {timeout:.0f} s; "
            + self.log_end()
        )

    def stop(self, *, timeout: float | None = None) -> bool:
        """Stop the server and what it started: SIGTERM to its process group, SIGKILL after
        ``timeout`` seconds. False if none was running."""
        wait = self.STOP_TIMEOUT_S if timeout is None else timeout
        record = self.record()
        stopped = stop_group(record.get("pid"), wait)
        self.stopped(record)
        self.state.unlink(missing_ok=True)
        return stopped

    def log_end(self, *logs: Path) -> str:
        """The end of the server's log (and of ``logs``), for an error message."""
        found = [
            f"{log} ends with:\n{tail(log)}"
            for log in (self.log, *logs)
            if log.is_file() and tail(log).strip()
        ]
        return "; ".join(found) or f"its log ({self.log}) is empty"

    def main(self, action: str) -> int:
        """``lakehouse <COMMAND> start | stop | status`` (status: exit code 1 when it is
        down)."""
        if action == "start":
            already = self.running_record() is not None
            print(describe(self.start(), already=already))
            return 0
        if action == "stop":
            print(f"{self.NAME}: stopped" if self.stop() else f"{self.NAME}: was not running")
            return 0
        if action == "status":
            current = self.status()
            print(describe(current))
            return 0 if current.running else 1
        raise ConfigError(f"lakehouse {self.COMMAND} {action}: expected start, stop or status")


class Described(Protocol):
    """What a server's status is: whether it runs, and a line that says so."""

    @property
    def running(self) -> bool: ...

    def describe(self, *, already: bool = False) -> str: ...


def describe(status: Described, *, already: bool = False) -> str:
    """A status's one-line description (``already``: it was running before this start)."""
    return status.describe(already=already)
