"""The platform's long-lived Spark: one Spark Connect server that holds the JVM, the jars, the
caches and every commit, and the thin clients (Airflow tasks, the CLI) that hand it their work;
in the same JVM, the SQL endpoint for tools (JDBC/ODBC, HiveServer2's protocol; docs/sql.md).

    lakehouse spark start | run | stop | status | reader

The server is the lakehouse's own main class (``include/jvm/server``, compiled at install:
:func:`lakehouse.runtime.jvm.server_jar`), started by pyspark's own ``spark-submit`` with the
platform's Spark settings and JVM jars (:func:`lakehouse.runtime.spark.spark_conf`): it starts the
session, then Spark Connect on it as Spark's ``SparkConnectServer`` does, then Spark's Thrift
server on the same session, so both protocols commit through this one driver. Delta has no
Connect plugin for this Spark line, so clients use Delta through SQL and the DataFrame reader and
writer, which Delta's session extension serves on the server (``MERGE INTO``,
``readChangeFeed``, ``txnAppId`` ...).

* It listens on 127.0.0.1 only: the Connect port, and Spark's own driver and block manager
  ports, which have no authentication of their own.
* Two credentials. The pipeline's token (``<home>/spark/token``) is what the pipeline's clients
  present, and writes. The readers' token (``<home>/spark/reader-token``; ``lakehouse spark
  reader`` prints what a reader needs) reads every table and changes none of the pipeline's: the
  server refuses its writes to the pipeline's schemas and the lake, and the ways around that
  (files outside the lake, Python code, Java reflection, uploaded jars; docs/sql.md). Both are
  generated on the first start, mode 0600, outside the repository. The server reads them from its
  standard input when it starts and keeps their digests only: they are not in its environment,
  where a session's code could read them, nor on a command line. On Spark Connect a client
  presents either as its bearer token (Spark's client sends a token over plain TCP only to the
  host named ``localhost``, so clients connect to ``sc://localhost:<port>``); the SQL endpoint
  logs in the user ``reader`` with the readers' token as password, and no one else.
* Its pid, its settings and its log live under ``<home>/spark/``; ``status`` reads them and
  checks that the process is alive and the port answers. Spark logs to ``server.log`` at WARN
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
* ``LAKEHOUSE_SPARK_MASTER`` chooses local mode (``local[2]``, the default) or a standalone
  cluster (``spark://host:7077``); ``LAKEHOUSE_SPARK_PORT`` the Connect port (default 15002);
  ``LAKEHOUSE_SQL_PORT`` the SQL endpoint's (default 10000) and ``LAKEHOUSE_SQL_ADDRESS`` the
  address it listens on (default 127.0.0.1; compose opens it to the container's network, the host
  publishing it on its loopback).

The server is the platform's single committing driver: Delta's log store excludes concurrent
commits only inside one JVM on a local filesystem, and assumes one driver on S3. The SQL endpoint
is in that JVM, on that driver's session, so a tool's statements commit there too.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from lakehouse.errors import ConfigError, LakehouseError
from lakehouse.runtime import metastore, objectstore
from lakehouse.runtime.config import Settings
from lakehouse.runtime.deployment import check_environment
from lakehouse.runtime.objectstore import Location
from lakehouse.runtime.process import (
    alive,
    answers,
    port_setting,
    private_file,
    read_record,
    socket_answers,
    tail,
    write_record,
)
from lakehouse.runtime.pydaemon import DEFAULT_PYTHON_IDLE_S, PYTHON_IDLE_ENV

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.connect.client.retries import RetryPolicy

SERVER_CLASS = "lakehouse.server.LakehouseServer"  # include/jvm/server
# The server's credentials on Spark Connect, and the check that holds the readers' to reading
# (both in include/jvm/server).
INTERCEPTOR_CLASS = "lakehouse.server.TokenInterceptor"
EXTENSION_CLASS = "lakehouse.server.ReadOnlyExtension"
PORT_ENV = "LAKEHOUSE_SPARK_PORT"
DEFAULT_PORT = 15002
SQL_PORT_ENV = "LAKEHOUSE_SQL_PORT"
DEFAULT_SQL_PORT = 10000
SQL_ADDRESS_ENV = "LAKEHOUSE_SQL_ADDRESS"
READER_USER = "reader"  # the SQL endpoint's one user (the readers' token is its password)
# Where Spark's client (and Spark's own Connect server) look for a token: never in this server's
# environment, which gets its tokens on its standard input.
TOKEN_ENV = "SPARK_CONNECT_AUTHENTICATE_TOKEN"
LOOPBACK = "127.0.0.1"
# The server's setting naming the lake's folders of data for the readers' check (lake_folders).
LAKE_FOLDERS_CONF = "spark.lakehouse.lakeFolders"
START_TIMEOUT_S = 180.0
SERVICE_MODULE = "lakehouse.quality.gx_service"  # the validation service, run with python -m
LOG_LEVEL_ENV, LOG_SIZE_ENV, LOG_FILES_ENV = (
    "LAKEHOUSE_SPARK_LOG_LEVEL",
    "LAKEHOUSE_SPARK_LOG_SIZE",
    "LAKEHOUSE_SPARK_LOG_FILES",
)
LOG_LEVELS = ("TRACE", "DEBUG", "INFO", "WARN", "ERROR", "FATAL", "OFF")
# Log4j 2 for the server's JVM (Spark's own default is INFO to the console: a line per task of
# every query, megabytes an hour): one rolling file.
_LOG4J2 = """\
appender.file.type = RollingFile
appender.file.name = file
appender.file.fileName = {log}
appender.file.filePattern = {log}.%i
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = %d{{yy/MM/dd HH:mm:ss}} %p %c{{1}}: %m%n%ex
appender.file.policies.type = Policies
appender.file.policies.size.type = SizeBasedTriggeringPolicy
appender.file.policies.size.size = {size}
appender.file.strategy.type = DefaultRolloverStrategy
appender.file.strategy.max = {files}
rootLogger.level = {level}
rootLogger.appenderRef.file.ref = file
"""


class ServerError(LakehouseError):
    """The Spark server could not be started, stopped or reached."""


class ServerDown(ServerError):
    """No Spark server answers: the message says how to start one."""


def port() -> int:
    """The Connect port (``LAKEHOUSE_SPARK_PORT``, default 15002); anything but a port number
    is a ConfigError naming the variable."""
    return port_setting(PORT_ENV, DEFAULT_PORT)


def sql_port() -> int:
    """The SQL endpoint's port (``LAKEHOUSE_SQL_PORT``, default 10000); anything but a port
    number is a ConfigError naming the variable."""
    return port_setting(SQL_PORT_ENV, DEFAULT_SQL_PORT)


def sql_address() -> str:
    """The address the SQL endpoint listens on (``LAKEHOUSE_SQL_ADDRESS``, default 127.0.0.1);
    anything but an IP address is a ConfigError naming the variable."""
    import ipaddress

    raw = os.environ.get(SQL_ADDRESS_ENV, "").strip() or LOOPBACK
    try:
        return str(ipaddress.ip_address(raw))
    except ValueError:
        raise ConfigError(
            f"{SQL_ADDRESS_ENV}={raw!r}: expected an IP address to listen on (127.0.0.1, the "
            "default, or 0.0.0.0 for every interface)"
        ) from None


def state_dir(settings: Settings) -> Path:
    """Where the server keeps its pid, settings, log and token: local state, never data."""
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
    """The readers' token, which reads every table and changes none of the pipeline's: read from
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
    """What a reader (a person, a BI tool, dbt) needs to reach the server with the readers'
    credential: the SQL endpoint's host, port, user and password, and the Spark Connect
    address."""

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
    """The readers' credential and addresses of this lakehouse's running server (``lakehouse
    spark reader`` prints them). Raises :class:`ServerDown`, saying how to start it, when the
    server is not running."""
    current = status(settings)
    if not current.running:
        raise ServerDown(current.describe())
    host = current.sql_address or LOOPBACK
    return Reader(
        host=LOOPBACK if host == "0.0.0.0" else host,
        port=current.sql_port or sql_port(),
        user=READER_USER,
        password=reader_token(settings),
        connect_port=current.port,
    )


@dataclass(frozen=True)
class Status:
    """What ``lakehouse spark status`` reports."""

    running: bool
    port: int
    master: str | None = None
    pid: int | None = None
    started_at: str | None = None
    log: str | None = None
    sql_port: int | None = None
    sql_address: str | None = None

    def describe(self) -> str:
        if not self.running:
            return (
                f"Spark server: not running (port {self.port}); start it with "
                "`lakehouse spark start`"
            )
        sql = (
            f", SQL endpoint jdbc:hive2://{self.sql_address}:{self.sql_port}/default"
            if self.sql_port
            else ""
        )
        return (
            f"Spark server: running, pid {self.pid}, sc://localhost:{self.port}{sql}, master "
            f"{self.master}, since {self.started_at} (log: {self.log})"
        )


def _recorded(settings: Settings) -> dict[str, object]:
    return read_record(state_dir(settings) / "server.json")


def status(settings: Settings) -> Status:
    """Whether this lakehouse's server is up: its recorded process is alive and its port
    answers."""
    rec = _recorded(settings)
    recorded_port, pid = rec.get("port"), rec.get("pid")
    at = recorded_port if isinstance(recorded_port, int) else port()
    if not isinstance(pid, int) or not alive(pid) or not answers(LOOPBACK, at):
        return Status(False, at)
    sql_at, sql_host = rec.get("sql_port"), rec.get("sql_address")
    return Status(
        True,
        at,
        master=str(rec.get("master")),
        pid=pid,
        started_at=str(rec.get("started_at")),
        log=str(state_dir(settings) / "server.log"),
        sql_port=sql_at if isinstance(sql_at, int) else None,
        sql_address=str(sql_host) if sql_host else None,
    )


def server_conf(settings: Settings, at: int, sql_at: int | None = None) -> dict[str, str]:
    """Every setting the server starts with: the platform's
    (:func:`lakehouse.runtime.spark.spark_conf`), the Connect service's and the SQL endpoint's
    (on ``sql_at``, by default :func:`sql_port`), every listener on the loopback address but the
    SQL endpoint's (:func:`sql_address`), and the readers' check's (its classes, the lake's
    folders, the warehouse and the pipeline's schemas)."""
    from lakehouse.runtime import jvm
    from lakehouse.runtime.config import whole_number_setting
    from lakehouse.runtime.spark import DELTA_CONF, merged, spark_conf

    conf = spark_conf(settings.spark_master, "lakehouse-spark-server")
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
            # Readers' tables go to the metastore's warehouse, under the lakehouse's home (also
            # with LAKEHOUSE_METASTORE=none), and the readers' check reads the warehouse, the
            # pipeline's schemas and the lake's folders from these static settings, which no
            # session can change.
            "spark.sql.warehouse.dir": str(metastore.folder(settings) / "warehouse"),
            "spark.lakehouse.pipelineSchemas": ",".join(metastore.PIPELINE_SCHEMAS),
            LAKE_FOLDERS_CONF: ",".join(map(str, lake_folders(settings))),
            # The server's code (its main class, its Connect credentials, the readers' check),
            # and the platform's jars (Delta ...) on the class path the JVM starts with, not only
            # in spark.jars: the SQL endpoint opens its sessions on threads whose class loader is
            # that one, and a session needs Delta's catalog.
            "spark.driver.extraClassPath": os.pathsep.join(
                (str(jvm.server_jar()), *map(str, jvm.spark_jars()))
            ),
            "spark.connect.grpc.interceptor.classes": INTERCEPTOR_CLASS,
            "spark.sql.extensions": f"{DELTA_CONF['spark.sql.extensions']},{EXTENSION_CLASS}",
            # The SQL endpoint (Spark's Thrift server, HiveServer2's binary protocol): SASL PLAIN
            # logins checked by the server's code (the readers' token; its main class names the
            # login class), as the server's own user.
            "spark.hadoop.hive.server2.thrift.bind.host": sql_address(),
            "spark.hadoop.hive.server2.thrift.port": str(sql_port() if sql_at is None else sql_at),
            "spark.hadoop.hive.server2.transport.mode": "binary",
            "spark.hadoop.hive.server2.authentication": "CUSTOM",
            "spark.hadoop.hive.server2.enable.doAs": "false",
        },
    )
    # The server is the process that keeps the lakehouse's table names: every table it creates
    # is registered in the metastore (lakehouse.storage.metastore). (Merged on its own: its class
    # path joins the one above.)
    return merged(served, metastore.metastore_conf(settings))


def lake_folders(settings: Settings) -> tuple[Location, ...]:
    """The lake's folders of data (landing, tables, the schema registry, the quality ledger):
    readers read there and never write (the SQL endpoint's and Connect's readers' check,
    :data:`LAKE_FOLDERS_CONF`). The lakehouse's home beside them (its tokens, its metastore) is
    not data, even when the data lies in the home."""
    return (
        settings.landing_root,
        settings.tables_root,
        settings.registry_path,
        settings.ledger_path,
    )


def log_config(settings: Settings) -> Path:
    """Write the server's Log4j 2 settings (see the module docstring) and return their file;
    a level or size that is not one is a ConfigError naming its variable."""
    from lakehouse.runtime.config import whole_number_setting

    level = os.environ.get(LOG_LEVEL_ENV, "WARN").strip().upper()
    if level not in LOG_LEVELS:
        raise ConfigError(f"{LOG_LEVEL_ENV}={level!r}: expected one of {', '.join(LOG_LEVELS)}")
    size = os.environ.get(LOG_SIZE_ENV, "10MB").strip().upper().replace(" ", "")
    if not re.fullmatch(r"\d+(KB|MB|GB)", size):
        raise ConfigError(f"{LOG_SIZE_ENV}={size!r}: a size such as 500KB, 10MB or 1GB")
    files = whole_number_setting(LOG_FILES_ENV, 5, "old log files", least=1)
    folder = state_dir(settings)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "log4j2.properties"
    text = _LOG4J2.format(log=folder / "server.log", size=size, files=files, level=level)
    path.write_text(text, encoding="utf-8")
    return path


def command(settings: Settings, at: int, sql_at: int | None = None) -> list[str]:
    """The ``spark-submit`` that runs the server (its tokens go to its standard input)."""
    import pyspark

    from lakehouse.runtime.spark import conf_args

    submit = Path(pyspark.__file__).parent / "bin" / "spark-submit"
    conf = server_conf(settings, at, sql_at)
    master = conf.pop("spark.master")
    name = conf.pop("spark.app.name")
    memory = conf.pop("spark.driver.memory")
    return [
        str(submit),
        "--class",
        SERVER_CLASS,
        "--master",
        master,
        "--name",
        name,
        "--driver-memory",
        memory,
        "--driver-java-options",
        f"-Dlog4j2.configurationFile=file:{log_config(settings)} {metastore.java_options(settings)}".strip(),
        *conf_args(conf),
        "spark-internal",
    ]


def start(settings: Settings, *, timeout: float = START_TIMEOUT_S) -> Status:
    """Start the server unless it runs; return once it accepts connections. Raises
    :class:`ServerError` with the end of its log if it exits or does not listen in time."""
    import pyspark

    from lakehouse.runtime.process import ensure_java

    current = status(settings)
    if current.running:
        return current
    recorded = _recorded(settings).get("pid")
    if not isinstance(recorded, int) or not alive(recorded):
        stop(settings)  # what a dead server left: its validation service, its socket
    at, sql_at = port(), sql_port()
    for taken, variable in ((at, PORT_ENV), (sql_at, SQL_PORT_ENV)):
        if answers(LOOPBACK, taken):
            raise ServerError(
                f"port {taken} on {LOOPBACK} is taken by another process: stop it, or choose "
                f"another port with {variable}"
            )
    check_environment(os.environ)
    ensure_java()
    objectstore.check_reachable(settings.data_root)
    metastore.prepare(settings)
    folder = state_dir(settings)
    folder.mkdir(parents=True, exist_ok=True)
    secrets_in = f"{token(settings, create=True)}\n{reader_token(settings, create=True)}\n"
    spark_home = Path(pyspark.__file__).parent
    env = {
        # No token in the server's environment (a client's own may hold one): the server reads
        # them from its standard input, and its sessions' code could read its environment.
        **{k: v for k, v in os.environ.items() if k != TOKEN_ENV},
        "SPARK_HOME": str(spark_home),
        # Spark Connect runs Python work (UDFs, mapInArrow) with this interpreter, which has the
        # platform's package; it reads this variable, not spark.pyspark.python.
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
    }
    log_path, out_path = folder / "server.log", folder / "server.out"
    with out_path.open("ab") as log:
        log.write(f"\n--- starting at {time.strftime('%Y-%m-%dT%H:%M:%S%z')}\n".encode())
        log.flush()
        proc = subprocess.Popen(
            command(settings, at, sql_at),
            env=env,
            stdin=subprocess.PIPE,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: stop() ends it whole
            cwd=folder,
        )
    assert proc.stdin is not None
    try:
        with proc.stdin:
            proc.stdin.write(secrets_in.encode())
    except BrokenPipeError:
        pass  # it exited at once: the wait below reports it with its log
    # Great Expectations' validation service: it imports GX while the JVM starts, and stop()
    # ends it with the server.
    try:
        service = spawn_validation_service(settings)
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)  # no server without its service
        raise
    record = {
        "pid": proc.pid,
        "validation_pid": service.pid,
        "port": at,
        "sql_port": sql_at,
        "sql_address": sql_address(),
        "master": settings.spark_master,
        "data": str(settings.data_root),
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    write_record(folder / "server.json", record)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(service.pid, signal.SIGTERM)
            raise ServerError(
                f"the Spark server exited with code {proc.returncode} while starting; "
                + _logs_end(log_path, out_path)
            )
        if service.poll() is not None:
            stop(settings)
            service_log = state_dir(settings) / "gx.log"
            raise ServerError(
                f"the validation service exited with code {service.returncode} while starting; "
                f"its log ({service_log}) ends with:\n{tail(service_log)}"
            )
        if (
            answers(LOOPBACK, at)
            and answers(LOOPBACK, sql_at)
            and socket_answers(validation_socket(settings))
        ):
            return status(settings)
        time.sleep(0.25)
    stop(settings)
    raise ServerError(
        f"the Spark server did not listen on ports {at} (Connect) and {sql_at} (SQL) within "
        f"{timeout:.0f} s; " + _logs_end(log_path, out_path)
    )


def _logs_end(*logs: Path) -> str:
    """The end of each of the server's logs that has anything, for an error message."""
    ends = [f"{log} ends with:\n{tail(log)}" for log in logs if log.is_file() and tail(log).strip()]
    return "; ".join(ends) or f"its logs ({', '.join(map(str, logs))}) are empty"


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


def stop(settings: Settings, *, timeout: float = 30.0) -> bool:
    """Stop the server, its Python workers and its validation service; False if no server was
    running. A service whose JVM died alone (kill -9, out of memory) is ended too: otherwise it
    outlives every server, and a new start spawns another beside it."""
    rec = _recorded(settings)
    pid, service = rec.get("pid"), rec.get("validation_pid")
    leaders = [pid] if isinstance(pid, int) and alive(pid) else []
    running = bool(leaders)
    if isinstance(service, int) and _is_service(service):
        leaders.append(service)
    family = [m for p in leaders for m in (p, *_descendants(p))]
    for leader in leaders:  # each one's process group: the children it forked too
        with contextlib.suppress(ProcessLookupError):
            os.killpg(leader, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(alive(p) for p in leaders):
        time.sleep(0.2)
    for member in family:
        with contextlib.suppress(ProcessLookupError):
            os.kill(member, signal.SIGKILL)
    (state_dir(settings) / "server.json").unlink(missing_ok=True)
    (state_dir(settings) / "gx.sock").unlink(missing_ok=True)
    return running


def remote(settings: Settings, at: int) -> str:
    """The Connect address of this lakehouse's server on port ``at``, token included
    (``sc://localhost``: the only host Spark's client sends a token to without TLS)."""
    return f"sc://localhost:{at}/;token={token(settings)}"


def connect(settings: Settings) -> SparkSession:
    """A Spark Connect session on this lakehouse's server. Raises :class:`ServerDown`, saying how
    to start it, when no server answers, and from any call of the session once the server
    process it connected to has died (instead of the client's minutes of retries)."""
    from pyspark.sql import SparkSession

    current = status(settings)
    if not current.running or current.pid is None:
        raise ServerDown(current.describe())
    serves = _recorded(settings).get("data")
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


def run(settings: Settings, *, poll: float = 1.0) -> int:
    """``lakehouse spark run``: start the server and stay in the foreground, as a service
    manager or a container wants it, until the server ends (exit status 1, the end of its log
    on stderr) or this process is told to stop (SIGTERM, SIGINT: the server is stopped whole,
    exit status 0)."""
    asked: list[int] = []  # a stop asked for while it starts is taken once it has started
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, _frame: asked.append(signum))
    started = start(settings)
    print(started.describe(), flush=True)
    while not asked and started.pid is not None and alive(started.pid):
        time.sleep(poll)
    stop(settings)
    if asked:
        print(f"Spark server: stopped ({signal.Signals(asked[0]).name})", flush=True)
        return 0
    folder = state_dir(settings)
    print(
        f"Spark server: ended by itself; {_logs_end(folder / 'server.log', folder / 'server.out')}",
        file=sys.stderr,
    )
    return 1


def main(settings: Settings, action: str) -> int:
    """``lakehouse spark start | run | stop | status | reader`` (status: exit code 1 when it is
    down; run: in the foreground, see :func:`run`; reader: what a reader needs, see
    :func:`reader`)."""
    if action == "start":
        print(start(settings).describe())
        return 0
    if action == "run":
        return run(settings)
    if action == "stop":
        print("Spark server: stopped" if stop(settings) else "Spark server: was not running")
        return 0
    if action == "status":
        current = status(settings)
        print(current.describe())
        return 0 if current.running else 1
    if action == "reader":
        print(reader(settings).describe())
        return 0
    raise ConfigError(f"lakehouse spark {action}: expected start, run, stop, status or reader")
