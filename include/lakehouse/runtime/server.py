"""The platform's long-lived Spark: one Spark Connect server that holds the JVM, the jars, the
caches and every commit, and the thin clients (Airflow tasks, the CLI) that hand it their work;
beside it, in a JVM of its own, the readers' server (:mod:`lakehouse.runtime.readers`).

    lakehouse spark start | run | stop | status | reader

The server is the lakehouse's own main class (``include/jvm/server``, compiled at install:
:func:`lakehouse.runtime.jvm.server_jar`) in its ``pipeline`` mode, started by pyspark's own
``spark-submit`` with the platform's Spark settings and JVM jars
(:func:`lakehouse.runtime.spark.spark_conf`): it starts the session, then Spark Connect on it as
Spark's ``SparkConnectServer`` does. Delta has no Connect plugin for this Spark line, so clients
use Delta through SQL and the DataFrame reader and writer, which Delta's session extension serves
on the server (``MERGE INTO``, ``readChangeFeed``, ``txnAppId`` ...).

* It listens on 127.0.0.1 only: the Connect port (``LAKEHOUSE_SPARK_PORT``, default 15002), the
  readers' catalog (``LAKEHOUSE_CATALOG_PORT``, by default a free port chosen at each start,
  which the readers' server reads from this server's record), and Spark's own driver and block
  manager ports, which have no authentication of their own.
* One credential: the pipeline's token (``<home>/spark/token``), which the pipeline's clients
  present. Readers never reach this server: the readers' token (``<home>/spark/reader-token``;
  ``lakehouse spark reader`` prints what a reader needs) opens the readers' server only. Both are
  generated on the first start, mode 0600, outside the repository; each server reads its own from
  its standard input and keeps its digest only: it is not in its environment, where a session's
  code could read it, nor on a command line. A client presents it as its bearer token (Spark's
  client sends a token over plain TCP only to the host named ``localhost``, so clients connect to
  ``sc://localhost:<port>``).
* It serves the readers' server its catalog: Hive's metastore protocol on the pipeline's own
  metastore (``CatalogService`` in ``include/jvm/server``), every call checked by an allow-list
  that admits reads and the readers' own schemas, so only the pipeline changes its schemas'
  entries.
* Its pid, its settings and its log live under ``<home>/spark/``; ``status`` reads them and
  checks that the process is alive and its ports answer. Spark logs to ``server.log`` at WARN
  (``LAKEHOUSE_SPARK_LOG_LEVEL``), rolled over at 10 MB with 5 old files kept
  (``LAKEHOUSE_SPARK_LOG_SIZE``, ``LAKEHOUSE_SPARK_LOG_FILES``); what the JVM prints outside
  Log4j (before it starts, the Python workers' errors) goes to ``server.out``.
* Its Python workers go when they are idle. Spark forks a client session's workers from a
  Python daemon of that session's own and stops none before the server stops (SPARK-54055, not
  fixed in Spark 4.2.0): every client that ran Python work left a daemon behind. Spark ends a
  session's idle workers a minute after its last Python task; the server's daemon
  (:func:`python_daemon`) quits once it has had no worker for ``LAKEHOUSE_SPARK_PYTHON_IDLE``
  seconds (default 60), and a session that runs Python work again gets a new one.
* Great Expectations' validation service starts and stops with it: clients validate their
  pandas-sized batches there, so no client imports GX. The server runs it as a process
  (``python -m lakehouse.quality.gx_service``) listening at :func:`validation_socket`; what it
  does is the quality layer's.
* It keeps the tables' names: Spark's Hive support with the lakehouse's metastore
  (:mod:`lakehouse.runtime.metastore`; an embedded Derby under ``<home>/metastore``, which only
  one process may open), and every table it creates is named there
  (:mod:`lakehouse.storage.metastore`).
* A server that ``start`` started warms itself (:mod:`lakehouse.runtime.warmup`): batches of the
  shipped contracts on a scratch lake of its own, in the background by default, so the first
  real batch does not pay for the JVM's compiling; ``status`` says how far it is, ``stop`` ends it.
* ``LAKEHOUSE_SPARK_MASTER`` chooses local mode (``local[2]``, the default) or a standalone
  cluster (``spark://host:7077``).

The server is the platform's single committing driver: Delta's log store excludes concurrent
commits only inside one JVM on a local filesystem, and assumes one driver on S3. No reader's query
runs in it.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lakehouse.errors import ConfigError, LakehouseError
from lakehouse.runtime import metastore, objectstore, readers, warmup
from lakehouse.runtime.config import Settings
from lakehouse.runtime.deployment import check_environment
from lakehouse.runtime.launch import TOKEN_ENV, log_config, server_main_argv
from lakehouse.runtime.objectstore import Location
from lakehouse.runtime.process import (
    alive,
    answers,
    free_port,
    private_file,
    socket_answers,
    tail,
)
from lakehouse.runtime.pydaemon import DEFAULT_PYTHON_IDLE_S, PYTHON_IDLE_ENV
from lakehouse.runtime.service import LOOPBACK, Launch, LocalServer, Port

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.connect.client.retries import RetryPolicy

INTERCEPTOR_CLASS = "lakehouse.server.TokenInterceptor"  # its Connect credential
MODE = "pipeline"  # the main class's first argument
PORT_ENV = "LAKEHOUSE_SPARK_PORT"
DEFAULT_PORT = 15002
CATALOG_PORT_ENV = "LAKEHOUSE_CATALOG_PORT"
DEFAULT_CATALOG_PORT = 9083  # Hive's metastore's
START_TIMEOUT_S = 180.0
SERVICE_MODULE = "lakehouse.quality.gx_service"  # the validation service, run with python -m


class ServerError(LakehouseError):
    """The Spark server could not be started, stopped or reached."""


class ServerDown(ServerError):
    """No Spark server answers: the message says how to start one."""


CONNECT_PORT = Port("port", PORT_ENV, DEFAULT_PORT)
CATALOG_PORT = Port("catalog_port", CATALOG_PORT_ENV, DEFAULT_CATALOG_PORT)


def port() -> int:
    """The Connect port (``LAKEHOUSE_SPARK_PORT``, default 15002); anything but a port number
    is a ConfigError naming the variable."""
    return CONNECT_PORT.value()


def state_dir(settings: Settings) -> Path:
    """Where the server keeps its pid, settings, log and tokens: local state, never data."""
    return settings.home / "spark"


def validation_socket(settings: Settings) -> Path:
    """Where the validation service listens: a Unix socket beside the server's state."""
    return state_dir(settings) / "gx.sock"


def spawn_validation_service(settings: Settings) -> subprocess.Popen[bytes]:
    """Start the validation service for ``settings``' lakehouse, in a process group of its own
    (its pid: ending the group ends the children it forked too); its output goes to
    ``<home>/spark/gx.log``."""
    path = validation_socket(settings)
    path.parent.mkdir(parents=True, exist_ok=True)
    with (path.parent / "gx.log").open("ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", SERVICE_MODULE, str(path)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=path.parent,
        )


def token(settings: Settings, *, create: bool = False) -> str:
    """The pipeline's token: read from ``<home>/spark/token``; with ``create``, generated there
    first if missing (mode 0600, written whole before it is visible)."""
    return _secret(state_dir(settings) / "token", create)


def reader_token(settings: Settings, *, create: bool = False) -> str:
    """The readers' token, which opens the readers' server only: read from
    ``<home>/spark/reader-token``; with ``create``, generated there first if missing (mode
    0600)."""
    return _secret(state_dir(settings) / "reader-token", create)


def _secret(path: Path, create: bool) -> str:
    if not create and not path.is_file():
        raise ServerDown(
            f"no Spark server token at {path}: start the server with `lakehouse spark start`"
        )
    return private_file(path, lambda: secrets.token_urlsafe(32)).strip()


@dataclass(frozen=True)
class Reader:
    """What a reader (a person, a BI tool, dbt) needs to reach the readers' server: the SQL
    endpoint's host, port, user and password, and the Spark Connect address."""

    host: str
    port: int
    user: str
    password: str
    connect_port: int

    @property
    def jdbc_url(self) -> str:
        """The SQL endpoint's JDBC URL (Hive's driver, ``org.apache.hive.jdbc.HiveDriver``)."""
        return f"jdbc:hive2://{self.host}:{self.port}/default"

    @property
    def connect_url(self) -> str:
        """The Spark Connect address with the readers' token (``sc://localhost``: the only host
        Spark's client sends a token to without TLS)."""
        return f"sc://localhost:{self.connect_port}/;token={self.password}"

    def describe(self) -> str:
        """What ``lakehouse spark reader`` prints: one ``name: value`` line each."""
        return "\n".join(
            (
                f"host: {self.host}",
                f"port: {self.port}",
                f"user: {self.user}",
                f"password: {self.password}",
                f"jdbc_url: {self.jdbc_url}",
                f"connect_url: {self.connect_url}",
            )
        )


def reader(settings: Settings) -> Reader:
    """The readers' credential and the addresses of this lakehouse's readers' server (``lakehouse
    spark reader`` prints them). Raises :class:`ServerDown`, saying how to start it, when it is
    not running."""
    current = readers.of(settings).status()
    if not current.running or current.port is None or current.sql_port is None:
        raise ServerDown(current.describe())
    host = current.sql_address or LOOPBACK
    return Reader(
        host=LOOPBACK if host == "0.0.0.0" else host,
        port=current.sql_port,
        user=readers.READER_USER,
        password=reader_token(settings),
        connect_port=current.port,
    )


@dataclass(frozen=True)
class Status:
    """What ``lakehouse spark status`` reports: the pipeline's server, and its readers'."""

    running: bool
    port: int
    master: str | None = None
    pid: int | None = None
    started_at: str | None = None
    log: str | None = None
    catalog_port: int | None = None
    readers: readers.Status | None = None
    warmup: str | None = None  # how far its warm-up is (lakehouse.runtime.warmup)

    def describe(self, *, already: bool = False) -> str:
        if not self.running:
            return (
                f"Spark server: not running (port {self.port}); start it with "
                "`lakehouse spark start`"
            )
        catalog = (
            f", readers' catalog on {LOOPBACK}:{self.catalog_port}" if self.catalog_port else ""
        )
        line = (
            f"Spark server: {'already ' if already else ''}running, pid {self.pid}, "
            f"sc://localhost:{self.port}{catalog}, master {self.master}, since "
            f"{self.started_at} (log: {self.log})"
        )
        if self.warmup:
            line = f"{line}\n  {self.warmup}"
        return line if self.readers is None else f"{line}\n{self.readers.describe(already=already)}"


def catalog_served() -> bool:
    """Whether the server serves a catalog to the readers' server: with a metastore."""
    return metastore.kind() != "none"


class SparkServer(LocalServer[Status]):
    """The pipeline's Spark server of ``settings``' lakehouse, kept in ``<home>/spark``."""

    NAME = "Spark server"
    COMMAND = "spark"
    LOG = "server.out"
    START_TIMEOUT_S = START_TIMEOUT_S
    ERROR = ServerError

    def __init__(self, settings: Settings) -> None:
        super().__init__(state_dir(settings))
        self.settings = settings
        self._service: subprocess.Popen[bytes] | None = None

    PORTS = (CONNECT_PORT,)

    def ports(self) -> dict[str, int]:
        """The Connect port, and the readers' catalog's when there is a metastore: the one
        ``LAKEHOUSE_CATALOG_PORT`` names, else a free one chosen at each start (the readers'
        server reads it from this server's record)."""
        ports = super().ports()
        if catalog_served():
            ports["catalog_port"] = (
                CATALOG_PORT.value() if os.environ.get(CATALOG_PORT_ENV) else free_port(LOOPBACK)
            )
        return ports

    def answering(self, record: Mapping[str, object]) -> bool:
        service = record.get("validation_pid")
        if isinstance(service, int) and not alive(service):
            raise ServerError(
                f"the validation service exited while the server started; its log "
                f"({self.root / 'gx.log'}) ends with:\n{tail(self.root / 'gx.log')}"
            )
        ports = [record.get("port"), record.get("catalog_port")]
        listening = all(isinstance(at, int) and answers(LOOPBACK, at) for at in ports if at)
        return listening and socket_answers(validation_socket(self.settings))

    def prepare(self, ports: Mapping[str, int]) -> None:
        check_environment(os.environ)
        from lakehouse.runtime.process import ensure_java

        ensure_java()
        objectstore.check_reachable(self.settings.data_root)
        metastore.prepare(self.settings)
        token(self.settings, create=True)
        reader_token(self.settings, create=True)
        # Great Expectations' validation service: it imports GX while the JVM starts; stop()
        # ends it with the server.
        self._service = spawn_validation_service(self.settings)

    def launch(self, ports: Mapping[str, int]) -> Launch:
        import pyspark

        conf = server_conf(self.settings, ports["port"], ports.get("catalog_port"))
        options = (
            f"-Dlog4j2.configurationFile=file:{log_config(self.root)} "
            f"{metastore.java_options(self.settings)}"
        ).strip()
        assert self._service is not None
        return Launch(
            server_main_argv(conf, options, MODE),
            env={
                # No token in the server's environment (a client's own may hold one): it reads
                # its token from its standard input, and its sessions' code could read its
                # environment.
                **{k: v for k, v in os.environ.items() if k != TOKEN_ENV},
                "SPARK_HOME": str(Path(pyspark.__file__).parent),
                # Spark's own addresses on the loopback interface, not the first it finds.
                "SPARK_LOCAL_IP": LOOPBACK,
                # Spark Connect runs Python work (UDFs, mapInArrow) with this interpreter, which
                # has the platform's package; it reads this variable, not spark.pyspark.python.
                "PYSPARK_PYTHON": sys.executable,
                "PYSPARK_DRIVER_PYTHON": sys.executable,
            },
            stdin=f"{token(self.settings)}\n",
            record={
                "validation_pid": self._service.pid,
                "master": self.settings.spark_master,
                "data": str(self.settings.data_root),
            },
        )

    def make_status(self, record: Mapping[str, object] | None) -> Status:
        if record is None:
            at = self.record().get("port")
            return Status(False, at if isinstance(at, int) else port())
        catalog = record.get("catalog_port")
        return Status(
            True,
            int(str(record["port"])),
            master=str(record.get("master")),
            pid=int(str(record["pid"])),
            started_at=str(record.get("started_at")),
            log=str(self.root / "server.log"),
            catalog_port=catalog if isinstance(catalog, int) else None,
        )

    def running_record(self) -> dict[str, object] | None:
        rec = self.record()
        pid = rec.get("pid")
        # The Connect port answering is the server; the catalog's answers with it.
        if not isinstance(pid, int) or not alive(pid):
            return None
        at = rec.get("port")
        return rec if isinstance(at, int) and answers(LOOPBACK, at) else None

    def stop(self, *, timeout: float | None = None) -> bool:
        """Stop the server, its Python workers and its validation service; False if no server
        was running. A service whose JVM died alone (kill -9, out of memory) is ended too:
        otherwise it outlives every server, and a new start spawns another beside it. A warm-up
        still running is ended first: a client that saw its server die would say it failed."""
        warmup.stop(self.settings)
        rec = self.record()
        pid, service = rec.get("pid"), rec.get("validation_pid")
        if self._service is not None and self._service.poll() is None:
            service = self._service.pid
        leaders = [pid] if isinstance(pid, int) and alive(pid) else []
        running = bool(leaders)
        if isinstance(service, int) and _is_service(service):
            leaders.append(service)
        family = [m for p in leaders for m in (p, *_descendants(p))]
        for leader in leaders:  # each one's process group: the children it forked too
            with contextlib.suppress(ProcessLookupError):
                os.killpg(leader, signal.SIGTERM)
        deadline = time.monotonic() + (30.0 if timeout is None else timeout)
        while time.monotonic() < deadline and any(alive(p) for p in leaders):
            time.sleep(0.2)
        for member in family:
            with contextlib.suppress(ProcessLookupError):
                os.kill(member, signal.SIGKILL)
        self._service = None
        self.state.unlink(missing_ok=True)
        validation_socket(self.settings).unlink(missing_ok=True)
        return running

    def log_end(self, *logs: Path) -> str:
        return super().log_end(self.root / "server.log", *logs)


def status(settings: Settings) -> Status:
    """Whether this lakehouse's server is up (its recorded process alive, its port answering),
    with its readers' server's status."""
    current = SparkServer(settings).status()
    if not current.running:
        return current
    warming = warmup.state(settings)
    return Status(
        **{
            **current.__dict__,
            "readers": readers.of(settings).status(),
            "warmup": warming.describe(settings) if warming else None,
        },
    )


def start(
    settings: Settings,
    *,
    only: str | None = None,
    timeout: float = START_TIMEOUT_S,
    sql_check: bool = True,
) -> Status:
    """Start the pipeline's server unless it runs, then the readers' server (``only``: one of
    the two, ``pipeline`` or ``readers``); return once each accepts connections. Raises
    :class:`ServerError` (or the readers' server's error) with the end of its log if one exits
    or does not listen in time; a readers' server that cannot start stops the pipeline's server
    that this call started. A pipeline's server this call started is then warmed as
    ``LAKEHOUSE_SPARK_WARMUP`` says (:mod:`lakehouse.runtime.warmup`). ``sql_check=False`` starts the readers' server without its SQL-level
    check (for the tests that show the layers below it hold alone)."""
    if only not in (None, "pipeline", "readers"):
        raise ConfigError(f"lakehouse spark --only {only}: expected pipeline or readers")
    warmup.mode()  # refused before anything starts
    pipeline = SparkServer(settings)
    started_here = False
    if only != "readers":
        started_here = pipeline.running_record() is None
        pipeline.start(timeout=timeout)
    if only != "pipeline":
        try:
            readers.ReadersServer(
                settings,
                catalog_port=_catalog_port(settings),
                token=reader_token(settings, create=True),
                sql_check=sql_check,
            ).start(timeout=timeout)
        except BaseException:
            if started_here:
                pipeline.stop()
            raise
    if started_here:
        # Once both answer, so the warm-up does not slow the readers' start.
        warmup.start(settings)
    return status(settings)


def _catalog_port(settings: Settings) -> int | None:
    """Where the readers' server reads the catalog: the port this lakehouse's pipeline server
    recorded, else ``LAKEHOUSE_CATALOG_PORT`` (a pipeline server in another container); None
    without a metastore."""
    if not catalog_served():
        return None
    recorded = SparkServer(settings).running_record()
    if recorded is not None and isinstance(recorded.get("catalog_port"), int):
        return int(str(recorded["catalog_port"]))
    if os.environ.get(CATALOG_PORT_ENV):
        return CATALOG_PORT.value()
    raise ServerDown(
        "the readers' server reads the tables' names from the pipeline's Spark server, which "
        f"is not running here: start it (`lakehouse spark start`), or set {CATALOG_PORT_ENV} to "
        "the port where it serves them"
    )


def stop(settings: Settings, *, only: str | None = None, timeout: float = 30.0) -> bool:
    """Stop the readers' server and the pipeline's server (``only``: one of them); False if the
    one asked for (the pipeline's, unless ``only`` is ``readers``) was not running."""
    stopped_readers = readers.of(settings).stop() if only != "pipeline" else False
    if only == "readers":
        return stopped_readers
    return SparkServer(settings).stop(timeout=timeout)


def server_conf(settings: Settings, at: int, catalog_at: int | None = None) -> dict[str, str]:
    """Every setting the pipeline's server starts with: the platform's
    (:func:`lakehouse.runtime.spark.spark_conf`), the Connect service's (on ``at``, its
    credential), the readers' catalog's (on ``catalog_at``; none when None), every listener on
    the loopback address, and the metastore's."""
    from lakehouse.runtime import jvm
    from lakehouse.runtime.config import whole_number_setting
    from lakehouse.runtime.spark import adaptive_conf, event_log_conf, merged, spark_conf

    conf = spark_conf(settings.spark_master, "lakehouse-spark-server")
    conf |= adaptive_conf() | event_log_conf()
    idle = whole_number_setting(PYTHON_IDLE_ENV, DEFAULT_PYTHON_IDLE_S, "seconds", least=1)
    served = merged(
        conf,
        {
            "spark.connect.grpc.binding.address": LOOPBACK,
            "spark.connect.grpc.binding.port": str(at),
            "spark.driver.bindAddress": LOOPBACK,
            "spark.driver.host": LOOPBACK,
            # Spark forks each Connect session's Python workers from a daemon of the session's own
            # and stops none until the server stops (SPARK-54055): every client session that ran
            # Python work left one behind, 37 MiB each. No setting of Spark's ends it:
            # spark.python.worker.idleTimeoutSeconds and killOnIdleTimeout watch a worker running a
            # task (a kill fails the task), spark.python.factory.idleWorkerMaxPoolSize bounds a
            # session's idle workers, not its daemon. Without daemons (spark.python.use.daemon
            # false) every Python task starts an interpreter and imports its modules anew:
            # `lakehouse run` took 2 to 3 times as long. So the server runs Spark's daemon with an
            # end (lakehouse.runtime.pydaemon), and workers are still reused within a session.
            "spark.python.daemon.module": "lakehouse.runtime.pydaemon",
            # (A cluster's executors run daemons too; in local mode the server's environment has it.)
            f"spark.executorEnv.{PYTHON_IDLE_ENV}": str(idle),
            # The readers' warehouse (their schemas' default folder, which the catalog makes),
            # the pipeline's schemas and the lake's folders, for the readers' catalog's check:
            # static settings, which no session can change.
            "spark.sql.warehouse.dir": str(metastore.folder(settings) / "warehouse"),
            "spark.lakehouse.pipelineSchemas": ",".join(metastore.PIPELINE_SCHEMAS),
            "spark.lakehouse.lakeFolders": ",".join(map(str, lake_folders(settings))),
            # The server's code (its main class, its Connect credential, the readers' catalog),
            # and the platform's jars (Delta ...) on the class path the JVM starts with, not only
            # in spark.jars.
            "spark.driver.extraClassPath": os.pathsep.join(
                (str(jvm.server_jar()), *map(str, jvm.spark_jars()))
            ),
            "spark.connect.grpc.interceptor.classes": INTERCEPTOR_CLASS,
            **({"spark.lakehouse.catalog.port": str(catalog_at)} if catalog_at else {}),
        },
    )
    # The server is the process that keeps the lakehouse's table names: every table it creates
    # is registered in the metastore (lakehouse.storage.metastore). (Merged on its own: its class
    # path joins the one above.)
    return merged(served, metastore.metastore_conf(settings))


def lake_folders(settings: Settings) -> tuple[Location, ...]:
    """The lake's folders of data (landing, tables, the schema registry, the quality ledger):
    readers read there and never write. The lakehouse's home beside them (its tokens, its
    metastore) is not data, even when the data lies in the home."""
    return (
        settings.landing_root,
        settings.tables_root,
        settings.registry_path,
        settings.ledger_path,
    )


def command(settings: Settings, at: int, catalog_at: int | None = None) -> list[str]:
    """The ``spark-submit`` that runs the pipeline's server (its token goes to its standard
    input)."""
    options = (
        f"-Dlog4j2.configurationFile=file:{log_config(state_dir(settings))} "
        f"{metastore.java_options(settings)}"
    ).strip()
    return server_main_argv(server_conf(settings, at, catalog_at), options, MODE)


def _is_service(pid: object) -> bool:
    """Whether ``pid`` is a running validation service: a recorded pid can since have been
    reused by an unrelated process, which is left alone."""
    if not isinstance(pid, int) or not alive(pid):
        return False
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return SERVICE_MODULE.encode() in argv


def _descendants(pid: int) -> list[int]:
    """``pid``'s descendant processes (Python workers leave the server's process group)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def remote(settings: Settings, at: int) -> str:
    """The Connect address of this lakehouse's server on port ``at``, token included
    (``sc://localhost``: the only host Spark's client sends a token to without TLS)."""
    return f"sc://localhost:{at}/;token={token(settings)}"


def connect(settings: Settings) -> SparkSession:
    """A Spark Connect session on this lakehouse's server. Raises :class:`ServerDown`, saying how
    to start it, when no server answers, and from any call of the session once the server
    process it connected to has died (instead of the client's minutes of retries)."""
    from pyspark.sql import SparkSession

    pipeline = SparkServer(settings)
    current = pipeline.status()
    if not current.running or current.pid is None:
        raise ServerDown(current.describe())
    serves = pipeline.record().get("data")
    if serves is not None and serves != str(settings.data_root):
        raise ServerError(
            f"the Spark server at port {current.port} was started for the data at {serves}, and "
            f"this process's is at {settings.data_root} (LAKEHOUSE_DATA): restart the server with "
            "this process's settings (`lakehouse spark stop`, then `lakehouse spark start`)"
        )
    spark = SparkSession.builder.remote(remote(settings, current.port)).getOrCreate()
    client = spark.client  # a Connect session's
    client.set_retry_policies([_while_alive(current.pid, current.port)])
    return spark


def _while_alive(pid: int, at: int) -> RetryPolicy:
    """Spark's retry policy of its Connect client, which retries an unavailable server for at
    least 10 minutes (its connection drops while the server is busy or its network hiccups),
    held to the life of the server process: once that process is dead (crashed, killed, or
    restarted as another process, which knows nothing of this session), a call that fails
    raises :class:`ServerDown` at once, whatever gRPC status the broken call ended with."""
    import grpc
    from pyspark.sql.connect.client.retries import DefaultPolicy

    class WhileAlive(DefaultPolicy):
        def can_retry(self, e: BaseException) -> bool:
            if isinstance(e, grpc.RpcError) and not alive(pid):
                raise ServerDown(
                    f"the Spark server (pid {pid}, sc://localhost:{at}) went down while this "
                    "client used it: start it again with `lakehouse spark start`, then rerun"
                ) from e
            return super().can_retry(e)

    return WhileAlive()


def connect_to(url: str, host: str, at: int) -> SparkSession:
    """A Spark Connect session at ``url`` (an Airflow connection's: a server this process may
    not be able to watch), held to ``host:at`` answering (:func:`hold_to_address`)."""
    from pyspark.sql import SparkSession

    spark = SparkSession.builder.remote(url).getOrCreate()
    hold_to_address(spark, host, at)
    return spark


def hold_to_address(spark: SparkSession, host: str, at: int) -> None:
    """Hold a Connect session's retries to its server's port answering (for a server that may
    be on another machine, where its process cannot be watched, e.g. an Airflow connection's):
    once nothing accepts connections at ``host:at``, a call that fails raises
    :class:`ServerDown` at once instead of retrying for minutes."""
    spark.client.set_retry_policies([_while_answering(host, at)])


def _while_answering(host: str, at: int) -> RetryPolicy:
    import grpc
    from pyspark.sql.connect.client.retries import DefaultPolicy

    class WhileAnswering(DefaultPolicy):
        def can_retry(self, e: BaseException) -> bool:
            if isinstance(e, grpc.RpcError) and not answers(host, at, timeout=2.0):
                raise ServerDown(
                    f"the Spark server at {host}:{at} went down while this client used it: "
                    "start it again (`lakehouse spark start`), then rerun"
                ) from e
            return super().can_retry(e)

    return WhileAnswering()


def run(settings: Settings, *, only: str | None = None, poll: float = 1.0) -> int:
    """``lakehouse spark run``: start the servers (``only``: one of them) and stay in the
    foreground, as a service manager or a container wants it, until the pipeline's server ends
    (or, with ``only`` readers, the readers' server; exit status 1, the end of its log on
    stderr) or this process is told to stop (SIGTERM, SIGINT: the servers are stopped whole,
    exit status 0). A readers' server that ends beside a running pipeline's server is started
    again (at most once a minute): readers never stop the pipeline."""
    asked: list[int] = []  # a stop asked for while it starts is taken once it has started
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, _frame: asked.append(signum))
    start(settings, only=only)
    reading = readers.of(settings)
    print(status(settings).describe() if only != "readers" else reading.status().describe())
    main_server: LocalServer[Any] = reading if only == "readers" else SparkServer(settings)
    pid = main_server.record().get("pid")
    restarted = 0.0
    while not asked and isinstance(pid, int) and alive(pid):
        # (Its supervisor's pid: while it lives, it starts the JVM again itself.)
        supervisor = reading.record().get("pid")
        gone = not (isinstance(supervisor, int) and alive(supervisor))
        if only is None and gone and time.monotonic() - restarted > 60:
            restarted = time.monotonic()
            print(f"{reading.NAME}: ended; {reading.log_end()}; starting it again", file=sys.stderr)
            with contextlib.suppress(LakehouseError):
                start(settings, only="readers")
        time.sleep(poll)
    stop(settings, only=only)
    if asked:
        print(f"Spark server: stopped ({signal.Signals(asked[0]).name})", flush=True)
        return 0
    print(f"{main_server.NAME}: ended by itself; {main_server.log_end()}", file=sys.stderr)
    return 1


def session(settings: Settings, app_name: str) -> SparkSession:
    """A session for a command (``lakehouse run``, ``refresh``, ...): on this lakehouse's Spark
    server when it runs (`lakehouse spark start`), with no JVM to start; otherwise a Spark of
    this process's own, whose log goes to a file (:func:`lakehouse.runtime.spark.session_log`),
    not to the terminal. Says on stderr which."""
    from lakehouse.runtime.spark import get_session, session_log

    now = status(settings)
    if now.running:
        print(f"on the Spark server at sc://localhost:{now.port}", file=sys.stderr)
        return connect(settings)
    log = session_log(settings.home)
    print(f"in a Spark of its own (its log: {log})", file=sys.stderr)
    return get_session(settings.spark_master, app_name=app_name, log=log)


def main(settings: Settings, action: str, only: str | None = None) -> int:
    """``lakehouse spark start | run | stop | status | reader [--only pipeline|readers]``
    (status: exit code 1 when the pipeline's server is down; run: in the foreground, see
    :func:`run`; reader: what a reader needs, see :func:`reader`)."""
    if action == "start":
        already = status(settings).running
        print(start(settings, only=only).describe(already=already))
        return 0
    if action == "run":
        return run(settings, only=only)
    if action == "stop":
        print(
            "Spark server: stopped"
            if stop(settings, only=only)
            else "Spark server: was not running"
        )
        return 0
    if action == "status":
        current = status(settings)
        if only == "readers":
            described = readers.of(settings).status()
            print(described.describe())
            return 0 if described.running else 1
        print(current.describe())
        return 0 if current.running else 1
    if action == "reader":
        print(reader(settings).describe())
        return 0
    raise ConfigError(f"lakehouse spark {action}: expected start, run, stop, status or reader")
