"""The lakehouse's local S3 API: moto's server, for the tests and for trying the lakehouse on S3
without an account.

    lakehouse s3 start | stop | status

It runs ``python -m moto.server`` (``moto[server]``, in the ``dev`` extra that ``make install``
installs) on 127.0.0.1 only, port ``LAKEHOUSE_S3_PORT`` (default 19000, away from MinIO's 9000
and moto's own 5000), with this interpreter. What it keeps is under ``<home>/s3/``:

* ``server.log``: what the server prints (one line per request);
* ``server.json``: the running server's pid, port, endpoint and start time.

Buckets and objects live in the server's memory: they are gone when it stops. It checks no
credentials or signatures: any access key and secret will do. Clients reach it at
:attr:`Status.endpoint`, ``http://127.0.0.1:<port>``, with path-style addressing
(``http://127.0.0.1:<port>/<bucket>/<key>``).
"""

from __future__ import annotations

import http.client
import importlib.util
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from lakehouse.errors import LakehouseError
from lakehouse.runtime.config import Settings
from lakehouse.runtime.process import (
    alive,
    answers,
    now,
    port_setting,
    read_record,
    service_main,
    start_lock,
    stop_group,
    tail,
    write_record,
)

PORT_ENV = "LAKEHOUSE_S3_PORT"
DEFAULT_PORT = 19000
LOOPBACK = "127.0.0.1"
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 10.0
MODULE = "moto.server"


class S3ServerError(LakehouseError):
    """The local S3 API could not be started or stopped."""


def port() -> int:
    """The port a start listens on (``LAKEHOUSE_S3_PORT``, default 19000); anything but a port
    number is a ConfigError naming the variable."""
    return port_setting(PORT_ENV, DEFAULT_PORT)


def endpoint(at: int) -> str:
    """The URL clients give as their S3 endpoint for a server on port ``at``."""
    return f"http://{LOOPBACK}:{at}"


@dataclass(frozen=True)
class Status:
    """What ``lakehouse s3 status`` reports."""

    running: bool
    root: Path
    endpoint: str | None = None
    pid: int | None = None
    started_at: str | None = None
    log: Path | None = None

    def describe(self, *, already: bool = False) -> str:
        if not self.running:
            return f"S3 API (moto): not running; start it with `lakehouse s3 start` ({self.root})"
        return (
            f"S3 API (moto): {'already ' if already else ''}running, pid {self.pid}, endpoint "
            f"{self.endpoint}, since {self.started_at}; in memory: its buckets go when it stops "
            f"(log: {self.log})"
        )


@dataclass(frozen=True)
class S3Server:
    """A local S3 API whose pid and log are kept in ``root`` (``<home>/s3``: :meth:`of`)."""

    root: Path

    @classmethod
    def of(cls, settings: Settings) -> S3Server:
        return cls(settings.home / "s3")

    @property
    def log(self) -> Path:
        return self.root / "server.log"

    @property
    def state(self) -> Path:
        return self.root / "server.json"

    # -- state -------------------------------------------------------------------------------
    def status(self) -> Status:
        """Running when the recorded process is alive and its port answers."""
        rec = read_record(self.state)
        pid, at = rec.get("pid"), rec.get("port")
        if not isinstance(pid, int) or not isinstance(at, int):
            return Status(False, self.root)
        if not alive(pid) or not answers(LOOPBACK, at):
            return Status(False, self.root)
        return Status(True, self.root, endpoint(at), pid, str(rec.get("started_at")), self.log)

    # -- life cycle --------------------------------------------------------------------------
    def start(self, at: int | None = None, *, timeout: float = START_TIMEOUT_S) -> Status:
        """Start the server on port ``at`` (default :func:`port`) unless it runs; return once it
        answers S3's ListBuckets. Raises :class:`S3ServerError`, with the end of its log when it
        ran, if moto is not installed, the port is taken, or the server exits or does not
        answer in time."""
        self.root.mkdir(parents=True, exist_ok=True)
        with start_lock(self.root):
            current = self.status()
            if current.running:
                return current
            at = port() if at is None else at
            if importlib.util.find_spec("moto") is None:
                raise S3ServerError(
                    "moto is not installed: the local S3 API is moto's server, from the dev "
                    "extra (`make install` installs it; or pip install 'moto[server]')"
                )
            if answers(LOOPBACK, at):
                raise S3ServerError(
                    f"port {at} on {LOOPBACK} is taken by another process: stop it, or choose "
                    f"another port with {PORT_ENV}"
                )
            return self._run(at, timeout)

    def stop(self, *, timeout: float = STOP_TIMEOUT_S) -> bool:
        """Stop the server and whatever it started: SIGTERM to its process group, SIGKILL after
        ``timeout`` seconds. False if none was running."""
        stopped = stop_group(read_record(self.state).get("pid"), timeout)
        self.state.unlink(missing_ok=True)
        return stopped

    # -- helpers -----------------------------------------------------------------------------
    def _run(self, at: int, timeout: float) -> Status:
        # MOTO_PORT: the port moto puts into the URLs it hands out.
        env = {**os.environ, "MOTO_PORT": str(at)}
        with self.log.open("ab") as log:
            log.write(f"\n--- starting on {LOOPBACK}:{at} at {now()}\n".encode())
            log.flush()
            proc = subprocess.Popen(
                [sys.executable, "-m", MODULE, "--host", LOOPBACK, "--port", str(at)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: stop() ends it whole
                cwd=self.root,
                env=env,
            )
        record = {"pid": proc.pid, "port": at, "endpoint": endpoint(at), "started_at": now()}
        write_record(self.state, record)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                self.state.unlink(missing_ok=True)
                raise S3ServerError(
                    f"the S3 API (moto) exited with code {proc.returncode} while starting; its "
                    f"log ({self.log}) ends with:\n{tail(self.log)}"
                )
            if lists_buckets(LOOPBACK, at):
                return self.status()
            time.sleep(0.2)
        self.stop()
        raise S3ServerError(
            f"the S3 API (moto) did not answer on {LOOPBACK}:{at} within {timeout:.0f} s; its "
            f"log ({self.log}) ends with:\n{tail(self.log)}"
        )


def lists_buckets(host: str, at: int, *, timeout: float = 2.0) -> bool:
    """Whether ``host:at`` answers S3's ListBuckets (``GET /``) as S3 does. Unsigned: moto does
    not check signatures; a real S3 would answer 403 and this says no."""
    connection = http.client.HTTPConnection(host, at, timeout=timeout)
    try:
        connection.request("GET", "/")
        response = connection.getresponse()
        return response.status == 200 and b"<ListAllMyBucketsResult" in response.read()
    except (OSError, http.client.HTTPException):
        return False
    finally:
        connection.close()


def main(settings: Settings, action: str) -> int:
    """``lakehouse s3 start | stop | status`` (status: exit code 1 when it is down)."""
    return service_main(S3Server.of(settings), "S3 API (moto)", "s3", action)
