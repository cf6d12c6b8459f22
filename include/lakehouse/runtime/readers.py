"""The readers' server: every reader's query (people, BI tools, dbt) in a Spark of its own, apart
from the pipeline's committing driver.

    lakehouse spark start | stop | status | reader      (it starts and stops with the Spark server)

It is the lakehouse's server main class in its ``readers`` mode (``include/jvm/server``), a JVM of
its own with its own heap, started by ``lakehouse spark start`` once the pipeline's server
listens. It serves Spark Connect (``LAKEHOUSE_READERS_PORT``, default 15003) and the SQL endpoint
(HiveServer2's protocol, ``LAKEHOUSE_SQL_PORT``, default 10000), both with the readers' token
only, and reads the tables' names from the catalog the pipeline's server serves
(:mod:`lakehouse.runtime.server`). A reader cannot change a pipeline table, by three layers, each
of which holds when the ones above it are bypassed:

1. **The operating system** (:mod:`lakehouse.runtime.sandbox`, where Linux allows it): the process
   sees the lakehouse's home and the lake's local folders read-only, its own folder and the
   readers' warehouse writable, the tokens and the databases' passwords not at all, and no other
   process; it holds no capability. On S3 the same layer is the readers' credentials:
   ``LAKEHOUSE_READERS_AWS_ACCESS_KEY_ID`` and ``LAKEHOUSE_READERS_AWS_SECRET_ACCESS_KEY`` (and
   ``..._SESSION_TOKEN``) replace the pipeline's in its environment; give it keys whose policy
   allows reading only (docs/sql.md).
2. **The file system and the catalog**: its Hadoop file systems read only the lake, the warehouse
   and its scratch folder, and change files only in the last two (``ReadersFileSystem``); every
   other scheme is refused. Its catalog calls go through the pipeline server's ``CatalogGuard``,
   which admits reads, and changes to the reader's own schemas in the warehouse only.
3. **The SQL check** (``ReaderGuard``, and Spark Connect's calls in ``TokenInterceptor``): an
   allow-list of statement kinds, which refuses every other with ``READ_ONLY_CREDENTIAL`` and a
   clear message.

A reader's statement is bounded: results stream to the client (the SQL endpoint's incremental
collect; Spark Connect sends Arrow batches), an action's results are held to
``LAKEHOUSE_READERS_RESULT_SIZE`` (default 256m, Spark's ``spark.driver.maxResultSize``), a
statement is cancelled after ``LAKEHOUSE_READERS_QUERY_TIMEOUT`` seconds (default 300), the JVM's
heap is ``LAKEHOUSE_READERS_MEMORY`` (default 1g), and it runs at a lower CPU priority than the
pipeline (``nice`` 10), so a heavy query slows readers, never a commit. A statement that needs more
than the heap ends the JVM (rather than leave it limping), and its supervisor starts it again at
once (:func:`lakehouse.runtime.sandbox.supervise`): the readers' sessions of that moment fail, the
pipeline's server is not touched. It runs no Python: its Python workers are ``false``.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from lakehouse.errors import ConfigError, LakehouseError
from lakehouse.runtime import metastore, sandbox
from lakehouse.runtime.config import Settings, whole_number_setting
from lakehouse.runtime.launch import TOKEN_ENV, log_config, server_main_argv
from lakehouse.runtime.objectstore import ObjectPath
from lakehouse.runtime.service import LOOPBACK, Launch, LocalServer, Port

PORT_ENV = "LAKEHOUSE_READERS_PORT"
DEFAULT_PORT = 15003
SQL_PORT_ENV = "LAKEHOUSE_SQL_PORT"
DEFAULT_SQL_PORT = 10000
SQL_ADDRESS_ENV = "LAKEHOUSE_SQL_ADDRESS"
MEMORY_ENV = "LAKEHOUSE_READERS_MEMORY"
RESULT_SIZE_ENV = "LAKEHOUSE_READERS_RESULT_SIZE"
TIMEOUT_ENV = "LAKEHOUSE_READERS_QUERY_TIMEOUT"
READER_USER = "reader"  # the SQL endpoint's one user (the readers' token is its password)
MODE = "readers"  # the server main class's first argument
EXTENSION_CLASS = "lakehouse.server.ReadOnlyExtension"
INTERCEPTOR_CLASS = "lakehouse.server.TokenInterceptor"
# The readers' credentials on S3 (each replaces the variable without the prefix).
S3_CREDENTIALS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")
S3_CREDENTIALS_PREFIX = "LAKEHOUSE_READERS_"
# Hadoop's file systems on the class path besides the lake's (file:, s3a:), and other clouds':
# refused, so no path reaches another server or store.
REFUSED_SCHEMES = (
    "viewfs",
    "har",
    "http",
    "https",
    "hdfs",
    "webhdfs",
    "swebhdfs",
    "pfile",
    "ftp",
    "sftp",
    "s3n",
    "gs",
    "abfs",
    "abfss",
    "wasb",
    "wasbs",
    "o3fs",
    "ofs",
    "oss",
    "cosn",
    "obs",
)
_SIZE = r"\d+[kKmMgG]"


class ReadersError(LakehouseError):
    """The readers' server could not be started, stopped or reached."""


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


def _size(variable: str, default: str) -> str:
    import re

    raw = os.environ.get(variable, default).strip()
    if not re.fullmatch(_SIZE, raw):
        raise ConfigError(f"{variable}={raw!r}: a size such as 512m or 2g")
    return raw.lower()


@dataclass(frozen=True)
class Status:
    """What ``lakehouse spark status`` says of the readers' server."""

    running: bool
    port: int | None = None
    sql_port: int | None = None
    sql_address: str | None = None
    pid: int | None = None
    started_at: str | None = None
    log: Path | None = None
    sandbox: str | None = None  # how the OS holds it to reading, or why it does not
    s3: str | None = None  # whose S3 credentials it has, when the data is in a bucket

    def describe(self, *, already: bool = False) -> str:
        if not self.running:
            return "Readers' server: not running; it starts with `lakehouse spark start`"
        s3 = f"; S3: {self.s3}" if self.s3 else ""
        return (
            f"Readers' server: {'already ' if already else ''}running, pid {self.pid}, "
            f"sc://localhost:{self.port}, SQL endpoint "
            f"jdbc:hive2://{self.sql_address}:{self.sql_port}/default, since {self.started_at}; "
            f"lake read-only by {self.sandbox}{s3} (log: {self.log})"
        )


class ReadersServer(LocalServer[Status]):
    """The readers' server of ``settings``' lakehouse, reading the names the pipeline's server
    serves on ``catalog_port`` (None: no metastore, names last as the session does).

    ``sql_check=False`` starts it without the SQL-level check (for the tests that show the
    layers below it refuse on their own); nothing else turns it off."""

    NAME = "readers' server"
    COMMAND = "spark"
    PORTS = (
        Port("port", PORT_ENV, DEFAULT_PORT),
        Port("sql_port", SQL_PORT_ENV, DEFAULT_SQL_PORT),
    )
    LOG = "server.out"
    START_TIMEOUT_S = 180.0
    ERROR = ReadersError

    def __init__(
        self,
        settings: Settings,
        *,
        catalog_port: int | None = None,
        token: str | None = None,
        sql_check: bool = True,
    ) -> None:
        super().__init__(settings.home / "readers")
        self.settings = settings
        self.catalog_port = catalog_port
        self.token = token
        self.sql_check = sql_check

    # -- where it may write and what it may not see -------------------------------------------
    @property
    def scratch(self) -> Path:
        """Its scratch folder (Hive's session folders, Spark's local files)."""
        return self.root / "scratch"

    @property
    def warehouse(self) -> Path:
        """The readers' warehouse: where their own schemas and tables are."""
        return metastore.folder(self.settings) / "warehouse"

    def lake_folders(self) -> tuple[str, ...]:
        """The lake's folders of data, which readers read and never write."""
        s = self.settings
        return tuple(
            str(f) for f in (s.landing_root, s.tables_root, s.registry_path, s.ledger_path)
        )

    def spec(self) -> sandbox.Spec:
        """What the sandbox holds it to: the home and the lake's local folders read-only, its own
        folder and the warehouse writable, the tokens, passwords and databases hidden."""
        home = self.settings.home
        local = [f for f in self.lake_folders() if not f.startswith(("s3://", "s3a://"))]
        hidden = (
            home / "spark",
            home / "postgres",
            home / "airflow",
            home / "kafka",
            home / "s3",
            metastore.folder(self.settings) / "derby",
            metastore.folder(self.settings) / "conf",
        )
        outside = [f for f in local if not Path(f).is_relative_to(home)]
        return sandbox.Spec(
            read_only=(str(home), *outside),
            writable=(str(self.root), str(self.warehouse)),
            hidden=tuple(str(h) for h in hidden),
        )

    # -- the holder's questions --------------------------------------------------------------
    def conf(self, ports: Mapping[str, int]) -> dict[str, str]:
        """Every setting the readers' server starts with."""
        from lakehouse.runtime import jvm
        from lakehouse.runtime.spark import DELTA_CONF, merged, spark_conf

        base = spark_conf(self.settings.spark_master, "lakehouse-readers")
        readable = [*self.lake_folders(), str(self.warehouse), str(self.scratch)]
        writable = [str(self.warehouse), str(self.scratch)]
        extensions = DELTA_CONF["spark.sql.extensions"]
        conf = {
            # Always its own local driver and executors, whatever the pipeline's master: its
            # file system and its sandbox hold in this process.
            "spark.master": "local[2]",
            "spark.driver.memory": _size(MEMORY_ENV, "1g"),
            "spark.driver.maxResultSize": _size(RESULT_SIZE_ENV, "256m"),
            "spark.lakehouse.readers.queryTimeout": str(
                whole_number_setting(TIMEOUT_ENV, 300, "seconds", least=1)
            ),
            "spark.connect.grpc.binding.address": LOOPBACK,
            "spark.connect.grpc.binding.port": str(ports["port"]),
            "spark.driver.bindAddress": LOOPBACK,
            "spark.driver.host": LOOPBACK,
            "spark.local.dir": str(self.scratch / "spark"),
            # Readers' tables go to the warehouse; the check reads the warehouse, the pipeline's
            # schemas and the lake's folders from these static settings, which no session can
            # change.
            "spark.sql.warehouse.dir": str(self.warehouse),
            "spark.lakehouse.pipelineSchemas": ",".join(metastore.PIPELINE_SCHEMAS),
            "spark.lakehouse.lakeFolders": ",".join(self.lake_folders()),
            "spark.driver.extraClassPath": os.pathsep.join(
                (str(jvm.server_jar()), *map(str, jvm.spark_jars()))
            ),
            "spark.connect.grpc.interceptor.classes": INTERCEPTOR_CLASS,
            "spark.sql.extensions": (
                f"{extensions},{EXTENSION_CLASS}" if self.sql_check else extensions
            ),
            # The SQL endpoint: SASL PLAIN logins checked by the server's code (the readers'
            # token), results streamed a partition at a time, as the server's own user.
            "spark.hadoop.hive.server2.thrift.bind.host": sql_address(),
            "spark.hadoop.hive.server2.thrift.port": str(ports["sql_port"]),
            "spark.hadoop.hive.server2.transport.mode": "binary",
            "spark.hadoop.hive.server2.authentication": "CUSTOM",
            "spark.hadoop.hive.server2.enable.doAs": "false",
            "spark.hadoop.hive.server2.logging.operation.log.location": str(
                self.scratch / "operation-logs"
            ),
            "spark.sql.thriftServer.incrementalCollect": "true",
            "spark.hadoop.hive.exec.scratchdir": str(self.scratch / "hive"),
            "spark.hadoop.hive.exec.local.scratchdir": str(self.scratch / "hive-local"),
            "spark.hadoop.hive.downloaded.resources.dir": str(self.scratch / "resources"),
            # The readers' file systems (include/jvm/server: ReadersFileSystem).
            "spark.hadoop.fs.file.impl": "lakehouse.server.ReadersLocalFileSystem",
            "spark.hadoop.fs.s3a.impl": "lakehouse.server.ReadersFileSystem",
            "spark.hadoop.fs.s3.impl": "lakehouse.server.ReadersFileSystem",
            "spark.hadoop.lakehouse.readers.fs.s3a.impl": "org.apache.hadoop.fs.s3a.S3AFileSystem",
            "spark.hadoop.lakehouse.readers.fs.s3.impl": "org.apache.hadoop.fs.s3a.S3AFileSystem",
            "spark.hadoop.lakehouse.readers.readable": ",".join(readable),
            "spark.hadoop.lakehouse.readers.writable": ",".join(writable),
            **{
                f"spark.hadoop.fs.{scheme}.impl": "lakehouse.server.RefusedFileSystem"
                for scheme in REFUSED_SCHEMES
            },
        }
        if self.catalog_port is not None:
            conf |= {
                "spark.sql.catalogImplementation": "hive",
                "spark.hadoop.hive.metastore.uris": f"thrift://{LOOPBACK}:{self.catalog_port}",
                "spark.hadoop.hive.metastore.execute.setugi": "false",
                "spark.hadoop.hive.metastore.connect.retries": "30",
            }
        return merged(base, conf)

    def prepare(self, ports: Mapping[str, int]) -> None:
        if self.token is None:
            raise ReadersError("the readers' server starts with the readers' token")
        for folder in (self.scratch / "hive-local", self.warehouse):
            folder.mkdir(parents=True, exist_ok=True)

    def launch(self, ports: Mapping[str, int]) -> Launch:
        import pyspark

        conf = self.conf(ports)
        java_options = (
            f"-Dlog4j2.configurationFile=file:{log_config(self.root)} -XX:+ExitOnOutOfMemoryError"
        )
        why_not = sandbox.available()
        argv = sandbox.command(
            self.spec() if why_not is None else None,
            ["nice", "-n", "10", *server_main_argv(conf, java_options, MODE)],
        )
        env = {k: v for k, v in os.environ.items() if k != TOKEN_ENV}
        env |= {
            "SPARK_HOME": str(Path(pyspark.__file__).parent),
            "SPARK_LOCAL_IP": LOOPBACK,
            # No Python in this process: Spark would start this for a Python UDF.
            "PYSPARK_PYTHON": shutil.which("false") or "/bin/false",
            "PYSPARK_DRIVER_PYTHON": shutil.which("false") or "/bin/false",
        }
        s3 = self._s3_credentials(env)
        return Launch(
            argv,
            env=env,
            stdin=f"{self.token}\n",
            record={
                "sql_address": sql_address(),
                "sandbox": "the operating system (read-only mounts)"
                if why_not is None
                else f"its file system only: {why_not}",
                "s3": s3,
                "catalog_port": self.catalog_port,
            },
        )

    def _s3_credentials(self, env: dict[str, str]) -> str | None:
        """Put the readers' own S3 credentials in ``env`` when the deployment gives them; say
        whose it holds (None when the data is not in a bucket)."""
        own = {
            name: os.environ[S3_CREDENTIALS_PREFIX + name]
            for name in S3_CREDENTIALS
            if os.environ.get(S3_CREDENTIALS_PREFIX + name)
        }
        if own:
            for name in S3_CREDENTIALS:
                env.pop(name, None)
            env |= own
        if not isinstance(self.settings.data_root, ObjectPath):
            return None
        if own:
            return "the readers' own credentials (LAKEHOUSE_READERS_AWS_ACCESS_KEY_ID)"
        return (
            "the pipeline's credentials (give the readers read-only ones: "
            "LAKEHOUSE_READERS_AWS_ACCESS_KEY_ID, docs/sql.md)"
        )

    def make_status(self, record: Mapping[str, object] | None) -> Status:
        if record is None:
            return Status(False)

        def port(name: str) -> int | None:
            value = record.get(name)
            return value if isinstance(value, int) else None

        s3 = record.get("s3")
        return Status(
            True,
            port=port("port"),
            sql_port=port("sql_port"),
            sql_address=str(record.get("sql_address") or LOOPBACK),
            pid=port("pid"),
            started_at=str(record.get("started_at")),
            log=self.root / "server.log",
            sandbox=str(record.get("sandbox")),
            s3=str(s3) if s3 else None,
        )

    def log_end(self, *logs: Path) -> str:
        return super().log_end(self.root / "server.log", *logs)


def of(settings: Settings) -> ReadersServer:
    """The readers' server of ``settings``' lakehouse, for its status and stop."""
    return ReadersServer(settings)
