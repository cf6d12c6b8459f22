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
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from lakehouse.errors import LakehouseError
from lakehouse.runtime.config import Settings
from lakehouse.runtime.process import port_setting
from lakehouse.runtime.service import Launch, LocalServer, Port

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


class S3Server(LocalServer[Status]):
    """A local S3 API whose pid and log are kept in ``root`` (``<home>/s3``: :meth:`of`)."""

    NAME = "S3 API (moto)"
    COMMAND = "s3"
    PORTS = (Port("port", PORT_ENV, DEFAULT_PORT),)
    START_TIMEOUT_S = START_TIMEOUT_S
    STOP_TIMEOUT_S = STOP_TIMEOUT_S
    ERROR = S3ServerError

    @classmethod
    def of(cls, settings: Settings) -> S3Server:
        return cls(settings.home / "s3")

    def prepare(self, ports: Mapping[str, int]) -> None:
        if importlib.util.find_spec("moto") is None:
            raise S3ServerError(
                "moto is not installed: the local S3 API is moto's server, from the dev "
                "extra (`make install` installs it; or pip install 'moto[server]')"
            )

    def launch(self, ports: Mapping[str, int]) -> Launch:
        at = ports["port"]
        # MOTO_PORT: the port moto puts into the URLs it hands out.
        return Launch(
            [sys.executable, "-m", MODULE, "--host", LOOPBACK, "--port", str(at)],
            env={**os.environ, "MOTO_PORT": str(at)},
            record={"endpoint": endpoint(at)},
        )

    def answering(self, record: Mapping[str, object]) -> bool:
        at = record.get("port")
        return isinstance(at, int) and lists_buckets(LOOPBACK, at)

    def make_status(self, record: Mapping[str, object] | None) -> Status:
        if record is None:
            return Status(False, self.root)
        return Status(
            True,
            self.root,
            endpoint(int(str(record["port"]))),
            int(str(record["pid"])),
            str(record.get("started_at")),
            self.log,
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
    return S3Server.of(settings).main(action)
